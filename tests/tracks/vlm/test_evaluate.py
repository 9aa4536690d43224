"""No vanishing rows in the VLM track: every record of an image of the evaluation split that is
unreadable or quarantined since the clean index / manifest was built is an ``error`` row with the
reason (no score, counted in ``n_error``, outside every metric); an image of another split has no
row. (An image file that is gone is not tested here: the record readers quarantine a record whose
image does not exist, before any evaluation.)"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from medrobust_lib.config import Suite
from medrobust_lib.config.vlm import VLMModelConfig
from medrobust_lib.store import results
from medrobust_lib.store.marts import build_mart, connect_readonly
from medrobust_lib.store.schema import VLM_TABLE
from medrobust_lib.tracks.vlm.evaluate import evaluate_clean, evaluate_perturbed
from medrobust_lib.tracks.vlm.runner import Answer
from tests.tracks.unusable_helpers import (
    CHANGED_REASON,
    LEVEL,
    MISSING,
    OK,
    OTHER_SPLIT,
    QUARANTINED,
    SPLIT,
    broken_suite,
)

PER_IMAGE = 3 + 2 + 1 + 1  # the demo's MC, yes/no, caption and grounding records per image


class FakeRunner:
    """Answers every question with ``A`` (yes/no: ``yes``), no model behind it."""

    checkpoint = "fake"
    adapter = None
    n_vision_calls = 0

    def __init__(self) -> None:
        self.m = VLMModelConfig(id="fake")

    def generate(self, images: Sequence[np.ndarray | None], prompts: Sequence[str],
                 max_new_tokens: int) -> list[Answer]:
        return [Answer("A") for _ in prompts]

    def yes_no(self, images: Sequence[np.ndarray | None],
               prompts: Sequence[str]) -> list[tuple[dict[str, float] | None, Answer]]:
        return [(None, Answer("yes")) for _ in prompts]


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory, demo_root: Path) -> Suite:
    return broken_suite(tmp_path_factory.mktemp("vlm_unusable"), demo_root, deleted=False,
                        vlm={"models": [{"id": "fake"}], "split": SPLIT})


def _rows(suite: Suite, level: int) -> pd.DataFrame:
    return results.read_partition(suite.results_dir, VLM_TABLE, {
        "model": "fake", "run": "clean" if level == 0 else "perturbation", "modality": "ct", "level": level})


def _by_sample(df: pd.DataFrame) -> dict[str, dict[str, int]]:
    return {str(s): {str(k): int(v) for k, v in g["outcome"].value_counts().items()}
            for s, g in df.groupby("sample_id")}


def test_perturbed_records_of_unusable_images_are_errors(suite: Suite) -> None:
    summary = evaluate_perturbed(suite, "fake", "ct", LEVEL, FakeRunner())  # type: ignore[arg-type]
    df = _rows(suite, LEVEL)
    assert OTHER_SPLIT not in set(df["sample_id"])  # another split: no row
    counts = _by_sample(df)
    assert counts[QUARANTINED] == counts[MISSING] == {"error": PER_IMAGE}
    assert sum(counts[OK].values()) == PER_IMAGE and "error" not in counts[OK]
    errors = df[df["outcome"] == "error"]
    assert set(errors.loc[errors["sample_id"] == QUARANTINED, "error"]) == {"quarantined:unreadable_dicom"}
    assert set(errors.loc[errors["sample_id"] == MISSING, "error"]) == {CHANGED_REASON}
    assert errors[["correct", "iou", "cider_d", "prediction"]].isna().all().all()
    assert set(errors["perturbation"]) == {"gaussian_noise"}
    # the metrics are those of the usable image's records alone
    ok_mc = df[(df["sample_id"] == OK) & (df["task"] == "vqa_mc")]
    assert summary.metrics["vqa_mc_accuracy"] == pytest.approx(ok_mc["correct"].mean())
    build_mart(suite.results_dir, suite.mart_path, max_error_share=1.0)
    con = connect_readonly(suite.mart_path)
    try:
        got = con.execute("select n, n_scored, n_error, accuracy from vlm_by_level where model = 'fake' "
                          "and task = 'vqa_mc' and level = ?", [LEVEL]).fetchone()
        n_error = con.execute("select n_error from partition_completeness where model = 'fake' and level = ?",
                              [LEVEL]).fetchone()
    finally:
        con.close()
    assert got == (9, 3, 6, pytest.approx(ok_mc["correct"].mean()))
    assert n_error == (2 * PER_IMAGE,)


def test_clean_records_of_missing_images_are_errors(suite: Suite) -> None:
    evaluate_clean(suite, "fake", "ct", FakeRunner())  # type: ignore[arg-type]
    counts = _by_sample(_rows(suite, 0))
    assert OTHER_SPLIT not in counts
    assert counts[MISSING] == {"error": PER_IMAGE}
    assert set(counts[QUARANTINED]) == {"excluded:image_not_indexed"}  # quarantined in the clean index
    assert "error" not in counts[OK] and sum(counts[OK].values()) == PER_IMAGE
    df = _rows(suite, 0)
    assert set(df.loc[df["outcome"] == "error", "error"]) == {CHANGED_REASON}


def test_a_rerun_asks_again_only_for_the_error_rows(suite: Suite) -> None:
    first = evaluate_perturbed(suite, "fake", "ct", LEVEL, FakeRunner())  # type: ignore[arg-type]
    again = evaluate_perturbed(suite, "fake", "ct", LEVEL, FakeRunner())  # type: ignore[arg-type]
    assert again.n_rows == first.n_rows == 3 * PER_IMAGE and again.n_reused == PER_IMAGE
    assert again.outcomes.get("error") == 2 * PER_IMAGE
