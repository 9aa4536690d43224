"""Strategy ranking on synthetic segmentation rows with known answers."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from medrobust_lib.store.schema import RANKING_COLUMNS
from medrobust_lib.store.views.common import LEVELS_NOTE, LEVELS_NOTE_TAIL
from medrobust_lib.tracks.finetune.ranking import compare_published, strategy_ranking

SAMPLES = [f"s{i:02d}" for i in range(16)]


def _rows(model: str, strategy: str, offset: float, failed: int = 0) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for i, sid in enumerate(SAMPLES):
        base = 0.01 + 0.002 * i  # per-image drop shared by every strategy
        out.append({"model": model, "strategy": strategy, "checkpoint": model[-4:], "dataset": "d", "sample_id": sid,
                    "condition": "clean", "perturbation": "clean", "level": 0, "iou": 0.8, "dice": 0.85,
                    "iou_drop": 0.0, "dice_drop": 0.0, "status": "ok"})
        for cond, pert, lv in (("perturbation", "gaussian_noise", 2), ("perturbation", "rotation", 4),
                               ("fgsm", "fgsm", 2)):
            drop = base + offset + (0.0005 * ((i * 7) % 5) if offset else 0.0)
            status = "perturbation_error" if (i < failed and cond == "perturbation") else "ok"
            out.append({"model": model, "strategy": strategy, "checkpoint": model[-4:], "dataset": "d",
                        "sample_id": sid, "condition": cond, "perturbation": pert, "level": lv,
                        "iou": 0.8 - drop, "dice": 0.85 - drop, "iou_drop": drop if status == "ok" else np.nan,
                        "dice_drop": drop if status == "ok" else np.nan, "status": status})
    return out


def test_ranking_known_answers() -> None:
    rows = pd.DataFrame(_rows("m-full", "full", 0.0) + _rows("m-lora", "lora", 0.02, failed=2)
                        + _rows("m-other", "other", 0.5))  # not in the model map: ignored
    models = {"m-full": ("m", "full"), "m-lora": ("m", "lora")}
    t = strategy_ranking(rows, models, {"m-full": 100, "m-lora": 10}, seed=0, n_boot=500)
    assert list(t.columns) == [c for c, _ in RANKING_COLUMNS] and len(t) == 4
    c = t[t["kind"] == "corruption"].set_index("strategy")
    base = np.mean([0.01 + 0.002 * i for i in range(16)])
    assert c.loc["full", "mean_iou_drop"] == pytest.approx(base)
    assert c.loc["full", "rank"] == 1 and c.loc["lora", "rank"] == 2
    # 2 images lost both corruption conditions: 4 failed rows, counted, never averaged
    assert c.loc["lora", "n_failed"] == 4 and c.loc["lora", "n_rows"] == 32 and c.loc["lora", "n_samples"] == 14
    assert c.loc["full", "n_conditions"] == 2 and c.loc["lora", "n_trainable"] == 10
    assert c.loc["full", "clean_iou"] == pytest.approx(0.8)
    # paired comparison with full: +0.02 (+ small image-dependent jitter) on every image
    assert c.loc["lora", "ref_strategy"] == "full" and c.loc["lora", "n_pairs"] == 14
    assert c.loc["lora", "iou_drop_diff"] == pytest.approx(0.02, abs=0.002)
    assert c.loc["lora", "iou_drop_diff_ci_low"] <= c.loc["lora", "iou_drop_diff"] <= c.loc["lora", "iou_drop_diff_ci_high"]
    assert c.loc["lora", "wilcoxon_p"] < 0.001 and c.loc["lora", "wilcoxon_q"] == pytest.approx(c.loc["lora", "wilcoxon_p"])
    assert pd.isna(c.loc["full", "iou_drop_diff"]) and pd.isna(c.loc["full", "wilcoxon_p"])
    a = t[t["kind"] == "attack"].set_index("strategy")
    assert a.loc["lora", "n_conditions"] == 1 and a.loc["lora", "mean_iou_drop"] > a.loc["full", "mean_iou_drop"]
    # deterministic for a seed
    again = strategy_ranking(rows, models, None, seed=0, n_boot=500)
    assert np.allclose(again["iou_drop_ci_low"], t["iou_drop_ci_low"], equal_nan=True)


def test_compare_published_orders_by_the_published_table() -> None:
    rows = pd.DataFrame(_rows("m-full", "full", 0.0) + _rows("m-lora", "lora", 0.02))
    t = strategy_ranking(rows, {"m-full": ("m", "full"), "m-lora": ("m", "lora")}, seed=0, n_boot=200)
    cmp = compare_published(t)
    assert list(cmp["strategy"])[0] == "full" and list(cmp["strategy"])[-1] == "lora"
    assert cmp.set_index("strategy").loc["lora", "our_rank"] == 2
    assert cmp["mean_iou_drop"].isna().sum() == 4  # strategies not evaluated here


def test_strategies_of_different_levels_are_not_ranked_together() -> None:
    """``lora`` was evaluated at levels 2 and 5, ``full`` at 2 and 4: each is rank 1 of its own
    coverage, says so in ``note``, and is not paired with the other."""
    lora = pd.DataFrame(_rows("m-lora", "lora", 0.02))
    lora.loc[lora["level"] == 4, "level"] = 5
    rows = pd.concat([pd.DataFrame(_rows("m-full", "full", 0.0)), lora], ignore_index=True)
    t = strategy_ranking(rows, {"m-full": ("m", "full"), "m-lora": ("m", "lora")}, seed=0, n_boot=200)
    c = t[t["kind"] == "corruption"].set_index("strategy")
    assert (c.loc["full", "levels"], c.loc["lora", "levels"]) == ("2,4", "2,5")
    assert list(c.loc[["full", "lora"], "rank"]) == [1, 1]
    assert c.loc["lora", "note"] == LEVELS_NOTE + "2,5" + LEVELS_NOTE_TAIL
    assert c.loc["lora", "ref_strategy"] == "lora" and pd.isna(c.loc["lora", "iou_drop_diff"])
    a = t[t["kind"] == "attack"]  # both evaluated FGSM at level 2: ranked together, no note
    assert set(a["levels"]) == {"2"} and sorted(a["rank"]) == [1, 2] and a["note"].isna().all()
    assert not t["floor_effect"].any() and set(t["n_floor_excluded"]) == {0} and not t["with_floor"].any()


def test_lora_plus_strategies_are_ranked_beside_the_others() -> None:
    """The reference's LoRA+ strategies rank and pair with ``full`` like any strategy; the published
    table has no LoRA+ numbers, so the comparison with it leaves them out."""
    rows = pd.DataFrame(_rows("m-full", "full", 0.0) + _rows("m-lpe", "lora_plus_encoder", 0.01)
                        + _rows("m-lpd", "lora_plus_decoder", 0.03))
    models = {"m-full": ("m", "full"), "m-lpe": ("m", "lora_plus_encoder"), "m-lpd": ("m", "lora_plus_decoder")}
    t = strategy_ranking(rows, models, {"m-lpe": 7}, seed=0, n_boot=200)
    c = t[t["kind"] == "corruption"].set_index("strategy")
    assert list(c.sort_values("rank").index) == ["full", "lora_plus_encoder", "lora_plus_decoder"]
    assert (c.loc["lora_plus_decoder", "ref_strategy"], c.loc["lora_plus_encoder", "n_trainable"]) == ("full", 7)
    assert c.loc["lora_plus_decoder", "iou_drop_diff"] == pytest.approx(0.03, abs=0.002)
    assert not compare_published(t)["strategy"].str.startswith("lora_plus").any()
