"""Strategy ranking (issue 6): how much IoU / Dice each fine-tuning strategy loses under
corruptions and under attacks, with bootstrap CIs, in the shape of the published table.

Input: ``segmentation_results`` rows (see :mod:`medrobust_lib.tracks.segmentation.evaluate`) of the
strategy models ``<base>-<strategy>``, all evaluated on the same conditions (the suite's
``finetune.eval``). For each (model, kind) with kind ``corruption``
(condition ``perturbation``) or ``attack`` (``fgsm``, ``pgd``):

* each test sample's mean drop (clean score - perturbed score, in [-1, 1]) over every condition
  (type x level) it was evaluated under, status ``ok`` only;
* ``mean_iou_drop`` / ``mean_dice_drop``: the mean of those per-sample drops, i.e. the mean drop
  over conditions weighted equally per sample; percentile bootstrap 95 % CI over samples
  (generator ``rng_for(seed, "strategy-ranking", model, kind, metric)``);
* ``clean_iou`` / ``clean_dice``: the mean clean score of the same samples;
* ``rank``: 1 = smallest mean IoU drop within (base model, kind);
* paired comparison with the reference strategy ``ref_strategy`` (``full`` when present, else
  the rank-1 strategy) on the images both have: ``iou_drop_diff`` = mean of (this strategy's
  per-image drop - the reference's), its paired bootstrap 95 % CI
  (``rng_for(seed, "strategy-vs-ref", model, kind, strategy)``), the two-sided Wilcoxon
  signed-rank p and Benjamini-Hochberg q over the strategies of (base model, kind); NULL on the
  reference row itself. Overlapping marginal CIs say little here: the images are shared, so the
  paired test is the one that separates strategies.

Rows that are not ``ok`` are counted in ``n_failed`` and never enter a mean.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from medrobust_lib.metrics.stats import benjamini_hochberg, bootstrap_ci, paired_bootstrap_ci, wilcoxon_paired
from medrobust_lib.seeding import rng_for
from medrobust_lib.store import results
from medrobust_lib.store.schema import RANKING_COLUMNS, RANKING_TABLE

KINDS: dict[str, tuple[str, ...]] = {"corruption": ("perturbation",), "attack": ("fgsm", "pgd")}
PUBLISHED_IOU_DROP: dict[str, float] = {  # MedFM-Robust, mean IoU drop under corruption
    "full": 0.025, "decoder_only": 0.029, "encoder_partial": 0.029, "decoder_prompt": 0.029,
    "adapter": 0.033, "lora": 0.048,
}


def strategy_ranking(rows: pd.DataFrame, models: Mapping[str, tuple[str, str]],
                     n_trainable: Mapping[str, int] | None = None, seed: int = 0,
                     n_boot: int = 2000) -> pd.DataFrame:
    """The ranking table (columns :data:`RANKING_COLUMNS`).

    ``models`` maps an evaluated model id to ``(base model id, strategy)``, e.g.
    ``{"tiny-sam-lora": ("tiny-sam", "lora")}``; rows of other models are ignored. ``n_trainable``: trainable parameters per evaluated model id."""
    out: list[dict[str, object]] = []
    names = [c for c, _ in RANKING_COLUMNS]
    if rows.empty:
        return pd.DataFrame(columns=names)
    sel = rows[rows["model"].isin(list(models))]
    for model_id, g in sel.groupby("model", sort=True):
        base, strategy = models[str(model_id)]
        clean = g[(g["condition"] == "clean") & (g["status"] == "ok")]
        for kind, conditions in KINDS.items():
            k = g[g["condition"].isin(conditions)]
            ok = k[k["status"] == "ok"]
            per = ok.groupby(["dataset", "sample_id"])[["iou_drop", "dice_drop"]].mean()
            cl = clean.set_index(["dataset", "sample_id"]).reindex(per.index)
            rec: dict[str, object] = {
                "model": base, "strategy": strategy, "evaluated_as": str(model_id),
                "checkpoint": ",".join(sorted(g["checkpoint"].astype(str).unique())), "kind": kind,
                "n_samples": len(per), "n_conditions": int(ok.groupby(["condition", "perturbation", "level"]).ngroups),
                "n_rows": len(k), "n_failed": int((k["status"] != "ok").sum()),
                "clean_iou": float(cl["iou"].mean()) if len(per) else float("nan"),
                "clean_dice": float(cl["dice"].mean()) if len(per) else float("nan"),
                "n_trainable": (n_trainable or {}).get(str(model_id)),
            }
            for metric in ("iou", "dice"):
                vals = per[f"{metric}_drop"].to_numpy(dtype=float)
                vals = vals[np.isfinite(vals)]
                est, lo, hi = bootstrap_ci(vals, n_boot=n_boot,
                                           rng=rng_for(seed, "strategy-ranking", str(model_id), kind, metric))
                rec.update({f"mean_{metric}_drop": est, f"{metric}_drop_ci_low": lo, f"{metric}_drop_ci_high": hi})
            out.append(rec)
    df = pd.DataFrame(out, columns=[c for c in names if c not in PAIRED_COLUMNS])
    df["rank"] = (df.groupby(["model", "kind"])["mean_iou_drop"].rank(method="min", na_option="bottom")
                  .astype("Int64"))
    df = _versus_reference(df, sel, models, seed, n_boot)
    return df.sort_values(["model", "kind", "rank", "strategy"]).reset_index(drop=True)[names]


PAIRED_COLUMNS = ("rank", "ref_strategy", "n_pairs", "iou_drop_diff", "iou_drop_diff_ci_low", "iou_drop_diff_ci_high",
                  "wilcoxon_p", "wilcoxon_q")


def _per_image_drop(rows: pd.DataFrame, model_id: str, kind: str) -> pd.Series:
    k = rows[(rows["model"] == model_id) & rows["condition"].isin(KINDS[kind]) & (rows["status"] == "ok")]
    return k.groupby(["dataset", "sample_id"])["iou_drop"].mean().dropna()


def _versus_reference(df: pd.DataFrame, rows: pd.DataFrame, models: Mapping[str, tuple[str, str]], seed: int,
                      n_boot: int) -> pd.DataFrame:
    for c in PAIRED_COLUMNS[1:]:
        df[c] = None if c == "ref_strategy" else np.nan
    for (_, kind), g in df.groupby(["model", "kind"]):
        strategies = dict(zip(g["strategy"], g["evaluated_as"], strict=True))
        ref = "full" if "full" in strategies else str(g.sort_values("rank")["strategy"].iloc[0])
        ref_drop = _per_image_drop(rows, strategies[ref], str(kind))
        ps: dict[object, float] = {}
        for idx, r in g.iterrows():
            df.loc[idx, "ref_strategy"] = ref
            if r["strategy"] == ref:
                continue
            mine = _per_image_drop(rows, str(r["evaluated_as"]), str(kind))
            both = mine.index.intersection(ref_drop.index)
            a, b = mine.loc[both].to_numpy(float), ref_drop.loc[both].to_numpy(float)
            est, lo, hi = paired_bootstrap_ci(a, b, n_boot=n_boot, rng=rng_for(
                seed, "strategy-vs-ref", str(r["model"]), str(kind), str(r["strategy"])))
            _, p = wilcoxon_paired(a, b)
            df.loc[idx, ["n_pairs", "iou_drop_diff", "iou_drop_diff_ci_low", "iou_drop_diff_ci_high", "wilcoxon_p"]] = [
                len(both), est, lo, hi, p]
            ps[idx] = p
        if ps:
            df.loc[list(ps), "wilcoxon_q"] = benjamini_hochberg(np.array(list(ps.values()), dtype=np.float64))
    df["n_pairs"] = df["n_pairs"].astype("Int64")
    return df


def write_strategy_ranking(results_dir: str | Path, models: Mapping[str, tuple[str, str]],
                           n_trainable: Mapping[str, int] | None = None, seed: int = 0) -> pd.DataFrame:
    """Recompute the ranking from every ``segmentation_results`` row and store it (one chunk per
    base model; the mart exposes it as the view ``strategy_ranking``)."""
    df = results.read_table(results_dir, "segmentation_results")
    table = strategy_ranking(df, models, n_trainable, seed)
    results.write_per_key(results_dir, RANKING_TABLE, table, "model", results.fingerprint(["ranking", len(table)]))
    return table


def compare_published(table: pd.DataFrame, kind: str = "corruption") -> pd.DataFrame:
    """Our mean IoU drop per strategy beside the published one (and both ranks)."""
    ours = table[(table["kind"] == kind) & table["strategy"].isin(list(PUBLISHED_IOU_DROP))]
    pub = pd.DataFrame({"strategy": list(PUBLISHED_IOU_DROP), "published_iou_drop": list(PUBLISHED_IOU_DROP.values())})
    pub["published_rank"] = pub["published_iou_drop"].rank(method="min").astype(int)
    merged = pub.merge(ours[["strategy", "mean_iou_drop", "iou_drop_ci_low", "iou_drop_ci_high"]], on="strategy",
                       how="left")
    merged["our_rank"] = merged["mean_iou_drop"].rank(method="min").astype("Int64")
    return merged.sort_values("published_rank").reset_index(drop=True)
