"""Contract tests parametrised over the whole perturbation registry (the registry is the matrix)."""

from __future__ import annotations

import numpy as np
import pytest

from medrobust_lib.data.boxes import mask_to_boxes
from medrobust_lib.perturb.calibrate import DEFAULT_BANDS, calibrate
from medrobust_lib.perturb.spec import get_perturbation, list_perturbations
from medrobust_lib.perturb.ssim import ssim
from medrobust_lib.seeding import rng_for
from medrobust_lib.types import ALL_MODALITIES

ALL = list_perturbations()
SPATIAL = list_perturbations(geometry="spatial")
INTENSITY = list_perturbations(geometry="intensity")
EXPECTED = {
    # generic
    "gaussian_noise", "salt_pepper_noise", "speckle_noise", "gaussian_blur", "motion_blur", "defocus_blur",
    "jpeg_compression", "pixelate", "contrast", "brightness", "saturation", "rotation", "scaling", "translation",
    # MRI, CT, ultrasound
    "kspace_motion", "bias_field", "ghosting", "rician_noise", "gibbs_ringing", "kspace_spike",
    "metal_streaks", "beam_hardening", "photon_starvation", "ring_artifact", "window_shift",
    "acoustic_shadowing", "reverberation", "depth_gain_variation",
    # dermoscopy, endoscopy, OCT/fundus, pathology, X-ray, angiography
    "vignetting", "light_reflection", "hair", "specular_reflection", "bubbles", "blood", "endoscopy_overexposure",
    "oct_shadow", "oct_blink", "oct_motion", "oct_speckle", "uneven_illumination",
    "stain_variation", "slide_bubbles", "tissue_fold", "scatter", "underexposure", "overexposure", "grid_lines",
    "window_level", "haze",
}


def test_catalogue_is_complete() -> None:
    assert set(ALL) == EXPECTED
    assert len(ALL) == 49
    assert set(SPATIAL) == {"rotation", "scaling", "translation", "oct_motion"}


def test_every_modality_has_types() -> None:
    for m in ALL_MODALITIES:
        specific = [n for n in ALL if set(get_perturbation(n).modalities) != set(ALL_MODALITIES)
                    and m in get_perturbation(n).modalities]
        assert specific, f"modality {m} has no specific perturbation"


def _image_for(name: str, gray: np.ndarray, rgb: np.ndarray) -> list[np.ndarray]:
    spec = get_perturbation(name)
    return [rgb] if spec.channels == "rgb" else [gray, rgb]


def _grid(name: str, n: int = 8) -> list[float]:
    spec = get_perturbation(name)
    grid = np.linspace(spec.weakest, spec.strongest, n)
    return [spec.clamp(float(s)) for s in grid]


@pytest.mark.parametrize("name", ALL)
def test_shape_dtype_range_and_purity(name: str, gray_image: np.ndarray, rgb_image: np.ndarray) -> None:
    spec = get_perturbation(name)
    for img in _image_for(name, gray_image, rgb_image):
        before = img.copy()
        for s in (spec.levels[0], spec.levels[4], spec.strongest):
            out = spec.apply(img, s, rng_for("contract", name)).image
            assert out.shape == img.shape and out.dtype == np.float32
            assert np.isfinite(out).all() and out.min() >= 0.0 and out.max() <= 1.0
        np.testing.assert_array_equal(img, before)  # the input is never modified


@pytest.mark.parametrize("name", ALL)
def test_deterministic_and_common_random_numbers(name: str, gray_image: np.ndarray, rgb_image: np.ndarray) -> None:
    spec = get_perturbation(name)
    img = _image_for(name, gray_image, rgb_image)[0]
    a = spec.apply(img, spec.levels[2], rng_for("k", name)).image
    b = spec.apply(img, spec.levels[2], rng_for("k", name)).image
    assert a.tobytes() == b.tobytes()
    # The random draws must not depend on strength: the generator ends in the same state.
    states = []
    for s in (spec.levels[0], spec.levels[4]):
        g = rng_for("k", name)
        spec.apply(img, s, g)
        states.append(g.bit_generator.state)
    assert states[0] == states[1], "the number of random draws depends on strength"


@pytest.mark.parametrize("name", ALL)
def test_weakest_is_near_identity_and_ssim_monotone(name: str, gray_image: np.ndarray, rgb_image: np.ndarray) -> None:
    spec = get_perturbation(name)
    for img in _image_for(name, gray_image, rgb_image):
        values = [ssim(img, spec.apply(img, s, rng_for("mono", name)).image) for s in _grid(name)]
        assert values[0] >= 0.98, f"weakest strength gives SSIM {values[0]:.4f}"
        diffs = np.diff(values)
        assert (diffs <= 2e-3).all(), f"SSIM not monotone in strength: {np.round(values, 4)}"


@pytest.mark.parametrize("name", ALL)
def test_ssim_non_increasing_in_level(name: str, gray_image: np.ndarray, rgb_image: np.ndarray) -> None:
    spec = get_perturbation(name)
    img = _image_for(name, gray_image, rgb_image)[0]
    got = [calibrate(spec, img, DEFAULT_BANDS[lv], ("lvl", name), start=spec.levels[lv - 1]) for lv in range(1, 6)]
    values = [c.ssim for c in got]
    assert all(b <= a + 1e-9 for a, b in zip(values, values[1:], strict=False)), values
    for lv, c in enumerate(got, start=1):
        lo, hi = DEFAULT_BANDS[lv]
        assert c.band_reached == (lo <= c.ssim <= hi)


@pytest.mark.parametrize("name", INTENSITY)
def test_intensity_types_leave_ground_truth_untouched(name: str, square_sample: tuple[np.ndarray, np.ndarray],
                                                      rgb_image: np.ndarray) -> None:
    img, mask = square_sample
    spec = get_perturbation(name)
    if spec.channels == "rgb":
        img = np.repeat(img[..., None], 3, axis=2) * rgb_image
    boxes = mask_to_boxes(mask)
    out = spec.apply(img, spec.levels[3], rng_for("gt", name), mask=mask, boxes=boxes)
    np.testing.assert_array_equal(out.mask, mask)
    np.testing.assert_array_equal(out.boxes, boxes)


@pytest.mark.parametrize("name", SPATIAL)
def test_spatial_types_move_mask_boxes_and_image_together(name: str, square_sample: tuple[np.ndarray, np.ndarray]) -> None:
    img, mask = square_sample
    spec = get_perturbation(name)
    boxes = mask_to_boxes(mask)
    out = spec.apply(img, spec.levels[4], rng_for("sp", name), mask=mask, boxes=boxes)
    assert out.mask is not None and out.boxes is not None
    assert not np.array_equal(out.mask, mask), "a spatial type at level 5 should move the mask"
    inside = out.image[out.mask]
    ring = out.image[~out.mask & (out.image > 0)]
    assert inside.mean() > 0.8 and ring.mean() < 0.5, "image and mask are misaligned"
    # the box of the warped rectangle is the tight box of the warped mask (the mask is the rectangle)
    np.testing.assert_allclose(out.boxes[0], mask_to_boxes(out.mask)[0], atol=1.0)
