"""Aggregates of ``taxonomy_results`` rows (pandas in, pandas out).

* :func:`quadrant_stats`: per (config, dataset, perturbation, level, image_mode) group and
  quadrant: share with a bootstrap CI, accuracy with a bootstrap CI, mean entropy, mean flip rate,
  counts (errors counted separately).
* :func:`flip_dangerous_correlation`: Pearson r, across (config, dataset) points, of the mean flip
  rate with the Dangerous share, per condition and pooled per image mode.
* :func:`transitions`: clean -> perturbed quadrant transition counts, paired per record.

Only rows with ``outcome == 'ok'`` enter the statistics (all rows when there is no ``outcome``
column); ``error`` rows are counted in ``n_error``; ``excluded:*`` rows are ignored. Bootstrap
draws come from :func:`medrobust_lib.seeding.rng_for` keyed by ``(seed, "taxonomy", *group key)``,
and each group's rows are put in a canonical order (``record_id``, ``sample_id``) first, so results
do not depend on the input row order or on which other groups are present.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from medrobust_lib.metrics.stats import bootstrap_ci, pearson_with_ci
from medrobust_lib.seeding import rng_for
from medrobust_lib.store.schema_taxonomy import QUADRANTS

GROUP_COLUMNS: tuple[str, ...] = ("config", "dataset", "perturbation", "level", "image_mode")
"""One condition of one configuration on one dataset."""
SCOPE_COLUMNS: tuple[str, ...] = ("perturbation", "level", "image_mode")
PAIR_COLUMNS: tuple[str, ...] = ("config", "dataset", "record_id", "image_mode")
ORDER_COLUMNS: tuple[str, ...] = ("record_id", "sample_id")
CLEAN = "clean"
DANGEROUS = "Dangerous"

QUADRANT_STATS_COLUMNS: tuple[str, ...] = (
    *GROUP_COLUMNS, "quadrant", "n", "n_total", "share", "share_ci_low", "share_ci_high", "accuracy",
    "accuracy_ci_low", "accuracy_ci_high", "mean_entropy", "mean_flip_rate", "n_error",
)
CORRELATION_COLUMNS: tuple[str, ...] = (
    "scope", *SCOPE_COLUMNS, "n_points", "r", "p_value", "ci_low", "ci_high", "fisher_low", "fisher_high", "note",
)
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


def _key(value: Any) -> Key:
    return tuple(value) if isinstance(value, tuple) else (value,)


def _groups(df: pd.DataFrame, columns: Sequence[str]) -> dict[Key, pd.DataFrame]:
    if df.empty:
        return {}
    return {_key(k): g for k, g in df.groupby(list(columns), sort=True, dropna=False)}


def _floats(values: pd.Series) -> npt.NDArray[np.float64]:
    """Finite values of a column as float64 (None/NaN dropped)."""
    a: npt.NDArray[np.float64] = np.asarray(pd.to_numeric(values, errors="coerce"), dtype=np.float64)
    keep: npt.NDArray[np.float64] = a[np.isfinite(a)]
    return keep


def _mean(values: pd.Series) -> float:
    a = _floats(values)
    return float(a.mean()) if a.size else _NAN


def _ordered(group: pd.DataFrame) -> pd.DataFrame:
    """Rows in a canonical order (by ``record_id``, ``sample_id`` where present) so that the
    bootstrap does not depend on the input row order."""
    by = [c for c in ORDER_COLUMNS if c in group.columns]
    return group.sort_values(by, kind="stable") if by else group


def _quadrant_row(key: Key, quadrant: str, group: pd.DataFrame, n_error: int, seed: int,
                  n_boot: int) -> dict[str, Any]:
    n_total = len(group)
    mask = (group["quadrant"] == quadrant).to_numpy(dtype=bool)
    if n_total:
        # Same key -> same index matrix for every quadrant of the group: shares of one resample sum to 1.
        share = bootstrap_ci(mask.astype(np.float64), n_boot=n_boot, rng=rng_for(seed, "taxonomy", *key))
    else:
        share = (_NAN, _NAN, _NAN)
    inside = group[mask]
    acc = bootstrap_ci(_floats(inside["correct_original"]), n_boot=n_boot,
                       rng=rng_for(seed, "taxonomy", *key, quadrant, "accuracy"))
    return {
        **dict(zip(GROUP_COLUMNS, key, strict=True)), "quadrant": quadrant, "n": int(mask.sum()),
        "n_total": n_total, "share": share[0], "share_ci_low": share[1], "share_ci_high": share[2],
        "accuracy": acc[0], "accuracy_ci_low": acc[1], "accuracy_ci_high": acc[2],
        "mean_entropy": _mean(inside["entropy_original"]), "mean_flip_rate": _mean(inside["flip_rate"]),
        "n_error": n_error,
    }


def quadrant_stats(df: pd.DataFrame, seed: int = 0, n_boot: int = 1000) -> pd.DataFrame:
    """Per-group, per-quadrant statistics of ``taxonomy_results`` rows.

    ``df`` needs the :data:`GROUP_COLUMNS`, ``quadrant``, ``correct_original`` (0/1),
    ``entropy_original`` (bits, may be NULL for generated answers) and ``flip_rate``; ``outcome``
    is optional. Returns :data:`QUADRANT_STATS_COLUMNS`, four rows per group (every quadrant of
    :data:`~medrobust_lib.store.schema_taxonomy.QUADRANTS`, in that order, groups sorted):

    * ``n`` samples in the quadrant, ``n_total`` ok samples in the group, ``n_error`` error rows;
    * ``share = n / n_total`` in [0, 1] (0 for an empty quadrant, NaN when the group has only
      errors) with a percentile bootstrap CI of the indicator mean over the group's samples;
    * ``accuracy``: mean ``correct_original`` within the quadrant, in [0, 1], with its bootstrap
      CI (NaN when n = 0); ``mean_entropy`` (bits) and ``mean_flip_rate`` within the quadrant.

    Deterministic for a given ``seed`` and ``n_boot``.
    """
    _require(df, (*GROUP_COLUMNS, "quadrant", "correct_original", "entropy_original", "flip_rate"))
    ok = _groups(_ok_rows(df), GROUP_COLUMNS)
    errors: dict[Key, int] = {}
    if "outcome" in df.columns:
        errors = {k: len(g) for k, g in _groups(df[df["outcome"] == "error"], GROUP_COLUMNS).items()}
    empty = df.iloc[0:0]
    rows = [
        _quadrant_row(key, quadrant, _ordered(ok.get(key, empty)), errors.get(key, 0), seed, n_boot)
        for key in sorted(set(ok) | set(errors))
        for quadrant in QUADRANTS
    ]
    return pd.DataFrame(rows, columns=list(QUADRANT_STATS_COLUMNS))


def condition_points(df: pd.DataFrame) -> pd.DataFrame:
    """One point per (config, dataset, perturbation, level, image_mode) from ok rows: ``flip_rate``
    (mean, in [0, 1]), ``dangerous_share`` (in [0, 1]) and ``n``. Points without a finite mean flip
    rate are dropped."""
    _require(df, (*GROUP_COLUMNS, "quadrant", "flip_rate"))
    ok = _ok_rows(df)
    rows = [
        {**dict(zip(GROUP_COLUMNS, key, strict=True)), "flip_rate": _mean(g["flip_rate"]),
         "dangerous_share": float((g["quadrant"] == DANGEROUS).mean()), "n": len(g)}
        for key, g in _groups(ok, GROUP_COLUMNS).items()
    ]
    points = pd.DataFrame(rows, columns=[*GROUP_COLUMNS, "flip_rate", "dangerous_share", "n"])
    finite = np.isfinite(points["flip_rate"].to_numpy(dtype=np.float64))
    out: pd.DataFrame = points.loc[finite].reset_index(drop=True)
    return out


def _correlation_row(scope: str, scope_key: Key, points: pd.DataFrame, rng_key: Key, seed: int,
                     n_boot: int) -> dict[str, Any]:
    x = points["flip_rate"].to_numpy(dtype=np.float64)
    y = points["dangerous_share"].to_numpy(dtype=np.float64)
    row: dict[str, Any] = {"scope": scope, **dict(zip(SCOPE_COLUMNS, scope_key, strict=True)),
                           "n_points": int(x.size), "r": _NAN, "p_value": _NAN, "ci_low": _NAN,
                           "ci_high": _NAN, "fisher_low": _NAN, "fisher_high": _NAN, "note": None}
    if x.size < 3:
        row["note"] = "n_points < 3"
    elif np.ptp(x) == 0 or np.ptp(y) == 0:
        row["note"] = "zero variance"
    else:
        res = pearson_with_ci(x, y, rng=rng_for(seed, "taxonomy", "correlation", *rng_key), n_boot=n_boot)
        row.update(r=res["r"], p_value=res["p"], ci_low=res["ci_low"], ci_high=res["ci_high"],
                   fisher_low=res["fisher_low"], fisher_high=res["fisher_high"])
    return row


def flip_dangerous_correlation(df: pd.DataFrame, seed: int = 0, n_boot: int = 2000) -> pd.DataFrame:
    """Pearson r of mean flip rate (x) with Dangerous share (y) across configurations.

    Points come from :func:`condition_points`. Scope ``condition``: one row per (perturbation,
    level, image_mode) over its (config, dataset) points. Scope ``all``: one row per image_mode
    pooling every (config, dataset, perturbation, level) point (clean included), with
    ``perturbation = 'all'`` and ``level`` NA. Returns :data:`CORRELATION_COLUMNS`: ``r`` in
    [-1, 1], two-sided ``p_value``, percentile bootstrap ``ci_*`` over points and Fisher-z
    ``fisher_*`` (see :func:`medrobust_lib.metrics.stats.pearson_with_ci`). With fewer than 3
    points or a constant x or y, the statistics are NaN and ``note`` says why (else None).
    """
    points = condition_points(df)
    rows = [
        _correlation_row("condition", key, g, key, seed, n_boot)
        for key, g in _groups(points, SCOPE_COLUMNS).items()
    ]
    rows += [
        _correlation_row("all", ("all", None, key[0]), g, ("all", key[0]), seed, n_boot)
        for key, g in _groups(points, ("image_mode",)).items()
    ]
    out = pd.DataFrame(rows, columns=list(CORRELATION_COLUMNS))
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
    "CORRELATION_COLUMNS",
    "GROUP_COLUMNS",
    "QUADRANT_STATS_COLUMNS",
    "TRANSITION_COLUMNS",
    "condition_points",
    "flip_dangerous_correlation",
    "quadrant_stats",
    "transitions",
]
