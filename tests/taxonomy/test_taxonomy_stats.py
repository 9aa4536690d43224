"""Aggregates of taxonomy rows: quadrant shares with CIs, the paper's flip rate, text-only accuracy and the
oracle Dangerous floor, the flip/Dangerous correlation (clean headline, cluster-bootstrapped pooled
analysis), transitions."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from medrobust_lib.metrics.stats import pearson_with_ci
from medrobust_lib.seeding import rng_for
from medrobust_lib.store.schema import QUADRANTS
from medrobust_lib.taxonomy.aggregates import (
    GROUP_COLUMNS,
    TRANSITION_COLUMNS,
    cluster_bootstrap_r,
    condition_points,
    flip_dangerous_correlation,
    quadrant_stats,
    transitions,
)
from medrobust_lib.taxonomy.quadrants import classify
from medrobust_lib.tracks.taxonomy.stats import QUADRANT_STATS_COLUMNS as STORED_COLUMNS

CONFIGS = ("c1", "c2", "c3", "c4")
CONDITIONS = (("clean", 0), ("blur", 1))
N_RECORDS = 12

QUADRANT_STATS_COLUMNS = [c for c in STORED_COLUMNS if c != "band_miss"]
"""What ``quadrant_stats`` returns: the stored columns but ``band_miss``, which
:func:`~medrobust_lib.tracks.taxonomy.stats.write_taxonomy_stats` adds from the manifest."""


def _rows(seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for ci, config in enumerate(CONFIGS):
        for pert, level in CONDITIONS:
            for mode in ("none", "blank"):
                for i in range(N_RECORDS):
                    # Make Dangerous more likely for later configurations.
                    quadrant = QUADRANTS[int(rng.integers(0, 4))] if rng.random() > 0.2 * ci else "Dangerous"
                    consistent = quadrant in ("Ideal", "Dangerous")
                    answer = "yes" if rng.random() < 0.5 else "no"
                    rows.append({
                        "config": config, "dataset": "demo", "perturbation": pert, "level": level,
                        "image_mode": mode, "record_id": f"r{i}", "quadrant": quadrant, "consistent": consistent,
                        "image_reliant": quadrant in ("Ideal", "Fragile"), "answer": answer,
                        "pred_removed": "yes" if rng.random() < 0.5 else "no",
                        "margin_removed": float(rng.normal(0.0, 2.0)),
                        "pairwise_disagreement": 0.0 if consistent else float(rng.choice([1 / 3, 2 / 3])),
                        "correct_original": float(rng.integers(0, 2)),
                        "entropy_original": float(rng.random()), "outcome": "ok",
                    })
    return pd.DataFrame(rows)


# ---- quadrant_stats --------------------------------------------------------------------------
def test_quadrant_stats_shares_sum_to_one_and_cis_bracket() -> None:
    df = _rows()
    out = quadrant_stats(df, seed=3, n_boot=200, min_n=1)  # no floor: CIs even on 1-sample quadrants
    assert set(out.columns) == set(QUADRANT_STATS_COLUMNS)  # band_miss is the writer's (it needs the manifest)
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


def _known(quadrant: str | None, correct: float | None, entropy: float | None, pairwise: float | None,
           outcome: str, answer: str = "yes", removed: str | None = "no", margin: float | None = -3.0) -> dict[str, object]:
    base = {"config": "c", "dataset": "d", "perturbation": "clean", "level": 0, "image_mode": "none"}
    ok = quadrant is not None
    return {**base, "quadrant": quadrant, "correct_original": correct, "entropy_original": entropy,
            "pairwise_disagreement": pairwise, "outcome": outcome, "answer": answer,
            "consistent": quadrant in ("Ideal", "Dangerous") if ok else None,
            "image_reliant": quadrant in ("Ideal", "Fragile") if ok else None,
            "pred_removed": removed if ok else None, "margin_removed": margin if ok else None}


def test_quadrant_stats_known_values_and_empty_quadrant() -> None:
    df = pd.DataFrame([
        _known("Ideal", 1.0, 0.2, 0.0, "ok", removed="no", margin=-3.0),
        _known("Ideal", 0.0, 0.4, 0.0, "ok", answer="no", removed="yes", margin=3.0),
        _known("Worst", 1.0, None, 1.0, "ok", removed="yes", margin=0.1),  # abstains: |0.1| < ln 2
        _known("Fragile", 1.0, 0.9, 0.5, "excluded:no_answer"),
        _known(None, None, None, None, "error"),
    ])
    out = quadrant_stats(df, n_boot=100, min_n=2).set_index("quadrant")
    assert out.loc["Ideal", "n"] == 2 and out.loc["Ideal", "n_total"] == 3
    assert out.loc["Ideal", "share"] == pytest.approx(2 / 3)
    assert out.loc["Ideal", "accuracy"] == pytest.approx(0.5)
    assert out.loc["Ideal", "mean_entropy"] == pytest.approx(0.3)
    assert math.isnan(out.loc["Worst", "mean_entropy"])  # generation fallback: no entropy
    assert out.loc["Worst", "mean_pairwise_disagreement"] == 1.0
    for quadrant in ("Fragile", "Dangerous"):
        assert out.loc[quadrant, "n"] == 0 and out.loc[quadrant, "share"] == 0.0
        assert out.loc[quadrant, "share_ci_low"] == 0.0 and out.loc[quadrant, "share_ci_high"] == 0.0
        assert math.isnan(out.loc[quadrant, "accuracy"])
    assert (out["n_error"] == 1).all()
    # group columns over the 3 ok rows only (the error and the excluded row are in no denominator)
    assert np.allclose(out["flip_rate"], 1 / 3)  # one of three samples is not consistent
    assert np.allclose(out["text_only_accuracy"], 1 / 3)  # only the Worst row: yes == yes
    assert (out["dangerous_floor"] == out["text_only_accuracy"]).all()
    # abstention sensitivity: the Worst sample abstains without the image -> Fragile; the primary stays
    assert out.loc["Worst", "share_abstention"] == 0.0 and out.loc["Fragile", "share_abstention"] == pytest.approx(1 / 3)
    assert out["share_abstention"].sum() == pytest.approx(1.0)
    assert np.allclose(out["abstention_tau"], math.log(2))
    assert out["negation_consistency"].isna().all() and (out["n_negation_samples"] == 0).all()


def test_errors_are_outside_every_denominator() -> None:
    df = _rows()
    errs = df.head(30).astype(object).assign(outcome="error", quadrant=None, consistent=None, pred_removed=None,
                                             correct_original=None, pairwise_disagreement=None)
    both = pd.concat([df.astype(object), errs], ignore_index=True)
    a = quadrant_stats(df, n_boot=50)
    b = quadrant_stats(both, n_boot=50)
    value_cols = [c for c in QUADRANT_STATS_COLUMNS if c != "n_error"]
    pd.testing.assert_frame_equal(a[value_cols], b[value_cols])
    assert b["n_error"].sum() == 4 * 30 and a["n_error"].sum() == 0
    pa, pb = condition_points(df), condition_points(both)
    pd.testing.assert_frame_equal(pa.drop(columns="n_error"), pb.drop(columns="n_error"))
    assert pb["n_error"].sum() == 30


def test_negation_consistency_is_its_own_statistic() -> None:
    rows = [_known("Ideal", 1.0, 0.1, 0.0, "ok") for _ in range(4)]
    for i, r in enumerate(rows):
        r.update(record_id=f"r{i}", n_negations=2 if i < 3 else 0, negation_consistent=[True, False, True, None][i])
    out = quadrant_stats(pd.DataFrame(rows), n_boot=20)
    assert (out["n_negation_samples"] == 3).all()
    assert np.allclose(out["negation_consistency"], 2 / 3)
    assert (out["flip_rate"] == 0.0).all()  # negations never enter the flip rate


def test_oracle_model_dangerous_share_equals_the_floor_exactly() -> None:
    """An oracle answers every question variant correctly with the image (analytic log-probabilities
    from the label), so it is consistent; without the image it answers from the wording alone (here:
    yes for every wording ending in an even record number). On 7 yes / 5 no labels with text-only
    answers yes on records 0, 2, ..., 10, the label equals the text-only answer on exactly the
    records counted below, and the oracle's Dangerous share must be that count over 12."""
    labels = ["yes"] * 7 + ["no"] * 5
    rows = []
    for i, label in enumerate(labels):
        p = 0.9 if label == "yes" else 0.1  # the oracle: confident and right with the image
        with_image = {"yes": math.log(p), "no": math.log(1 - p)}
        text_only = {"yes": math.log(0.7), "no": math.log(0.3)} if i % 2 == 0 else \
            {"yes": math.log(0.2), "no": math.log(0.8)}
        flags = classify([with_image] * 6, [1] * 6, label, text_only)
        rows.append({"config": "oracle", "dataset": "d", "perturbation": "clean", "level": 0, "image_mode": "none",
                     "record_id": f"r{i:02d}", "answer": label, "outcome": "ok", **flags.to_dict()})
    expected = sum(1 for i, lab in enumerate(labels) if lab == ("yes" if i % 2 == 0 else "no")) / len(labels)
    assert expected == 7 / 12  # yes-labels at even i: 0, 2, 4, 6; no-labels at odd i: 7, 9, 11
    out = quadrant_stats(pd.DataFrame(rows), n_boot=20).set_index("quadrant")
    assert out.loc["Dangerous", "share"] == expected
    assert out.loc["Dangerous", "dangerous_floor"] == expected
    assert out.loc["Ideal", "share"] == pytest.approx(1 - expected) and out.loc["Ideal", "text_only_accuracy"] == expected
    assert (out["flip_rate"] == 0.0).all() and out.loc["Ideal", "accuracy"] == 1.0


def test_quadrant_stats_is_deterministic_and_independent_of_row_order() -> None:
    df = _rows()
    a = quadrant_stats(df, seed=1, n_boot=100)
    b = quadrant_stats(df.sample(frac=1.0, random_state=0), seed=1, n_boot=100)
    c = quadrant_stats(df, seed=2, n_boot=100)
    pd.testing.assert_frame_equal(a, b)
    assert not a["share_ci_low"].equals(c["share_ci_low"])


def test_quadrant_stats_group_with_only_errors() -> None:
    df = pd.DataFrame([_known(None, None, None, None, "error")])
    out = quadrant_stats(df, n_boot=10)
    assert len(out) == 4
    assert (out["n_total"] == 0).all() and (out["n_error"] == 1).all()
    assert out["share"].isna().all() and out["flip_rate"].isna().all() and out["text_only_accuracy"].isna().all()


# ---- correlation -----------------------------------------------------------------------------
def test_correlation_matches_scipy_on_the_same_points() -> None:
    df = _rows()
    out = flip_dangerous_correlation(df, seed=0, n_boot=200, min_n=2)  # 4 configurations
    points = condition_points(df)
    for _, row in out.iterrows():
        if row["scope"] == "pooled_perturbed":
            sel = points[(points["perturbation"] != "clean") & (points["image_mode"] == row["image_mode"])]
            assert row["perturbation"] == "all" and pd.isna(row["level"])
            assert math.isnan(row["p_value"]) and math.isnan(row["fisher_low"])  # no p for pseudo-replicates
            assert row["ci_method"] == "cluster_bootstrap_configs"
        else:
            sel = points[(points["perturbation"] == row["perturbation"]) & (points["level"] == row["level"])
                         & (points["image_mode"] == row["image_mode"])]
            assert row["scope"] == ("headline" if row["perturbation"] == "clean" else "condition")
            assert row["p_value"] == pytest.approx(sps.pearsonr(sel["flip_rate"], sel["dangerous_share"]).pvalue)
            assert row["ci_method"] == "bootstrap_points"
        assert row["n_points"] == len(sel) and row["n_configs"] == sel["config"].nunique()
        assert row["r"] == pytest.approx(sps.pearsonr(sel["flip_rate"], sel["dangerous_share"]).statistic)
        assert row["ci_low"] <= row["r"] <= row["ci_high"]
        assert row["note"] is None
    assert set(out["scope"]) == {"headline", "condition", "pooled_perturbed"}
    head = out[out["scope"] == "headline"]
    assert len(head) == 2 and (head["n_points"] == len(CONFIGS)).all()  # one point per (config, dataset)
    assert len(out) == len(CONDITIONS) * 2 + 2


def test_correlation_points_are_flip_rates_and_dangerous_shares() -> None:
    df = _rows()
    points = condition_points(df)
    g = df[(df["config"] == "c2") & (df["perturbation"] == "blur") & (df["image_mode"] == "none")]
    p = points[(points["config"] == "c2") & (points["perturbation"] == "blur") & (points["image_mode"] == "none")]
    assert p["flip_rate"].item() == pytest.approx((~g["consistent"].astype(bool)).mean())
    assert p["flip_rate"].item() == pytest.approx(g["quadrant"].isin(["Fragile", "Worst"]).mean())
    assert p["dangerous_share"].item() == pytest.approx((g["quadrant"] == "Dangerous").mean())


def test_paper_flip_rate_and_dangerous_share_add_up_when_ideal_is_empty() -> None:
    """The paper's abstract: a 1.5 % flip rate with 98.5 % Dangerous (Ideal near 0)."""
    base = {"config": "c", "dataset": "d", "perturbation": "clean", "level": 0, "image_mode": "none",
            "outcome": "ok"}
    rows = [{**base, "record_id": f"r{i}", "quadrant": "Dangerous" if i < 197 else "Worst",
             "consistent": i < 197} for i in range(200)]
    p = condition_points(pd.DataFrame(rows))
    assert p["flip_rate"].item() == pytest.approx(0.015) and p["dangerous_share"].item() == pytest.approx(0.985)


def test_cluster_bootstrap_ignores_pseudo_replication() -> None:
    """Repeating every configuration's points k times (as pooling perturbed conditions does) leaves
    the cluster-bootstrap CI unchanged, while a bootstrap over points narrows as if n grew k-fold."""
    rng = np.random.default_rng(5)
    pts = pd.DataFrame({"config": np.repeat([f"c{i}" for i in range(6)], 3),
                        "flip_rate": rng.random(18), "dangerous_share": rng.random(18)})
    rep = pd.concat([pts] * 10, ignore_index=True)
    a = cluster_bootstrap_r(pts, rng_for(0, "t"), n_boot=300)
    b = cluster_bootstrap_r(rep, rng_for(0, "t"), n_boot=300)
    assert a == pytest.approx(b, abs=1e-12) and a[0] < a[1]
    naive_a = pearson_with_ci(pts["flip_rate"], pts["dangerous_share"], rng=rng_for(0, "n"), n_boot=300)
    naive_b = pearson_with_ci(rep["flip_rate"], rep["dangerous_share"], rng=rng_for(0, "n"), n_boot=300)
    assert naive_b["ci_high"] - naive_b["ci_low"] < 0.6 * (naive_a["ci_high"] - naive_a["ci_low"])
    assert all(math.isnan(v) for v in cluster_bootstrap_r(pts[pts["config"] == "c0"], rng_for(0, "t")))


def test_correlation_notes_too_few_points_and_zero_variance() -> None:
    df = _rows()
    few = flip_dangerous_correlation(df[df["config"].isin(["c1", "c2"]) & (df["perturbation"] == "clean")],
                                     n_boot=50)
    assert len(few) == 2  # the clean headline x 2 modes
    assert few["r"].isna().all() and (few["note"] == "n_points < 3").all()
    flat = df.assign(consistent=True)
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
