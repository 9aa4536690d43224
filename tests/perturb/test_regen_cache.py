"""The per-process cache of regenerated perturbed samples: bit-exact, keyed on the inputs,
bounded, read-only, and off when its budget is 0."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import numpy as np
import pytest

from medrobust_lib.data.boxes import mask_to_boxes
from medrobust_lib.data.sample import Sample
from medrobust_lib.perturb import regen_cache
from medrobust_lib.perturb.engine import regenerate


@pytest.fixture(autouse=True)
def _empty_cache() -> Iterator[None]:
    regen_cache.clear()
    yield
    regen_cache.clear()


def _sample(seed: int = 0, mask_shift: int = 0) -> Sample:
    rng = np.random.default_rng(seed)
    img = rng.random((48, 40)).astype(np.float32)
    mask = np.zeros((48, 40), bool)
    mask[10 + mask_shift : 30 + mask_shift, 8:24] = True
    return Sample("s0", "ds", "ct", img, mask, mask_to_boxes(mask))


def _row(kind: str = "rotation", strength: float = 12.0, seed_key: str = "k0") -> dict[str, object]:
    return {"perturbation": kind, "strength": strength, "seed_key": seed_key}


def test_a_repeated_row_is_regenerated_once_and_equals_regenerate() -> None:
    s = _sample()
    first = regen_cache.regenerate_cached(_row(), s)
    again = regen_cache.regenerate_cached(_row(), s)
    want = regenerate(_row(), s)
    assert again is first
    assert np.array_equal(first.image, want.image) and np.array_equal(first.mask, want.mask)
    assert np.array_equal(first.boxes, want.boxes)
    st = regen_cache.stats()
    assert (st["hits"], st["misses"], st["entries"]) == (1, 1, 1)
    assert st["bytes"] == first.image.nbytes + first.mask.nbytes + first.boxes.nbytes


def test_equal_inputs_from_another_reader_hit_and_different_inputs_miss() -> None:
    s = _sample()
    out = regen_cache.regenerate_cached(_row(), s)
    copy = Sample("s0", "ds", "ct", s.image.copy(), s.mask.copy(), s.boxes.copy())  # same content, new arrays
    assert regen_cache.regenerate_cached(_row(), copy) is out
    moved = _sample(mask_shift=5)  # same image, another mask: the moved mask must be its own
    other = regen_cache.regenerate_cached(_row(), moved)
    assert other is not out
    assert np.array_equal(other.mask, regenerate(_row(), moved).mask)
    assert not np.array_equal(other.mask, out.mask)
    for row in (_row(strength=20.0), _row(seed_key="k1"), _row(kind="gaussian_noise", strength=0.1)):
        assert regen_cache.regenerate_cached(row, s) is not out
    assert regen_cache.stats()["entries"] == 5


def test_outputs_are_read_only() -> None:
    out = regen_cache.regenerate_cached(_row(), _sample())
    with pytest.raises(ValueError, match="read-only"):
        out.image[0, 0] = 1.0
    with pytest.raises(ValueError, match="read-only"):
        out.mask[0, 0] = True


def test_budget_keeps_the_most_recently_used(monkeypatch: pytest.MonkeyPatch) -> None:
    s = _sample()
    one = regen_cache.regenerate_cached(_row(seed_key="a"), s)
    size = regen_cache.stats()["bytes"]
    # room for two entries (the budget is whole MiB: make each entry a third of a MiB)
    monkeypatch.setattr(regen_cache, "_nbytes", lambda out: 350_000)
    monkeypatch.setenv(regen_cache.BUDGET_ENV, "1")
    regen_cache.clear()
    a = regen_cache.regenerate_cached(_row(seed_key="a"), s)
    b = regen_cache.regenerate_cached(_row(seed_key="b"), s)
    assert regen_cache.regenerate_cached(_row(seed_key="a"), s) is a  # a is now the most recent
    regen_cache.regenerate_cached(_row(seed_key="c"), s)  # drops b, the least recently used
    st = regen_cache.stats()
    assert st["entries"] == 2 and st["bytes"] == 700_000
    assert regen_cache.regenerate_cached(_row(seed_key="a"), s) is a
    assert regen_cache.regenerate_cached(_row(seed_key="b"), s) is not b
    assert size > 0 and np.array_equal(one.image, a.image)


def test_zero_budget_disables_and_bad_values_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(regen_cache.BUDGET_ENV, "0")
    s = _sample()
    out = regen_cache.regenerate_cached(_row(), s)
    assert regen_cache.regenerate_cached(_row(), s) is not out
    assert out.image.flags.writeable  # not shared, so not frozen
    assert regen_cache.stats() == {"hits": 0, "misses": 0, "entries": 0, "bytes": 0}
    monkeypatch.setenv(regen_cache.BUDGET_ENV, "lots")
    with pytest.raises(ValueError, match=regen_cache.BUDGET_ENV):
        regen_cache.regenerate_cached(_row(), s)


def test_fingerprints_are_forgotten_with_their_arrays() -> None:
    s = _sample(seed=3)
    before = len(regen_cache._FINGERPRINTS)
    regen_cache.regenerate_cached(_row(), s)
    assert len(regen_cache._FINGERPRINTS) == before + 3  # image, mask, boxes
    del s
    gc.collect()
    assert len(regen_cache._FINGERPRINTS) == before
