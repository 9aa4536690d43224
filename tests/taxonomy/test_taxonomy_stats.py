"""Aggregates of taxonomy rows: quadrant shares with CIs, flip/Dangerous correlation, transitions."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from medrobust_lib.store.schema_taxonomy import QUADRANTS
from medrobust_lib.taxonomy.stats import (
    GROUP_COLUMNS,
    QUADRANT_STATS_COLUMNS,
    TRANSITION_COLUMNS,
    condition_points,
    flip_dangerous_correlation,
    quadrant_stats,
    transitions,
)

CONFIGS = ("c1", "c2", "c3", "c4")
CONDITIONS = (("clean", 0), ("blur", 1))
N_RECORDS = 12


def _rows(seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for ci, config in enumerate(CONFIGS):
        for pert, level in CONDITIONS:
            for mode in ("none", "blank"):
                for i in range(N_RECORDS):
                    flip = float(rng.choice([0.0, 1 / 3, 2 / 3]))
                    # Make Dangerous more likely for configurations with higher flip rates.
                    quadrant = QUADRANTS[int(rng.integers(0, 4))] if rng.random() > 0.2 * ci else "Dangerous"
                    rows.append({
                        "config": config, "dataset": "demo", "perturbation": pert, "level": level,
                        "image_mode": mode, "record_id": f"r{i}", "quadrant": quadrant,
                        "flip_rate": flip + 0.05 * ci, "correct_original": float(rng.integers(0, 2)),
                        "entropy_original": float(rng.random()), "outcome": "ok",
                    })
    return pd.DataFrame(rows)


# ---- quadrant_stats --------------------------------------------------------------------------
def test_quadrant_stats_shares_sum_to_one_and_cis_bracket() -> None:
    df = _rows()
    out = quadrant_stats(df, seed=3, n_boot=200)
    assert list(out.columns) == list(QUADRANT_STATS_COLUMNS)
    n_groups = len(CONFIGS) * len(CONDITIONS) * 2
    assert len(out) == 4 * n_groups
    for _, g in out.groupby(list(GROUP_COLUMNS)):
        assert list(g["quadrant"]) == list(QUADRANTS)
        assert g["share"].sum() == pytest.approx(1.0)
        assert g["n"].sum() == N_RECORDS
        assert (g["n_total"] == N_RECORDS).all()
    assert (out["share_ci_low"] <= out["share"] + 1e-12).all()
    assert (out["share"] <= out["share_ci_high"] + 1e-12).all()
    filled = out[out["n"] > 0]
    assert (filled["accuracy_ci_low"] <= filled["accuracy"] + 1e-12).all()
    assert (filled["accuracy"] <= filled["accuracy_ci_high"] + 1e-12).all()


def test_quadrant_stats_known_values_and_empty_quadrant() -> None:
    base = {"config": "c", "dataset": "d", "perturbation": "clean", "level": 0, "image_mode": "none"}
    df = pd.DataFrame([
        {**base, "quadrant": "Ideal", "correct_original": 1.0, "entropy_original": 0.2, "flip_rate": 0.0,
         "outcome": "ok"},
        {**base, "quadrant": "Ideal", "correct_original": 0.0, "entropy_original": 0.4, "flip_rate": 0.0,
         "outcome": "ok"},
        {**base, "quadrant": "Worst", "correct_original": 1.0, "entropy_original": None, "flip_rate": 1.0,
         "outcome": "ok"},
        {**base, "quadrant": "Fragile", "correct_original": 1.0, "entropy_original": 0.9, "flip_rate": 0.5,
         "outcome": "excluded:no_answer"},
        {**base, "quadrant": None, "correct_original": None, "entropy_original": None, "flip_rate": None,
         "outcome": "error"},
    ])
    out = quadrant_stats(df, n_boot=100).set_index("quadrant")
    assert out.loc["Ideal", "n"] == 2 and out.loc["Ideal", "n_total"] == 3
    assert out.loc["Ideal", "share"] == pytest.approx(2 / 3)
    assert out.loc["Ideal", "accuracy"] == pytest.approx(0.5)
    assert out.loc["Ideal", "mean_entropy"] == pytest.approx(0.3)
    assert math.isnan(out.loc["Worst", "mean_entropy"])  # generation fallback: no entropy
    assert out.loc["Worst", "mean_flip_rate"] == 1.0
    for quadrant in ("Fragile", "Dangerous"):
        assert out.loc[quadrant, "n"] == 0 and out.loc[quadrant, "share"] == 0.0
        assert out.loc[quadrant, "share_ci_low"] == 0.0 and out.loc[quadrant, "share_ci_high"] == 0.0
        assert math.isnan(out.loc[quadrant, "accuracy"])
    assert (out["n_error"] == 1).all()


def test_quadrant_stats_is_deterministic_and_independent_of_row_order() -> None:
    df = _rows()
    a = quadrant_stats(df, seed=1, n_boot=100)
    b = quadrant_stats(df.sample(frac=1.0, random_state=0), seed=1, n_boot=100)
    c = quadrant_stats(df, seed=2, n_boot=100)
    pd.testing.assert_frame_equal(a, b)
    assert not a["share_ci_low"].equals(c["share_ci_low"])


def test_quadrant_stats_group_with_only_errors() -> None:
    df = pd.DataFrame([{"config": "c", "dataset": "d", "perturbation": "clean", "level": 0, "image_mode": "none",
                        "quadrant": None, "correct_original": None, "entropy_original": None,
                        "flip_rate": None, "outcome": "error"}])
    out = quadrant_stats(df, n_boot=10)
    assert len(out) == 4
    assert (out["n_total"] == 0).all() and (out["n_error"] == 1).all()
    assert out["share"].isna().all()


# ---- correlation -----------------------------------------------------------------------------
def test_correlation_matches_scipy_on_the_same_points() -> None:
    df = _rows()
    out = flip_dangerous_correlation(df, seed=0, n_boot=200)
    points = condition_points(df)
    for _, row in out.iterrows():
        if row["scope"] == "all":
            sel = points[points["image_mode"] == row["image_mode"]]
            assert row["perturbation"] == "all" and pd.isna(row["level"])
        else:
            sel = points[(points["perturbation"] == row["perturbation"]) & (points["level"] == row["level"])
                         & (points["image_mode"] == row["image_mode"])]
        assert row["n_points"] == len(sel)
        ref = sps.pearsonr(sel["flip_rate"], sel["dangerous_share"])
        assert row["r"] == pytest.approx(ref.statistic)
        assert row["p_value"] == pytest.approx(ref.pvalue)
        assert row["ci_low"] <= row["r"] <= row["ci_high"]
        assert row["note"] is None
    assert set(out["scope"]) == {"condition", "all"}
    assert len(out) == len(CONDITIONS) * 2 + 2
    assert (out.loc[out["scope"] == "all", "n_points"] == len(CONFIGS) * len(CONDITIONS)).all()


def test_correlation_points_are_means_and_dangerous_shares() -> None:
    df = _rows()
    points = condition_points(df)
    g = df[(df["config"] == "c2") & (df["perturbation"] == "blur") & (df["image_mode"] == "none")]
    p = points[(points["config"] == "c2") & (points["perturbation"] == "blur") & (points["image_mode"] == "none")]
    assert p["flip_rate"].item() == pytest.approx(g["flip_rate"].mean())
    assert p["dangerous_share"].item() == pytest.approx((g["quadrant"] == "Dangerous").mean())


def test_correlation_notes_too_few_points_and_zero_variance() -> None:
    df = _rows()
    few = flip_dangerous_correlation(df[df["config"].isin(["c1", "c2"]) & (df["perturbation"] == "clean")],
                                     n_boot=50)
    assert len(few) == 4  # clean x 2 modes, all x 2 modes
    assert few["r"].isna().all() and (few["note"] == "n_points < 3").all()
    flat = df.assign(flip_rate=0.25)
    out = flip_dangerous_correlation(flat, n_boot=50)
    assert out["r"].isna().all() and (out["note"] == "zero variance").all()


# ---- transitions -----------------------------------------------------------------------------
def test_transitions_counts_known_pairs() -> None:
    def row(record: str, pert: str, level: int, quadrant: str, mode: str = "none") -> dict[str, object]:
        return {"config": "c", "dataset": "d", "record_id": record, "perturbation": pert, "level": level,
                "image_mode": mode, "quadrant": quadrant, "outcome": "ok"}

    df = pd.DataFrame([
        row("r1", "clean", 0, "Ideal"), row("r2", "clean", 0, "Ideal"), row("r3", "clean", 0, "Fragile"),
        row("r1", "blur", 1, "Dangerous"), row("r2", "blur", 1, "Ideal"), row("r3", "blur", 1, "Dangerous"),
        row("r4", "blur", 1, "Worst"),  # no clean partner: left out
        row("r1", "blur", 2, "Dangerous"), row("r2", "blur", 2, "Dangerous"),
        {**row("r3", "blur", 2, "Worst"), "outcome": "error"},
    ])
    out = transitions(df)
    assert list(out.columns) == list(TRANSITION_COLUMNS)
    assert len(out) == 2 * 16
    idx = out.set_index(["level", "from_quadrant", "to_quadrant"])
    assert idx.loc[(1, "Ideal", "Dangerous"), "count"] == 1
    assert idx.loc[(1, "Ideal", "Ideal"), "count"] == 1
    assert idx.loc[(1, "Ideal", "Ideal"), "share"] == pytest.approx(0.5)
    assert idx.loc[(1, "Fragile", "Dangerous"), "share"] == pytest.approx(1.0)
    assert idx.loc[(2, "Ideal", "Dangerous"), "count"] == 2
    assert idx.loc[(2, "Ideal", "Dangerous"), "share"] == pytest.approx(1.0)
    assert pd.isna(idx.loc[(2, "Fragile", "Dangerous"), "share"])  # r3's blur-2 row errored
    assert pd.isna(idx.loc[(1, "Worst", "Worst"), "share"])
    assert out.loc[out["level"] == 1, "count"].sum() == 3
    assert out.loc[out["level"] == 2, "count"].sum() == 2


def test_transitions_on_synthetic_rows_conserve_counts() -> None:
    out = transitions(_rows())
    per_condition = out.groupby(list(GROUP_COLUMNS))["count"].sum()
    assert (per_condition == N_RECORDS).all()
    assert len(per_condition) == len(CONFIGS) * 2  # blur-1 per config x image mode


def test_transitions_rejects_duplicate_clean_rows() -> None:
    df = _rows()
    with pytest.raises(ValueError):
        transitions(pd.concat([df, df[df["perturbation"] == "clean"].head(1)]))
