"""Statistics that know their n (docs/statistics.md): no CI or p-value for a cell below the
suite's ``stats.min_n`` (default 5), no correlation over fewer than 3 distinct x positions, and
strategies whose CIs overlap ranked as ties. One test per floor, each on both sides of it."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from medrobust_lib.config import Suite
from medrobust_lib.config.common import DEFAULT_MIN_N, MIN_X_POSITIONS
from medrobust_lib.store.schema import VLM_COLUMN_NAMES
from medrobust_lib.taxonomy.aggregates import flip_dangerous_correlation, quadrant_stats
from medrobust_lib.tracks.finetune.ranking import SMALL_N_NOTE, TIE_NOTE, strategy_ranking, tie_groups
from medrobust_lib.tracks.segmentation.stats import segmentation_stats
from medrobust_lib.tracks.vlm.stats import vlm_stats


def test_the_floor_is_a_suite_setting() -> None:
    assert DEFAULT_MIN_N == 5 and MIN_X_POSITIONS == 3
    assert Suite().stats.min_n == 5
    assert Suite.model_validate({"stats": {"min_n": 8}}).stats.min_n == 8
    with pytest.raises(ValueError):
        Suite.model_validate({"stats": {"min_n": 1}})


# ---- segmentation_stats ---------------------------------------------------------------------
def _seg_rows(n_by_type: dict[str, int]) -> pd.DataFrame:
    rows = []
    for pert, n in n_by_type.items():
        for i in range(n):
            drop = 0.05 + 0.01 * i
            rows.append({"model": "m", "checkpoint": "c", "strategy": "s", "dataset": "d", "sample_id": f"x{i}",
                         "condition": "perturbation", "perturbation": pert, "level": 2, "iou": 0.8 - drop,
                         "dice": 0.85 - drop, "clean_iou": 0.8, "clean_dice": 0.85, "iou_drop": drop,
                         "dice_drop": drop, "status": "ok"})
    return pd.DataFrame(rows)


def test_segmentation_cells_below_min_n_have_no_ci_and_no_p() -> None:
    st = segmentation_stats(_seg_rows({"small": 4, "enough": 5}), seed=0).set_index("perturbation")
    ci_cols = ["iou_drop_ci_low", "iou_drop_ci_high", "dice_drop_ci_low", "dice_drop_ci_high", "wilcoxon_p",
               "wilcoxon_q"]
    assert st.loc["small", "n"] == 4 and st.loc["small", "iou_drop"] == pytest.approx(0.065)  # the mean stays
    assert st.loc["small", ci_cols].isna().all()
    assert st.loc["enough", ci_cols].notna().all()
    assert st.loc["enough", "iou_drop_ci_low"] <= st.loc["enough", "iou_drop"] <= st.loc["enough", "iou_drop_ci_high"]
    # configurable: with a floor of 3 the 4-image cell gets its CI
    assert segmentation_stats(_seg_rows({"small": 4}), seed=0, min_n=3)[ci_cols].notna().all(axis=None)


# ---- vlm_stats ------------------------------------------------------------------------------
def _vlm_rows(n: int) -> pd.DataFrame:
    rows = []
    for i in range(n):
        for pert, level, correct in (("clean", 0, 1.0), ("blur", 1, float(i % 2))):
            rows.append({**dict.fromkeys(VLM_COLUMN_NAMES),
                         "model": "v", "checkpoint": "c", "adapter": None, "task": "vqa_yesno", "dataset": "d",
                         "modality": "ct", "sample_id": f"s{i}", "record_id": f"r{i}", "prompt_id": 0,
                         "image_mode": "image", "perturbation": pert, "level": level, "outcome": "ok",
                         "correct": correct})
    return pd.DataFrame(rows)


@pytest.mark.parametrize(("n", "has_ci"), [(4, False), (5, True)])
def test_vlm_cells_below_min_n_have_no_ci_and_no_p(n: int, has_ci: bool) -> None:
    row = vlm_stats(_vlm_rows(n), seed=0).iloc[0]
    assert row["n_pairs"] == n and row["drop"] == pytest.approx(1.0 - np.mean([i % 2 for i in range(n)]))
    cols = ["clean_ci_low", "clean_ci_high", "perturbed_ci_low", "perturbed_ci_high", "drop_ci_low", "drop_ci_high",
            "p_value", "q_value"]
    assert all(math.isfinite(row[c]) for c in cols) if has_ci else all(pd.isna(row[c]) for c in cols)


# ---- taxonomy ---------------------------------------------------------------------------------
def _tax_rows(points: list[tuple[str, int, int]], n_records: int = 12) -> pd.DataFrame:
    """Clean taxonomy rows of (config, n_inconsistent, n_dangerous) points: each point's flip rate
    is n_inconsistent / n_records and its Dangerous share n_dangerous / n_records."""
    rows = []
    for config, n_flip, n_dang in points:
        for i in range(n_records):
            consistent = i >= n_flip
            quadrant = "Dangerous" if consistent and i < n_flip + n_dang else ("Ideal" if consistent else "Fragile")
            rows.append({"config": config, "dataset": "demo", "perturbation": "clean", "level": 0,
                         "image_mode": "none", "record_id": f"r{i}", "quadrant": quadrant,
                         "consistent": consistent, "image_reliant": quadrant in ("Ideal", "Fragile"), "answer": "yes",
                         "pred_removed": "no", "pairwise_disagreement": 0.0 if consistent else 0.5,
                         "correct_original": float(i % 2), "entropy_original": 0.5, "outcome": "ok"})
    return pd.DataFrame(rows)


def test_no_correlation_over_fewer_than_three_x_positions() -> None:
    # ten points on two flip-rate positions: a perfect line through two positions means nothing
    pts = [(f"c{k}", 2 if k < 5 else 6, 1 + (k % 5) if k < 5 else k % 3) for k in range(10)]
    row = flip_dangerous_correlation(_tax_rows(pts), seed=0).iloc[0]
    assert row["n_points"] == 10
    assert pd.isna(row["r"]) and pd.isna(row["p_value"]) and pd.isna(row["ci_low"])
    assert "2 distinct values" in row["note"]
    # a third position brings r back, with its CI and p (10 points >= min_n)
    pts[0] = ("c0", 4, 1)
    row = flip_dangerous_correlation(_tax_rows(pts), seed=0).iloc[0]
    assert math.isfinite(row["r"]) and math.isfinite(row["p_value"]) and math.isfinite(row["ci_low"])
    assert row["note"] is None or pd.isna(row["note"])


def test_a_correlation_below_min_n_has_r_but_no_ci_or_p() -> None:
    pts = [("a", 1, 1), ("b", 3, 2), ("c", 5, 4), ("d", 7, 3)]
    row = flip_dangerous_correlation(_tax_rows(pts), seed=0).iloc[0]
    assert row["n_points"] == 4 and math.isfinite(row["r"])
    assert pd.isna(row["p_value"]) and pd.isna(row["ci_low"]) and pd.isna(row["fisher_low"])
    assert row["note"] == "n_points < 5: no CI or p"
    row = flip_dangerous_correlation(_tax_rows(pts), seed=0, min_n=4).iloc[0]
    assert math.isfinite(row["p_value"]) and math.isfinite(row["ci_low"])


def test_quadrant_cis_below_min_n_are_empty() -> None:
    st = quadrant_stats(_tax_rows([("a", 2, 3)], n_records=4), seed=0)  # a group of 4 samples
    assert st["share"].notna().all() and st["share_ci_low"].isna().all() and st["accuracy_ci_low"].isna().all()
    st = quadrant_stats(_tax_rows([("a", 2, 6)], n_records=12), seed=0).set_index("quadrant")
    assert st["share_ci_low"].notna().all()  # 12 samples in the group
    assert st.loc["Dangerous", "n"] == 6 and math.isfinite(st.loc["Dangerous", "accuracy_ci_low"])
    assert st.loc["Fragile", "n"] == 2 and pd.isna(st.loc["Fragile", "accuracy_ci_low"])


# ---- strategy ranking: ties and the floor ------------------------------------------------------
def test_tie_groups_chain_overlapping_intervals() -> None:
    est = pd.Series([0.160, 0.163, 0.169, 0.30, 0.31])
    low = pd.Series([0.150, 0.155, 0.161, 0.29, 0.305])
    high = pd.Series([0.162, 0.170, 0.175, 0.308, 0.32])
    # a-b overlap, b-c overlap (a-c do not): one group of three; d-e overlap: a second group
    assert tie_groups(est, low, high).tolist() == [1, 1, 1, 4, 4]
    # disjoint intervals keep plain ranks, ordered by the estimate
    assert tie_groups(pd.Series([0.3, 0.1, 0.2]), pd.Series([0.29, 0.09, 0.19]),
                      pd.Series([0.31, 0.11, 0.21])).tolist() == [3, 1, 2]


def _strategy_rows(model: str, offset: float, n_samples: int = 16, spread: float = 0.03) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for i in range(n_samples):
        drop = offset + spread * ((i * 7) % 5 - 2) / 2
        common = {"model": model, "strategy": "x", "checkpoint": model, "dataset": "d", "sample_id": f"s{i:02d}",
                  "status": "ok"}
        out.append({**common, "condition": "clean", "perturbation": "clean", "level": 0, "iou": 0.8, "dice": 0.85,
                    "iou_drop": 0.0, "dice_drop": 0.0})
        out.append({**common, "condition": "perturbation", "perturbation": "blur", "level": 2, "iou": 0.8 - drop,
                    "dice": 0.85 - drop, "iou_drop": drop, "dice_drop": drop})
    return out


def test_strategies_with_overlapping_cis_are_ties() -> None:
    rows = pd.DataFrame(_strategy_rows("m-full", 0.160) + _strategy_rows("m-lora", 0.165)
                        + _strategy_rows("m-adapter", 0.169) + _strategy_rows("m-decoder", 0.40)
                        + _strategy_rows("m-small", 0.10, n_samples=4))
    models = {f"m-{s}": ("m", s) for s in ("full", "lora", "adapter", "decoder", "small")}
    t = strategy_ranking(rows, models, seed=0, n_boot=500)
    c = t[t["kind"] == "corruption"].set_index("strategy")
    assert c.loc[["full", "lora", "adapter"], "rank"].tolist() == [1, 1, 1]
    assert c.loc[["full", "lora", "adapter"], "tied"].tolist() == [True, True, True]
    assert c.loc["full", "note"] == TIE_NOTE + "adapter, lora"
    assert c.loc["decoder", "rank"] == 4 and not c.loc["decoder", "tied"]
    assert pd.isna(c.loc["decoder", "note"])
    # four samples: the mean is there, its CI and rank are not, and the note says why
    assert c.loc["small", "n_samples"] == 4 and c.loc["small", "mean_iou_drop"] == pytest.approx(0.10, abs=0.02)
    assert pd.isna(c.loc["small", "iou_drop_ci_low"]) and pd.isna(c.loc["small", "rank"])
    assert c.loc["small", "note"] == SMALL_N_NOTE.format(min_n=5)
    # the paired comparison with the reference also stops below the floor (4 pairs)
    assert c.loc["small", "n_pairs"] == 4 and pd.isna(c.loc["small", "wilcoxon_p"])
    assert math.isfinite(c.loc["decoder", "wilcoxon_p"])


def test_the_strategy_figure_says_tie_and_small_n() -> None:
    from medrobust_lib.report.figures.paper import _strategy_label

    rows = pd.DataFrame({"strategy": ["full", "lora", "small", "decoder"], "tied": [True, True, None, False],
                         "mean_iou_drop": [0.16, 0.165, 0.1, 0.4], "iou_drop_ci_low": [0.15, 0.155, np.nan, 0.39]})
    assert [_strategy_label(rows, s) for s in ("full", "lora", "small", "decoder", "other")] == [
        "full (tie)", "lora (tie)", "small (no CI: small n)", "decoder", "other"]
