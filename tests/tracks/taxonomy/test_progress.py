"""Progress of a taxonomy partition: ``(done, total)`` in ``samples`` (images scored), of the images
the partition scores; reporting changes no row."""

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
from tests.progress_helpers import Recorder, check_progress
from tests.tracks.unusable_helpers import LEVEL, SPLIT, broken_suite

CONFIG = "demo-image-reliant"
MODES = ["none", "blank"]


class _FakeRunner:
    checkpoint = "fake"
    adapter = None
    n_vision_calls = 0
    hf = None


class CountingScorer:
    """Says yes to every variant (no model behind it), counting the images it scores."""

    images = 0

    def __init__(self, suite: Suite, entry: tx.TaxonomyConfigEntry) -> None:
        self.entry, self.runner = entry, _FakeRunner()

    @property
    def vision_calls(self) -> int:
        return 0

    def variants(self, image: np.ndarray | None, prompts: Sequence[str]) -> tuple[list[Any], str]:
        CountingScorer.images += 1
        return [{"yes": -0.1 - 0.01 * len(p), "no": -2.4} for p in prompts], "logprobs"


@pytest.fixture(autouse=True)
def fake_scorer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tx, "_Scorer", CountingScorer)


@pytest.fixture(scope="module")
def suites(tmp_path_factory: pytest.TempPathFactory, demo_root: Path) -> tuple[Suite, Suite]:
    tax = {"configs": [{"id": CONFIG, "demo_training": "image_reliant"}], "image_modes": MODES, "split": SPLIT}
    return (broken_suite(tmp_path_factory.mktemp("tax_progress_a"), demo_root, deleted=False, taxonomy=tax),
            broken_suite(tmp_path_factory.mktemp("tax_progress_b"), demo_root, deleted=False, taxonomy=tax))


def _rows(suite: Suite, level: int) -> pd.DataFrame:
    df = results.read_partition(suite.results_dir, TAXONOMY_TABLE, {
        "config": CONFIG, "run": "clean" if level == 0 else "perturbation", "modality": "ct", "level": level})
    return df.sort_values(["sample_id", "record_id", "perturbation", "image_mode"]).reset_index(drop=True)


def test_baselines_report_their_records(suites: tuple[Suite, Suite]) -> None:
    plain, watched = suites
    rec = Recorder()
    n = tx.compute_baselines(watched, CONFIG, "ct", progress=rec)
    tx.compute_baselines(plain, CONFIG, "ct")
    check_progress(rec.calls, n // len(MODES), "records")


@pytest.mark.parametrize("level", [0, LEVEL])
def test_partition_progress_counts_the_samples_and_changes_no_row(suites: tuple[Suite, Suite], level: int) -> None:
    plain, watched = suites
    for s in suites:
        tx.compute_baselines(s, CONFIG, "ct")
    tx.evaluate(plain, CONFIG, "ct", level)
    rec = Recorder()
    before = CountingScorer.images
    out = tx.evaluate(watched, CONFIG, "ct", level, progress=rec)
    scored = CountingScorer.images - before
    assert scored == out.n_images > 0
    check_progress(rec.calls, scored, tx.PROGRESS_WHAT)
    pd.testing.assert_frame_equal(_rows(plain, level), _rows(watched, level))
    rec2 = Recorder()
    again = tx.evaluate(watched, CONFIG, "ct", level, progress=rec2)  # every row kept: nothing to score
    assert again.n_images == 0 and rec2.calls[-1][:2] == (0, 0)
