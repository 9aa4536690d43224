"""A per-process cache of regenerated perturbed samples.

Every evaluation track regenerates its perturbed images from the manifest
(:func:`medrobust_lib.perturb.engine.regenerate`), so a process that evaluates several models on
one (modality, level) partition, such as the segmentation model, two VLMs and three taxonomy
configurations batched into one Dagster run, or six fine-tuning strategies over the same level,
would regenerate every row once per model. :func:`regenerate_cached` regenerates a row once and
hands the same :class:`~medrobust_lib.perturb.spec.PerturbOutput` to every later caller.

* **Key.** The row's perturbation type, strength and seed key (all the output depends on besides
  the inputs) plus a SHA-256 fingerprint of the input image, mask and boxes. A fingerprint is
  computed once per array object (remembered through a weak reference, forgotten when the array
  is freed), so a caller with a different sample (another mask, another reader) never gets an
  output that was not made from its own inputs. The memo relies on the library's contract that a
  sample's arrays are never changed in place (``Sample`` is frozen, every perturbation is pure).
* **Bounded.** Entries are counted by the bytes of their arrays and kept within
  :func:`budget_bytes` (default :data:`DEFAULT_BUDGET_MB` MiB; ``MEDROBUST_REGEN_CACHE_MB``
  overrides, 0 disables), least recently used dropped first. The demo's highest severity (898
  rows, about 540 MiB) fits, so the fine-tuning strategies' evaluations share it.
* **Read-only outputs.** Cached arrays are marked non-writeable: a caller that tried to change a
  shared output in place would raise instead of corrupting another model's input.

Outputs are bit-identical to :func:`~medrobust_lib.perturb.engine.regenerate` (they are its
outputs). Thread-safe (:class:`medrobust_lib.lru.LRU`).
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from medrobust_lib.data.sample import Sample, array_hash
from medrobust_lib.lru import LRU
from medrobust_lib.perturb.engine import regenerate
from medrobust_lib.perturb.spec import PerturbOutput

BUDGET_ENV = "MEDROBUST_REGEN_CACHE_MB"
DEFAULT_BUDGET_MB = 1024

_FINGERPRINTS: dict[int, tuple[weakref.ref[np.ndarray], str]] = {}


def budget_bytes() -> int:
    """The cache's budget in bytes: ``MEDROBUST_REGEN_CACHE_MB`` MiB when set (0 disables the
    cache), else :data:`DEFAULT_BUDGET_MB`. A value that is not a non-negative integer raises
    ``ValueError`` naming the variable."""
    raw = os.environ.get(BUDGET_ENV, "").strip()
    if not raw:
        return DEFAULT_BUDGET_MB << 20
    if not raw.isdigit():
        raise ValueError(f"{BUDGET_ENV} must be a whole number of MiB (0 disables the cache), got {raw!r}")
    return int(raw) << 20


_CACHE: LRU[tuple[Any, ...], PerturbOutput] = LRU(max_bytes=budget_bytes, name="perturb.regen")


def _forget(k: int) -> Callable[[weakref.ref[np.ndarray]], None]:
    """The weak-reference callback that drops array ``k``'s fingerprint when it is freed."""
    def drop(_ref: weakref.ref[np.ndarray]) -> None:
        _FINGERPRINTS.pop(k, None)
    return drop


def _fingerprint(a: np.ndarray | None) -> str:
    """SHA-256 of one input array (dtype, shape, bytes), computed once per array object."""
    if a is None:
        return "<none>"
    k = id(a)
    hit = _FINGERPRINTS.get(k)
    if hit is not None and hit[0]() is a:
        return hit[1]
    fp = array_hash(a)
    try:
        _FINGERPRINTS[k] = (weakref.ref(a, _forget(k)), fp)
    except TypeError:  # not an ndarray (e.g. a list of boxes): hashed again next time
        pass
    return fp


def _nbytes(out: PerturbOutput) -> int:
    return sum(int(a.nbytes) for a in (out.image, out.mask, out.boxes, out.instances) if a is not None)


def _freeze(out: PerturbOutput) -> PerturbOutput:
    for a in (out.image, out.mask, out.boxes, out.instances):
        if a is not None:
            a.flags.writeable = False
    return out


def _key(row: dict[str, Any], sample: Sample) -> tuple[Any, ...]:
    return (str(row["perturbation"]), float(row["strength"]), str(row["seed_key"]),
            _fingerprint(sample.image), _fingerprint(sample.mask), _fingerprint(sample.boxes),
            _fingerprint(sample.instances))


def lookup(row: dict[str, Any], sample: Sample) -> PerturbOutput | None:
    """The cached output of ``row`` on ``sample``'s inputs, or None (counted as a miss)."""
    if budget_bytes() == 0:
        return None
    return _CACHE.get(_key(row, sample))


def remember(row: dict[str, Any], sample: Sample, out: PerturbOutput) -> PerturbOutput:
    """Keep ``out``, the regeneration of ``row`` on ``sample``, within the budget (least recently
    used entries dropped first); returns it with its arrays made read-only."""
    if budget_bytes() == 0:
        return out
    out = _freeze(out)
    _CACHE.put(_key(row, sample), out, _nbytes(out))
    return out


def regenerate_cached(row: dict[str, Any], sample: Sample) -> PerturbOutput:
    """:func:`~medrobust_lib.perturb.engine.regenerate` of a manifest row (at least
    ``perturbation``, ``strength``, ``seed_key``) on ``sample``, from the cache when the same row
    was regenerated from the same inputs before. With the cache on, the returned arrays are
    read-only (copy before changing them)."""
    if budget_bytes() == 0:
        return regenerate(row, sample)
    key = _key(row, sample)  # fingerprints once, for the lookup and the insert
    hit = _CACHE.get(key)
    if hit is not None:
        return hit
    out = _freeze(regenerate(row, sample))
    _CACHE.put(key, out, _nbytes(out))
    return out


def stats() -> dict[str, int]:
    """Hits, misses, entries and bytes held since the process started (or :func:`clear`)."""
    return {"hits": _CACHE.hits, "misses": _CACHE.misses, "entries": len(_CACHE), "bytes": _CACHE.nbytes}


def clear() -> None:
    """Drop every entry and reset the counters."""
    _CACHE.clear()
