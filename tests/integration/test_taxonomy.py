"""The taxonomy pipeline on a small demo with known-answer scorers: a model whose answer comes from
the image (yes with a real image, no without one) is all Ideal; a model that answers from the wording alone
is all Dangerous; failures are counted rows; perturbed conditions and transitions line up."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from medrobust_lib.config import Suite, load_suite
from medrobust_lib.store import results
from medrobust_lib.store.schema import TAXONOMY_TABLE
from medrobust_lib.taxonomy.aggregates import transitions
from medrobust_lib.taxonomy.known_answers import clean_summary, demo_checks
from medrobust_lib.tracks.datasets import build_clean_index
from medrobust_lib.tracks.perturbed import build_perturbed, read_manifest
from medrobust_lib.tracks.taxonomy import evaluate as tx
from medrobust_lib.tracks.taxonomy.stats import write_taxonomy_stats
from medrobust_lib.tracks.vlm.items import YESNO_SUFFIX, load_items
from tests.suite_helpers import write_suite

TAX = {"configs": [{"id": "demo-image-reliant", "demo_training": "image_reliant"},
                   {"id": "demo-shortcut", "demo_training": "shortcut"}],
       "image_modes": ["none", "blank", "noise"], "split": "all"}


@pytest.fixture(scope="module")
def tax_suite(tmp_path_factory: pytest.TempPathFactory, demo_root: Path) -> Suite:
    root = tmp_path_factory.mktemp("tax")
    suite = load_suite(write_suite(root, demo_root, modalities=["ct", "dermoscopy"], taxonomy=TAX,
                                   perturbations={"include": ["gaussian_noise", "rotation"], "split": "all",
                                                  "calibration_subset": 2, "levels": [1, 2, 3, 4, 5]}))
    for m in suite.modalities:
        build_clean_index(suite, m)
    build_perturbed(suite, "ct", 4)
    return suite


class _FakeRunner:
    checkpoint = "fake"
    adapter = None
    n_vision_calls = 0
    hf = None


def _lp(label: str) -> dict[str, float]:
    return {"yes": -0.1, "no": -2.4} if label == "yes" else {"yes": -2.4, "no": -0.1}


class _Removed(np.ndarray):
    """Marks an array that stands in for a removed image."""


_real_removed_image = tx.removed_image


def _tracking_removed_image(mode: str, like: np.ndarray, key: tuple[str, ...], seed: int) -> np.ndarray | None:
    """tx.removed_image, remembering which arrays stand in for a removed image."""
    out = _real_removed_image(mode, like, key, seed)
    return None if out is None else out.view(_Removed)


def _fake_scorer(suite: Suite, fail: bool = False, negations: bool = False) -> type:
    """Known-answer stand-ins. With ``negations`` the fake answers a negated variant like the
    original (it does not understand "not"), so it is never negation-robust."""
    lookup: dict[str, tuple[str, int, str]] = {}
    for it in load_items(suite).items:
        if it.task == "vqa_yesno":
            for text, pol in tx.variants_of(it, 5, negations=True):
                lookup[text + YESNO_SUFFIX] = (it.answer, 1 if negations else pol, it.question)

    class Fake:
        def __init__(self, s: Suite, entry: tx.TaxonomyConfigEntry) -> None:
            self.entry, self.runner = entry, _FakeRunner()

        @property
        def vision_calls(self) -> int:
            return 0

        def variants(self, image: np.ndarray | None, prompts: Sequence[str]) -> tuple[list[Any], str]:
            if fail:
                raise RuntimeError("device lost")
            out = []
            for p in prompts:
                truth, pol, question = lookup[p]
                if self.entry.id == "demo-shortcut":  # the wording decides, the image never matters
                    base = "yes" if len(question) % 2 else "no"
                else:  # sees a finding in every real image, none in a removed one (no / blank / noise)
                    removed = image is None or isinstance(image, _Removed)
                    base = "no" if removed else "yes"
                out.append(_lp(base if pol == 1 else ("no" if base == "yes" else "yes")))
            return out, "logprobs"

    return Fake


def _rows(s: Suite) -> pd.DataFrame:
    return results.read_table(s.results_dir, TAXONOMY_TABLE)


def test_missing_model_is_a_clear_error(tax_suite: Suite) -> None:
    with pytest.raises(FileNotFoundError, match="demo-shortcut/taxonomy_model"):
        tx.compute_baselines(tax_suite, "demo-shortcut", "ct")


def test_known_answers_clean_and_perturbed(tax_suite: Suite, monkeypatch: pytest.MonkeyPatch) -> None:
    s = tax_suite
    monkeypatch.setattr(tx, "_Scorer", _fake_scorer(s))
    monkeypatch.setattr(tx, "removed_image", _tracking_removed_image)
    for cfg in ("demo-image-reliant", "demo-shortcut"):
        for m in s.modalities:
            tx.compute_baselines(s, cfg, m)
            out = tx.evaluate(s, cfg, m, 0)
            assert out.outcomes == {"ok": out.n_rows}
        tx.evaluate(s, cfg, "ct", 4)
    df = _rows(s)
    ok = df[df["outcome"] == "ok"]
    n_records = sum(1 for it in load_items(s).items if it.task == "vqa_yesno" and it.dataset in ("ct_demo",
                                                                                                 "dermoscopy_demo"))
    clean = ok[ok["perturbation"] == "clean"]
    assert len(clean) == 2 * n_records * 3  # 2 configs x records x 3 image modes
    reliant = clean[clean["config"] == "demo-image-reliant"]
    assert reliant["quadrant"].eq("Ideal").all()
    assert (reliant["correct_original"] == (reliant["answer"] == "yes").astype(float)).all()
    assert reliant["pairwise_disagreement"].eq(0.0).all() and reliant["consistent"].all()
    assert (reliant["n_variants"] == 6).all() and reliant["n_negations"].eq(0).all()  # 5 paraphrases, no negation
    assert reliant["negation_consistent"].isna().all()
    shortcut = clean[clean["config"] == "demo-shortcut"]
    assert shortcut["quadrant"].eq("Dangerous").all() and (~shortcut["image_reliant"]).all()
    assert shortcut["reliance_score"].abs().max() < 1e-12
    pert = ok[(ok["perturbation"] != "clean")]
    man = read_manifest(s, "ct", 4)
    ct_records = sum(1 for it in load_items(s).items if it.task == "vqa_yesno" and it.dataset == "ct_demo")
    assert len(pert) == 2 * 3 * len(man) * ct_records // len(set(man["sample_id"]))
    tr = transitions(ok)
    stay = tr[(tr["from_quadrant"] == tr["to_quadrant"]) & (tr["count"] > 0)]
    assert set(stay["from_quadrant"]) == {"Ideal", "Dangerous"} and stay["share"].eq(1.0).all()
    stats, corr = write_taxonomy_stats(s.results_dir, s.seed)
    d = stats[(stats["config"] == "demo-shortcut") & (stats["quadrant"] == "Dangerous")]
    assert d["share"].eq(1.0).all() and (d["share_ci_low"] == 1.0).all()
    # the reliant fake answers "no" without the image: its text-only accuracy is the share of "no" labels
    rs = clean_summary(stats).set_index(["config", "image_mode"])
    no_share = (reliant.groupby("image_mode")["answer"].apply(lambda a: (a == "no").mean()))
    for mode, share in no_share.items():
        assert rs.loc[("demo-image-reliant", mode), "text_only_accuracy"] == pytest.approx(share)
        assert rs.loc[("demo-image-reliant", mode), "image_reliant"] == 1.0
    checks = [c for c in demo_checks(stats, ("none", "blank", "noise")) if c.name != "text_only_accuracy"]
    assert len(checks) == 3 * 3 and all(c.passed for c in checks), [c.text() for c in checks]
    head = corr[corr["scope"] == "headline"]
    assert set(head["image_mode"]) == {"none", "blank", "noise"}
    assert (head["n_points"] == 2 * 2).all()  # clean: 2 configurations x 2 datasets


def test_negations_kept_feed_negation_robustness_only(tmp_path: Path, demo_root: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    tax = {**TAX, "configs": [{"id": "demo-image-reliant", "demo_training": "image_reliant"}], "image_modes": ["none"],
           "negations": True}
    s = load_suite(write_suite(tmp_path, demo_root, modalities=["ct"], taxonomy=tax))
    build_clean_index(s, "ct")
    monkeypatch.setattr(tx, "_Scorer", _fake_scorer(s, negations=True))
    monkeypatch.setattr(tx, "removed_image", _tracking_removed_image)
    tx.compute_baselines(s, "demo-image-reliant", "ct")
    tx.evaluate(s, "demo-image-reliant", "ct", 0)
    ok = _rows(s)
    assert ok["outcome"].eq("ok").all() and ok["n_negations"].eq(2).all() and (ok["n_variants"] == 8).all()
    # the fake answers every negation like the original (it ignores the "not"): consistency and the
    # quadrant are untouched, negation robustness fails
    assert ok["consistent"].all() and ok["quadrant"].eq("Ideal").all()
    assert (~ok["negation_consistent"].astype(bool)).all()


def test_failures_are_counted(tax_suite: Suite, monkeypatch: pytest.MonkeyPatch) -> None:
    s = tax_suite
    monkeypatch.setattr(tx, "_Scorer", _fake_scorer(s))
    tx.compute_baselines(s, "demo-shortcut", "dermoscopy")
    monkeypatch.setattr(tx, "_Scorer", _fake_scorer(s, fail=True))
    # a first run of the partition: an earlier test's ok rows of the same inputs would be kept
    part = {"config": "demo-shortcut", "run": "clean", "modality": "dermoscopy", "level": 0}
    results.finalize_partition(s.results_dir, TAXONOMY_TABLE, part, [])
    out = tx.evaluate(s, "demo-shortcut", "dermoscopy", 0)
    df = _rows(s)
    d = df[(df["config"] == "demo-shortcut") & (df["modality"] == "dermoscopy")]
    assert out.outcomes == {"error": len(d)} and d["error"].str.contains("device lost").all()
    assert d["quadrant"].isna().all()
    # the scorer recovers: the re-run retries every error row, nothing is duplicated
    monkeypatch.setattr(tx, "_Scorer", _fake_scorer(s))
    again = tx.evaluate(s, "demo-shortcut", "dermoscopy", 0)
    d2 = _rows(s)
    d2 = d2[(d2["config"] == "demo-shortcut") & (d2["modality"] == "dermoscopy")]
    assert again.outcomes == {"ok": len(d)} and len(d2) == len(d)


def test_removed_images() -> None:
    like = np.zeros((8, 8, 3), np.float32)
    assert tx.removed_image("none", like, ("a",), 0) is None
    assert np.all(tx.removed_image("blank", like, ("a",), 0) == 0.5)
    a = tx.removed_image("noise", like, ("a",), 0)
    assert a is not None and a.shape == like.shape and np.array_equal(a, tx.removed_image("noise", like, ("a",), 0))
    with pytest.raises(ValueError, match="image mode"):
        tx.removed_image("gray", like, ("a",), 0)
