"""Statistics for robustness comparisons (docs/design.md, section 5), plain numpy/scipy.

* Bootstrap CIs over samples: percentile bootstrap, ``n_boot`` resamples drawn at once as an index
  matrix (n_boot, n) from the caller's ``np.random.Generator`` (no global RNG).
* Clean vs perturbed: paired Wilcoxon signed-rank for continuous scores (IoU, Dice),
  McNemar for binary outcomes (correct / wrong).
* Multiple testing: Benjamini-Hochberg q-values across the type x level grid.
* Correlation across configurations: Pearson r with its p-value, a bootstrap CI over points and
  the Fisher-z CI.

Inputs are 1-D array-likes of finite floats (bools for McNemar); NaN raises ``ValueError`` except in
:func:`benjamini_hochberg`, where NaN marks an untested cell.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy import stats as sps

Stat = Callable[..., Any]

WILCOXON_ZERO_METHOD = "wilcox"
"""Zero differences are discarded before ranking (scipy's default ``zero_method='wilcox'``): a
sample whose score did not change carries no sign information. All-zero differences give p = 1.0."""
MCNEMAR_EXACT_BELOW = 25
"""McNemar uses the exact binomial test when the discordant count is below this, else chi-square
with continuity correction."""


def _as_1d(values: npt.ArrayLike, name: str) -> npt.NDArray[np.float64]:
    a = np.asarray(values, dtype=np.float64)
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} contains NaN or infinite values")
    return a


def _as_pair(a: npt.ArrayLike, b: npt.ArrayLike) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    x, y = _as_1d(a, "a"), _as_1d(b, "b")
    if x.shape != y.shape:
        raise ValueError(f"paired samples need equal lengths, got {x.size} and {y.size}")
    return x, y


def _check_alpha(alpha: float, n_boot: int) -> None:
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")


def _stat_rows(stat: Stat, resampled: np.ndarray) -> npt.NDArray[np.float64]:
    """``stat`` of each row of (n_boot, n): vectorised via ``axis=1`` when the callable takes it."""
    try:
        out = np.asarray(stat(resampled, axis=1), dtype=np.float64)
        if out.shape == (resampled.shape[0],):
            return out
    except TypeError:
        pass
    return np.array([stat(row) for row in resampled], dtype=np.float64)


def _percentile_ci(estimate: float, boot: np.ndarray, alpha: float) -> tuple[float, float, float]:
    lo, hi = np.nanquantile(boot, [alpha / 2, 1 - alpha / 2])
    return float(estimate), float(lo), float(hi)


def bootstrap_ci(values: npt.ArrayLike, stat: Stat = np.mean, n_boot: int = 2000, alpha: float = 0.05, *,
                 rng: np.random.Generator) -> tuple[float, float, float]:
    """Percentile bootstrap CI of ``stat`` over samples.

    ``values``: 1-D finite floats (n,). ``stat``: a reducer, called as ``stat(matrix, axis=1)`` when
    it accepts ``axis`` (numpy reducers do), else row by row. Returns ``(estimate, low, high)``
    where ``estimate = stat(values)`` and the bounds are the ``alpha/2`` and ``1 - alpha/2``
    quantiles of the bootstrap distribution. n = 0 gives NaNs; n = 1 a degenerate interval.
    Deterministic for a given generator state.
    """
    _check_alpha(alpha, n_boot)
    x = _as_1d(values, "values")
    n = x.size
    if n == 0:
        return float("nan"), float("nan"), float("nan")
    idx = rng.integers(0, n, size=(n_boot, n))
    return _percentile_ci(float(stat(x)), _stat_rows(stat, x[idx]), alpha)


def paired_bootstrap_ci(a: npt.ArrayLike, b: npt.ArrayLike, stat: Stat = np.mean, n_boot: int = 2000,
                        alpha: float = 0.05, *, rng: np.random.Generator) -> tuple[float, float, float]:
    """Percentile bootstrap CI of ``stat(a - b)`` (default: the mean difference), resampling pairs.

    ``a``, ``b``: 1-D finite floats of equal length (e.g. clean and perturbed IoU per sample, so the
    estimate is the signed drop). Returns ``(estimate, low, high)``.
    """
    x, y = _as_pair(a, b)
    return bootstrap_ci(x - y, stat, n_boot, alpha, rng=rng)


WILCOXON_PERMUTATION_MAX_N = 13
"""``scipy.stats.wilcoxon(method="auto")`` runs an exact permutation test (all 2^n sign flips) for at
most this many differences (zeros counted) when some are zero or tied (above it, the normal
approximation); without zeros and ties, the exact null distribution up to 50 differences, the
normal approximation above."""


def _auto_takes_permutation(d: npt.NDArray[np.float64]) -> bool:
    """Whether scipy's ``method="auto"`` would take its permutation test for the differences ``d``
    (finite, 1-D; ``zero_method="wilcox"``): n <= :data:`WILCOXON_PERMUTATION_MAX_N` and a zero or a
    tie among the nonzero absolute differences (scipy ranks zeros as NaNs, which tie with nothing)."""
    if d.size > WILCOXON_PERMUTATION_MAX_N:
        return False
    nonzero = np.abs(d[d != 0])
    return nonzero.size < d.size or np.unique(nonzero).size < nonzero.size


def _signed_rank_permutation(d: npt.NDArray[np.float64]) -> tuple[float, float]:
    """``(min(R+, R-), two-sided p)`` of the signed-rank test of ``d`` with scipy's exact permutation
    null (``scipy.stats.permutation_test``, ``permutation_type="samples"``: every sign flip), as
    ``scipy.stats.wilcoxon`` computes it for these inputs, with the statistic vectorised over the
    flips instead of called once per flip (2^13 Python calls, about a second per test at n = 13).
    R+ is scipy's sum: (d > 0) times the average rank of |d| among the nonzero differences (a zero
    adds 0), summed along the last axis, so the values, and the p-value, are scipy's."""
    nonzero = d != 0
    ranks = np.zeros(d.size)
    ranks[nonzero] = sps.rankdata(np.abs(d[nonzero]), method="average")

    def r_plus(flipped: npt.NDArray[np.float64], axis: int = -1) -> npt.NDArray[np.float64]:
        return np.sum((np.moveaxis(flipped, axis, -1) > 0).astype(np.float64) * ranks, axis=-1)

    res = sps.permutation_test((d,), r_plus, permutation_type="samples", vectorized=True, n_resamples=9999,
                               alternative="two-sided", axis=-1)
    r_minus = np.sum((d < 0).astype(np.float64) * ranks, axis=-1)
    return float(min(r_plus(d), r_minus)), float(res.pvalue)


def wilcoxon_paired(a: npt.ArrayLike, b: npt.ArrayLike, zero_method: str = WILCOXON_ZERO_METHOD
                    ) -> tuple[float, float]:
    """Two-sided paired Wilcoxon signed-rank test of ``a - b``: ``scipy.stats.wilcoxon``'s result.

    ``zero_method`` defaults to :data:`WILCOXON_ZERO_METHOD` (``"wilcox"``, zeros dropped); scipy's
    ``method="auto"`` picks the exact null, an exact permutation test (small n with zeros or ties:
    computed here through ``scipy.stats.permutation_test`` with a vectorised statistic,
    :func:`_signed_rank_permutation`; equal to scipy's own, ``tests/metrics/test_stats.py``) or the
    normal approximation. Returns ``(statistic, p)``: ``(nan, nan)`` for n < 2 pairs, ``(0.0, 1.0)``
    when every difference is zero.
    """
    x, y = _as_pair(a, b)
    if x.size < 2:
        return float("nan"), float("nan")
    d = x - y
    if not np.any(d != 0):
        return 0.0, 1.0
    if zero_method == "wilcox" and _auto_takes_permutation(d):
        return _signed_rank_permutation(d)
    res = sps.wilcoxon(x, y, zero_method=zero_method, alternative="two-sided")
    return float(res.statistic), float(res.pvalue)


def mcnemar(a_correct: npt.ArrayLike, b_correct: npt.ArrayLike, exact: bool | None = None) -> tuple[float, float]:
    """Two-sided McNemar test for paired binary outcomes (e.g. clean vs perturbed correctness).

    ``a_correct``, ``b_correct``: 1-D bool arrays of equal length. With ``b01`` = #(a right, b wrong)
    and ``b10`` = #(a wrong, b right), only the n = b01 + b10 discordant pairs count.

    * exact (default when n < :data:`MCNEMAR_EXACT_BELOW`): statistic = min(b01, b10), p = the
      two-sided binomial test of b01 successes in n trials at 0.5 (``scipy.stats.binomtest``).
    * otherwise: statistic = (|b01 - b10| - 1)^2 / n (Edwards' continuity correction), p from
      chi-square with 1 degree of freedom.

    ``exact`` forces either. No discordant pairs gives ``(0.0, 1.0)``.
    """
    x = np.asarray(a_correct)
    y = np.asarray(b_correct)
    for name, arr in (("a_correct", x), ("b_correct", y)):
        if arr.dtype != np.bool_:
            raise ValueError(f"{name} must be a bool array, got dtype {arr.dtype}")
        if arr.ndim != 1:
            raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    if x.shape != y.shape:
        raise ValueError(f"paired samples need equal lengths, got {x.size} and {y.size}")
    b01 = int(np.count_nonzero(x & ~y))
    b10 = int(np.count_nonzero(~x & y))
    n = b01 + b10
    if n == 0:
        return 0.0, 1.0
    if exact is None:
        exact = n < MCNEMAR_EXACT_BELOW
    if exact:
        return float(min(b01, b10)), float(sps.binomtest(b01, n, 0.5, alternative="two-sided").pvalue)
    stat = (abs(b01 - b10) - 1.0) ** 2 / n
    return float(stat), float(sps.chi2.sf(stat, 1))


def benjamini_hochberg(pvalues: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """Benjamini-Hochberg adjusted p-values (q-values), same shape as ``pvalues``, float64.

    NaN entries (untested cells) stay NaN and are excluded from m. Equals
    ``scipy.stats.false_discovery_control(p, method="bh")`` on NaN-free input. Raises ValueError for
    p outside [0, 1].
    """
    p = np.asarray(pvalues, dtype=np.float64)
    flat = p.ravel()
    ok = ~np.isnan(flat)
    vals = flat[ok]
    if np.any((vals < 0) | (vals > 1)):
        raise ValueError("p-values must lie in [0, 1]")
    out = np.full(flat.shape, np.nan, np.float64)
    m = vals.size
    if m:
        order = np.argsort(vals, kind="stable")
        ranked = vals[order] * m / np.arange(1, m + 1)
        q = np.minimum.accumulate(ranked[::-1])[::-1]
        adj = np.empty(m, np.float64)
        adj[order] = np.clip(q, 0.0, 1.0)
        out[ok] = adj
    return out.reshape(p.shape)


def pearson_rows(xs: npt.ArrayLike, ys: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """Pearson r of each row pair of (B, n) float matrices -> float64 (B,), clipped to [-1, 1]
    (rounding can put a perfect correlation a hair outside); NaN for a row with zero variance."""
    xs, ys = np.asarray(xs, np.float64), np.asarray(ys, np.float64)
    xc = xs - xs.mean(axis=1, keepdims=True)
    yc = ys - ys.mean(axis=1, keepdims=True)
    den = np.sqrt((xc * xc).sum(axis=1) * (yc * yc).sum(axis=1))
    with np.errstate(invalid="ignore", divide="ignore"):
        r = (xc * yc).sum(axis=1) / den
    r[~(den > 0)] = np.nan
    return np.clip(r, -1.0, 1.0)


def pearson_with_ci(x: npt.ArrayLike, y: npt.ArrayLike, rng: np.random.Generator, n_boot: int = 2000,
                    alpha: float = 0.05) -> dict[str, float | int]:
    """Pearson correlation of paired points with two CIs.

    ``x``, ``y``: 1-D finite floats of equal length n (e.g. one point per configuration). Returns
    ``{"r", "p", "n", "ci_low", "ci_high", "fisher_low", "fisher_high"}``: r and the two-sided p
    from ``scipy.stats.pearsonr``; ``ci_*`` the percentile bootstrap over points (resamples with
    zero variance are ignored); ``fisher_*`` the Fisher-z interval tanh(atanh(r) +- z_{1-alpha/2} /
    sqrt(n - 3)) (NaN for n <= 3). Everything but n is NaN for n < 3 or constant input.
    """
    _check_alpha(alpha, n_boot)
    a, b = _as_pair(x, y)
    n = int(a.size)
    nan = float("nan")
    out: dict[str, float | int] = {"r": nan, "p": nan, "n": n, "ci_low": nan, "ci_high": nan,
                                   "fisher_low": nan, "fisher_high": nan}
    if n < 3 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return out
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sps.ConstantInputWarning)
        res = sps.pearsonr(a, b)
    r = float(res.statistic)
    out["r"], out["p"] = r, float(res.pvalue)
    idx = rng.integers(0, n, size=(n_boot, n))
    boot = pearson_rows(a[idx], b[idx])
    if np.any(np.isfinite(boot)):
        lo, hi = np.nanquantile(boot, [alpha / 2, 1 - alpha / 2])
        out["ci_low"], out["ci_high"] = float(lo), float(hi)
    if n > 3:
        zc = float(sps.norm.ppf(1 - alpha / 2))
        with np.errstate(divide="ignore"):
            z = np.arctanh(np.clip(r, -1.0, 1.0))
        half = zc / np.sqrt(n - 3)
        out["fisher_low"], out["fisher_high"] = float(np.tanh(z - half)), float(np.tanh(z + half))
    return out
