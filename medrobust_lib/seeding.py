"""Deterministic random generators derived from a key.

All randomness in medrobust comes from :func:`rng_for`. The key is typically
``(seed, dataset, sample_id, perturbation)``; the severity level is deliberately *not* part of a
perturbation's key, so every level of a type sees the same random field (common random numbers)
and only the strength changes between levels.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np


def seed_key(*parts: object) -> str:
    """Canonical string form of a key: parts joined by ``/`` (stored in manifests)."""
    return "/".join(str(p) for p in parts)


def key_digest(*parts: object) -> bytes:
    """SHA-256 digest of the canonical key string."""
    return hashlib.sha256(seed_key(*parts).encode("utf-8")).digest()


def rng_for(*parts: object) -> np.random.Generator:
    """A fresh PCG64 generator seeded from SHA-256 of the key; same key -> same stream.

    Independent of call order, process and platform.
    """
    digest = key_digest(*parts)
    entropy = [int.from_bytes(digest[i : i + 4], "little") for i in range(0, 32, 4)]
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(entropy)))


def stable_fraction(*parts: object) -> float:
    """A number in [0, 1) determined by the key (used for hash-based splits and orderings)."""
    return int.from_bytes(key_digest(*parts)[:8], "little") / 2**64


@contextmanager
def scoped_torch_seed(*parts: object, module: Any = None) -> Iterator[None]:
    """Seed torch's global generators from the key inside the block and restore the previous
    state on exit (CPU, plus the module's CUDA device when it has one). Only for library code
    (peft, transformers initialisers) that draws from the global generator and takes none."""
    import torch

    devices: list[int] = []
    if module is not None:
        p = next(iter(module.parameters()), None)
        if p is not None and p.device.type == "cuda":
            devices = [p.device.index or 0]
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(int.from_bytes(key_digest(*parts)[:8], "little") & (2**63 - 1))
        yield
