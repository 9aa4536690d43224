"""Conformance (against scipy) and behaviour tests for the statistics helpers."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from medrobust_lib.metrics import stats as stats_module
from medrobust_lib.metrics.stats import (
    benjamini_hochberg,
    bootstrap_ci,
    mcnemar,
    paired_bootstrap_ci,
    pearson_rows,
    pearson_with_ci,
    wilcoxon_paired,
)


# ---- bootstrap -------------------------------------------------------------------------------
def test_bootstrap_ci_contains_true_mean_of_large_normal_sample() -> None:
    x = np.random.default_rng(0).normal(3.0, 2.0, size=5000)
    est, lo, hi = bootstrap_ci(x, rng=np.random.default_rng(1))
    assert est == pytest.approx(x.mean())
    assert lo < 3.0 < hi
    assert lo < est < hi
    # Percentile bootstrap of the mean ~ normal interval mean +- 1.96 s / sqrt(n).
    assert hi - lo == pytest.approx(2 * 1.96 * x.std(ddof=1) / np.sqrt(x.size), rel=0.1)


def test_bootstrap_ci_is_deterministic_under_the_same_generator() -> None:
    x = np.random.default_rng(2).random(100)
    a = bootstrap_ci(x, n_boot=500, rng=np.random.default_rng(7))
    b = bootstrap_ci(x, n_boot=500, rng=np.random.default_rng(7))
    c = bootstrap_ci(x, n_boot=500, rng=np.random.default_rng(8))
    assert a == b
    assert a != c


def test_bootstrap_ci_width_shrinks_with_n() -> None:
    rng = np.random.default_rng(3)
    widths = []
    for n in (20, 200, 2000):
        _, lo, hi = bootstrap_ci(rng.normal(size=n), rng=np.random.default_rng(0))
        widths.append(hi - lo)
    assert widths[0] > widths[1] > widths[2]


def test_bootstrap_ci_other_statistics_and_edge_cases() -> None:
    x = np.random.default_rng(4).exponential(size=301)
    est, lo, hi = bootstrap_ci(x, stat=np.median, n_boot=300, rng=np.random.default_rng(0))
    assert est == pytest.approx(np.median(x)) and lo <= est <= hi
    # A callable without an axis argument falls back to row-by-row evaluation.
    est2, lo2, hi2 = bootstrap_ci(x, stat=lambda v: float(np.median(v)), n_boot=300, rng=np.random.default_rng(0))
    assert (est2, lo2, hi2) == pytest.approx((est, lo, hi))
    assert all(math.isnan(v) for v in bootstrap_ci([], rng=np.random.default_rng(0)))
    assert bootstrap_ci([0.5], rng=np.random.default_rng(0)) == (0.5, 0.5, 0.5)
    with pytest.raises(ValueError, match="NaN"):
        bootstrap_ci([1.0, float("nan")], rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="alpha"):
        bootstrap_ci([1.0, 2.0], alpha=1.5, rng=np.random.default_rng(0))


def test_paired_bootstrap_is_the_bootstrap_of_differences() -> None:
    rng = np.random.default_rng(5)
    clean = rng.random(80)
    pert = clean - 0.1 + 0.05 * rng.normal(size=80)
    est, lo, hi = paired_bootstrap_ci(clean, pert, rng=np.random.default_rng(0))
    assert (est, lo, hi) == bootstrap_ci(clean - pert, rng=np.random.default_rng(0))
    assert lo < 0.1 < hi and lo > 0
    with pytest.raises(ValueError, match="equal lengths"):
        paired_bootstrap_ci(clean, pert[:-1], rng=np.random.default_rng(0))


# ---- Wilcoxon --------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [8, 30, 120])
def test_wilcoxon_matches_scipy(n: int) -> None:
    rng = np.random.default_rng(n)
    a = rng.random(n)
    b = a - 0.05 + 0.1 * rng.normal(size=n)
    b[:2] = a[:2]  # some zero differences
    ref = sps.wilcoxon(a, b, zero_method="wilcox")
    assert wilcoxon_paired(a, b) == (pytest.approx(ref.statistic), pytest.approx(ref.pvalue))


def _small_cases() -> list[tuple[np.ndarray, np.ndarray]]:
    """Pairs of 2-16 scores (below, at and above scipy's permutation cut-off of 13) with zeros,
    ties, both, or neither among the differences; scores rounded like IoUs of small masks, so ties
    are common."""
    rng = np.random.default_rng(7)
    cases = []
    for n in range(2, 17):
        for kind in ("zeros", "ties", "both", "neither", "all_one_sign"):
            a = np.round(rng.random(n), 3)
            d = np.round(rng.normal(0.02, 0.05, n), 3) if kind != "neither" else rng.normal(0.02, 0.05, n)
            if kind == "all_one_sign":
                d = np.abs(d) + 0.001
            if kind in ("zeros", "both"):
                d[: max(1, n // 4)] = 0.0
            if kind in ("ties", "both") and n >= 3:
                d[-1] = -d[-2] if d[-2] != 0 else 0.01
                d[-2] = d[-2] if d[-2] != 0 else -0.01
            cases.append((a, a - d))
    return cases


def test_wilcoxon_equals_scipy_exactly_on_small_samples_with_zeros_and_ties() -> None:
    """The vectorised permutation path (n <= 13 with zeros or ties) and every other path give
    scipy.stats.wilcoxon's statistic and p-value exactly; the permutation path was taken."""
    permutation = 0
    for a, b in _small_cases():
        if not np.any(a - b != 0):
            continue
        ref = sps.wilcoxon(a, b, zero_method="wilcox", alternative="two-sided")
        d = a - b
        permutation += stats_module._auto_takes_permutation(d)
        assert wilcoxon_paired(a, b) == (float(ref.statistic), float(ref.pvalue)), (a, b)
    assert permutation >= 30  # the cases exercise the fast path, not only scipy's own call


def test_wilcoxon_edge_cases() -> None:
    assert wilcoxon_paired([1.0, 2.0, 3.0], [1.0, 2.0, 3.0]) == (0.0, 1.0)
    s, p = wilcoxon_paired([1.0], [0.0])
    assert math.isnan(s) and math.isnan(p)


# ---- McNemar ---------------------------------------------------------------------------------
def _pairs(b01: int, b10: int, both_right: int = 7, both_wrong: int = 3) -> tuple[np.ndarray, np.ndarray]:
    a = np.array([True] * b01 + [False] * b10 + [True] * both_right + [False] * both_wrong)
    b = np.array([False] * b01 + [True] * b10 + [True] * both_right + [False] * both_wrong)
    return a, b


@pytest.mark.parametrize(("b01", "b10"), [(0, 5), (3, 9), (12, 12), (1, 0)])
def test_mcnemar_exact_equals_binomtest_on_discordant_pairs(b01: int, b10: int) -> None:
    a, b = _pairs(b01, b10)
    stat, p = mcnemar(a, b)
    assert stat == min(b01, b10)
    assert p == pytest.approx(sps.binomtest(b01, b01 + b10, 0.5, alternative="two-sided").pvalue)


def test_mcnemar_chi_square_known_answer() -> None:
    # Wikipedia's McNemar example: discordant cells b = 121, c = 59.
    a, b = _pairs(121, 59, both_right=101, both_wrong=33)
    stat, p = mcnemar(a, b)
    assert stat == pytest.approx((abs(121 - 59) - 1) ** 2 / 180)  # 20.672...
    assert stat == pytest.approx(20.6722, abs=1e-4)
    assert p == pytest.approx(math.erfc(math.sqrt(stat / 2)))  # chi-square(1) survival function
    assert p == pytest.approx(5.45e-6, rel=0.01)
    # Forcing the exact test is allowed at any size.
    assert mcnemar(a, b, exact=True)[1] == pytest.approx(sps.binomtest(121, 180).pvalue)


def test_mcnemar_no_discordant_pairs_and_validation() -> None:
    a, b = _pairs(0, 0)
    assert mcnemar(a, b) == (0.0, 1.0)
    with pytest.raises(ValueError, match="bool"):
        mcnemar(np.ones(3), np.ones(3))
    with pytest.raises(ValueError, match="equal lengths"):
        mcnemar(np.ones(3, bool), np.ones(4, bool))


# ---- Benjamini-Hochberg ----------------------------------------------------------------------
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bh_equals_scipy_false_discovery_control(seed: int) -> None:
    rng = np.random.default_rng(seed)
    p = np.concatenate([rng.random(40), rng.random(10) * 1e-3, [0.0, 1.0, 0.5, 0.5]])
    rng.shuffle(p)
    np.testing.assert_allclose(benjamini_hochberg(p), sps.false_discovery_control(p, method="bh"), rtol=1e-12)


def test_bh_is_nan_aware_and_keeps_shape() -> None:
    rng = np.random.default_rng(3)
    grid = rng.random((5, 4)) * 0.1
    grid[1, 2] = np.nan
    grid[4, 0] = np.nan
    q = benjamini_hochberg(grid)
    assert q.shape == grid.shape
    assert np.isnan(q[1, 2]) and np.isnan(q[4, 0]) and np.isfinite(q).sum() == 18
    ok = ~np.isnan(grid)
    np.testing.assert_allclose(q[ok], sps.false_discovery_control(grid[ok], method="bh"), rtol=1e-12)
    assert np.all(np.isnan(benjamini_hochberg([np.nan, np.nan])))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        benjamini_hochberg([0.1, 1.2])


# ---- Pearson ---------------------------------------------------------------------------------
def test_pearson_with_ci_matches_scipy_and_has_sane_intervals() -> None:
    rng = np.random.default_rng(6)
    x = rng.normal(size=40)
    y = 0.6 * x + 0.8 * rng.normal(size=40)
    out = pearson_with_ci(x, y, np.random.default_rng(0), n_boot=1000)
    ref = sps.pearsonr(x, y)
    assert out["n"] == 40
    assert out["r"] == pytest.approx(ref.statistic) and out["p"] == pytest.approx(ref.pvalue)
    assert out["ci_low"] < out["r"] < out["ci_high"]
    half = 1.959963984540054 / math.sqrt(40 - 3)
    assert out["fisher_low"] == pytest.approx(math.tanh(math.atanh(out["r"]) - half))
    assert out["fisher_high"] == pytest.approx(math.tanh(math.atanh(out["r"]) + half))
    again = pearson_with_ci(x, y, np.random.default_rng(0), n_boot=1000)
    assert again == out


def test_pearson_rows_matches_scipy_row_by_row_and_stays_in_range() -> None:
    """The one row-wise Pearson r (the bootstrap's and the taxonomy's pooled r): scipy's r on every
    row, NaN on a constant row, and a perfectly (anti-)collinear row within [-1, 1] (clipped)."""
    rng = np.random.default_rng(7)
    x = rng.normal(size=(6, 25))
    y = 0.5 * x + rng.normal(size=(6, 25))
    got = pearson_rows(x, y)
    assert got.shape == (6,) and got.dtype == np.float64
    assert got == pytest.approx([sps.pearsonr(a, b).statistic for a, b in zip(x, y, strict=True)], abs=1e-12)
    line = np.array([[0.1, 0.2, 0.3, 0.7, 1.3], [0.1, 0.2, 0.3, 0.7, 1.3], [1.0, 1.0, 1.0, 1.0, 1.0]])
    r = pearson_rows(line, np.stack([3.0 * line[0] + 0.1, -7.0 * line[1], line[1]]))
    assert r[0] == pytest.approx(1.0) and r[1] == pytest.approx(-1.0) and math.isnan(r[2])
    assert np.all(np.abs(r[:2]) <= 1.0)


def test_pearson_with_ci_degenerate_inputs() -> None:
    small = pearson_with_ci([1.0, 2.0], [2.0, 1.0], np.random.default_rng(0))
    assert small["n"] == 2 and math.isnan(small["r"]) and math.isnan(small["ci_low"])
    const = pearson_with_ci([1.0, 1.0, 1.0, 1.0, 1.0], [1.0, 2.0, 3.0, 4.0, 5.0], np.random.default_rng(0))
    assert math.isnan(const["r"]) and math.isnan(const["p"])
