"""Behaviour tests for the OCT family (oct_shadow, oct_blink, oct_motion, oct_speckle,
uneven_illumination)."""

from __future__ import annotations

from typing import cast

import cv2
import numpy as np
import pytest
from skimage import data

from medrobust_lib.perturb.spec import get_perturbation
from medrobust_lib.perturb.ssim import ssim
from medrobust_lib.seeding import rng_for

TYPES = ["oct_shadow", "oct_blink", "oct_motion", "oct_speckle", "uneven_illumination"]
H = W = 256


def _bscan() -> np.ndarray:
    """A synthetic 256x256 retinal B-scan: dark vitreous, eight curved layers of different
    reflectivity, a fading choroid, and fully developed speckle texture."""
    rng = np.random.default_rng(0)
    ys, xs = np.mgrid[0:H, 0:W].astype(np.float32)
    top = 80 + 20 * np.sin(xs / W * np.pi * 1.3) - 25 * np.exp(-(((xs - W / 2) / 30) ** 2))
    img = np.full((H, W), 0.04, np.float32)
    bounds = [0, 8, 30, 45, 70, 85, 100, 110, 125]
    for (a, b), r in zip(zip(bounds[:-1], bounds[1:], strict=True), [0.85, 0.45, 0.6, 0.3, 0.55, 0.25, 0.9, 0.7],
                         strict=True):
        img[(ys >= top + a) & (ys < top + b)] = r
    deep = ys >= top + 125
    img[deep] = 0.35 * np.exp(-(ys[deep] - top[deep] - 125) / 40)
    smooth = cv2.GaussianBlur(img, (0, 0), 1.0)
    speckle = np.abs(rng.normal(size=(H, W)) + 1j * rng.normal(size=(H, W))).astype(np.float32) / np.sqrt(2)
    return np.clip(smooth * (0.5 + 0.55 * cv2.GaussianBlur(speckle, (0, 0), 0.7)), 0, 1).astype(np.float32)


@pytest.fixture(scope="module")
def bscan() -> np.ndarray:
    return _bscan()


@pytest.fixture(scope="module")
def fundus() -> np.ndarray:
    return np.asarray(cv2.resize(data.retina(), (H, W), interpolation=cv2.INTER_AREA), np.float32) / 255.0


def _flat(value: float) -> np.ndarray:
    return np.full((H, W), value, np.float32)


def test_oct_shadow_attenuates_whole_a_scans_below_the_absorber() -> None:
    spec = get_perturbation("oct_shadow")
    s = 0.5
    out = spec.apply(_flat(0.6), s, rng_for("t", "shadow")).image
    # a shadow never lifts along the beam: each column is non-increasing with depth
    assert (np.diff(out, axis=0) <= 1e-6).all()
    # absorbers sit at 15-50 % depth: rows above are untouched, rows below are fully in shadow
    np.testing.assert_array_equal(out[: int(0.15 * H)], np.float32(0.6))
    np.testing.assert_allclose(out[-1], out[int(0.55 * H)], atol=1e-6)
    bottom = out[-1] / 0.6
    shadowed = bottom < 0.99
    assert 0.05 < shadowed.mean() < 0.9
    # plateaus at powers of the one-absorber transmission (overlapping shadows multiply); the
    # rest are the anti-aliased band edges
    n_absorbers = np.log(bottom[shadowed]) / np.log(1 - 0.97 * np.sqrt(s))
    assert (np.abs(n_absorbers - np.round(n_absorbers)) < 0.02).mean() > 0.7
    assert (np.abs(n_absorbers - 1) < 0.02).sum() >= 5
    # RGB: every channel gets the same shadow
    rgb = spec.apply(np.full((H, W, 3), 0.6, np.float32), s, rng_for("t", "shadow")).image
    np.testing.assert_allclose(rgb[..., 1], out, atol=1e-6)


def test_oct_blink_blacks_out_one_contiguous_nested_run_of_a_scans() -> None:
    spec = get_perturbation("oct_blink")
    lost = []
    for s in (0.2, 0.4):
        out = spec.apply(_flat(0.5), s, rng_for("t", "blink")).image
        np.testing.assert_array_equal(out, np.broadcast_to(out[0], out.shape))  # whole A-scans
        cols = np.flatnonzero(out[0] < 0.05)
        assert cols.size == pytest.approx(s * W, abs=1.5)
        assert (np.diff(cols) == 1).all()  # one contiguous band
        assert out[0].max() == pytest.approx(0.5) and out[0].min() == pytest.approx(0.5 * 0.03, abs=1e-4)
        lost.append(set(cols.tolist()))
    assert lost[0] <= lost[1]


def test_oct_motion_shifts_each_a_scan_axially_and_moves_the_mask_with_it() -> None:
    spec = get_perturbation("oct_motion")
    img = _flat(0.1)
    img[128] = 1.0  # one bright layer
    mask = np.zeros((H, W), bool)
    mask[128] = True
    boxes = np.array([[0, 120, W, 137]], np.float32)
    out = spec.apply(img, 10.0, rng_for("t", "motion"), mask=mask, boxes=boxes)
    assert out.mask is not None and out.boxes is not None
    rows = out.image.argmax(axis=0)
    assert out.mask.sum(axis=0).min() >= 1  # the layer is still there in every column
    np.testing.assert_array_equal(out.mask.argmax(axis=0), rows)  # the mask moved with the image
    shift = rows - 128
    assert np.abs(shift).max() == pytest.approx(10, abs=1)  # strength is the peak displacement
    assert np.abs(np.diff(shift)).max() <= 2  # a smooth profile across A-scans
    assert out.boxes[0, 1] <= 120 + shift.min() + 1 and out.boxes[0, 3] >= 137 + shift.max() - 1
    # axial only: the maps never move a pixel sideways
    map_x, map_y = cast(tuple[np.ndarray, np.ndarray], spec.fn(img, 10.0, rng_for("t", "motion")))
    np.testing.assert_array_equal(map_x, np.broadcast_to(np.arange(W, dtype=np.float32), (H, W)))
    disp = map_y - np.arange(H, dtype=np.float32)[:, None]
    np.testing.assert_allclose(disp, np.broadcast_to(disp[0], (H, W)), atol=1e-4)  # per A-scan


def test_oct_speckle_has_unit_mean_power_and_rician_to_rayleigh_statistics() -> None:
    spec = get_perturbation("oct_speckle")
    img = _flat(0.2)  # dark enough that no speckle peak clips
    for c in (0.5, 0.95):
        out = spec.apply(img, c, rng_for("t", "speckle")).image
        intensity = (out.astype(np.float64) / 0.2) ** 2
        assert intensity.mean() == pytest.approx(1.0, abs=0.03)
        # intensity contrast of a specular + diffuse phasor sum: sqrt(1 - (1 - c^2)^2)
        assert intensity.std() / intensity.mean() == pytest.approx(np.sqrt(1 - (1 - c * c) ** 2), abs=0.04)
    # near fully developed speckle the intensity is exponential: P(I > 1) = 1/e
    assert (intensity > 1).mean() == pytest.approx(np.exp(-1), abs=0.03)


def test_uneven_illumination_is_one_smooth_darkening_field_linear_in_strength(fundus: np.ndarray) -> None:
    spec = get_perturbation("uneven_illumination")
    gains = [spec.apply(_flat(0.5), s, rng_for("t", "illum")).image / 0.5 for s in (0.5, 1.0)]
    assert (gains[1] <= 1 + 1e-6).all() and gains[1].min() < 0.2 and gains[1].max() > 0.5
    np.testing.assert_allclose(1 - gains[0], 0.5 * (1 - gains[1]), atol=1e-5)  # amplitude = strength
    assert np.abs(np.diff(gains[1], axis=0)).max() < 0.03 and np.abs(np.diff(gains[1], axis=1)).max() < 0.03
    # the lit spot is off the image centre
    cy, cx = np.unravel_index(np.argmax(gains[1]), gains[1].shape)
    assert (cy, cx) != (H // 2, W // 2)
    # on a colour fundus every channel gets the same gain
    out = spec.apply(fundus, 1.0, rng_for("t", "illum")).image
    lit = fundus.min(axis=2) > 0.05
    for c in range(3):
        np.testing.assert_allclose(out[..., c][lit] / fundus[..., c][lit], gains[1][lit], rtol=1e-4)


@pytest.mark.parametrize("name", TYPES)
def test_ssim_falls_monotonically_and_reaches_low_values(name: str, bscan: np.ndarray, fundus: np.ndarray) -> None:
    spec = get_perturbation(name)
    images = [bscan, fundus] if "fundus" in spec.modalities else [bscan]
    grid = np.linspace(spec.weakest, spec.strongest, 8)
    for img in images:
        values = [ssim(img, spec.apply(img, float(s), rng_for("ssim", name)).image) for s in grid]
        assert values[0] >= 0.98
        assert (np.diff(values) <= 1e-3).all(), np.round(values, 4)
        assert values[-1] < 0.6, np.round(values, 4)
