"""Adversarial attacks in pixel space (docs/design.md, section 5)."""

from __future__ import annotations

from medrobust_lib.attacks.linf import (
    ATTACK_KINDS,
    DEFAULT_STEP_SIZE_FACTOR,
    EPSILONS,
    PGD_STEPS,
    AttackKind,
    AttackSetting,
    DifferentiableSegmenter,
    eval_mode,
    fgsm,
    pgd,
    torch_generator_for,
)

__all__ = [
    "ATTACK_KINDS",
    "DEFAULT_STEP_SIZE_FACTOR",
    "EPSILONS",
    "PGD_STEPS",
    "AttackSetting",
    "AttackKind",
    "DifferentiableSegmenter",
    "eval_mode",
    "fgsm",
    "pgd",
    "torch_generator_for",
]
