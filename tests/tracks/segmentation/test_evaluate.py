"""No vanishing rows in the segmentation track: a sample of the evaluation split that is missing or
quarantined since the clean index / manifest was built is an explicit ``error`` row with the reason,
outside every average and counted as failed; a sample of another split has no row."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from medrobust_lib.config import Suite
from medrobust_lib.store import results
from medrobust_lib.store.marts import build_mart, connect_readonly
from medrobust_lib.tracks.segmentation.evaluate import (
    RESULTS_TABLE,
    evaluate_attacks,
    evaluate_clean,
    evaluate_perturbed,
)
from tests.tracks.unusable_helpers import (
    LEVEL,
    MISSING,
    OK,
    OTHER_SPLIT,
    QUARANTINED,
    broken_seg_suite,
    image_path,
)


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory, demo_root: Path) -> Suite:
    return broken_seg_suite(tmp_path_factory.mktemp("seg_unusable"), demo_root)


def _rows(suite: Suite, run: str, level: int) -> pd.DataFrame:
    return results.read_partition(suite.results_dir, RESULTS_TABLE,
                                  {"model": "ref", "run": run, "modality": "ct", "level": level})


def _missing_reason(suite: Suite) -> str:
    return f"missing: {image_path(Path(suite.demo.root), MISSING)}"


def test_perturbed_rows_of_unusable_samples_are_errors(suite: Suite) -> None:
    summary = evaluate_perturbed(suite, "ref", "ct", LEVEL)
    df = _rows(suite, "perturbation", LEVEL).set_index("sample_id")
    assert sorted(df.index) == [OK, QUARANTINED, MISSING]  # the other split's row is no row at all
    assert OTHER_SPLIT not in df.index
    assert df.loc[OK, "status"] == "ok" and math.isfinite(df.loc[OK, "iou"])
    assert df.loc[QUARANTINED, "status"] == "error" and df.loc[QUARANTINED, "error"] == "quarantined:unreadable_dicom"
    assert df.loc[MISSING, "status"] == "error" and df.loc[MISSING, "error"] == _missing_reason(suite)
    assert df.loc[[QUARANTINED, MISSING], "iou"].isna().all()
    assert set(df["perturbation"]) == {"gaussian_noise"} and set(df["level"]) == {LEVEL}
    # the averages are over the usable sample only; the errors are counted as failed
    assert summary.n_rows == 3 and summary.n_failed == 2
    assert summary.mean_iou == pytest.approx(df.loc[OK, "iou"])
    build_mart(suite.results_dir, suite.mart_path)
    con = connect_readonly(suite.mart_path)
    try:
        n, n_failed, iou = con.execute(
            "select n, n_failed, iou from segmentation_by_level where model = 'ref' and condition = 'perturbation'"
        ).fetchone()
    finally:
        con.close()
    assert (n, n_failed) == (3, 2) and iou == pytest.approx(df.loc[OK, "iou"])


def test_clean_rows_of_missing_samples_are_errors(suite: Suite) -> None:
    summary = evaluate_clean(suite, "ref", "ct")
    df = _rows(suite, "clean", 0).set_index("sample_id")
    # quarantined in the current clean index: reported there (the quarantine view), not evaluated
    assert sorted(df.index) == [OK, MISSING]
    assert df.loc[OK, "status"] == "ok"
    assert df.loc[MISSING, "status"] == "error" and df.loc[MISSING, "error"] == _missing_reason(suite)
    assert summary.n_failed == 1 and summary.mean_iou == pytest.approx(df.loc[OK, "iou"])
    evaluate_perturbed(suite, "ref", "ct", LEVEL)  # the clean cache skips the error row
    assert _rows(suite, "perturbation", LEVEL).set_index("sample_id").loc[OK, "clean_iou"] == pytest.approx(
        df.loc[OK, "iou"])


def test_attack_rows_of_missing_samples_are_errors(suite: Suite) -> None:
    summary = evaluate_attacks(suite, "ref", "ct", LEVEL)
    df = _rows(suite, "attack", LEVEL).set_index("sample_id")
    assert sorted(df.index) == [OK, MISSING] and set(df["condition"]) == {"fgsm"}
    assert df.loc[MISSING, "status"] == "error" and df.loc[MISSING, "error"] == _missing_reason(suite)
    assert summary.n_failed == 1 and summary.mean_iou == pytest.approx(df.loc[OK, "iou"])
