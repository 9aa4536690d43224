"""Behaviour tests for the pathology family (stain_variation, slide_bubbles, tissue_fold)."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
from skimage import data
from skimage.color import rgb2hed

from medrobust_lib.perturb.spec import get_perturbation
from medrobust_lib.perturb.ssim import ssim
from medrobust_lib.seeding import rng_for

TYPES = ["stain_variation", "slide_bubbles", "tissue_fold"]


@pytest.fixture(scope="module")
def slide() -> np.ndarray:
    """float32 (256, 256, 3): skimage's immunohistochemistry (haematoxylin + DAB) field."""
    img = data.immunohistochemistry()
    return np.asarray(cv2.resize(img, (256, 256), interpolation=cv2.INTER_AREA), np.float32) / 255.0


def test_stain_variation_is_an_affine_change_of_each_stain_concentration(slide: np.ndarray) -> None:
    """Colour deconvolution (skimage's rgb2hed, Ruifrok-Johnston) of the output gives, stain by
    stain, an affine function of the input concentration: a per-stain scale and shift in optical
    density space, not an RGB-space jitter."""
    spec = get_perturbation("stain_variation")
    out = spec.apply(slide, 0.8, rng_for("t", "stain")).image
    unclipped = np.all((out > 0.01) & (out < 0.99), axis=2) & np.all(slide > 0.01, axis=2)
    before, after = rgb2hed(slide)[unclipped], rgb2hed(out)[unclipped]
    fitted = moved = 0
    for i in range(3):
        ok = (before[:, i] > 1e-3) & (after[:, i] > 1e-3)  # rgb2hed clips at zero
        if ok.sum() < 1000:  # a stain this slide barely carries (eosin on an IHC slide)
            continue
        slope, intercept = np.polyfit(before[ok, i], after[ok, i], 1)
        resid = after[ok, i] - (slope * before[ok, i] + intercept)
        assert np.abs(resid).max() < 1e-3, f"stain {i}: not affine (max residual {np.abs(resid).max():.2e})"
        fitted += 1
        moved += abs(slope - 1) > 0.05 or abs(intercept) > 0.005
    assert fitted >= 2 and moved >= 1
    # black stays black (no light, whatever the stain)
    black = slide.copy()
    black[:8] = 0.0
    assert (spec.apply(black, 0.8, rng_for("t", "stain")).image[:8] == 0).all()


def test_slide_bubbles_wash_out_the_inside_and_draw_dark_rims(slide: np.ndarray) -> None:
    spec = get_perturbation("slide_bubbles")
    s = 0.3
    flat = spec.apply(np.full((256, 256), 0.6, np.float32), s, rng_for("t", "sb")).image
    changed = flat != np.float32(0.6)
    assert 0.3 * s < changed.mean() < s  # overlaps make the covered area smaller than nominal
    # inside: contrast lowered to 40 % toward the glass brightness 0.94 (0.94 + 0.4 (0.6 - 0.94))
    interior = np.isclose(flat, 0.804, atol=1e-3)
    assert interior.mean() > 0.5 * changed.mean()
    assert flat.min() < 0.25  # dark refractive rims
    # on tissue the interior keeps far less contrast (same draw, same bubbles)
    out = spec.apply(slide, s, rng_for("t", "sb")).image
    core = cv2.erode(interior.astype(np.uint8), np.ones((5, 5), np.uint8)).astype(bool)
    assert out[core].std() < 0.5 * slide[core].std()
    # the rest of the slide is untouched
    np.testing.assert_array_equal(out[~changed], slide[~changed])


def test_tissue_fold_doubles_the_optical_density_in_a_nested_straight_band() -> None:
    spec = get_perturbation("tissue_fold")
    pink = np.broadcast_to(np.array([0.9, 0.6, 0.8], np.float32), (256, 256, 3)).copy()
    bands = []
    for s in (0.3, 0.6):
        out = spec.apply(pink, s, rng_for("t", "fold")).image
        assert (out <= pink + 1e-6).all()
        band = np.any(out < pink - 1e-4, axis=2)
        bands.append(band)
        # inside the band a mirrored flap lies on top: T = x * x^k with k = 3 * strength
        expected = pink[0, 0] ** (1 + 3 * s)
        interior = np.all(np.isclose(out, expected, atol=1e-4), axis=2)
        assert interior.sum() > 0.8 * band.sum()
        # darker and more saturated
        sat = lambda c: (c.max() - c.min()) / c.max()  # noqa: E731
        assert sat(expected) > sat(pink[0, 0])
    assert bands[0].mean() < bands[1].mean() and bands[1][bands[0]].all()
    # a straight band: the fold edge is a line, so the covered set is convex
    hull = cv2.convexHull(np.argwhere(bands[1])[:, ::-1].astype(np.int32))
    hull_mask = np.zeros((256, 256), np.uint8)
    cv2.fillConvexPoly(hull_mask, hull, 1)
    assert bands[1].sum() > 0.97 * hull_mask.sum()


@pytest.mark.parametrize("name", TYPES)
def test_ssim_falls_monotonically_and_reaches_low_values(name: str, slide: np.ndarray) -> None:
    spec = get_perturbation(name)
    grid = np.linspace(spec.weakest, spec.strongest, 8)
    values = [ssim(slide, spec.apply(slide, float(s), rng_for("ssim", name)).image) for s in grid]
    assert values[0] >= 0.98
    assert (np.diff(values) <= 1e-3).all(), np.round(values, 4)
    assert values[-1] < 0.6, np.round(values, 4)
