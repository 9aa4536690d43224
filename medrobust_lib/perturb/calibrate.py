"""Per-image SSIM calibration of perturbation strength (DESIGN.md section 3).

For one (image, type, level) the strength is searched so that SSIM(clean, perturbed) lands in the
level's band. The search starts from a warm start (the dataset-level strength: the median of the
strengths calibrated on a calibration subset), and searches only when that start misses the band.
The search brackets the band between the weakest strength (SSIM >= the top of every band, checked
by the contract tests) and the start or the strongest strength, then narrows the bracket by
regula falsi with the Illinois modification (a bracketing method that never leaves the bracket,
falling back to bisection when interpolation stalls). A band that the strongest strength cannot
reach is flagged with ``band_reached = False`` and the strongest output is kept, never silently
accepted. Integer strengths bracket the band and report the closer side.

The perturbation's random field comes from a Generator recreated from the same key at every
evaluation (common random numbers), so SSIM is a deterministic, monotone function of strength.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from medrobust_lib.perturb.spec import PerturbationSpec, PerturbOutput
from medrobust_lib.perturb.ssim import ssim
from medrobust_lib.seeding import rng_for
from medrobust_lib.types import SSIM_BANDS, BoolMask, Boxes, FloatImage, validate_bands  # noqa: F401

Band = tuple[float, float]
DEFAULT_BANDS: dict[int, Band] = dict(SSIM_BANDS)
MAX_EVALS = 24


@dataclass(frozen=True)
class Calibrated:
    """Outcome of calibrating one (image, type, level)."""

    strength: float
    ssim: float
    band_reached: bool
    n_ssim_evals: int
    output: PerturbOutput


def calibrate(
    spec: PerturbationSpec,
    image: FloatImage,
    band: Band,
    key: Sequence[object],
    *,
    start: float | None = None,
    mask: BoolMask | None = None,
    boxes: Boxes | None = None,
    max_evals: int = MAX_EVALS,
) -> Calibrated:
    """Find a strength whose SSIM lies in ``band`` for this image.

    Args:
        spec: the perturbation type.
        image: float32 (H, W) or (H, W, 3) in [0, 1].
        band: (low, high) SSIM, inclusive.
        key: the random key, e.g. (seed, dataset, sample_id, type); the level is not part of it.
        start: warm-start strength (defaults to the type's default for the band's level, or the
            mid-range when unknown).
        mask, boxes: ground truth moved along with spatial types.
    """
    lo, hi = band
    evals: dict[float, tuple[float, PerturbOutput]] = {}

    shape = image.shape  # the range of a type in pixels grows with the image (spec.scales_with_size)

    def run(s: float) -> float:
        s = spec.clamp(s, shape)
        if s not in evals:
            out = spec.apply(image, s, rng_for(*key), mask=mask, boxes=boxes)
            evals[s] = (ssim(image, out.image), out)
        return evals[s][0]

    def done(s: float, reached: bool) -> Calibrated:
        s = spec.clamp(s, shape)
        value, out = evals[s]
        return Calibrated(s, value, reached, len(evals), out)

    # Work in "severity" coordinates t where larger is always stronger.
    sign = -1.0 if spec.inverse else 1.0
    s0 = spec.clamp(start if start is not None else _default_start(spec, band, shape), shape)
    f0 = run(s0)
    if lo <= f0 <= hi:
        return done(s0, True)
    weak, strong = spec.weakest, spec.strongest_for(shape)
    if f0 > hi:  # too weak: bracket [s0, strongest]
        f_strong = run(strong)
        if f_strong > hi:
            return done(strong, False)
        if f_strong >= lo:
            return done(strong, True)
        a, fa, b, fb = s0, f0, strong, f_strong
    else:  # too strong: bracket [weakest, s0]; SSIM(weakest) >= every band's top (contract)
        a, fa, b, fb = weak, 1.0, s0, f0
    target = 0.5 * (lo + hi)
    side = 0
    while len(evals) < max_evals:
        if spec.integer:
            ta, tb = sign * a, sign * b
            if abs(tb - ta) <= 1:
                break
            # interpolate, then keep strictly inside the integer bracket
            t = ta + (tb - ta) * _frac(fa, fb, target)
            t = min(max(round(t), min(ta, tb) + 1), max(ta, tb) - 1)
            s = sign * t
        else:
            frac = _frac(fa, fb, target)
            s = a + (b - a) * frac
            if abs(b - a) <= 1e-9 * max(1.0, abs(b)):
                break
        f = run(s)
        if lo <= f <= hi:
            return done(s, True)
        if f > hi:  # still too weak: move the weak end
            a, fa = s, f
            if side == -1:
                fb = target + (fb - target) * 0.5  # Illinois step
            side = -1
        else:
            b, fb = s, f
            if side == 1:
                fa = target + (fa - target) * 0.5
            side = 1
    # No evaluated strength lies in the band: report the closer side, flagged.
    best = min(evals, key=lambda s: _distance(evals[s][0], band))
    if best not in evals:
        run(best)
    return done(best, False)


def _frac(fa: float, fb: float, target: float) -> float:
    """Where ``target`` sits between fa (at 0) and fb (at 1), kept inside [0.05, 0.95] so the
    bracket always shrinks."""
    if fa == fb:
        return 0.5
    return float(min(max((fa - target) / (fa - fb), 0.05), 0.95))


def _distance(value: float, band: Band) -> float:
    lo, hi = band
    return 0.0 if lo <= value <= hi else min(abs(value - lo), abs(value - hi))


def _default_start(spec: PerturbationSpec, band: Band, shape: tuple[int, ...] | None = None) -> float:
    for level, b in DEFAULT_BANDS.items():
        if b == band:
            return spec.level_start(level, shape)
    lo, hi = spec.strength_range_for(shape)
    return 0.5 * (lo + hi)


def dataset_strength(
    spec: PerturbationSpec,
    images: Sequence[tuple[FloatImage, Sequence[object]]],
    band: Band,
    start: float | None = None,
    calibrate_fn: Callable[..., Calibrated] = calibrate,
) -> tuple[float, int]:
    """Median calibrated strength over a calibration subset ``[(image, key), ...]`` (the
    dataset-level warm start) and the total SSIM evaluations it cost. Integer types round."""
    strengths, n_evals = [], 0
    for image, key in images:
        c = calibrate_fn(spec, image, band, key, start=start)
        strengths.append(c.strength)
        n_evals += c.n_ssim_evals
    if not strengths:
        return (spec.clamp(start) if start is not None else spec.levels[0]), 0
    largest = max((image.shape for image, _ in images), key=lambda sh: max(sh[:2]))
    return spec.clamp(float(np.median(strengths)), largest), n_evals
