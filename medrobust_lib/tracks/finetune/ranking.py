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
* ``rank``: 1 = smallest mean IoU drop within (base model, kind, levels); strategies whose IoU drop
  CIs overlap (directly or through a chain of overlaps) share the rank of the best of them and are
  marked ``tied`` (``note`` names the others): the data cannot order them. A strategy with fewer
  than ``min_n`` samples (the suite's ``stats.min_n``) has no CI and no rank (``note`` says why);
* paired comparison with the reference strategy ``ref_strategy`` (``full`` when present, else
  the rank-1 strategy) on the images both have: ``iou_drop_diff`` = mean of (this strategy's
  per-image drop - the reference's), its paired bootstrap 95 % CI
  (``rng_for(seed, "strategy-vs-ref", model, kind, strategy)``), the two-sided Wilcoxon
  signed-rank p and Benjamini-Hochberg q over the strategies of (base model, kind, levels); NULL on the
  reference row itself. Overlapping marginal CIs say little here: the images are shared, so the
  paired test is the one that separates strategies.

Rows that are not ``ok`` never enter a mean: failures are counted in ``n_failed``, rows of a type
that does not apply to the sample in ``n_not_applicable`` and rows of samples without a mask in
``n_no_mask`` (the last two are not failures). Corruption rows whose perturbed output missed its
level's SSIM band are left out of every mean, CI, test and rank (as in the mart's default views),
unless the suite keeps them (``perturbations.include_off_band``; :func:`write_strategy_ranking`).

Floors and coverage (the rule of :func:`medrobust_lib.store.views.common.seg_rows_ctes`, run by :func:`~medrobust_lib.store.views.common.dataset_floors`): by default
(``with_floor`` false) the rows of a dataset whose clean IoU or Dice is below ``SEG_FLOOR`` for that
evaluated model are left out (``n_floor_excluded`` counts them), unless every dataset of the model is
at the floor: then they are kept, the row is flagged ``floor_effect`` and left unranked. With
``with_floor`` every dataset is kept and ranked. ``levels`` (the severity levels of the kind's ok
rows) and ``n_datasets`` say what a row covers; ``rank`` and the paired comparison only put rows of
the same (model, kind, levels) together, and ``note`` says when a group mixes levels.
:func:`write_strategy_ranking` stores both variants (views ``strategy_ranking`` and
``strategy_ranking_all``).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from medrobust_lib.config.common import DEFAULT_MIN_N
from medrobust_lib.hashing import digest
from medrobust_lib.metrics.stats import benjamini_hochberg, bootstrap_ci, paired_bootstrap_ci, wilcoxon_paired
from medrobust_lib.seeding import rng_for
from medrobust_lib.store import results
from medrobust_lib.store.schema import (
    RANKING_COLUMNS,
    RANKING_TABLE,
    SEG_NO_MASK,
    SEG_NOT_APPLICABLE,
    seg_failed,
)
from medrobust_lib.store.views.common import (
    FLOOR_KEYS,
    FLOOR_NOTE,
    LEVELS_NOTE,
    LEVELS_NOTE_TAIL,
    dataset_floors,
    text_keys,
)
from medrobust_lib.tracks.off_band import MANIFEST_TABLE, off_band

KINDS: dict[str, tuple[str, ...]] = {"corruption": ("perturbation",), "attack": ("fgsm", "pgd")}
PUBLISHED_IOU_DROP: dict[str, float] = {  # MedFM-Robust, mean IoU drop under corruption
    "full": 0.025, "decoder_only": 0.029, "encoder_partial": 0.029, "decoder_prompt": 0.029,
    "adapter": 0.033, "lora": 0.048,
}


def without_floor(rows: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, tuple[int, bool]]]:
    """``rows`` without the datasets at the floor (kept when every dataset of their model is), and
    per evaluated model id ``(n_floor_excluded, floor_effect)``."""
    fl = dataset_floors(rows)[[*FLOOR_KEYS, "floor", "all_floor"]]
    merged = text_keys(rows).merge(fl, on=list(FLOOR_KEYS), how="left")
    floor = merged["floor"].fillna(False).astype(bool).to_numpy()
    all_floor = merged["all_floor"].fillna(False).astype(bool).to_numpy()
    info = {str(m): (int((g["floor"] & ~g["all_floor"]).sum()), bool(g["all_floor"].any()))
            for m, g in fl.groupby("model")}
    return rows[~floor | all_floor], info


def _levels(ok: pd.DataFrame) -> str:
    """The distinct levels of ``ok``, sorted, comma-separated (the SQL views' ``levels``)."""
    return ",".join(str(v) for v in sorted({int(v) for v in ok["level"].dropna()}))


def _record(model_id: str, g: pd.DataFrame, kind: str, base: str, strategy: str,
            n_trainable: Mapping[str, int] | None, seed: int, n_boot: int,
            min_n: int = DEFAULT_MIN_N) -> dict[str, object]:
    """One ranking row of an evaluated model and kind (before ranks and paired comparisons)."""
    clean = g[(g["condition"] == "clean") & (g["status"] == "ok")]
    k = g[g["condition"].isin(KINDS[kind])]
    ok = k[k["status"] == "ok"]
    per = ok.groupby(["dataset", "sample_id"])[["iou_drop", "dice_drop"]].mean()
    cl = clean.set_index(["dataset", "sample_id"]).reindex(per.index)
    rec: dict[str, object] = {
        "model": base, "strategy": strategy, "evaluated_as": model_id,
        "checkpoint": ",".join(sorted(g["checkpoint"].astype(str).unique())), "kind": kind,
        "n_samples": len(per), "n_conditions": int(ok.groupby(["condition", "perturbation", "level"]).ngroups),
        "n_rows": len(k), "n_failed": int(k["status"].map(seg_failed).sum()),
        "n_not_applicable": int((k["status"] == SEG_NOT_APPLICABLE).sum()),
        "n_no_mask": int((k["status"] == SEG_NO_MASK).sum()),
        "clean_iou": float(cl["iou"].mean()) if len(per) else float("nan"),
        "clean_dice": float(cl["dice"].mean()) if len(per) else float("nan"),
        "n_trainable": (n_trainable or {}).get(model_id),
        "levels": _levels(ok), "n_datasets": int(ok["dataset"].nunique()),
    }
    for metric in ("iou", "dice"):
        vals = per[f"{metric}_drop"].to_numpy(dtype=float)
        vals = vals[np.isfinite(vals)]
        est, lo, hi = bootstrap_ci(vals, n_boot=n_boot, rng=rng_for(seed, "strategy-ranking", model_id, kind, metric))
        if len(per) < min_n:  # below the floor: the mean only
            lo = hi = float("nan")
        rec.update({f"mean_{metric}_drop": est, f"{metric}_drop_ci_low": lo, f"{metric}_drop_ci_high": hi})
    return rec


def strategy_ranking(rows: pd.DataFrame, models: Mapping[str, tuple[str, str]],
                     n_trainable: Mapping[str, int] | None = None, seed: int = 0,
                     n_boot: int = 2000, with_floor: bool = False, min_n: int = DEFAULT_MIN_N) -> pd.DataFrame:
    """The ranking table (columns :data:`RANKING_COLUMNS`) of one variant: floor datasets left out
    (``with_floor`` false, the default) or kept.

    ``models`` maps an evaluated model id to ``(base model id, strategy)``, e.g.
    ``{"tiny-sam-lora": ("tiny-sam", "lora")}``; rows of other models are ignored. ``n_trainable``:
    trainable parameters per evaluated model id."""
    names = [c for c, _ in RANKING_COLUMNS]
    if rows.empty:
        return pd.DataFrame(columns=names)
    sel = rows[rows["model"].isin(list(models))]
    kept, floors = without_floor(sel)
    if with_floor:
        kept = sel
    out: list[dict[str, object]] = []
    for model_id, g in kept.groupby("model", sort=True):
        base, strategy = models[str(model_id)]
        n_excluded, floor_effect = floors.get(str(model_id), (0, False))
        for kind in KINDS:
            rec = _record(str(model_id), g, kind, base, strategy, n_trainable, seed, n_boot, min_n)
            rec.update(n_floor_excluded=0 if with_floor else n_excluded, floor_effect=floor_effect,
                       with_floor=with_floor)
            out.append(rec)
    df = pd.DataFrame(out, columns=[c for c in names if c not in PAIRED_COLUMNS and c != "note"])
    df = _rank(df, with_floor, min_n)
    df = _versus_reference(df, kept, models, seed, n_boot, min_n)
    return df.sort_values(["model", "kind", "rank", "strategy"]).reset_index(drop=True)[names]


PAIRED_COLUMNS = ("rank", "tied", "ref_strategy", "n_pairs", "iou_drop_diff", "iou_drop_diff_ci_low",
                  "iou_drop_diff_ci_high",
                  "wilcoxon_p", "wilcoxon_q")


def _per_image_drop(rows: pd.DataFrame, model_id: str, kind: str) -> pd.Series:
    k = rows[(rows["model"] == model_id) & rows["condition"].isin(KINDS[kind]) & (rows["status"] == "ok")]
    return k.groupby(["dataset", "sample_id"])["iou_drop"].mean().dropna()


RANK_GROUP: tuple[str, ...] = ("model", "kind", "levels")
"""Rows ranked and compared together: the same base model, kind and evaluated levels."""


def tie_groups(est: pd.Series, low: pd.Series, high: pd.Series) -> pd.Series:
    """Competition ranks (1 = smallest ``est``) in which rows whose [``low``, ``high``] intervals
    overlap, directly or through a chain of overlapping intervals, share one rank: that of the
    best row of their group (the number of rows in better groups + 1). Every row needs finite
    bounds. Returns the ranks (int64) on ``est``'s index."""
    e = {i: float(v) for i, v in est.items()}
    lo = {i: float(v) for i, v in low.items()}
    hi = {i: float(v) for i, v in high.items()}
    order = sorted(e, key=lambda i: (lo[i], e[i]))
    groups: list[list[Hashable]] = []
    reach = float("-inf")
    for i in order:
        if groups and lo[i] <= reach:
            groups[-1].append(i)
            reach = max(reach, hi[i])
        else:
            groups.append([i])
            reach = hi[i]
    groups.sort(key=lambda g: min(e[i] for i in g))
    ranks: dict[Hashable, int] = {}
    before = 0
    for g in groups:
        for i in g:
            ranks[i] = before + 1
        before += len(g)
    return pd.Series(ranks, dtype="int64").reindex(est.index)


TIE_NOTE = "tied (95 % CIs of the IoU drop overlap) with "
"""``note`` prefix of a tied row; the names of the strategies it is tied with follow."""
SMALL_N_NOTE = "fewer than {min_n} samples: no CI, not ranked"
"""``note`` of a row below the ``min_n`` floor (formatted with it)."""


def _rank(df: pd.DataFrame, with_floor: bool, min_n: int = DEFAULT_MIN_N) -> pd.DataFrame:
    """``rank`` and ``tied`` within :data:`RANK_GROUP` (floor-effect rows unranked unless
    ``with_floor``; rows without a CI, below ``min_n``, unranked), and ``note``."""
    floor = df["floor_effect"].astype(bool) & (not with_floor)
    has_ci = np.isfinite(df["iou_drop_ci_low"].astype(float)) & np.isfinite(df["iou_drop_ci_high"].astype(float))
    rankable = ~floor & has_ci & np.isfinite(df["mean_iou_drop"].astype(float))
    df["rank"] = pd.Series(pd.NA, index=df.index, dtype="Int64")
    df["tied"] = pd.Series(pd.NA, index=df.index, dtype="boolean")
    notes: dict[object, list[str]] = {i: [] for i in df.index}
    for _, g in df[rankable].groupby(list(RANK_GROUP)):
        ranks = tie_groups(g["mean_iou_drop"], g["iou_drop_ci_low"], g["iou_drop_ci_high"])
        df.loc[g.index, "rank"] = ranks.astype("Int64")
        for i in g.index:
            peers = [str(g.loc[j, "strategy"]) for j in g.index if j != i and ranks[j] == ranks[i]]
            df.loc[i, "tied"] = bool(peers)
            if peers:
                notes[i].append(TIE_NOTE + ", ".join(sorted(peers)))
    mixed = df.groupby(["model", "kind"])["levels"].transform("nunique") > 1
    for i in df.index[mixed]:
        notes[i].insert(0, LEVELS_NOTE + str(df.loc[i, "levels"]) + LEVELS_NOTE_TAIL)
    for i in df.index[~floor & ~has_ci]:
        notes[i].append(SMALL_N_NOTE.format(min_n=min_n))
    if not with_floor:
        for i in df.index[df["floor_effect"].astype(bool)]:
            notes[i] = [FLOOR_NOTE]
    df["note"] = pd.Series({i: "; ".join(v) if v else None for i, v in notes.items()}, dtype=object)
    return df


def _versus_reference(df: pd.DataFrame, rows: pd.DataFrame, models: Mapping[str, tuple[str, str]], seed: int,
                      n_boot: int, min_n: int = DEFAULT_MIN_N) -> pd.DataFrame:
    for c in PAIRED_COLUMNS[2:]:
        df[c] = None if c == "ref_strategy" else np.nan
    for (_, kind, _), g in df.groupby(list(RANK_GROUP)):
        strategies = dict(zip(g["strategy"], g["evaluated_as"], strict=True))
        ranked = g[g["rank"].notna()] if g["rank"].notna().any() else g
        ref = "full" if "full" in set(ranked["strategy"]) else \
            str(ranked.sort_values(["rank", "mean_iou_drop"])["strategy"].iloc[0])
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
            if len(both) < min_n:  # below the floor: the mean difference only
                lo = hi = p = float("nan")
            df.loc[idx, ["n_pairs", "iou_drop_diff", "iou_drop_diff_ci_low", "iou_drop_diff_ci_high", "wilcoxon_p"]] = [
                len(both), est, lo, hi, p]
            if np.isfinite(p):
                ps[idx] = p
        if ps:
            df.loc[list(ps), "wilcoxon_q"] = benjamini_hochberg(np.array(list(ps.values()), dtype=np.float64))
    df["n_pairs"] = df["n_pairs"].astype("Int64")
    return df


def write_strategy_ranking(results_dir: str | Path, models: Mapping[str, tuple[str, str]],
                           n_trainable: Mapping[str, int] | None = None, seed: int = 0,
                           min_n: int = DEFAULT_MIN_N, include_off_band: bool = False) -> pd.DataFrame:
    """Recompute the ranking from the ``segmentation_results`` rows and store both variants (one
    chunk per base model; the mart exposes them as the views ``strategy_ranking``, floor datasets
    left out, and ``strategy_ranking_all``); returns the default variant. Corruption rows whose
    output missed its level's SSIM band (``perturbation_manifest``) are left out, as in the mart's
    by-level means, unless ``include_off_band`` (the suite's ``perturbations.include_off_band``)."""
    df = results.read_table(results_dir, "segmentation_results")
    if not include_off_band and len(df):
        df = df[~off_band(df, results.read_table(results_dir, MANIFEST_TABLE))]
    table = strategy_ranking(df, models, n_trainable, seed, min_n=min_n)
    both = pd.concat([table, _with_floor_variant(df, models, n_trainable, seed, table, min_n)], ignore_index=True)
    results.write_per_key(results_dir, RANKING_TABLE, both, "model", digest(["ranking", len(both)]))
    return table


def _with_floor_variant(rows: pd.DataFrame, models: Mapping[str, tuple[str, str]],
                        n_trainable: Mapping[str, int] | None, seed: int, default: pd.DataFrame,
                        min_n: int = DEFAULT_MIN_N) -> pd.DataFrame:
    """The ``with_floor`` variant: the default one relabelled when no row touched a floor (the same
    numbers), else recomputed with the floor datasets."""
    if default.empty or not (default["n_floor_excluded"].fillna(0).astype(int).any()
                             or default["floor_effect"].fillna(False).astype(bool).any()):
        return default.assign(with_floor=True)
    return strategy_ranking(rows, models, n_trainable, seed, with_floor=True, min_n=min_n)


def compare_published(table: pd.DataFrame, kind: str = "corruption") -> pd.DataFrame:
    """Our mean IoU drop per strategy beside the published one (and both ranks)."""
    ours = table[(table["kind"] == kind) & table["strategy"].isin(list(PUBLISHED_IOU_DROP))]
    pub = pd.DataFrame({"strategy": list(PUBLISHED_IOU_DROP), "published_iou_drop": list(PUBLISHED_IOU_DROP.values())})
    pub["published_rank"] = pub["published_iou_drop"].rank(method="min").astype(int)
    merged = pub.merge(ours[["strategy", "mean_iou_drop", "iou_drop_ci_low", "iou_drop_ci_high"]], on="strategy",
                       how="left")
    merged["our_rank"] = merged["mean_iou_drop"].rank(method="min").astype("Int64")
    return merged.sort_values("published_rank").reset_index(drop=True)
