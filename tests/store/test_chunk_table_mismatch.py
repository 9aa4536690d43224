"""A valid chunk copied into another table's folder is refused by the mart build, naming the file
(issue 44, finding 12): it used to pass its checksums and add rows of NULLs to that table."""

from __future__ import annotations

import shutil
from pathlib import Path

import duckdb
import pytest

from medrobust_lib.store import results
from medrobust_lib.store.marts import MartBuildError, build_mart


def test_a_chunk_of_another_table_is_refused(tmp_path: Path) -> None:
    res = tmp_path / "results"
    vlm = results.chunk_path(res, "vlm_results", {"model": "m", "modality": "ct"}, "d")
    results.write_chunk(vlm, [{"dataset": "d", "sample_id": "a", "task": "vqa_yesno", "outcome": "ok"}], "fp")
    seg = results.chunk_path(res, "segmentation_results", {"model": "m", "modality": "ct"}, "d")
    results.write_chunk(seg, [{"dataset": "d", "sample_id": "a", "condition": "clean", "status": "ok", "iou": 0.5,
                               "dice": 0.6}], "fp")
    mart = tmp_path / "m.duckdb"
    build_mart(res, mart)
    con = duckdb.connect(str(mart), read_only=True)
    assert con.execute("select count(*) from segmentation_results").fetchall() == [(1,)]
    con.close()
    stray = seg.with_name("copied.parquet")
    shutil.copyfile(vlm, stray)
    results.verify_chunk(stray)  # its checksums and content hash are valid: only its table is wrong
    with pytest.raises(MartBuildError, match=r"copied.parquet was written for table 'vlm_results', not "
                                             r"'segmentation_results'"):
        build_mart(res, mart)
    con = duckdb.connect(str(mart), read_only=True)
    assert con.execute("select count(*) from segmentation_results").fetchall() == [(1,)]  # the old mart stays
    con.close()
