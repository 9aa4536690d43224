"""Deterministic train/val/test splits by a hash of (dataset, sample id)."""

from __future__ import annotations

from medrobust_lib.seeding import stable_fraction

SPLIT_FRACTIONS: tuple[tuple[str, float], ...] = (("train", 0.60), ("val", 0.15), ("test", 0.25))


def split_for(dataset: str, sample_id: str,
              fractions: tuple[tuple[str, float], ...] = SPLIT_FRACTIONS) -> str:
    """'train', 'val' or 'test' for a sample: stable across runs, machines and dataset order.
    Not seeded by the suite seed on purpose, so every suite sees the same held-out images.
    ``fractions``: (split, share) pairs, cut in this order (a suite's ``splits``: the shares differ,
    the hash is the same, so a suite with a larger test share holds every test sample of one with
    a smaller)."""
    u = stable_fraction("split", dataset, sample_id)
    acc = 0.0
    for name, frac in fractions:
        acc += frac
        if u < acc:
            return name
    return fractions[-1][0]


EVALUATION_SPLIT = "test"
"""The split every sample of an evaluation-only dataset belongs to."""


def split_of(dataset: str, sample_id: str, evaluation_only: bool = False,
             fractions: tuple[tuple[str, float], ...] = SPLIT_FRACTIONS) -> str:
    """The split of a sample of a dataset: :data:`EVALUATION_SPLIT` for every sample of an
    evaluation-only dataset (``DatasetConfig.evaluation_only``: data kept out of training and
    validation, e.g. a few real images evaluated next to a synthetic corpus), else
    :func:`split_for`'s hash split with ``fractions`` (the suite's ``splits``)."""
    return EVALUATION_SPLIT if evaluation_only else split_for(dataset, sample_id, fractions)
