"""Levels that hold at any resolution (issue 30, deliver 6).

The level-resolution test: the demo images, upsampled to 1024 and 2048 px, reach their levels' SSIM
bands about as often as at 256 px: per level, the share of in-band outputs stays within 5 points of
256 px's. Upsampling makes an image smoother per pixel, so a strength in pixels (blur width, cell
size, displacement) whose cap did not grow with the image would stop reaching the strong bands (the
failure of issue 30: levels 3-5 identical on a 1411 px fundus photo).

What holds (measured): levels 1-3 at 1024 px (fast variant in the default suite: the generic pixel
types on one CT image; the slow variant adds OCT and 2048 px and has not been run yet). What does not:
levels 4-5 of the blur types and pixelate on the CT image at 1024 px, and levels 3-4 of Gaussian blur
on the fundus image at 2048 px (SSIM's fixed 7x7 window makes an upsampled smooth image nearly
insensitive to blur; see ``SSIM_FLOOR_GAP``), kept as strict xfails.
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
from medrobust_lib.perturb.calibrate import DEFAULT_BANDS, calibrate
from medrobust_lib.perturb.spec import (
    REFERENCE_SIZE,
    get_perturbation,
    list_perturbations,
    size_factor,
)
from medrobust_lib.seeding import rng_for

TOLERANCE = 0.05
"""Largest allowed difference (share, 0-1) between a level's in-band share at 256 px and at a larger size."""

PIXEL_TYPES = tuple(n for n in list_perturbations() if get_perturbation(n).scales_with_size)
FAST_MODALITIES = ("ct", "oct")


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


def in_band_shares(samples: Sequence[Sample], types: Sequence[str], size: int) -> dict[int, float]:
    """Per level, the share of (sample, type) outputs whose calibrated SSIM lies in the level's band
    on the samples upsampled to ``size`` px (types that do not apply to a sample are skipped)."""
    hits: dict[int, list[bool]] = {lv: [] for lv in DEFAULT_BANDS}
    for s in samples:
        image = upsample(s.image, size)
        for name in types:
            spec = get_perturbation(name)
            if not spec.applies_to(s.modality, s.n_channels):
                continue
            for lv, band in DEFAULT_BANDS.items():
                c = calibrate(spec, image, band, (0, s.dataset, s.sample_id, name))
                hits[lv].append(c.band_reached)
    return {lv: float(np.mean(v)) for lv, v in hits.items() if v}


def assert_levels_hold(samples: Sequence[Sample], types: Sequence[str], sizes: Sequence[int],
                       levels: Sequence[int] = (1, 2, 3, 4, 5)) -> None:
    base = in_band_shares(samples, types, REFERENCE_SIZE)
    for size in sizes:
        got = in_band_shares(samples, types, size)
        shares = {lv: (round(base[lv], 3), round(got[lv], 3)) for lv in base}
        off = {lv: shares[lv] for lv in levels if abs(got[lv] - base[lv]) > TOLERANCE}
        assert not off, (f"in-band share per level (256 px, {size} px) differs by more than {TOLERANCE:.0%}: {off} "
                         f"(all levels: {shares})")


def test_pixel_types_are_the_ones_in_pixels() -> None:
    assert set(PIXEL_TYPES) == {"gaussian_blur", "motion_blur", "defocus_blur", "pixelate", "oct_motion"}
    for n in list_perturbations():
        spec = get_perturbation(n)
        assert spec.scales_with_size == ("pixels" in spec.unit and "fraction" not in spec.unit), n


@pytest.mark.parametrize("name", PIXEL_TYPES)
def test_caps_stretch_with_the_image_and_stay_at_256(name: str) -> None:
    spec = get_perturbation(name)
    assert spec.strength_range_for((256, 256)) == spec.strength_range
    assert spec.strength_range_for((100, 80, 3)) == spec.strength_range  # smaller images keep the stated range
    lo, hi = spec.strength_range_for((1024, 700))
    assert lo == spec.strength_range[0]
    assert hi == pytest.approx(spec.weakest + 4 * (spec.strength_range[1] - spec.weakest))
    assert spec.strongest_for((2048, 2048)) == pytest.approx(spec.weakest + 8 * (spec.strongest - spec.weakest))
    assert [spec.level_start(lv, (512, 512)) for lv in range(1, 6)] == pytest.approx(
        [spec.weakest + 2 * (v - spec.weakest) for v in spec.levels])
    assert [spec.level_start(lv) for lv in range(1, 6)] == list(spec.levels)


def test_scale_free_types_keep_their_range() -> None:
    for name in ("gaussian_noise", "jpeg_compression", "translation", "rotation"):
        spec = get_perturbation(name)
        assert spec.strength_range_for((2048, 2048)) == spec.strength_range
        assert spec.clamp(1e9, (2048, 2048)) == spec.clamp(1e9)


def test_size_factor() -> None:
    assert size_factor((256, 256)) == 1.0
    assert size_factor((64, 32, 3)) == 1.0
    assert size_factor((1411, 1411, 3)) == pytest.approx(1411 / 256)
    assert size_factor((300, 1024)) == 4.0


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


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="measured: Gaussian blur at sigma 192 (the scaled cap) leaves SSIM 0.847 on "
                   "the demo fundus upsampled to 2048 px, so levels 3-4 are out of reach (SSIM's 7x7 window; "
                   "docs/perturbations.md)")
def test_a_blurred_fundus_keeps_distinct_levels_at_2048_px(demo_root: Path) -> None:
    """The issue's case: on a large smooth fundus photo, blur levels 2-4 (those reached at 256 px; level 5
    lies below the SSIM floor blur reaches on this image, at any size) are distinct and in their bands."""
    s = demo_samples(demo_root, ["fundus"], 1)[0]
    image = upsample(s.image, 2048)
    spec = get_perturbation("gaussian_blur")
    got = [calibrate(spec, image, DEFAULT_BANDS[lv], (0, s.dataset, s.sample_id, spec.name)) for lv in (2, 3, 4)]
    assert all(c.band_reached for c in got), [(c.strength, round(c.ssim, 3)) for c in got]
    assert got[0].strength < got[1].strength < got[2].strength
    assert got[2].strength > spec.strongest  # beyond the 256 px cap: the old cap could not reach it


# Levels 4-5 of the blur types and pixelate do not hold on one of the two upsampled images (CT, checked
# for Gaussian blur): SSIM's 7x7 window sees an image
# upsampled 4x as smooth, where blur changes little. Measured on the CT demo image at 1024 px: Gaussian
# blur sigma 96 (the scaled cap) gives SSIM 0.695, sigma 192 0.678, sigma 384 0.661 (at 256 px sigma 24
# gives 0.37). Level 4 would need about twice the linearly scaled cap; level 5 no blur reaches.
SSIM_FLOOR_GAP = ("blur on an upsampled smooth image: SSIM (7x7 window) stays above 0.66 at any sigma on the "
                  "CT demo image at 1024 px, so levels 4-5 are out of reach there (docs/perturbations.md)")


def test_levels_1_to_3_hold_at_1024_px_fast(demo_root: Path) -> None:
    """Fast variant: the four generic pixel types on one CT image at 1024 px, levels 1-3."""
    types = [t for t in PIXEL_TYPES if t != "oct_motion"]
    assert_levels_hold(demo_samples(demo_root, ("ct",), 1), types, [1024], levels=(1, 2, 3))


@pytest.mark.slow
def test_levels_1_to_3_hold_at_1024_and_2048_px(demo_root: Path) -> None:
    """The pixel types on one CT and one OCT image at 1024 and 2048 px, levels 1-3."""
    assert_levels_hold(demo_samples(demo_root, FAST_MODALITIES, 1), PIXEL_TYPES, [1024, 2048], levels=(1, 2, 3))


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason=SSIM_FLOOR_GAP)
def test_levels_4_and_5_hold_at_1024_px(demo_root: Path) -> None:
    """The issue's full criterion at levels 4-5 (the pixel types on one CT and one OCT image, 1024 px):
    a known gap (measured 9/9 in band at 256 px, 5/9 at 1024 px at both levels); strict, so closing the
    gap turns this into a failure that asks to drop the mark."""
    assert_levels_hold(demo_samples(demo_root, FAST_MODALITIES, 1), PIXEL_TYPES, [1024], levels=(4, 5))
