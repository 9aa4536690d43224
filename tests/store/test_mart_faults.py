"""Fault injection on the result store and the mart: disk full during a chunk write and during the
mart build, SIGKILL during the mart build, a corrupt Parquet chunk. Each ends with nothing lost
(the previous chunk / mart intact and readable), no temporary file left, and a clear message."""

from __future__ import annotations

import errno
import os
import signal
import sys
from pathlib import Path
from typing import Any

import duckdb
import pyarrow.parquet as pq
import pytest

from medrobust_lib.store import marts, results
from medrobust_lib.store.marts import MartBuildError, build_mart
from tests.process_helpers import kill_at_marker

ROW = {"model": "sam", "strategy": "pretrained", "dataset": "ds", "sample_id": "a", "condition": "perturbation",
       "perturbation": "noise", "iou": 0.5, "dice": 0.25, "status": "ok"}


def _seg_rows(mart: Path) -> list[tuple[Any, ...]]:
    con = duckdb.connect(str(mart), read_only=True)
    try:
        return con.execute("select sample_id, iou from segmentation_results order by all").fetchall()
    finally:
        con.close()


def _write(results_dir: Path, level: int, sample: str, iou: float) -> Path:
    p = results.chunk_path(results_dir, "segmentation_results", {"modality": "ct", "level": level}, "c")
    results.write_chunk(p, [{**ROW, "sample_id": sample, "iou": iou}], f"fp{sample}{iou}")
    return p


@pytest.fixture()
def store(tmp_path: Path) -> tuple[Path, Path]:
    res = tmp_path / "results"
    _write(res, 1, "a", 0.5)
    mart = tmp_path / "var" / "marts.duckdb"
    build_mart(res, mart)
    assert _seg_rows(mart) == [("a", 0.5)]
    return res, mart


def _temps(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp") or ".tmp." in p.name)


def test_disk_full_during_a_chunk_write_keeps_the_previous_chunk(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = _write(tmp_path, 1, "a", 0.5)
    before = p.read_bytes()

    def full(table: Any, where: Any, **kw: Any) -> None:
        Path(where).write_bytes(b"PAR1 partial")  # some bytes reach the disk, then it is full
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(results.pq, "write_table", full)
    with pytest.raises(OSError) as e:
        results.write_chunk(p, [{**ROW, "iou": 0.9}], "fp2")
    assert e.value.errno == errno.ENOSPC
    assert f"cannot write result chunk {p}" in str(e.value) and "No space left" in str(e.value)
    assert "previous chunk" in str(e.value)
    assert p.read_bytes() == before and pq.read_table(p).column("iou").to_pylist() == [0.5]
    assert _temps(p.parent) == []


class _FullDiskConnection:
    """Wraps a DuckDB connection: the n-th statement fails as a full disk would."""

    def __init__(self, real: duckdb.DuckDBPyConnection, fail_at: int) -> None:
        self.real, self.fail_at, self.n = real, fail_at, 0

    def execute(self, sql: str, *a: Any) -> Any:
        self.n += 1
        if self.n == self.fail_at:
            raise duckdb.IOException('IO Error: Could not write file ".tmp": No space left on device')
        return self.real.execute(sql, *a)

    def close(self) -> None:
        self.real.close()


@pytest.mark.parametrize("fail_at", [3, 40])
def test_disk_full_during_the_mart_build_keeps_the_previous_mart(
        store: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, fail_at: int) -> None:
    res, mart = store
    _write(res, 2, "b", 0.75)
    real_connect = duckdb.connect

    def connect(path: str = ":memory:", **kw: Any) -> Any:
        return _FullDiskConnection(real_connect(path, **kw), fail_at)

    monkeypatch.setattr(marts.duckdb, "connect", connect)
    with pytest.raises(duckdb.IOException, match="No space left"):
        build_mart(res, mart)
    monkeypatch.undo()
    assert _seg_rows(mart) == [("a", 0.5)]  # the previous mart, intact and readable
    assert _temps(mart.parent) == []
    build_mart(res, mart)  # space is back: the next build succeeds
    assert _seg_rows(mart) == [("a", 0.5), ("b", 0.75)]


def test_disk_full_at_the_final_fsync_keeps_the_previous_mart(
        store: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    res, mart = store
    _write(res, 2, "b", 0.75)

    def full(path: Path) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(marts, "_fsync_file", full)
    with pytest.raises(OSError, match="No space left"):
        build_mart(res, mart)
    assert _seg_rows(mart) == [("a", 0.5)] and _temps(mart.parent) == []


def test_a_corrupt_chunk_names_table_and_partition_and_keeps_the_previous_mart(store: tuple[Path, Path]) -> None:
    res, mart = store
    bad = _write(res, 3, "c", 0.1)
    bad.write_bytes(b"PAR1" + os.urandom(64) + b"PAR1")  # a chunk damaged on disk
    with pytest.raises(MartBuildError) as e:
        build_mart(res, mart)
    msg = str(e.value)
    assert "table 'segmentation_results'" in msg and "partition modality=ct, level=3" in msg
    assert str(bad) in msg and "re-materialise" in msg and "previous one is kept" in msg
    assert _seg_rows(mart) == [("a", 0.5)] and _temps(mart.parent) == []


_KILL_SCRIPT = """
import sys, time
from pathlib import Path
from medrobust_lib.store import marts

def stall(path):
    Path(sys.argv[3]).write_text(str(path))
    time.sleep(60)

marts._fsync_file = stall  # the new mart is fully written; the process dies before the rename
marts.build_mart(sys.argv[1], sys.argv[2])
"""


def test_sigkill_during_the_mart_build_keeps_the_previous_mart(store: tuple[Path, Path], tmp_path: Path) -> None:
    res, mart = store
    _write(res, 2, "b", 0.75)
    marker = tmp_path / "building"
    root = Path(__file__).resolve().parents[2]
    status = kill_at_marker([sys.executable, "-c", _KILL_SCRIPT, str(res), str(mart), str(marker)], marker,
                            cwd=root, env={**os.environ, "PYTHONPATH": str(root)}, poll_s=0.05)
    assert status == -signal.SIGKILL
    assert _seg_rows(mart) == [("a", 0.5)]  # readers still see the previous, complete mart
    orphan = Path(marker.read_text())
    assert orphan.exists()  # SIGKILL cannot clean up ...
    build_mart(res, mart)  # ... the next build removes the dead process's temporary file
    assert not orphan.exists() and _temps(mart.parent) == []
    assert _seg_rows(mart) == [("a", 0.5), ("b", 0.75)]


def test_a_live_builders_temporary_file_is_left_alone(tmp_path: Path) -> None:
    mart = tmp_path / "marts.duckdb"
    live = tmp_path / f".marts.duckdb.{os.getppid()}.abc.tmp"  # the parent process is alive
    dead_legacy = tmp_path / ".marts.duckdb.0123abcdef.tmp"  # old naming, no pid: always stale
    live.write_bytes(b"x")
    dead_legacy.write_bytes(b"x")
    build_mart(tmp_path / "results", mart)
    assert live.exists() and not dead_legacy.exists()
