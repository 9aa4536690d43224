"""A resumed run does not score again what it has: a segmentation partition (clean, perturbed,
attack) written from the same inputs is read back, not recomputed; any change of its inputs (a
sample's pixels or mask, a sample that became unusable) or of its files (a chunk missing, a stray
one, a corrupt one) makes it scored and written again."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from medrobust_lib.config import Suite
from medrobust_lib.store import results
from medrobust_lib.tracks import feed
from medrobust_lib.tracks.datasets import build_clean_index
from medrobust_lib.tracks.perturbed import build_perturbed
from medrobust_lib.tracks.segmentation import evaluate as ev
from tests.tracks.unusable_helpers import LEVEL, OK, broken_seg_suite, change_pixels, image_path

Evaluation = Callable[[Suite], ev.EvalSummary]
EVALUATIONS: dict[str, Evaluation] = {
    "clean": lambda s: ev.evaluate_clean(s, "ref", "ct"),
    "perturbation": lambda s: ev.evaluate_perturbed(s, "ref", "ct", LEVEL),
    "attack": lambda s: ev.evaluate_attacks(s, "ref", "ct", LEVEL),
}


@pytest.fixture
def suite(tmp_path: Path, demo_root: Path) -> Suite:
    return broken_seg_suite(tmp_path, demo_root)


def _folder(suite: Suite, run: str) -> Path:
    level = 0 if run == "clean" else LEVEL
    return results.partition_dir(suite.results_dir, ev.RESULTS_TABLE,
                                 {"model": "ref", "run": run, "modality": "ct", "level": level})


def _rows(suite: Suite, run: str) -> pd.DataFrame:
    return results.read_partition(suite.results_dir, ev.RESULTS_TABLE, {
        "model": "ref", "run": run, "modality": "ct", "level": 0 if run == "clean" else LEVEL})


def _no_scoring(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the model calls of the evaluation (none expected when it reuses its partition)."""
    calls: list[int] = []
    real = ev._score_items

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(ev, "_score_items", counted)
    return calls


@pytest.mark.parametrize("run", sorted(EVALUATIONS))
def test_a_current_partition_is_read_back_not_scored(suite: Suite, run: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    first = EVALUATIONS[run](suite)
    assert not first.reused and first.n_rows > 0
    files = {f.name: (f.stat().st_mtime_ns, f.read_bytes()) for f in _folder(suite, run).glob("*.parquet")}
    calls = _no_scoring(monkeypatch)
    again = EVALUATIONS[run](suite)
    assert again.reused and calls == []
    assert (again.n_rows, again.n_failed) == (first.n_rows, first.n_failed)
    assert again.mean_iou == pytest.approx(first.mean_iou, nan_ok=True)
    # nothing was rewritten
    assert {f.name: (f.stat().st_mtime_ns, f.read_bytes()) for f in _folder(suite, run).glob("*.parquet")} == files


@pytest.mark.parametrize("run", sorted(EVALUATIONS))
def test_a_changed_sample_is_scored_again(suite: Suite, run: str, monkeypatch: pytest.MonkeyPatch) -> None:
    EVALUATIONS[run](suite)
    before = _rows(suite, run).set_index(["sample_id", "perturbation"])
    # the usable sample's pixels change; the clean index (and manifest) are rebuilt, as a user would
    change_pixels(image_path(Path(suite.demo.root), OK))
    build_clean_index(suite, "ct")
    build_perturbed(suite, "ct", LEVEL)
    calls = _no_scoring(monkeypatch)
    again = EVALUATIONS[run](suite)
    assert not again.reused and calls
    after = _rows(suite, run).set_index(["sample_id", "perturbation"])
    # one row per (sample, condition), no duplicate; the rebuilt index quarantines the deleted
    # sample, which the clean and attack partitions then leave to the quarantine view
    assert after.index.is_unique and set(after.index) <= set(before.index)
    assert (after.loc[OK, "status"] == "ok").all()


def test_a_sample_that_became_unusable_is_an_error_row_on_resume(suite: Suite) -> None:
    first = EVALUATIONS["clean"](suite)
    assert (_rows(suite, "clean").set_index("sample_id").loc[OK, "status"]) == "ok"
    image_path(Path(suite.demo.root), OK).write_bytes(b"not a dicom file")  # the clean index still lists it ok
    feed._CLEAN.clear()  # a resumed run is a new process: it reads the samples again
    again = EVALUATIONS["clean"](suite)
    assert not again.reused and again.n_failed == first.n_failed + 1
    df = _rows(suite, "clean").set_index("sample_id")
    assert df.loc[OK, "status"] == "error" and df.loc[OK, "error"].startswith("quarantined:")


def _corrupt(chunk: Path) -> None:
    """Flip the first byte whose flip the chunk's checksums detect (a flip in padding changes no
    value and is rightly not an error)."""
    original = chunk.read_bytes()
    for offset in range(4, len(original) - 8):
        data = bytearray(original)
        data[offset] ^= 0xFF
        chunk.write_bytes(bytes(data))
        try:
            results.verify_chunk(chunk)
        except results.CorruptChunkError:
            return
    raise AssertionError("no detectable flip")


@pytest.mark.parametrize("damage", ["missing", "stray", "corrupt"])
def test_damaged_partition_files_are_scored_again(suite: Suite, damage: str) -> None:
    first = EVALUATIONS["perturbation"](suite)
    folder = _folder(suite, "perturbation")
    (chunk,) = sorted(folder.glob("*.parquet"))
    if damage == "missing":
        chunk.unlink()
    elif damage == "stray":
        (folder / "other_dataset.parquet").write_bytes(chunk.read_bytes())
    else:
        _corrupt(chunk)
    again = EVALUATIONS["perturbation"](suite)
    assert not again.reused and (again.n_rows, again.n_failed) == (first.n_rows, first.n_failed)
    assert sorted(f.name for f in folder.glob("*.parquet")) == [chunk.name]  # the stray one removed
    results.verify_chunk(chunk)  # whole and valid again


def test_chunks_current_needs_exactly_the_named_chunks(tmp_path: Path) -> None:
    part = {"model": "m", "run": "clean", "modality": "ct", "level": 0}
    rows = [{"dataset": "a", "x": 1}]
    assert not results.chunks_current(tmp_path, "t", part, {"a"}, "fp")  # nothing written yet
    results.write_chunk(results.chunk_path(tmp_path, "t", part, "a"), rows, "fp")
    assert results.chunks_current(tmp_path, "t", part, {"a"}, "fp")
    assert not results.chunks_current(tmp_path, "t", part, {"a"}, "other fp")
    assert not results.chunks_current(tmp_path, "t", part, {"a", "b"}, "fp")  # a chunk missing
    assert not results.chunks_current(tmp_path, "t", part, set(), "fp")  # nothing expected: compute
    results.write_chunk(results.chunk_path(tmp_path, "t", part, "b"), rows, "fp")
    assert not results.chunks_current(tmp_path, "t", part, {"a"}, "fp")  # a chunk too many


def test_reuse_false_always_scores(suite: Suite, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the benchmarks rely on: ``reuse=False`` scores a current partition again."""
    ev.evaluate_perturbed(suite, "ref", "ct", LEVEL)
    calls = _no_scoring(monkeypatch)
    again = ev.evaluate_perturbed(suite, "ref", "ct", LEVEL, reuse=False)
    assert not again.reused and calls
