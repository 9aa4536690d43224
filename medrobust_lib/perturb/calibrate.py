"""Per-image SSIM calibration of perturbation strength (docs/design.md, section 3).

For one (image, type, level) the strength is searched so that SSIM(clean, perturbed) lands in the
level's band; every returned output has been evaluated and checked against the band.

Model. In severity coordinates ``t = (s - weakest) / (strongest - weakest)`` (0 = weakest,
1 = strongest, whatever the type's unit or direction) the distortion ``d = log(1 - SSIM)`` of one
image is modelled as ``d = a_image + slope * log(t)``: one shape parameter per (dataset, type,
level), one offset per image. :func:`warm_start` fits the slope on the calibration subset (pooled
within-image regression over the strengths their searches evaluated) and picks the strength in the
stretch of severity that the most subset images have in band (:func:`fit_warm_start`).

Search (:func:`calibrate`). The first strength is the warm start. On a miss, the model predicts the
strength for the band's centre from the image's own SSIM (its offset) and the fitted slope; that
second guess lands in the band for most images. If it misses on the too-weak side again, the
strongest strength is tried (a band it cannot reach is flagged ``band_reached = False`` and the
strongest output kept, never silently accepted). Once the band is bracketed (by evaluated
strengths, or by the weakest strength, whose SSIM is >= the top of every band by the contract
tests) the bracket is narrowed by regula falsi in the model's coordinates ``(log t, d)``, kept
strictly inside the bracket, with a bisection step whenever the same end moved twice in a row
(so the bracket at least halves every two steps). Integer strengths bracket the band and report
the closer side, flagged.

Known points (:func:`calibrate`'s ``known``). SSIM is one function of strength at every level (the
key has no level), so points already evaluated on the image elsewhere (its calibrated point at the
suite's previous level, its calibration-subset search) set the first strength
(:func:`first_strength`: a known strength in the band, else the model's step inside their
bracket, else the prediction from the nearest with the warm start's ``anchor_slope``) and the
initial bracket; they are not counted, and the returned output is always one evaluated here.

The perturbation's random field comes from a Generator recreated from the same key at every
evaluation (common random numbers), so SSIM is a deterministic, monotone function of strength.
The clean image's half of SSIM is computed once per search (:class:`SSIMReference`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass

import numpy as np

from medrobust_lib.perturb.spec import PerturbationSpec, PerturbOutput
from medrobust_lib.perturb.ssim import SSIMReference
from medrobust_lib.seeding import rng_for
from medrobust_lib.types import SSIM_BANDS, BoolMask, Boxes, FloatImage, validate_bands  # noqa: F401

Band = tuple[float, float]
DEFAULT_BANDS: dict[int, Band] = dict(SSIM_BANDS)
MAX_EVALS = 24
DEFAULT_SLOPE = 1.0
"""The model's slope when the calibration subset gave none (no image with two usable points)."""
SLOPE_RANGE = (0.25, 4.0)
"""A fitted slope is clipped into this range (a guess outside it would only cost evaluations)."""
_MIN_DISTORTION = 1e-6


@dataclass(frozen=True)
class Calibrated:
    """Outcome of calibrating one (image, type, level). ``points``: every evaluated
    (strength, SSIM), in evaluation order."""

    strength: float
    ssim: float
    band_reached: bool
    n_ssim_evals: int
    output: PerturbOutput
    points: tuple[tuple[float, float], ...] = ()


@dataclass(frozen=True)
class WarmStart:
    """The fitted start of one (dataset, type, level): the first strength tried on every image,
    the model's slope (``d log(1 - SSIM) / d log t``) and the SSIM evaluations the fit cost.
    ``anchor_slope``: the slope that carries an image's own point at the neighbouring, already
    calibrated level (its anchor) to this band (fitted on the subset's anchors; None without
    anchors): with it, an image that has an anchor starts from its own predicted strength."""

    strength: float
    slope: float
    n_evals: int
    anchor_slope: float | None = None


def severity(spec: PerturbationSpec, s: float) -> float:
    """Strength -> severity ``t`` in [0, 1] (0 = weakest, 1 = strongest)."""
    return (s - spec.weakest) / (spec.strongest - spec.weakest)


def strength_at(spec: PerturbationSpec, t: float) -> float:
    """Severity -> strength (clamped, rounded for integer types)."""
    return spec.clamp(spec.weakest + t * (spec.strongest - spec.weakest))


def distortion(value: float) -> float:
    """The model's response ``log(1 - SSIM)`` (SSIM >= 1 - 1e-6 counts as 1 - 1e-6)."""
    return math.log(max(1.0 - value, _MIN_DISTORTION))


def predict_severity(t: float, value: float, target: float, slope: float) -> float:
    """Severity at which an image whose SSIM is ``value`` at severity ``t`` > 0 reaches
    ``target``, under the model (may exceed 1)."""
    return t * math.exp((distortion(target) - distortion(value)) / slope)


def calibrate(
    spec: PerturbationSpec,
    image: FloatImage,
    band: Band,
    key: Sequence[object],
    *,
    start: float | None = None,
    warm: WarmStart | None = None,
    mask: BoolMask | None = None,
    boxes: Boxes | None = None,
    max_evals: int = MAX_EVALS,
    known: Sequence[tuple[float, float]] = (),
) -> Calibrated:
    """Find a strength whose SSIM lies in ``band`` for this image.

    Args:
        spec: the perturbation type.
        image: float32 (H, W) or (H, W, 3) in [0, 1].
        band: (low, high) SSIM, inclusive.
        key: the random key, e.g. (seed, dataset, sample_id, type); the level is not part of it.
        start: first strength when ``warm`` is None (defaults to the type's default for the
            band's level, or the mid-range when unknown).
        warm: the fitted warm start (:func:`warm_start`): its strength is tried first and its
            slope guides the search.
        mask, boxes: ground truth moved along with spatial types.
        known: (strength, SSIM) points of this image under the same key already evaluated
            elsewhere (its anchor at the neighbouring level, its calibration-subset search): SSIM
            is one function of strength for every level, so they set the first strength
            (:func:`first_strength`) and the initial bracket; they are not counted in
            ``n_ssim_evals`` and the returned output is always one evaluated here.
    """
    spec = spec.for_shape(image.shape)  # a type in pixels searches the image's own (stretched) range
    reference = SSIMReference(image)
    evals: dict[float, tuple[float, PerturbOutput]] = {}
    shape = image.shape  # the range of a type in pixels grows with the image (spec.scales_with_size)

    def run(s: float) -> float:
        if s not in evals:
            out = spec.apply(image, s, rng_for(*key), mask=mask, boxes=boxes)
            evals[s] = (reference(out.image), out)
        return evals[s][0]

    steps = search(spec, band, first_strength(spec, band, start, warm, known, shape),
                   warm.slope if warm is not None else DEFAULT_SLOPE, max_evals, shape, known)
    s = next(steps)
    try:
        while True:
            s = steps.send(run(s))
    except StopIteration as stop:
        s, reached = stop.value  # a strength it yielded, so one evaluated
    value, out = evals[s]
    return Calibrated(s, value, reached, len(evals), out, tuple((k, v[0]) for k, v in evals.items()))


def first_strength(spec: PerturbationSpec, band: Band, start: float | None, warm: WarmStart | None,
                   known: Sequence[tuple[float, float]] = (), shape: tuple[int, ...] | None = None) -> float:
    """The first strength :func:`calibrate` tries (clamped). From the image's ``known`` points,
    when they say something: a known strength in the band (the one nearest its centre); else,
    with known points on both sides, the bracket's model step; else, from the known point nearest
    the band, the strength the model predicts for the band's centre (with the warm start's
    ``anchor_slope``, or its slope). Otherwise the warm start's strength, else ``start``, else the
    type's default for the band's level (the mid-range when the band is not a default one)."""
    lo, hi = band
    target = 0.5 * (lo + hi)
    pts = {spec.clamp(s, shape): v for s, v in known}  # apply clamps: SSIM at s is SSIM at clamp(s)
    if pts:
        inside = [s for s, v in pts.items() if lo <= v <= hi]
        if inside:
            return min(inside, key=lambda s: (abs(distortion(pts[s]) - distortion(target)), s))
        sev = [(severity(spec, s), v) for s, v in pts.items()]
        weak, strong = _known_bracket(sev, band)
        slope = DEFAULT_SLOPE if warm is None else warm.anchor_slope or warm.slope
        if strong is not None and weak[0] > 0.0:
            return spec.clamp(strength_at(spec, _inside(weak, strong, target, slope, False)), shape)
        if warm is None or warm.anchor_slope is not None:  # one side only: a prediction over levels
            usable = [p for p in sev if p[0] > 0.0 and p[1] < 1.0 - _MIN_DISTORTION]
            if usable:
                t, v = min(usable, key=lambda p: abs(distortion(p[1]) - distortion(target)))
                return spec.clamp(strength_at(spec, min(predict_severity(t, v, target, slope), 1.0)), shape)
    if warm is not None:
        return spec.clamp(warm.strength)
    return spec.clamp(start if start is not None else _default_start(spec, band))


def _known_bracket(pts: Sequence[tuple[float, float]], band: Band
                   ) -> tuple[tuple[float, float], tuple[float, float] | None]:
    """The tightest bracket of the band among known ``(t, SSIM)`` points: the strongest point above
    the band (else the unevaluated weakest, ``(0, 1)``) and the weakest point below it (None)."""
    lo, hi = band
    above = [p for p in pts if p[1] > hi]
    below = [p for p in pts if p[1] < lo]
    weak = max(above, key=lambda p: (p[0], -p[1])) if above else (0.0, 1.0)
    strong = min(below, key=lambda p: (p[0], -p[1])) if below else None
    return weak, strong


def search(spec: PerturbationSpec, band: Band, s0: float, slope: float = DEFAULT_SLOPE, max_evals: int = MAX_EVALS,
           shape: tuple[int, ...] | None = None, known: Sequence[tuple[float, float]] = ()
           ) -> Generator[float, float, tuple[float, bool]]:
    """The band search of :func:`calibrate` as a generator, apart from how the SSIM is computed, so
    the CPU engine and the device engine (which runs many searches in lock-step,
    :mod:`medrobust_lib.perturb.torch_engine`) take the same steps: it yields each strength to
    evaluate (clamped for an image of ``shape``, never one yielded before), is sent that
    strength's SSIM, and returns ``(strength, band_reached)`` (the strength is one it yielded).
    ``spec`` is the type as seen on the image (``spec.for_shape(shape)``). ``known``: (strength,
    SSIM) points of the image evaluated elsewhere (:func:`calibrate`); after a miss of the first
    strength they tighten the bracket (not yielded unless chosen, not counted)."""
    lo, hi = band
    target = 0.5 * (lo + hi)
    evals: dict[float, float] = {}

    def run(s: float) -> Generator[float, float, float]:
        s = spec.clamp(s, shape)
        if s not in evals:
            evals[s] = yield s
        return evals[s]

    s0 = spec.clamp(s0, shape)
    f0 = yield from run(s0)
    if lo <= f0 <= hi:
        return s0, True
    # The bracket in severity: the weak end (SSIM above the band; the weakest strength, not
    # evaluated, is the initial one) and the strong end (SSIM below the band), as (t, SSIM).
    t0 = severity(spec, s0)
    seen = [(severity(spec, spec.clamp(s, shape)), v) for s, v in known]
    weak, strong = _known_bracket([*seen, (t0, f0)], band)
    # a second known point above the band, weaker than the weak end: the image's own slope (secant)
    weaker = max((p for p in seen if 0.0 < p[0] < weak[0] and weak[1] < p[1] < 1.0 - _MIN_DISTORTION),
                 default=None)
    extrapolated = False
    moved = 0  # +1 when the weak end moved last, -1 the strong end
    bisect = False
    while len(evals) < max_evals:
        if strong is None:  # too weak so far: extrapolate once by the model, then the strongest
            tw, fw = weak
            if tw >= 1.0:  # the strongest strength cannot reach the band (known, or just evaluated)
                s = spec.clamp(spec.strongest, shape)
                f = yield from run(s)  # a known point is evaluated once here: the output is one evaluated
                return s, lo <= f <= hi
            t = 1.0
            if not extrapolated and tw > 0.0:
                t = min(predict_severity(tw, fw, target, _secant(weaker, weak) if weaker else slope), 1.0)
                extrapolated = True
        else:
            t = _inside(weak, strong, target, slope, bisect)
        s = strength_at(spec, t)
        if spec.integer:
            inside = _integer_inside(spec, s, weak[0], None if strong is None else strong[0])
            if inside is None:
                break
            s = inside
        elif strong is not None and abs(strong[0] - weak[0]) <= 1e-9:
            break
        if s in evals:  # nothing new to learn (a rounding or clamping fixed point)
            break
        f = yield from run(s)
        if lo <= f <= hi:
            return spec.clamp(s, shape), True
        t = severity(spec, s)
        bisect = False
        if f > hi:
            weak = (t, f)
            bisect = moved == 1
            moved = 1
        else:
            strong = (t, f)
            bisect = moved == -1
            moved = -1
    return (yield from _closer_side(run, evals, {spec.clamp(s, shape): v for s, v in known}, band))


def _closer_side(run: Callable[[float], Generator[float, float, float]], evals: dict[float, float],
                 held: dict[float, float], band: Band) -> Generator[float, float, tuple[float, bool]]:
    """The end of a :func:`search` whose evaluated strengths all missed ``band``: the closer side,
    flagged. A known point (``held``: clamped strength -> SSIM) closer to the band than every
    evaluated one (integer types: both sides known, no integer between) is evaluated first, so the
    closer side is reported and the output is one evaluated in this search."""
    best = min(evals, key=lambda s: _distance(evals[s], band))
    nearer = [s for s, v in held.items() if s not in evals and _distance(v, band) < _distance(evals[best], band)]
    if nearer:
        yield from run(min(nearer, key=lambda s: (_distance(held[s], band), s)))
        best = min(evals, key=lambda s: _distance(evals[s], band))
    return best, band[0] <= evals[best] <= band[1]


def miss_reason(spec: PerturbationSpec, shape: tuple[int, ...], c: Calibrated, band: Band) -> str | None:
    """Why a calibrated output of an image of ``shape`` missed ``band`` (None when it is in band):
    ``unreachable`` when it is the strongest admissible output for that image
    (``spec.strongest_for(shape)``) and its SSIM is still above the band (no strength of the type
    reaches the band on this image), else ``bracket`` (the search ended on the closer side)."""
    if c.band_reached:
        return None
    return "unreachable" if c.strength == spec.strongest_for(shape) and c.ssim > band[1] else "bracket"


def _inside(weak: tuple[float, float], strong: tuple[float, float], target: float, slope: float,
            bisect: bool) -> float:
    """Next severity strictly inside the bracket ``(weak, strong)``: regula falsi in the model's
    coordinates (from the strong end with the fitted slope while the weak end is the unevaluated
    weakest), kept within the middle 90 % of the bracket; the midpoint when ``bisect``."""
    (tw, fw), (ts, fs) = weak, strong
    if bisect:
        return 0.5 * (tw + ts)
    if tw <= 0.0 or fw >= 1.0:
        t = predict_severity(ts, fs, target, slope)
    else:
        dw, ds, dt = distortion(fw), distortion(fs), distortion(target)
        frac = 0.5 if ds == dw else (dt - dw) / (ds - dw)
        t = math.exp(math.log(tw) + frac * (math.log(ts) - math.log(tw)))
    lo_t, hi_t = tw + 0.05 * (ts - tw), tw + 0.95 * (ts - tw)
    return min(max(t, lo_t), hi_t)


def _secant(a: tuple[float, float], b: tuple[float, float]) -> float:
    """The model's slope through two (t, SSIM) points (t > 0, distinct), clipped to
    :data:`SLOPE_RANGE` (:data:`DEFAULT_SLOPE` when they give none)."""
    dx = math.log(b[0]) - math.log(a[0])
    dy = distortion(b[1]) - distortion(a[1])
    if dx == 0.0 or dy / dx <= 0.0:
        return DEFAULT_SLOPE
    return float(min(max(dy / dx, SLOPE_RANGE[0]), SLOPE_RANGE[1]))


def _integer_inside(spec: PerturbationSpec, s: float, tw: float, ts: float | None) -> float | None:
    """For integer types: ``s`` moved strictly inside the integer bracket between the weak end
    and the strong end (the strongest when there is none yet); None when no integer is left."""
    sign = -1.0 if spec.inverse else 1.0
    a = sign * strength_at(spec, tw)
    b = sign * (strength_at(spec, ts) if ts is not None else spec.strongest)
    if ts is None:
        # only the weak end is known: anything stronger than it, up to the strongest, is allowed
        return None if b <= a else sign * min(max(sign * s, a + 1), b)
    if b - a <= 1:
        return None
    return sign * min(max(sign * s, a + 1), b - 1)


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
    return spec.clamp(float(np.median(strengths))), n_evals


def warm_start(
    spec: PerturbationSpec,
    images: Sequence[tuple[FloatImage, Sequence[object]]],
    band: Band,
    start: float | None = None,
    anchors: Sequence[tuple[float, float] | None] | None = None,
) -> WarmStart:
    """Fit the model on a calibration subset ``[(image, key), ...]`` (:func:`warm_start_runs`)."""
    return warm_start_runs(spec, images, band, start, anchors)[0]


def warm_start_runs(
    spec: PerturbationSpec,
    images: Sequence[tuple[FloatImage, Sequence[object]]],
    band: Band,
    start: float | None = None,
    anchors: Sequence[tuple[float, float] | None] | None = None,
) -> tuple[WarmStart, list[Calibrated]]:
    """Fit the model on a calibration subset ``[(image, key), ...]``: each image is calibrated
    from ``start`` (the default search), or, when ``anchors[i]`` gives the image's calibrated
    (strength, SSIM) at the neighbouring level, from the strength that point predicts; the fit is
    :func:`fit_warm_start`. Returns the warm start and the subset's searches (their points are
    known points of those images for their own searches). Without images: ``start`` (or level 1's
    default), no evaluations."""
    if not images:
        return WarmStart(spec.clamp(start) if start is not None else spec.levels[0], DEFAULT_SLOPE, 0), []
    anchors = list(anchors) if anchors is not None else [None] * len(images)
    spec = spec.for_shape(max((image.shape for image, _ in images), key=lambda sh: max(sh[:2])))
    runs = [calibrate(spec, image, band, key, start=start, known=(a,) if a is not None else ())
            for (image, key), a in zip(images, anchors, strict=True)]
    return fit_warm_start(spec, [(c.strength, c.points, c.n_ssim_evals) for c in runs], band, anchors), runs


def fit_warm_start(spec: PerturbationSpec, runs: Sequence[tuple[float, Sequence[tuple[float, float]], int]],
                   band: Band, anchors: Sequence[tuple[float, float] | None] | None = None) -> WarmStart:
    """The fit of :func:`warm_start` from the calibration subset's searches, each given as (its
    calibrated strength, its evaluated (strength, SSIM) points, its SSIM evaluations); ``spec`` is
    the type as seen on the subset's largest image. Shared by the CPU and the device engine.

    Each subset image's in-band interval of severity is predicted from its point nearest the
    band's centre and the fitted slope; the first strength is the geometric middle of the stretch
    that the most intervals cover (ties: the stretch nearest the median of the images' predicted
    centres), so the first evaluation lands in band for as many subset images as the model allows
    (the median of the centres alone can fall outside the narrow bands of every image).

    ``anchors``: each subset image's (strength, SSIM) at the neighbouring level (None where it has
    none). The anchor slope is chosen the same way: each image admits the interval of slopes that
    carry its anchor into its in-band interval; the slope is the middle of the stretch (in log
    slope) the most images admit. None without a usable anchor, or when fewer subset images admit
    it than have the common first strength in their in-band interval (then every image starts
    from the common strength)."""
    lo, hi = band
    target = 0.5 * (lo + hi)
    slope = fit_slope([points for _, points, _ in runs], spec)
    anchors = list(anchors) if anchors is not None else [None] * len(runs)
    centres: list[float] = []
    intervals: list[tuple[float, float]] = []
    g_centres: list[float] = []  # log(1 / anchor slope) per image: its anchor carried to its centre
    g_intervals: list[tuple[float, float]] = []
    for (strength, points, _), anchor in zip(runs, anchors, strict=True):
        usable = [(severity(spec, s), v) for s, v in points if severity(spec, s) > 0.0]
        if not usable:
            centres.append(severity(spec, strength))
            continue
        t, v = min(usable, key=lambda p: abs(distortion(p[1]) - distortion(target)))
        centre = min(predict_severity(t, v, target, slope), 1.0)
        centres.append(centre)
        a, b = predict_severity(t, v, hi, slope), predict_severity(t, v, lo, slope)
        if a < 1.0:
            intervals.append((math.log(max(a, 1e-12)), math.log(min(b, 1.0))))
        gains = _anchor_gains(spec, anchor, target, (centre, a, b))
        if gains is not None:
            g_centres.append(gains[0])
            if gains[1] is not None:
                g_intervals.append(gains[1])
    median = float(np.median(centres))
    best = _most_covered(intervals, math.log(median)) if median > 0.0 and len(intervals) >= 2 else None
    t0 = math.exp(best) if best is not None else median
    anchor_slope = None
    if g_centres:
        g_median = float(np.median(g_centres))
        g_best = _most_covered(g_intervals, g_median) if len(g_intervals) >= 2 else None
        g = g_best if g_best is not None else g_median
        # the anchors serve only where they land at least as many subset images in band as the
        # common strength does (in a type's severity coordinates the model can fit levels badly,
        # e.g. JPEG quality, whose strong levels all lie near t = 1)
        if t0 <= 0.0 or _coverage(g_intervals, g) >= _coverage(intervals, math.log(t0)):
            anchor_slope = float(min(max(1.0 / math.exp(g), SLOPE_RANGE[0]), SLOPE_RANGE[1]))
    return WarmStart(strength_at(spec, t0), slope, sum(n for _, _, n in runs), anchor_slope)


def _anchor_gains(spec: PerturbationSpec, anchor: tuple[float, float] | None, target: float,
                  ts: tuple[float, float, float]) -> tuple[float, tuple[float, float] | None] | None:
    """For one subset image, with its anchor (strength, SSIM) and its predicted (centre, weak edge,
    strong edge) severities of the band: the log gain (log of 1 / slope) that carries the anchor
    to the centre, and the interval of log gains that carry it into the band (None when the band's
    edge is beyond the strongest); None when the anchor is unusable."""
    if anchor is None:
        return None
    ta, fa = severity(spec, spec.clamp(anchor[0])), anchor[1]
    delta = distortion(target) - distortion(fa)
    if ta <= 0.0 or fa >= 1.0 - _MIN_DISTORTION or abs(delta) < 1e-9:
        return None
    lg_lo, lg_hi = math.log(1.0 / SLOPE_RANGE[1]), math.log(1.0 / SLOPE_RANGE[0])

    def log_gain(t: float) -> float | None:
        g = (math.log(max(t, 1e-12)) - math.log(ta)) / delta
        return math.log(g) if g > 0.0 else None

    centre, a, b = ts
    c = log_gain(centre)
    if c is None or centre >= 1.0:
        return None
    ends = [log_gain(a), log_gain(min(b, 1.0))]
    if a >= 1.0 or any(e is None for e in ends):
        return min(max(c, lg_lo), lg_hi), None
    x, y = sorted(e for e in ends if e is not None)
    return min(max(c, lg_lo), lg_hi), (max(x, lg_lo), min(y, lg_hi))


def _coverage(intervals: Sequence[tuple[float, float]], x: float) -> int:
    """How many of ``intervals`` contain ``x``."""
    return sum(1 for a, b in intervals if a <= x <= b)


def _most_covered(intervals: Sequence[tuple[float, float]], prefer: float) -> float | None:
    """The middle of the stretch covered by the most of ``intervals`` (log severity), the stretch
    nearest ``prefer`` among equals; None when no two intervals overlap (then the median rules)."""
    edges = sorted({e for iv in intervals for e in iv})
    best: tuple[int, float, float] | None = None
    for a, b in zip(edges, edges[1:], strict=False):
        mid = 0.5 * (a + b)
        n = sum(1 for x, y in intervals if x <= mid <= y)
        score = (n, -min(abs(prefer - a), abs(prefer - b)) if not a <= prefer <= b else 0.0)
        if best is None or score > best[:2]:
            best = (*score, mid)
    if best is None or best[0] < 2:
        return None
    return best[2]


def fit_slope(points: Sequence[Sequence[tuple[float, float]]], spec: PerturbationSpec) -> float:
    """Pooled within-image least-squares slope of ``log(1 - SSIM)`` on ``log t`` over each image's
    evaluated ``(strength, SSIM)`` points (points at t = 0 or SSIM >= 1 - 1e-6 are unusable),
    clipped to :data:`SLOPE_RANGE`; :data:`DEFAULT_SLOPE` without two usable points in one image."""
    sxy = sxx = 0.0
    for image_points in points:
        xy = [(math.log(severity(spec, s)), distortion(v)) for s, v in image_points
              if severity(spec, s) > 0.0 and v < 1.0 - _MIN_DISTORTION]
        if len(xy) < 2:
            continue
        mx = sum(x for x, _ in xy) / len(xy)
        my = sum(y for _, y in xy) / len(xy)
        sxy += sum((x - mx) * (y - my) for x, y in xy)
        sxx += sum((x - mx) ** 2 for x, _ in xy)
    if sxx <= 1e-12 or sxy <= 0.0:
        return DEFAULT_SLOPE
    return float(min(max(sxy / sxx, SLOPE_RANGE[0]), SLOPE_RANGE[1]))
