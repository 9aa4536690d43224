"""Levels that hold at any resolution (issue 30, deliver 6).

The level-resolution test: the demo images, upsampled to 1024 and 2048 px, reach their levels' SSIM
bands about as often as at 256 px: per level, the share of in-band outputs over the (type, image,
level) cells whose band is reachable does not fall more than 5 points below 256 px's.

Why "reachable" (measured, docs/perturbations.md): SSIM's 7x7 window sees an upsampled image as
smooth, and on a smooth image a perturbation that keeps local means changes little: the CT demo
image upsampled to 1024 px keeps SSIM 0.650 against its own mean (a constant image: the limit of any
blur, and of contrast loss), the X-ray 0.843, and at 2048 px 0.757 and 0.906. So some bands are out of
reach there. A cell is unreachable when the type's strongest admissible output on that image (its cap,
:meth:`PerturbationSpec.strongest_for`) stays above the band (the pipeline's ``miss_reason`` rule,
:func:`miss_reason`), except that for a smoothing type (blurs, pixelate) that verdict counts only when
the image's mean also stays above the band: otherwise a stronger blur could reach it, the cap is to
blame, and the cell is a reachable miss. That keeps the rule from being circular (a cap too small
would otherwise make its misses "unreachable"); :func:`test_blur_caps_reach_the_limit` checks that the
caps now come within :data:`LIMIT_GAP` of that limit.

One-sided: a larger size may do better than 256 px. The stated (256 px) caps of the smoothing types
stop short of the limit on a few smooth demo images (X-ray, fundus, dermoscopy, endoscopy: their
strongest blur is 0.02-0.1 SSIM above the image's mean), and they are kept as they are (outputs at
256 px are unchanged), while at 1024 px the caps reach it: there such cells are reached. At 2048 px
motion blur and pixelate need caps beyond the quadratic stretch to reach their own limits (their
``limit_extent``; :func:`test_level_5_holds_at_2048_px`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import cv2
import numpy as np
import pytest

from medrobust_lib.data.dataset import DatasetConfig, iter_dataset
from medrobust_lib.data.sample import Sample
from medrobust_lib.demo.manifest import DemoManifest
from medrobust_lib.perturb.calibrate import DEFAULT_BANDS, calibrate, miss_reason
from medrobust_lib.perturb.families.blur import _gaussian_dct
from medrobust_lib.perturb.spec import (
    CAP_GROWTH_MAX,
    REFERENCE_SIZE,
    cap_factor,
    get_perturbation,
    list_perturbations,
    size_factor,
)
from medrobust_lib.perturb.ssim import ssim
from medrobust_lib.seeding import rng_for

TOLERANCE = 0.05
"""Largest allowed fall (share, 0-1) of a level's in-band share from 256 px to a larger size."""
LIMIT_GAP = 0.02
"""Largest SSIM by which a smoothing type's strongest output may stay above the image's mean's SSIM."""

PIXEL_TYPES = tuple(n for n in list_perturbations() if get_perturbation(n).scales_with_size)
SMOOTHING_TYPES = tuple(n for n in PIXEL_TYPES if get_perturbation(n).smoothing)
SLOW_MODALITIES = ("ct", "mri", "ultrasound", "xray", "fundus")
"""The demo images of the slow variants: those whose levels did not hold before (measured)."""


def demo_samples(root: Path, modalities: Sequence[str], per_modality: int) -> list[Sample]:
    """The first ``per_modality`` usable samples (by id) of each demo dataset of ``modalities``."""
    out: list[Sample] = []
    for d in DemoManifest.load(root).datasets:
        if d.modality not in modalities:
            continue
        cfg = DatasetConfig(name=d.name, modality=d.modality, format=d.format, root=d.root, options=d.options)
        out += [s for s in iter_dataset(cfg) if isinstance(s, Sample)][:per_modality]
    return out


def upsample(image: np.ndarray, size: int) -> np.ndarray:
    """``image`` (H, W) or (H, W, 3) float32 resized to ``size`` x ``size`` (bicubic, clipped to [0, 1])."""
    if image.shape[0] == size and image.shape[1] == size:
        return image
    out = cv2.resize(image, (size, size), interpolation=cv2.INTER_CUBIC)
    return np.clip(out, 0.0, 1.0).astype(np.float32).reshape((size, size) + image.shape[2:])


def mean_image(image: np.ndarray) -> np.ndarray:
    """The constant image of ``image``'s per-channel mean (about the limit of any normalised blur,
    which is the mean of the reflected image: edge rows and columns weigh half)."""
    m = image.reshape(-1, *image.shape[2:]).mean(axis=0)
    return np.broadcast_to(m, image.shape).astype(np.float32)


def in_band_shares(samples: Sequence[Sample], types: Sequence[str], size: int
                   ) -> dict[int, tuple[int, int, int]]:
    """Per level, ``(in band, reachable, all)`` counts of (sample, type) outputs calibrated on the
    samples upsampled to ``size`` px (types that do not apply to a sample are skipped).

    A cell is unreachable when the pipeline's ``miss_reason`` says so (the type's strongest
    admissible output stays above the band), except for a smoothing type when the image's mean (the
    limit of any blur) lies at or below the band's top: then a stronger blur could reach the band,
    the cap is to blame, and the cell counts as a reachable miss."""
    hits: dict[int, list[tuple[bool, bool]]] = {lv: [] for lv in DEFAULT_BANDS}
    for s in samples:
        image = upsample(s.image, size)
        limit = ssim(image, mean_image(image))
        for name in types:
            spec = get_perturbation(name)
            if not spec.applies_to(s.modality, s.n_channels):
                continue
            for lv, band in DEFAULT_BANDS.items():
                c = calibrate(spec, image, band, (0, s.dataset, s.sample_id, name))
                unreachable = miss_reason(spec, image.shape, c, band) == "unreachable" and not (
                    spec.smoothing and limit <= band[1])
                hits[lv].append((c.band_reached, not unreachable))
    return {lv: (sum(h for h, _ in v), sum(r for _, r in v), len(v)) for lv, v in hits.items() if v}


def assert_levels_hold(samples: Sequence[Sample], types: Sequence[str], sizes: Sequence[int],
                       levels: Sequence[int] = (1, 2, 3, 4, 5)) -> None:
    """Per level, the in-band share over reachable cells at each of ``sizes`` is at least 256 px's
    minus :data:`TOLERANCE` (a level with no reachable cell at a size is not compared)."""
    def share(c: tuple[int, int, int]) -> float:
        return c[0] / c[1] if c[1] else float("nan")

    base = in_band_shares(samples, types, REFERENCE_SIZE)
    for size in sizes:
        got = in_band_shares(samples, types, size)
        counts = {lv: (base[lv], got[lv]) for lv in base}
        off = {lv: counts[lv] for lv in levels if got[lv][1] and share(got[lv]) < share(base[lv]) - TOLERANCE}
        assert not off, (f"in-band share over reachable cells per level ((in band, reachable, all) at 256 px, "
                         f"at {size} px) falls more than {TOLERANCE:.0%} below 256 px's: {off} (all levels: {counts})")


def test_pixel_types_are_the_ones_in_pixels() -> None:
    assert set(PIXEL_TYPES) == {"gaussian_blur", "motion_blur", "defocus_blur", "pixelate", "oct_motion"}
    assert set(SMOOTHING_TYPES) == {"gaussian_blur", "motion_blur", "defocus_blur", "pixelate"}
    for n in list_perturbations():
        spec = get_perturbation(n)
        assert spec.scales_with_size == ("pixels" in spec.unit and "fraction" not in spec.unit), n


@pytest.mark.parametrize("name", PIXEL_TYPES)
def test_caps_stretch_with_the_image_and_stay_at_256(name: str) -> None:
    spec = get_perturbation(name)
    assert spec.strength_range_for((256, 256)) == spec.strength_range
    assert spec.strength_range_for((100, 80, 3)) == spec.strength_range  # smaller images keep the stated range
    span = spec.strength_range[1] - spec.weakest
    # the cap: linear for a displacement, faster for a smoothing type (f * min(f, 4))
    at = {512: 2.0, 1024: 4.0, 2048: 8.0} if not spec.smoothing else {512: 4.0, 1024: 16.0, 2048: 32.0}
    for size, k in at.items():
        want = spec.weakest + k * span
        if spec.limit_extent is not None and size > 1024:  # at least the strength of the type's own limit
            want = max(want, spec.weakest + spec.limit_extent * size)
        lo, hi = spec.strength_range_for((size, size * 3 // 4))
        assert lo == spec.strength_range[0]
        assert hi == pytest.approx(want)
        assert spec.strongest_for((size, size)) == pytest.approx(want)
    # the default levels stretch linearly either way
    assert [spec.level_start(lv, (512, 512)) for lv in range(1, 6)] == pytest.approx(
        [spec.weakest + 2 * (v - spec.weakest) for v in spec.levels])
    assert [spec.level_start(lv) for lv in range(1, 6)] == list(spec.levels)


def test_limit_extent_raises_the_cap_only_beyond_1024_px() -> None:
    """Pixelate's cap reaches cells of half the image (its limit, four quadrant means) and motion
    blur's a line twice the image, only on images larger than 1024 px; at and below 1024 px
    the quadratic stretch decides, so those outputs are unchanged."""
    pix, mot = get_perturbation("pixelate"), get_perturbation("motion_blur")
    assert (pix.limit_extent, mot.limit_extent) == (0.5, 2.0)
    assert pix.strongest_for((1024, 1024)) == 1 + 16 * 15 and mot.strongest_for((1024, 700)) == 16 * 96
    assert pix.strongest_for((2048, 1536)) == 1 + 1024 and mot.strongest_for((1536, 2048)) == 2 * 2048
    assert pix.strongest_for((4096, 4096)) == 1 + 2048
    for name in ("gaussian_blur", "defocus_blur"):  # they reach the image mean by the quadratic stretch
        assert get_perturbation(name).limit_extent is None


def test_scale_free_types_keep_their_range() -> None:
    for name in ("gaussian_noise", "jpeg_compression", "translation", "rotation", "contrast"):
        spec = get_perturbation(name)
        assert spec.strength_range_for((2048, 2048)) == spec.strength_range
        assert spec.clamp(1e9, (2048, 2048)) == spec.clamp(1e9)


def test_size_and_cap_factors() -> None:
    assert size_factor((256, 256)) == 1.0
    assert size_factor((64, 32, 3)) == 1.0
    assert size_factor((1411, 1411, 3)) == pytest.approx(1411 / 256)
    assert size_factor((300, 1024)) == 4.0
    assert cap_factor((256, 256), True) == cap_factor((100, 100), True) == 1.0
    assert cap_factor((384, 384), True) == pytest.approx(1.5 * 1.5)
    assert cap_factor((1411, 1411), True) == pytest.approx(1411 / 256 * CAP_GROWTH_MAX)
    assert cap_factor((1411, 1411), False) == pytest.approx(1411 / 256)


def test_apply_clamps_to_the_image_range_and_stays_deterministic() -> None:
    spec = get_perturbation("gaussian_blur")
    rng = np.random.default_rng(3)
    big = rng.random((600, 600)).astype(np.float32)
    cap_256 = spec.strongest
    # beyond the 256 px cap the output still changes on a larger image: the strength is not clamped there
    a = spec.apply(big, cap_256, rng_for(0, "x")).image
    b = spec.apply(big, cap_256 * 2, rng_for(0, "x")).image
    assert not np.array_equal(a, b)
    again = spec.apply(big, cap_256 * 2, rng_for(0, "x")).image
    assert np.array_equal(b, again)
    # on a 256 px image it is clamped to the stated cap, as before
    small = big[:256, :256].copy()
    assert np.array_equal(spec.apply(small, cap_256 * 2, rng_for(0, "x")).image,
                          spec.apply(small, cap_256, rng_for(0, "x")).image)


@pytest.mark.parametrize("shape", [(600, 600), (300, 451, 3)])
@pytest.mark.parametrize("sigma", [5.0, 24.0, 30.0])
def test_large_sigma_gaussian_matches_opencv(shape: tuple[int, ...], sigma: float) -> None:
    """The DCT-I Gaussian used above sigma 24 against OpenCV's (the reference, BORDER_REFLECT_101;
    it truncates at 4 sigma, hence the tolerance): measured max difference 6e-6."""
    rng = np.random.default_rng(1)
    image = cv2.GaussianBlur(rng.random(shape).astype(np.float32), (0, 0), 3.0)
    want = cv2.GaussianBlur(image, (0, 0), sigma, sigma, borderType=cv2.BORDER_REFLECT_101).reshape(shape)
    assert np.abs(_gaussian_dct(image, sigma) - want).max() < 1e-4


def test_large_sigma_gaussian_tends_to_the_mean() -> None:
    image = np.random.default_rng(2).random((64, 80, 3)).astype(np.float32)
    out = get_perturbation("gaussian_blur").fn(image, 1e5, rng_for(0, "x"))
    # a constant image: the mean of the reflected image (edge rows and columns count half), within
    # 1e-3 of the plain mean here
    assert np.ptp(out.reshape(-1, 3), axis=0).max() < 1e-5
    w0 = np.r_[0.5, np.ones(62), 0.5] / 63
    w1 = np.r_[0.5, np.ones(78), 0.5] / 79
    assert out[0, 0] == pytest.approx(np.einsum("i,j,ijc->c", w0, w1, image.astype(np.float64)), abs=1e-5)
    assert np.abs(out - mean_image(image)).max() < 1e-3
    assert get_perturbation("gaussian_blur").fn(image, 30.0, rng_for(0, "x")).std() > out.std()


ISOTROPIC_BLURS = ("gaussian_blur", "defocus_blur")
"""The smoothing types whose limit is exactly a constant image (pixelate's keeps the means of the
four quadrants around the grid's anchor, motion blur's the means along lines)."""


def test_blur_caps_reach_the_limit(demo_root: Path) -> None:
    """On the CT demo image at 1024 px, the strongest admissible Gaussian and defocus blur lie within
    :data:`LIMIT_GAP` SSIM of the image's mean, the limit of any blur (measured: 0.011 and 0.017
    above it; the linearly stretched caps of before stayed 0.045 and 0.062 above), so a band they
    cannot reach no blur reaches."""
    s = demo_samples(demo_root, ("ct",), 1)[0]
    image = upsample(s.image, 1024)
    limit = ssim(image, mean_image(image))
    for name in ISOTROPIC_BLURS:
        spec = get_perturbation(name)
        strongest = spec.apply(image, spec.strongest_for(image.shape), rng_for(0, s.dataset, s.sample_id, name))
        value = ssim(image, strongest.image)
        assert limit <= value <= limit + LIMIT_GAP, (name, value, limit)


def test_levels_hold_at_1024_px_fast(demo_root: Path) -> None:
    """Fast variant: Gaussian blur and pixelate on one CT image at 1024 px, every level."""
    assert_levels_hold(demo_samples(demo_root, ("ct",), 1), ["gaussian_blur", "pixelate"], [1024])


@pytest.mark.slow
def test_levels_hold_at_1024_px(demo_root: Path) -> None:
    """Every type on one image of each of five modalities at 1024 px, every level."""
    assert_levels_hold(demo_samples(demo_root, SLOW_MODALITIES, 1), list_perturbations(), [1024])


@pytest.mark.slow
def test_levels_1_to_4_hold_at_2048_px(demo_root: Path) -> None:
    """The types in pixels (those whose range depends on the size) on the CT, MRI and X-ray images at
    2048 px, levels 1-4 (measured: every reachable cell in band; 8, 8 and 4 of 12 cells reachable at
    levels 2-4)."""
    assert_levels_hold(demo_samples(demo_root, ("ct", "mri", "xray"), 1), PIXEL_TYPES, [2048], levels=(1, 2, 3, 4))


@pytest.mark.slow
def test_level_5_holds_at_2048_px(demo_root: Path) -> None:
    """Level 5 of the same run. Level 5 (SSIM 0.50-0.59) is reachable at 2048 px only on the MRI
    image (its mean: 0.542); motion blur and pixelate reach it there through their ``limit_extent``
    caps (before: motion blur at 3072 px gave 0.596, pixelate at 481 px cells 0.651, 2 of 4 cells in
    band against 8 of 12 at 256 px; measured now: pixelate 0.567 at 1024 px cells, motion blur
    0.582 at 4096 px)."""
    assert_levels_hold(demo_samples(demo_root, ("ct", "mri", "xray"), 1), PIXEL_TYPES, [2048], levels=(5,))


@pytest.mark.slow
def test_a_blurred_fundus_at_2048_px(demo_root: Path) -> None:
    """The issue's case, a large smooth fundus photo: Gaussian blur reaches level 2 beyond the 256 px
    cap; levels 3-4 (reached at 256 px) are out of reach for any blur there, since the image's mean
    itself keeps SSIM 0.836 (measured): flagged ``unreachable`` at the cap, which lies within
    :data:`LIMIT_GAP` of that limit."""
    s = demo_samples(demo_root, ["fundus"], 1)[0]
    image = upsample(s.image, 2048)
    spec = get_perturbation("gaussian_blur")
    limit = ssim(image, mean_image(image))
    got = {lv: calibrate(spec, image, DEFAULT_BANDS[lv], (0, s.dataset, s.sample_id, spec.name)) for lv in (2, 3, 4)}
    assert got[2].band_reached and got[2].strength > spec.strongest
    for lv in (3, 4):
        assert limit > DEFAULT_BANDS[lv][1]
        assert miss_reason(spec, image.shape, got[lv], DEFAULT_BANDS[lv]) == "unreachable"
        assert got[lv].ssim - limit <= LIMIT_GAP
