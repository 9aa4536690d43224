"""The plain-Python pipeline on a small demo: clean index, perturbed partitions, resume, mart."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd

from medrobust_lib.config import load_suite
from medrobust_lib.perturb.engine import verify_row
from medrobust_lib.store.marts import build_mart, connect_readonly
from medrobust_lib.tracks.datasets import build_clean_index, load_clean_samples
from medrobust_lib.tracks.perturbed import build_perturbed, read_manifest
from tests.suite_helpers import write_suite


def _prepare(root: Path, demo_root: Path, **over: object):  # type: ignore[no-untyped-def]
    suite = load_suite(write_suite(root, demo_root, **over))
    for m in suite.modalities:
        build_clean_index(suite, m)
    return suite


def test_partition_rows_complete_and_regenerable(tmp_path: Path, demo_root: Path) -> None:
    suite = _prepare(tmp_path, demo_root)
    summary = build_perturbed(suite, "dermoscopy", 2)
    df = read_manifest(suite, "dermoscopy", 2)
    samples = load_clean_samples(suite, "dermoscopy")
    n = sum(len(v) for v in samples.values())
    # dermoscopy (RGB) gets the generic types incl. saturation plus hair; not the CT ring artifact
    assert set(df["perturbation"]) == {"gaussian_noise", "rotation", "jpeg_compression", "hair", "saturation"}
    assert len(df) == 5 * n and not df.duplicated(["sample_id", "perturbation"]).any()
    assert summary.n_rows == len(df) and summary.n_error == 0
    by_id = {s.sample_id: s for v in samples.values() for s in v}
    for r in df.head(6).to_dict("records"):
        assert verify_row(r, by_id[r["sample_id"]])
    # re-materializing reuses every chunk and leaves identical rows
    again = build_perturbed(suite, "dermoscopy", 2)
    assert again.chunks_reused == 5 and again.chunks_computed == 0
    pd.testing.assert_frame_equal(df.sort_values(["perturbation", "sample_id"]).reset_index(drop=True),
                                  read_manifest(suite, "dermoscopy", 2).sort_values(["perturbation", "sample_id"]).reset_index(drop=True))


def test_same_manifest_with_one_or_two_workers(tmp_path: Path, demo_root: Path) -> None:
    a = _prepare(tmp_path / "a", demo_root, workers=1)
    b = _prepare(tmp_path / "b", demo_root, workers=2)
    build_perturbed(a, "ct", 4)
    build_perturbed(b, "ct", 4)
    key = ["dataset", "perturbation", "sample_id"]
    da = read_manifest(a, "ct", 4).sort_values(key).reset_index(drop=True)
    db = read_manifest(b, "ct", 4).sort_values(key).reset_index(drop=True)
    pd.testing.assert_frame_equal(da, db)


KILL_SCRIPT = """
import sys, time
from medrobust_lib.config import load_suite
from medrobust_lib.tracks.perturbed import build_perturbed
suite = load_suite(sys.argv[1])
def slow(msg):
    print(msg, flush=True)
    time.sleep(30)   # the parent kills us here, after the first chunk is on disk
build_perturbed(suite, "ct", 3, progress=slow)
"""


def test_resume_after_sigkill_gives_identical_rows(tmp_path: Path, demo_root: Path) -> None:
    killed = _prepare(tmp_path / "killed", demo_root)
    clean = _prepare(tmp_path / "clean", demo_root)
    suite_path = tmp_path / "killed" / "suite.yaml"
    env = {**os.environ, "PYTHONPATH": str(Path.cwd())}
    proc = subprocess.Popen([sys.executable, "-c", KILL_SCRIPT, str(suite_path)], stdout=subprocess.PIPE, env=env)
    assert proc.stdout is not None
    first = proc.stdout.readline()  # blocks until one chunk has been written
    assert b"[ct L3]" in first
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    part = Path(killed.results_dir, "perturbation_manifest", "modality=ct", "level=3")
    assert 0 < len(list(part.glob("*.parquet"))) < 4
    resumed = build_perturbed(killed, "ct", 3)
    assert resumed.chunks_reused >= 1
    build_perturbed(clean, "ct", 3)
    key = ["dataset", "perturbation", "sample_id"]
    pd.testing.assert_frame_equal(read_manifest(killed, "ct", 3).sort_values(key).reset_index(drop=True),
                                  read_manifest(clean, "ct", 3).sort_values(key).reset_index(drop=True))


def test_mart_summary_matches_manifest(tmp_path: Path, demo_root: Path) -> None:
    suite = _prepare(tmp_path, demo_root)
    build_perturbed(suite, "ct", 1)
    build_perturbed(suite, "ct", 5)
    counts = build_mart(suite.results_dir, suite.mart_path)
    df = pd.concat([read_manifest(suite, "ct", 1), read_manifest(suite, "ct", 5)])
    assert counts["perturbation_manifest"] == len(df)
    con = connect_readonly(suite.mart_path)
    try:
        got = con.execute("select perturbation, level, n, mean_ssim, band_hit_rate from perturbation_summary "
                          "where modality = 'ct' order by all").df()
    finally:
        con.close()
    # the hit rate is over the rows the type applies to: an RGB-only type on this grayscale CT has only
    # not_applicable rows (counted in n), and no hit rate
    df = df.assign(hit=df["band_reached"].where(df["status"] != "not_applicable").astype("float"))
    ref = (df.groupby(["perturbation", "level"])
           .agg(n=("ssim", "size"), mean_ssim=("ssim", "mean"), band_hit_rate=("hit", "mean"))
           .reset_index().sort_values(["perturbation", "level"]).reset_index(drop=True))
    pd.testing.assert_frame_equal(got.reset_index(drop=True), ref, check_dtype=False)
