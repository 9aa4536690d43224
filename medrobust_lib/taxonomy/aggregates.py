"""Aggregates of ``taxonomy_results`` rows (pandas in, pandas out), with the paper's definitions.

* :func:`quadrant_stats`: per (config, dataset, perturbation, level, image_mode) group and
  quadrant: share with a bootstrap CI, accuracy with a bootstrap CI, mean entropy, mean pairwise
  disagreement, counts; per group also the ``flip_rate`` (share of samples whose answers are not
  all identical across the original question and its paraphrases), the text-only accuracy, the
  oracle Dangerous floor, the abstention sensitivity share and the negation robustness.
* :func:`flip_dangerous_correlation`: Pearson r of the flip rate with the Dangerous share across
  (config, dataset) points. The headline (scope ``headline``) uses clean points only, one per
  (configuration, dataset), n = their number, as the paper does. Per perturbed condition (scope
  ``condition``) the same cross-section. Pooling every perturbed point (scope
  ``pooled_perturbed``) repeats each configuration many times, so it is a separately labelled
  secondary analysis whose CI resamples whole configurations (cluster bootstrap) and that has
  no p-value.
* :func:`transitions`: clean -> perturbed quadrant transition counts, paired per record.

Only rows with ``outcome == 'ok'`` enter any share, accuracy or correlation (all rows when there
is no ``outcome`` column); infrastructure failures (``error`` rows) are counted in ``n_error``,
never in a denominator; ``excluded:*`` rows are ignored. Bootstrap draws come from
:func:`medrobust_lib.seeding.rng_for` keyed by ``(seed, "taxonomy", *group key)``, and each
group's rows are put in a canonical order (``record_id``, ``sample_id``) first, so results do not
depend on the input row order or on which other groups are present.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from medrobust_lib.config.common import DEFAULT_MIN_N, MIN_X_POSITIONS
from medrobust_lib.config.taxonomy import DEFAULT_ABSTENTION_TAU
from medrobust_lib.metrics.stats import bootstrap_ci, pearson_rows, pearson_with_ci
from medrobust_lib.seeding import rng_for
from medrobust_lib.taxonomy.quadrants import quadrant_of
from medrobust_lib.types import QUADRANTS

GROUP_COLUMNS: tuple[str, ...] = ("config", "dataset", "perturbation", "level", "image_mode")
"""One condition of one configuration on one dataset."""
SCOPE_COLUMNS: tuple[str, ...] = ("perturbation", "level", "image_mode")
PAIR_COLUMNS: tuple[str, ...] = ("config", "dataset", "record_id", "image_mode")
ORDER_COLUMNS: tuple[str, ...] = ("record_id", "sample_id")
CLEAN = "clean"
DANGEROUS = "Dangerous"
HEADLINE = "headline"
"""Scope of the headline correlation: clean points, one per (configuration, dataset)."""
CONDITION = "condition"
POOLED = "pooled_perturbed"
"""Scope of the secondary analysis pooling every perturbed point (cluster bootstrap over configs)."""
CI_POINTS = "bootstrap_points"
CI_CLUSTER = "cluster_bootstrap_configs"

POINT_COLUMNS: tuple[str, ...] = (*GROUP_COLUMNS, "flip_rate", "dangerous_share", "n", "n_error")
TRANSITION_COLUMNS: tuple[str, ...] = (
    *GROUP_COLUMNS, "from_quadrant", "to_quadrant", "count", "n_from", "share",
)

Key = tuple[Hashable, ...]
_NAN = float("nan")


def _require(df: pd.DataFrame, columns: Iterable[str]) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(f"taxonomy rows lack columns {missing}")


def _ok_rows(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["outcome"] == "ok"] if "outcome" in df.columns else df


def _error_counts(df: pd.DataFrame, columns: Sequence[str]) -> dict[Key, int]:
    if "outcome" not in df.columns:
        return {}
    return {k: len(g) for k, g in _groups(df[df["outcome"] == "error"], columns).items()}


def _key(value: Any) -> Key:
    return tuple(value) if isinstance(value, tuple) else (value,)


def _groups(df: pd.DataFrame, columns: Sequence[str]) -> dict[Key, pd.DataFrame]:
    if df.empty:
        return {}
    return {_key(k): g for k, g in df.groupby(list(columns), sort=True, dropna=False)}


def _bools(values: pd.Series | npt.NDArray[Any]) -> npt.NDArray[np.bool_]:
    """A boolean column (object dtype with None / NaN allowed) as bool; None and NaN read False."""
    return np.fromiter((v is not None and v == v and bool(v) for v in values), dtype=bool, count=len(values))


def _ordered(group: pd.DataFrame) -> pd.DataFrame:
    """Rows in a canonical order (by ``record_id``, ``sample_id`` where present) so that the
    bootstrap does not depend on the input row order."""
    by = [c for c in ORDER_COLUMNS if c in group.columns]
    return group.sort_values(by, kind="stable") if by else group


def flip_rate(consistent: pd.Series) -> float:
    """The paper's flip rate of a group: the share of its samples whose answers are not all
    identical across the original question and its paraphrases (``consistent`` false), in [0, 1];
    NaN for no samples. ``consistent``: one boolean per ok sample."""
    c = _bools(consistent)
    return float((~c).mean()) if c.size else _NAN


def text_only_accuracy(answer: pd.Series, pred_removed: pd.Series) -> float:
    """Share of samples whose text-only answer (``pred_removed``) equals the label, in [0, 1]; NaN
    for no samples."""
    if not len(answer):
        return _NAN
    return float(np.mean([str(a).lower() == str(p).lower() for a, p in zip(answer, pred_removed, strict=True)]))


def dangerous_floor(answer: pd.Series, pred_removed: pd.Series) -> float:
    """The oracle Dangerous floor: the share of samples whose label equals the text-only answer.

    An oracle that answers every question variant correctly with the image is consistent, so it
    is Dangerous exactly where its image answer (the label) equals its text-only answer: no
    configuration with these text-only answers can be accurate and consistent with a smaller
    Dangerous share. On label-balanced questions it is about 0.5. For yes/no answers it equals
    :func:`text_only_accuracy` by construction; it is reported separately because it is read
    against the Dangerous share, not as an accuracy.
    """
    return text_only_accuracy(answer, pred_removed)


def abstention_quadrants(group: pd.DataFrame, tau: float) -> pd.Series:
    """Sensitivity variant of the quadrant (never the primary one): the text-only answer counts as
    changed also when it abstains, |``margin_removed``| < ``tau`` (nats). Rows without a margin
    (generated answers) keep their primary reliance flag. Needs ``consistent``, ``image_reliant``
    and ``margin_removed``."""
    margin = pd.to_numeric(group["margin_removed"], errors="coerce").to_numpy(dtype=np.float64)
    abstain = np.isfinite(margin) & (np.abs(margin) < tau)
    changed = _bools(group["image_reliant"]) | abstain
    consistent = _bools(group["consistent"])
    return pd.Series([quadrant_of(bool(c), bool(r)) for c, r in zip(consistent, changed, strict=True)],
                     index=group.index, dtype=object)


@dataclass(frozen=True)
class _GroupColumns:
    """One group's columns as arrays, converted once for its four quadrant rows: ``quadrant``
    (object), ``correct`` / ``entropy`` / ``disagreement`` (float64, NaN where missing)."""

    quadrant: npt.NDArray[Any]
    correct: npt.NDArray[np.float64]
    entropy: npt.NDArray[np.float64]
    disagreement: npt.NDArray[np.float64]

    @classmethod
    def of(cls, group: pd.DataFrame) -> _GroupColumns:
        def num(col: str) -> npt.NDArray[np.float64]:
            return np.asarray(pd.to_numeric(group[col], errors="coerce"), dtype=np.float64)

        return cls(group["quadrant"].to_numpy(dtype=object), num("correct_original"), num("entropy_original"),
                   num("pairwise_disagreement"))


def _finite(a: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    out: npt.NDArray[np.float64] = a[np.isfinite(a)]
    return out


def _group_summary(group: pd.DataFrame, tau: float) -> dict[str, Any]:
    """Group-level columns of :func:`quadrant_stats` (the same on the group's four rows)."""
    n = len(group)
    with_neg = (pd.to_numeric(group["n_negations"], errors="coerce").fillna(0).to_numpy() > 0
                if "n_negations" in group.columns else np.zeros(n, dtype=bool))
    neg_consistent = _bools(group["negation_consistent"].to_numpy()[with_neg]) if with_neg.any() else None
    has_margin = "margin_removed" in group.columns and "image_reliant" in group.columns
    text_only = text_only_accuracy(group["answer"], group["pred_removed"])
    return {
        "flip_rate": flip_rate(group["consistent"]),
        "text_only_accuracy": text_only,
        "dangerous_floor": text_only,  # dangerous_floor(): equal by construction for yes/no answers
        "_abstention": abstention_quadrants(group, tau).to_numpy(dtype=object) if has_margin and n else None,
        "abstention_tau": tau,
        "negation_consistency": float(neg_consistent.mean()) if neg_consistent is not None else _NAN,
        "n_negation_samples": int(with_neg.sum()),
    }


def _share_cis(cols: _GroupColumns, key: Key, seed: int, n_boot: int) -> dict[str, tuple[float, float, float]]:
    """Per quadrant: its share of the group with the percentile bootstrap CI. One index matrix
    (from the group's key) serves all four quadrants, so the shares of one resample sum to 1; equal
    to :func:`~medrobust_lib.metrics.stats.bootstrap_ci` of each indicator with that generator."""
    n = cols.quadrant.size
    if n == 0:
        return {q: (_NAN, _NAN, _NAN) for q in QUADRANTS}
    idx = rng_for(seed, "taxonomy", *key).integers(0, n, size=(n_boot, n))
    out: dict[str, tuple[float, float, float]] = {}
    for q in QUADRANTS:
        x = (cols.quadrant == q).astype(np.float64)
        lo, hi = np.nanquantile(np.mean(x[idx], axis=1), [0.025, 0.975])
        out[q] = (float(np.mean(x)), float(lo), float(hi))
    return out


def _quadrant_row(key: Key, quadrant: str, cols: _GroupColumns, share: tuple[float, float, float],
                  summary: dict[str, Any], n_error: int, seed: int, n_boot: int,
                  min_n: int = DEFAULT_MIN_N) -> dict[str, Any]:
    n_total = cols.quadrant.size
    mask = cols.quadrant == quadrant
    acc = bootstrap_ci(_finite(cols.correct[mask]), n_boot=n_boot,
                       rng=rng_for(seed, "taxonomy", *key, quadrant, "accuracy"))
    if int(mask.sum()) < min_n:  # the floor: no CI on fewer than min_n samples
        acc = (acc[0], _NAN, _NAN)
    if n_total < min_n:
        share = (share[0], _NAN, _NAN)
    entropy, disagreement = _finite(cols.entropy[mask]), _finite(cols.disagreement[mask])
    abst = summary["_abstention"]
    return {
        **dict(zip(GROUP_COLUMNS, key, strict=True)), "quadrant": quadrant, "n": int(mask.sum()),
        "n_total": n_total, "share": share[0], "share_ci_low": share[1], "share_ci_high": share[2],
        "accuracy": acc[0], "accuracy_ci_low": acc[1], "accuracy_ci_high": acc[2],
        "mean_entropy": float(entropy.mean()) if entropy.size else _NAN,
        "mean_pairwise_disagreement": float(disagreement.mean()) if disagreement.size else _NAN,
        "n_error": n_error,
        **{k: v for k, v in summary.items() if not k.startswith("_")},
        "share_abstention": float((abst == quadrant).mean()) if abst is not None and n_total else _NAN,
    }


def quadrant_stats(df: pd.DataFrame, seed: int = 0, n_boot: int = 1000,
                   abstention_tau: float = DEFAULT_ABSTENTION_TAU, min_n: int = DEFAULT_MIN_N) -> pd.DataFrame:
    """Per-group, per-quadrant statistics of ``taxonomy_results`` rows.

    ``df`` needs the :data:`GROUP_COLUMNS`, ``quadrant``, ``consistent``, ``answer``,
    ``pred_removed``, ``correct_original`` (0/1), ``entropy_original`` (bits, may be NULL for
    generated answers) and ``pairwise_disagreement``; ``outcome``, ``image_reliant`` with
    ``margin_removed`` (abstention) and ``n_negations`` with ``negation_consistent`` are optional.
    Returns the ``taxonomy_quadrant_stats`` columns (declared in ``store/schema.py``) but
    ``band_miss`` (added by the writer, from the manifest), four rows per group (every quadrant of
    :data:`~medrobust_lib.types.QUADRANTS`, in that order, groups sorted):

    * ``n`` samples in the quadrant, ``n_total`` ok samples in the group, ``n_error`` error rows
      (outside every denominator);
    * ``share = n / n_total`` in [0, 1] (0 for an empty quadrant, NaN when the group has only
      errors) with a percentile bootstrap CI of the indicator mean over the group's samples;
    * ``accuracy``: mean ``correct_original`` within the quadrant, in [0, 1], with its bootstrap
      CI (NaN when n = 0); ``mean_entropy`` (bits) and ``mean_pairwise_disagreement``;
    * per group (the same on its four rows): ``flip_rate`` (:func:`flip_rate`),
      ``text_only_accuracy``, ``dangerous_floor`` (:func:`dangerous_floor`), ``abstention_tau``
      and ``negation_consistency`` (share of the ``n_negation_samples`` samples with negations
      whose negations all agree with the original answer; NaN without);
    * ``share_abstention``: the quadrant's share under :func:`abstention_quadrants` (sensitivity
      analysis; NaN without margins).

    Floors (``min_n``, the suite's ``stats.min_n``): a share has no CI when the group has fewer
    than ``min_n`` ok samples, an accuracy none when its quadrant has fewer.

    Deterministic for a given ``seed`` and ``n_boot``.
    """
    _require(df, (*GROUP_COLUMNS, "quadrant", "consistent", "answer", "pred_removed", "correct_original",
                  "entropy_original", "pairwise_disagreement"))
    if not abstention_tau > 0:
        raise ValueError(f"abstention_tau must be > 0 nats, got {abstention_tau}")
    # one stable sort up front: each group then holds its rows in _ordered()'s canonical order
    ok = _groups(_ordered(_ok_rows(df)), GROUP_COLUMNS)
    errors = _error_counts(df, GROUP_COLUMNS)
    empty = df.iloc[0:0]
    rows: list[dict[str, Any]] = []
    for key in sorted(set(ok) | set(errors)):
        group = ok.get(key, empty)
        cols = _GroupColumns.of(group)
        summary = _group_summary(group, abstention_tau)
        shares = _share_cis(cols, key, seed, n_boot)
        rows += [_quadrant_row(key, q, cols, shares[q], summary, errors.get(key, 0), seed, n_boot, min_n)
                 for q in QUADRANTS]
    return pd.DataFrame(rows)  # the writer orders them as store/schema.py declares the table


def condition_points(df: pd.DataFrame) -> pd.DataFrame:
    """One point per (config, dataset, perturbation, level, image_mode) with ok rows: ``flip_rate``
    (:func:`flip_rate`, in [0, 1]), ``dangerous_share`` (in [0, 1]), ``n`` ok samples and
    ``n_error`` error rows (not in n). Needs :data:`GROUP_COLUMNS`, ``quadrant``, ``consistent``."""
    _require(df, (*GROUP_COLUMNS, "quadrant", "consistent"))
    errors = _error_counts(df, GROUP_COLUMNS)
    rows = [
        {**dict(zip(GROUP_COLUMNS, key, strict=True)), "flip_rate": flip_rate(g["consistent"]),
         "dangerous_share": float((g["quadrant"] == DANGEROUS).mean()), "n": len(g),
         "n_error": errors.get(key, 0)}
        for key, g in _groups(_ok_rows(df), GROUP_COLUMNS).items()
    ]
    points = pd.DataFrame(rows, columns=list(POINT_COLUMNS))
    points["n"] = points["n"].astype(np.int64)
    points["n_error"] = points["n_error"].astype(np.int64)
    return points


def cluster_bootstrap_r(points: pd.DataFrame, rng: np.random.Generator, n_boot: int = 2000,
                        alpha: float = 0.05) -> tuple[float, float]:
    """Percentile CI of Pearson r (``flip_rate`` vs ``dangerous_share``) resampling whole
    configurations: each resample draws the ``config`` clusters with replacement and keeps all
    their points. Resamples with zero variance are ignored; (NaN, NaN) below 2 configurations.
    """
    configs = sorted(points["config"].astype(str).unique())
    if len(configs) < 2:
        return _NAN, _NAN
    by = [points[points["config"].astype(str) == c] for c in configs]
    xs = [g["flip_rate"].to_numpy(np.float64) for g in by]
    ys = [g["dangerous_share"].to_numpy(np.float64) for g in by]
    picks = rng.integers(0, len(configs), size=(n_boot, len(configs)))
    boot = np.empty(n_boot)
    for b, pick in enumerate(picks):
        x = np.concatenate([xs[i] for i in pick])[None, :]
        y = np.concatenate([ys[i] for i in pick])[None, :]
        boot[b] = pearson_rows(x, y)[0]
    if not np.any(np.isfinite(boot)):
        return _NAN, _NAN
    lo, hi = np.nanquantile(boot, [alpha / 2, 1 - alpha / 2])
    return float(lo), float(hi)


def _correlation_row(scope: str, scope_key: Key, points: pd.DataFrame, rng_key: Key, seed: int,
                     n_boot: int, min_n: int = DEFAULT_MIN_N) -> dict[str, Any]:
    x = points["flip_rate"].to_numpy(dtype=np.float64)
    y = points["dangerous_share"].to_numpy(dtype=np.float64)
    pooled = scope == POOLED
    row: dict[str, Any] = {"scope": scope, **dict(zip(SCOPE_COLUMNS, scope_key, strict=True)),
                           "n_points": int(x.size), "n_configs": int(points["config"].nunique()),
                           "n_error": int(points["n_error"].sum()), "r": _NAN, "p_value": _NAN, "ci_low": _NAN,
                           "ci_high": _NAN, "ci_method": CI_CLUSTER if pooled else CI_POINTS,
                           "fisher_low": _NAN, "fisher_high": _NAN, "note": None}
    rng = rng_for(seed, "taxonomy", "correlation", scope, *rng_key)
    n_x = int(np.unique(x).size)
    if x.size < 3:
        row["note"] = "n_points < 3"
    elif np.ptp(x) == 0 or np.ptp(y) == 0:
        row["note"] = "zero variance"
    elif n_x < MIN_X_POSITIONS:
        row["note"] = (f"flip rate takes only {n_x} distinct values (< {MIN_X_POSITIONS}): a line through "
                       "2 positions fits any data, so no r")
    elif pooled:
        row["r"] = float(pearson_rows(x[None, :], y[None, :])[0])
        row["ci_low"], row["ci_high"] = cluster_bootstrap_r(points, rng, n_boot)
    else:
        res = pearson_with_ci(x, y, rng=rng, n_boot=n_boot)
        row.update(r=res["r"], p_value=res["p"], ci_low=res["ci_low"], ci_high=res["ci_high"],
                   fisher_low=res["fisher_low"], fisher_high=res["fisher_high"])
    if np.isfinite(row["r"]) and x.size < min_n:  # r shown, but no CI or p on so few points
        row.update(p_value=_NAN, ci_low=_NAN, ci_high=_NAN, fisher_low=_NAN, fisher_high=_NAN,
                   note=f"n_points < {min_n}: no CI or p")
    return row


def flip_dangerous_correlation(df: pd.DataFrame, seed: int = 0, n_boot: int = 2000,
                               min_n: int = DEFAULT_MIN_N) -> pd.DataFrame:
    """Pearson r of the flip rate (x) with the Dangerous share (y) across (config, dataset) points.

    Points come from :func:`condition_points`. Rows (the ``taxonomy_correlation_stats`` columns of ``store/schema.py``):

    * scope ``headline`` (:data:`HEADLINE`), one per image_mode: clean points only, one per
      (configuration, dataset), ``n_points`` = their number; two-sided ``p_value``, percentile
      bootstrap ``ci_*`` over points (``ci_method`` ``bootstrap_points``) and Fisher-z
      ``fisher_*`` (:func:`medrobust_lib.metrics.stats.pearson_with_ci`);
    * scope ``condition``, one per perturbed (perturbation, level, image_mode): the same
      cross-section under that condition;
    * scope ``pooled_perturbed`` (:data:`POOLED`), one per image_mode, ``perturbation = 'all'``,
      ``level`` NA: every perturbed point pooled. A configuration contributes many points, so the
      CI resamples whole configurations (:func:`cluster_bootstrap_r`, ``ci_method``
      ``cluster_bootstrap_configs``) and ``p_value`` / ``fisher_*`` are NaN (they would assume
      independent points). Secondary analysis only, never the headline.

    ``n_configs``: configurations among the points; ``n_error``: error rows behind them (outside
    every point). With fewer than 3 points, a constant x or y, or x on fewer than
    :data:`~medrobust_lib.config.common.MIN_X_POSITIONS` distinct values, r and its bounds are NaN
    and ``note`` says why; with fewer than ``min_n`` points (the suite's ``stats.min_n``) r is
    kept but p and the CIs are NaN and ``note`` says so (else None).
    """
    points = condition_points(df)
    clean = points[points["perturbation"] == CLEAN]
    pert = points[points["perturbation"] != CLEAN]
    rows = [_correlation_row(HEADLINE, key, g, key, seed, n_boot, min_n)
            for key, g in _groups(clean, SCOPE_COLUMNS).items()]
    rows += [_correlation_row(CONDITION, key, g, key, seed, n_boot, min_n)
             for key, g in _groups(pert, SCOPE_COLUMNS).items()]
    rows += [_correlation_row(POOLED, ("all", None, key[0]), g, key, seed, n_boot, min_n)
             for key, g in _groups(pert, ("image_mode",)).items()]
    out = pd.DataFrame(rows)  # the writer orders them as store/schema.py declares the table
    if "level" in out:
        out["level"] = out["level"].astype("Int64")
    return out


def _unique(df: pd.DataFrame, columns: Sequence[str], what: str) -> None:
    if df.duplicated(list(columns)).any():
        raise ValueError(f"duplicate {what} rows for {list(columns)}")


def transitions(df: pd.DataFrame) -> pd.DataFrame:
    """Clean -> perturbed quadrant transitions, paired on (config, dataset, record_id, image_mode).

    Each ok perturbed row (``perturbation != 'clean'``) is matched with the ok clean row of the same
    pair key; unmatched rows are left out. Returns :data:`TRANSITION_COLUMNS` with the full 4 x 4
    grid per perturbed condition: ``count`` (>= 0), ``n_from`` (paired records whose clean
    quadrant is ``from_quadrant``) and ``share = count / n_from`` in [0, 1] (NaN when n_from = 0).
    Raises ValueError when a pair key has more than one clean row, or more than one row per
    condition.
    """
    _require(df, (*GROUP_COLUMNS, "record_id", "quadrant"))
    ok = _ok_rows(df)
    is_clean = ok["perturbation"] == CLEAN
    clean = ok.loc[is_clean, [*PAIR_COLUMNS, "quadrant"]].rename(columns={"quadrant": "from_quadrant"})
    pert = ok.loc[~is_clean, [*PAIR_COLUMNS, "perturbation", "level", "quadrant"]]
    _unique(clean, PAIR_COLUMNS, "clean")
    _unique(pert, (*PAIR_COLUMNS, "perturbation", "level"), "perturbed")
    paired = pert.rename(columns={"quadrant": "to_quadrant"}).merge(clean, on=list(PAIR_COLUMNS), how="inner")
    if paired.empty:
        return pd.DataFrame(columns=list(TRANSITION_COLUMNS))
    cells = [*GROUP_COLUMNS, "from_quadrant", "to_quadrant"]
    counts = paired.groupby(cells, sort=True).size()
    conditions = sorted(_groups(paired, GROUP_COLUMNS))
    index = pd.MultiIndex.from_tuples(
        [(*c, f, t) for c in conditions for f in QUADRANTS for t in QUADRANTS], names=cells)
    out = counts.reindex(index, fill_value=0).rename("count").reset_index()
    out["count"] = out["count"].astype(np.int64)
    out["n_from"] = out.groupby([*GROUP_COLUMNS, "from_quadrant"], sort=False)["count"].transform("sum")
    n_from = out["n_from"].to_numpy(dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        out["share"] = np.where(n_from > 0, out["count"].to_numpy(dtype=np.float64) / n_from, np.nan)
    return out[list(TRANSITION_COLUMNS)]


__all__ = [
    "GROUP_COLUMNS",
    "HEADLINE",
    "POINT_COLUMNS",
    "POOLED",
    "TRANSITION_COLUMNS",
    "abstention_quadrants",
    "cluster_bootstrap_r",
    "condition_points",
    "dangerous_floor",
    "flip_dangerous_correlation",
    "flip_rate",
    "quadrant_stats",
    "text_only_accuracy",
    "transitions",
]


POINT_KEYS: tuple[str, ...] = ("config", "dataset", "perturbation", "level", "image_mode")
"""The keys of one scatter point (:data:`POINT_COLUMNS` are :func:`condition_points`' columns)."""


def correlation_points(df: pd.DataFrame, clean_only: bool = False) -> pd.DataFrame:
    """Scatter points from ``taxonomy_results`` rows: one row per (config, dataset, perturbation,
    level, image_mode) with ok rows, ``flip_rate`` (share of samples not consistent across the
    original question and its paraphrases), ``dangerous_share``, ``n`` ok samples and ``n_error``
    (:func:`medrobust_lib.taxonomy.aggregates.condition_points`). ``clean_only``: the headline points
    (clean, one per configuration and dataset) only."""
    if df.empty:
        return pd.DataFrame(columns=list(POINT_COLUMNS))
    rows = df[df["perturbation"] == "clean"] if clean_only else df
    out = condition_points(rows)
    out["config"] = out["config"].astype(str)
    out["level"] = pd.to_numeric(out["level"]).astype(int)
    return out[list(POINT_COLUMNS)].reset_index(drop=True)
