"""Error share and completeness per partition (medrobust_lib.store.completeness), known answers."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from medrobust_lib.store import results
from medrobust_lib.store.completeness import (
    complete_rows,
    error_share_sql,
    error_shares,
    partition_error_share,
)


def _rows(model: str, level: int, outcomes: dict[str, int]) -> list[dict[str, object]]:
    return [{"model": model, "modality": "ct", "level": level, "outcome": o} for o, k in outcomes.items()
            for _ in range(k)]


ROWS = pd.DataFrame(
    _rows("a", 0, {"ok": 60, "unparseable": 1, "error": 1, "excluded:box_out_of_view": 10})  # 1 / 62
    + _rows("a", 1, {"ok": 48, "refused": 1, "error": 1})  # 1 / 50 = 0.02: exactly at the limit
    + _rows("a", 2, {"ok": 40, "error": 2})  # 2 / 42 > 0.02
    + _rows("b", 0, {"excluded:image_not_indexed": 3}))  # nothing attempted


def test_error_shares_known_answers() -> None:
    out = error_shares(ROWS, "vlm_results").set_index(["model", "level"])
    assert list(out.loc[("a", 0), ["n", "n_excluded", "n_attempted", "n_error"]]) == [72, 10, 62, 1]
    assert out.loc[("a", 0), "error_share"] == pytest.approx(1 / 62) and out.loc[("a", 0), "complete"]
    assert out.loc[("a", 1), "error_share"] == pytest.approx(0.02) and out.loc[("a", 1), "complete"]
    assert out.loc[("a", 2), "error_share"] == pytest.approx(2 / 42) and not out.loc[("a", 2), "complete"]
    assert pd.isna(out.loc[("b", 0), "error_share"]) and out.loc[("b", 0), "complete"]
    assert (out["max_error_share"] == 0.02).all() and (out["source_table"] == "vlm_results").all()
    strict = error_shares(ROWS, "vlm_results", 0.0).set_index(["model", "level"])
    assert list(strict["complete"]) == [False, False, False, True]


def test_complete_rows_drops_incomplete_partitions_only() -> None:
    kept = complete_rows(ROWS, "vlm_results")
    assert sorted({(m, lv) for m, lv in zip(kept["model"], kept["level"], strict=True)}) == [
        ("a", 0), ("a", 1), ("b", 0)]
    assert len(kept) == len(ROWS) - 42


def test_taxonomy_partitions_are_keyed_by_config() -> None:
    df = pd.DataFrame([{"config": "c", "modality": "ct", "level": 3, "outcome": "error"}])
    out = error_shares(df, "taxonomy_results")
    assert list(out[["model", "level", "error_share", "complete"]].iloc[0]) == ["c", 3, 1.0, False]


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="max_error_share"):
        error_share_sql("t", "vlm_results", 1.5)
    with pytest.raises(KeyError, match="segmentation_results"):
        error_share_sql("t", "segmentation_results", 0.02)


def test_partition_error_share_reads_one_partition(tmp_path: Path) -> None:
    part = {"model": "a", "run": "perturbation", "modality": "ct", "level": 2}
    df = ROWS[(ROWS["model"] == "a") & (ROWS["level"] == 2)]
    results.write_chunk(results.chunk_path(tmp_path, "vlm_results", part, "ds"), df, "fp")
    s = partition_error_share(tmp_path, "vlm_results", part)
    assert (s.n, s.n_attempted, s.n_error, s.complete) == (42, 42, 2, False)
    assert s.error_share == pytest.approx(2 / 42)
    empty = partition_error_share(tmp_path, "vlm_results", {**part, "level": 3})
    assert empty.complete and empty.n == 0
