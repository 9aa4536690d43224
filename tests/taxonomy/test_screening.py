"""Confidence screening of the Dangerous quadrant: the AUROC equals scikit-learn's and the
Mann-Whitney U statistic's, the 95 %-Ideal screen has known answers, the three signals agree for
two-option probabilities, and a signal an endpoint did not return is "not available"."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy.stats import mannwhitneyu
from sklearn.metrics import roc_auc_score

from medrobust_lib.seeding import rng_for
from medrobust_lib.store.schema import TAXONOMY_SCREENING_TABLE, column_names
from medrobust_lib.taxonomy.confidence_screening import (
    NOT_AVAILABLE,
    SIGNALS,
    auroc,
    confidence,
    screen,
    screening_stats,
)
from medrobust_lib.vlm_tasks.vqa import yes_no_from_logprobs


@pytest.mark.parametrize("case", range(6))
def test_auroc_equals_sklearn_and_mann_whitney(case: int) -> None:
    rng = rng_for("screening", case)
    n_pos, n_neg = int(rng.integers(1, 40)), int(rng.integers(1, 40))
    # rounded scores: many ties, which both references count one half
    pos = np.round(rng.normal(0.3 * case, 1.0, n_pos), 1)
    neg = np.round(rng.normal(0.0, 1.0, n_neg), 1)
    got = auroc(pos, neg)
    labels = np.r_[np.ones(n_pos), np.zeros(n_neg)]
    assert got == pytest.approx(roc_auc_score(labels, np.r_[pos, neg]), abs=1e-12)
    u = mannwhitneyu(pos, neg, alternative="two-sided").statistic
    assert got == pytest.approx(u / (n_pos * n_neg), abs=1e-12)


def test_auroc_edges() -> None:
    assert auroc([2.0, 3.0], [0.0, 1.0]) == 1.0 and auroc([0.0], [1.0, 2.0]) == 0.0
    assert auroc([1.0, 1.0], [1.0]) == 0.5
    assert math.isnan(auroc([], [1.0])) and math.isnan(auroc([1.0], []))
    with pytest.raises(ValueError, match="finite"):
        auroc([math.nan], [1.0])


def test_the_screen_keeps_95_percent_of_the_ideal_samples() -> None:
    ideal = np.arange(1, 21, dtype=np.float64) / 20  # 0.05 .. 1.00, 20 samples: keep the top 19
    threshold, kept, passed = screen(ideal, np.array([0.04, 0.1, 0.5, 0.99]))
    assert threshold == 0.1 and kept == 0.95 and passed == 0.75
    # 10 samples: ceil(9.5) = 10 kept, the threshold is the least confident one
    threshold, kept, passed = screen(np.linspace(0.5, 1.0, 10), np.array([0.49, 0.5]))
    assert threshold == 0.5 and kept == 1.0 and passed == 0.5
    # ties at the threshold keep more than asked
    assert screen(np.array([0.9] * 20), np.array([0.8]))[1:] == (1.0, 0.0)
    assert math.isnan(screen(np.array([1.0]), np.array([]))[2])
    with pytest.raises(ValueError, match="Ideal"):
        screen(np.array([]), np.array([1.0]))


def _rows(config: str, quadrants: list[str], margins: list[float | None], dataset: str = "d") -> pd.DataFrame:
    out = []
    for i, (q, m) in enumerate(zip(quadrants, margins, strict=True)):
        if m is None:
            p = e = None
        else:
            _, _, p, e = yes_no_from_logprobs(m / 2, -m / 2)
        out.append({"config": config, "dataset": dataset, "perturbation": "clean", "level": 0, "image_mode": "none",
                    "sample_id": str(i), "quadrant": q, "outcome": "ok", "margin_original": m, "p_yes_original": p,
                    "entropy_original": e})
    return pd.DataFrame(out)


def test_shortcut_like_dangerous_answers_are_confident_and_pass_the_screen() -> None:
    """Dangerous samples answered with large margins (a shortcut is sure of its wording rule), Ideal
    ones with moderate margins: the signals rank Dangerous as the most confident (AUROC 0), and a
    screen keeping 95 % of Ideal lets every Dangerous sample through."""
    quadrants = ["Dangerous"] * 4 + ["Ideal"] * 5 + ["Fragile", "Worst"]
    margins = [-6.0, 5.0, 7.5, -9.0, 1.0, -2.0, 1.5, 3.0, -0.5, 0.2, -0.1]
    stats = screening_stats(_rows("shortcut", quadrants, margins))
    assert set(stats.columns) == set(column_names(TAXONOMY_SCREENING_TABLE)) and list(stats["signal"]) == list(SIGNALS)
    assert set(stats["status"]) == {"ok"}
    assert stats["auroc"].tolist() == [0.0, 0.0, 0.0]
    assert stats["dangerous_pass"].tolist() == [1.0, 1.0, 1.0]
    assert (stats["n_dangerous"] == 4).all() and (stats["n_ideal"] == 5).all() and (stats["n"] == 11).all()
    assert (stats["ideal_kept"] >= 0.95).all()
    assert stats.loc[stats["signal"] == "margin", "threshold"].item() == 0.5  # the least sure Ideal |margin|


def test_the_three_signals_agree_for_two_options() -> None:
    rng = rng_for("screening", "signals")
    n = 60
    margins = list(rng.normal(0.0, 3.0, n))
    quadrants = list(rng.choice(["Ideal", "Fragile", "Dangerous", "Worst"], n))
    stats = screening_stats(_rows("c", quadrants, margins)).set_index("signal")
    for col in ("auroc", "dangerous_pass", "ideal_kept"):
        assert stats.loc["max_p", col] == pytest.approx(stats.loc["margin", col], abs=1e-12)
        assert stats.loc["entropy", col] == pytest.approx(stats.loc["margin", col], abs=1e-12)
    # the AUROC is the margin's: sklearn on the uncertainty -|margin| with Dangerous positive
    df = _rows("c", quadrants, margins)
    labels = (df["quadrant"] == "Dangerous").to_numpy()
    assert stats.loc["margin", "auroc"] == pytest.approx(roc_auc_score(labels, -confidence(df, "margin")))


def test_groups_without_the_signal_or_without_dangerous_samples() -> None:
    api = _rows("api", ["Dangerous", "Ideal"], [None, None])  # generated text, no log-probabilities
    partial = _rows("mixed", ["Dangerous", "Ideal", "Dangerous"], [4.0, 2.0, None])
    none_dangerous = _rows("reliant", ["Ideal", "Fragile"], [2.0, 1.0])
    no_ideal = _rows("worst", ["Dangerous", "Worst"], [2.0, 1.0])
    stats = screening_stats(pd.concat([api, partial, none_dangerous, no_ideal], ignore_index=True))
    by = stats.groupby("config")["status"].agg(set)
    assert by["api"] == {NOT_AVAILABLE} and by["reliant"] == {"no Dangerous samples"}
    assert by["worst"] == {"no Ideal samples"} and by["mixed"] == {"ok"}
    assert stats.loc[stats["config"] == "api", ["auroc", "dangerous_pass"]].isna().all().all()
    mixed = stats[stats["config"] == "mixed"]
    assert (mixed["n_no_signal"] == 1).all() and (mixed["n_dangerous"] == 1).all()
    worst = stats[stats["config"] == "worst"]
    assert worst["auroc"].tolist() == [0.0] * 3 and worst["dangerous_pass"].isna().all()


def test_error_rows_stay_out() -> None:
    df = _rows("c", ["Dangerous", "Ideal", "Ideal"], [3.0, 1.0, 2.0])
    df.loc[2, "outcome"] = "error"
    stats = screening_stats(df)
    assert (stats["n"] == 2).all() and (stats["n_ideal"] == 1).all()


def test_a_screen_pooled_over_configurations_screens_a_model_without_ideal_samples() -> None:
    """The demo's shortcut case: every sample Dangerous and answered with near certainty. Its own
    Ideal samples cannot set a screen; one set on the Ideal samples of every configuration of the
    cell (here the image-reliant one's) lets all its Dangerous samples through."""
    reliant = _rows("reliant", ["Ideal"] * 20 + ["Dangerous"] * 2, [0.5 + 0.1 * i for i in range(20)] + [0.3, 4.0])
    shortcut = _rows("shortcut", ["Dangerous"] * 5, [9.0, -9.0, 8.5, -8.8, 9.2])
    stats = screening_stats(pd.concat([reliant, shortcut], ignore_index=True)).set_index(["config", "signal"])
    sc = stats.loc["shortcut"]
    assert set(sc["status"]) == {"no Ideal samples"} and sc["threshold"].isna().all()
    assert sc["dangerous_pass_pooled"].tolist() == [1.0, 1.0, 1.0]
    # 20 Ideal |margins| 0.5 .. 2.4: the 19th most confident is 0.6; reliant's Dangerous 0.3 is caught, 4.0 passes
    assert stats.loc[("reliant", "margin"), "pooled_threshold"] == pytest.approx(0.6)
    assert stats.loc[("shortcut", "margin"), "pooled_threshold"] == pytest.approx(0.6)
    assert stats.loc[("reliant", "margin"), "dangerous_pass"] == 0.5
    assert stats.loc[("reliant", "margin"), "dangerous_pass_pooled"] == 0.5
    assert sc["mean_confidence_dangerous"]["max_p"] > 0.999
