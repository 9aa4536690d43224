"""Behaviour tests for the dermoscopy family (vignetting, light_reflection, hair)."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
from skimage import data

from medrobust_lib.perturb.spec import get_perturbation
from medrobust_lib.perturb.ssim import ssim
from medrobust_lib.seeding import rng_for

TYPES = ["vignetting", "light_reflection", "hair"]


@pytest.fixture(scope="module")
def skin() -> np.ndarray:
    """float32 (256, 256, 3): skimage's astronaut, cropped to the face (skin, hair, flat background)."""
    crop = data.astronaut()[30:280, 130:380]
    return np.asarray(cv2.resize(crop, (256, 256), interpolation=cv2.INTER_AREA), np.float32) / 255.0


def test_vignetting_follows_the_cos4_law_about_one_optical_centre() -> None:
    spec = get_perturbation("vignetting")
    h, w, s = 128, 160, 2.0
    out = spec.apply(np.full((h, w), 0.8, np.float32), s, rng_for("t", "vig")).image
    gain = out / 0.8
    assert gain.max() == pytest.approx(1.0, abs=2e-3)  # the optical centre keeps all its light
    cy, cx = np.unravel_index(np.argmax(gain), gain.shape)
    ys, xs = np.mgrid[0:h, 0:w]
    r = np.hypot(ys - cy, xs - cx) / (0.5 * np.hypot(h, w))
    np.testing.assert_allclose(gain, np.cos(np.arctan(s * r)) ** 4, atol=0.02)
    # RGB: one gain for every channel
    rgb = spec.apply(np.full((h, w, 3), 0.8, np.float32), s, rng_for("t", "vig")).image
    for c in range(3):
        np.testing.assert_allclose(rgb[..., c], out, atol=1e-6)


def test_light_reflection_only_brightens_into_growing_saturated_spots(skin: np.ndarray) -> None:
    spec = get_perturbation("light_reflection")
    img = skin * np.float32(0.9)  # below the light colour (>= 0.94) everywhere
    weak = spec.apply(img, 0.08, rng_for("t", "glare")).image
    strong = spec.apply(img, 0.25, rng_for("t", "glare")).image
    assert (weak >= img - 1e-6).all() and (strong >= weak - 1e-6).all()
    hit_weak = np.any(weak > img + 1e-4, axis=2)
    hit_strong = np.any(strong > img + 1e-4, axis=2)
    assert hit_weak.any() and hit_strong[hit_weak].all() and hit_strong.mean() > 2 * hit_weak.mean()
    # saturated cores take the near-white light colour whatever lay beneath
    core = strong.min(axis=2) > 0.93
    assert core.mean() > 0.05
    assert np.ptp(strong[core], axis=1).max() < 0.07  # (near) neutral light


def test_hair_draws_thin_dark_brown_strands_that_accumulate() -> None:
    spec = get_perturbation("hair")
    pale = np.full((256, 256, 3), 0.95, np.float32)
    outs = [spec.apply(pale, s, rng_for("t", "hair")).image for s in (0.1, 0.4, 1.0)]
    covered = [np.any(o < 0.9, axis=2) for o in outs]
    assert 0.0 < covered[0].mean() < covered[1].mean() < covered[2].mean() < 0.8
    assert covered[1][covered[0]].all() and covered[2][covered[1]].all()  # hairs only get added
    # hair cores are dark brown: dark, with R > G > B
    core = outs[2].max(axis=2) < 0.35
    assert core.sum() > 200
    r, g, b = outs[2][core].mean(axis=0)
    assert r > g > b
    # strands are thin curves, not blobs: no pixel is far from the skin at the weak level
    inside = cv2.distanceTransform(covered[0].astype(np.uint8), cv2.DIST_L2, 3)
    assert inside.max() <= 3.0
    # grayscale stays grayscale, with the same strands
    gray = spec.apply(pale[..., 0], 0.4, rng_for("t", "hair")).image
    assert gray.shape == (256, 256)
    assert (gray < 0.9).mean() == pytest.approx(covered[1].mean(), abs=0.02)


@pytest.mark.parametrize("name", TYPES)
def test_ssim_falls_monotonically_and_reaches_low_values(name: str, skin: np.ndarray) -> None:
    spec = get_perturbation(name)
    grid = np.linspace(spec.weakest, spec.strongest, 8)
    values = [ssim(skin, spec.apply(skin, float(s), rng_for("ssim", name)).image) for s in grid]
    assert values[0] >= 0.98
    assert (np.diff(values) <= 1e-3).all(), np.round(values, 4)
    assert values[-1] < 0.6, np.round(values, 4)
