"""No vanishing rows in the taxonomy: every yes/no record of an image of the evaluation split that is
unreadable, gone or quarantined since the clean index / manifest was built gives ``error`` rows (one
per image mode) with the reason, counted in ``n_error`` and in no share; an image of another split
has no row. Each test runs twice: with the broken images' pixels changed and with the image files
deleted (the record readers then quarantine the records as ``missing_image``:
``missing: <image path>``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from medrobust_lib.config import Suite
from medrobust_lib.store import results
from medrobust_lib.store.schema import TAXONOMY_TABLE
from medrobust_lib.tracks.taxonomy import evaluate as tx
from medrobust_lib.tracks.taxonomy.stats import write_taxonomy_stats
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

CONFIG = "demo-image-reliant"
MODES = ["none", "blank"]
PER_IMAGE = 2 * len(MODES)  # the demo's yes/no records per image, one row per image mode


class _FakeRunner:
    checkpoint = "fake"
    adapter = None
    n_vision_calls = 0
    hf = None


class FakeScorer:
    """Says yes to every variant, with or without the image (no model behind it)."""

    def __init__(self, suite: Suite, entry: tx.TaxonomyConfigEntry) -> None:
        self.entry, self.runner = entry, _FakeRunner()

    @property
    def vision_calls(self) -> int:
        return 0

    def variants(self, image: np.ndarray | None, prompts: Sequence[str]) -> tuple[list[Any], str]:
        return [{"yes": -0.1, "no": -2.4} for _ in prompts], "logprobs"


@pytest.fixture(scope="module", params=["changed", "deleted"])
def suite(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, demo_root: Path) -> Suite:
    tax = {"configs": [{"id": CONFIG, "demo_training": "image_reliant"}], "image_modes": MODES, "split": SPLIT}
    return broken_suite(tmp_path_factory.mktemp(f"tax_unusable_{request.param}"), demo_root,
                        deleted=request.param == "deleted", taxonomy=tax)


@pytest.fixture(autouse=True)
def fake_scorer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tx, "_Scorer", FakeScorer)


def _rows(suite: Suite, level: int) -> pd.DataFrame:
    return results.read_partition(suite.results_dir, TAXONOMY_TABLE, {
        "config": CONFIG, "run": "clean" if level == 0 else "perturbation", "modality": "ct", "level": level})


def _by_sample(df: pd.DataFrame) -> dict[str, dict[str, int]]:
    return {str(s): {str(k): int(v) for k, v in g["outcome"].value_counts().items()}
            for s, g in df.groupby("sample_id")}


def test_perturbed_records_of_unusable_images_are_errors(suite: Suite) -> None:
    assert tx.compute_baselines(suite, CONFIG, "ct") == PER_IMAGE  # the usable image's records only
    out = tx.evaluate(suite, CONFIG, "ct", LEVEL)
    df = _rows(suite, LEVEL)
    counts = _by_sample(df)
    assert OTHER_SPLIT not in counts  # another split: no row
    assert counts == {OK: {"ok": PER_IMAGE}, QUARANTINED: {"error": PER_IMAGE}, MISSING: {"error": PER_IMAGE}}
    errors = df[df["outcome"] == "error"].set_index("sample_id")
    assert set(errors.loc[QUARANTINED, "error"]) == {"quarantined:unreadable_dicom"}
    assert set(errors.loc[MISSING, "error"]) == {missing_reason(suite)}
    assert errors[["quadrant", "consistent", "image_reliant", "correct_original"]].isna().all().all()
    deleted = not image_path(Path(suite.demo.root), MISSING).exists()
    # a record the reader quarantined has no known answer; a record of an unreadable image keeps it
    assert errors.loc[MISSING, "answer"].isna().all() == deleted
    assert errors.loc[QUARANTINED, "answer"].notna().all()
    assert set(errors["perturbation"]) == {"gaussian_noise"} and set(errors["level"]) == {LEVEL}
    assert out.outcomes == {"ok": PER_IMAGE, "error": 2 * PER_IMAGE}
    assert sum(out.quadrants.values()) == PER_IMAGE  # quadrants of the ok rows only
    quad, _ = write_taxonomy_stats(suite.results_dir, max_error_share=1.0)
    cell = quad[(quad["level"] == LEVEL) & (quad["image_mode"] == "none")]
    assert set(cell["n_total"]) == {2} and set(cell["n_error"]) == {4}


def test_clean_records_of_unreadable_images_are_errors(suite: Suite) -> None:
    tx.compute_baselines(suite, CONFIG, "ct")
    out = tx.evaluate(suite, CONFIG, "ct", 0)
    counts = _by_sample(_rows(suite, 0))
    # quarantined in the current clean index: not an evaluation sample; another split: no row
    assert counts == {OK: {"ok": PER_IMAGE}, MISSING: {"error": PER_IMAGE}}
    assert set(_rows(suite, 0).query("outcome == 'error'")["error"]) == {missing_reason(suite)}
    assert out.outcomes == {"ok": PER_IMAGE, "error": PER_IMAGE}
