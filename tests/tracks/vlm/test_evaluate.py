"""No vanishing rows in the VLM track: every record of an image of the evaluation split that is
unreadable, gone or quarantined since the clean index / manifest was built is an ``error`` row with
the reason (no score, counted in ``n_error``, outside every metric); an image of another split has
no row. Each test runs twice: with the broken images' pixels changed (the records are read, the
sample fails to load: ``changed_on_disk``) and with the image files deleted (the record readers
quarantine every record of the image as ``missing_image``: ``missing: <image path>``)."""

from __future__ import annotations

import json
from collections import Counter
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
from medrobust_lib.tracks.datasets import build_clean_index
from medrobust_lib.tracks.vlm.evaluate import evaluate_clean, evaluate_perturbed
from medrobust_lib.tracks.vlm.items import load_items, records_config
from medrobust_lib.tracks.vlm.model import Answer
from tests.tracks.unusable_helpers import (
    LEVEL,
    MISSING,
    OK,
    OTHER_SPLIT,
    QUARANTINED,
    SPLIT,
    broken_suite,
    image_path,
    missing_reason,
)

PER_IMAGE = 3 + 2 + 1 + 1  # the demo's MC, yes/no, caption and grounding records per image


class FakeRunner:
    """Answers every question with ``A`` (yes/no: ``yes``), no model behind it."""

    checkpoint = "fake"
    adapter = None
    n_vision_calls = 0
    box_scale = None

    def __init__(self) -> None:
        self.m = VLMModelConfig(id="fake")

    def generate(self, images: Sequence[np.ndarray | None], prompts: Sequence[str],
                 max_new_tokens: int) -> list[Answer]:
        return [Answer("A") for _ in prompts]

    def yes_no(self, images: Sequence[np.ndarray | None],
               prompts: Sequence[str]) -> list[tuple[dict[str, float] | None, Answer]]:
        return [(None, Answer("yes")) for _ in prompts]


VLM = {"models": [{"id": "fake"}], "split": SPLIT}


@pytest.fixture(scope="module", params=["changed", "deleted"])
def suite(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, demo_root: Path) -> Suite:
    return broken_suite(tmp_path_factory.mktemp(f"vlm_unusable_{request.param}"), demo_root,
                        deleted=request.param == "deleted", vlm=VLM)


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
    assert set(errors.loc[errors["sample_id"] == MISSING, "error"]) == {missing_reason(suite)}
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
    assert set(df.loc[df["outcome"] == "error", "error"]) == {missing_reason(suite)}
    assert df.loc[df["outcome"] == "error", ["correct", "iou", "cider_d", "prediction"]].isna().all().all()


def test_a_rerun_asks_again_only_for_the_error_rows(suite: Suite) -> None:
    first = evaluate_perturbed(suite, "fake", "ct", LEVEL, FakeRunner())  # type: ignore[arg-type]
    again = evaluate_perturbed(suite, "fake", "ct", LEVEL, FakeRunner())  # type: ignore[arg-type]
    assert again.n_rows == first.n_rows == 3 * PER_IMAGE and again.n_reused == PER_IMAGE
    assert again.outcomes.get("error") == 2 * PER_IMAGE


def test_records_of_a_deleted_image_after_the_index_was_rebuilt(tmp_path: Path, demo_root: Path) -> None:
    """The image file is gone and the clean index no longer lists it: the clean run writes its
    records as a readable record of an image not in the index, ``excluded:image_not_indexed`` (with
    the reader's reason), the perturbed run (its manifest still names the image) as ``error`` rows;
    another split gives no error row."""
    suite = broken_suite(tmp_path, demo_root, deleted=True, vlm=VLM)
    build_clean_index(suite, "ct")
    evaluate_clean(suite, "fake", "ct", FakeRunner())  # type: ignore[arg-type]
    clean = _rows(suite, 0)
    assert "error" not in set(clean["outcome"])
    for sid in (MISSING, OTHER_SPLIT):  # not indexed: the split is not asked, as for readable records
        gone = clean[clean["sample_id"] == sid]
        # the caption record names no modality (ROCO has none), so it has no partition here
        assert len(gone) == PER_IMAGE - 1 and set(gone["outcome"]) == {"excluded:image_not_indexed"}
        path = image_path(Path(suite.demo.root), sid)
        assert set(gone["error"]) == {f"no usable sample ct_demo/{sid} in the clean index (record missing: {path})"}
    evaluate_perturbed(suite, "fake", "ct", LEVEL, FakeRunner())  # type: ignore[arg-type]
    counts = _by_sample(_rows(suite, LEVEL))
    assert OTHER_SPLIT not in counts and counts[MISSING] == {"error": PER_IMAGE}


def test_a_malformed_record_of_a_usable_image_is_an_error_row(tmp_path: Path, demo_root: Path) -> None:
    """A record its reader quarantines for another reason than a gone image (here an answer that is
    none of the options) is an ``error`` row ``quarantined:<reason>: <detail>``, clean and perturbed;
    the image's other records are asked as usual."""
    suite = broken_suite(tmp_path, demo_root, deleted=True, vlm=VLM)
    qa = Path(str(records_config(suite).omnimedvqa))
    entries = json.loads(qa.read_text(encoding="utf-8"))
    bad = next(e for e in entries if e["dataset"] == "ct_demo" and e["sample_id"] == OK)
    bad["gt_answer"] = "no such option"
    qa.write_text(json.dumps(entries), encoding="utf-8")
    dropped = load_items(suite).dropped
    assert Counter((d.sample_id, d.reason) for d in dropped if d.dataset == "ct_demo") == {
        (OK, "answer_not_in_options"): 1, (MISSING, "missing_image"): PER_IMAGE,
        (OTHER_SPLIT, "missing_image"): PER_IMAGE}
    clean = evaluate_clean(suite, "fake", "ct", FakeRunner())  # type: ignore[arg-type]
    perturbed = evaluate_perturbed(suite, "fake", "ct", LEVEL, FakeRunner())  # type: ignore[arg-type]
    for level, summary in ((0, clean), (LEVEL, perturbed)):
        df = _rows(suite, level)
        ok = df[df["sample_id"] == OK].set_index("record_id")
        assert len(ok) == PER_IMAGE and ok.loc[bad["question_id"], "outcome"] == "error"
        assert str(ok.loc[bad["question_id"], "error"]).startswith(
            "quarantined:answer_not_in_options: gt_answer 'no such option' not in ")
        assert pd.isna(ok.loc[bad["question_id"], "correct"])
        assert set(ok.drop(index=bad["question_id"])["outcome"]) <= {"ok", "unparseable", "refused"}
        mc = ok[(ok["task"] == "vqa_mc") & (ok["outcome"] != "error")]
        assert len(mc) == 2 and summary.metrics["vqa_mc_accuracy"] == pytest.approx(mc["correct"].mean())
