"""Behaviour tests for the CT perturbation family."""

from __future__ import annotations

from collections.abc import Callable

import cv2
import numpy as np
import pydicom
import pytest
from pydicom.data import get_testdata_file

from medrobust_lib.perturb.families import ct
from medrobust_lib.perturb.spec import get_perturbation, list_perturbations
from medrobust_lib.perturb.ssim import ssim
from medrobust_lib.seeding import rng_for

N = 256


def _call(fn: Callable[..., object], *args: object) -> np.ndarray:
    """Call a registered perturbation function directly (unclipped), typed as an array."""
    return np.asarray(fn(*args), np.float32)
YY, XX = np.mgrid[0:N, 0:N] - (N - 1) / 2.0


@pytest.fixture(scope="module")
def ct_image() -> np.ndarray:
    """pydicom's CT_small.dcm (ships in the wheel) in a [-1000, 1000] HU window, 256x256."""
    ds = pydicom.dcmread(str(get_testdata_file("CT_small.dcm")))
    hu = ds.pixel_array.astype(np.float32) * float(ds.RescaleSlope) + float(ds.RescaleIntercept)
    img = np.clip((hu + 1000.0) / 2000.0, 0.0, 1.0)
    return np.clip(cv2.resize(img, (N, N), interpolation=cv2.INTER_CUBIC), 0.0, 1.0)


def test_family_registers_the_five_types() -> None:
    assert set(list_perturbations(family="ct")) == {
        "metal_streaks", "beam_hardening", "photon_starvation", "ring_artifact", "window_shift"}


def test_metal_streaks_radiate_from_the_metal() -> None:
    key = next(("metal", i) for i in range(200) if int(rng_for("metal", i).integers(1, ct.METAL_MAX + 1)) == 1)
    img = np.full((N, N), 0.4, np.float32)
    g = rng_for(*key)
    g.integers(1, ct.METAL_MAX + 1)
    r, c = ct.metal_positions(img, g.random(ct.METAL_MAX))[0]
    diff = _call(ct.metal_streaks, img, 0.1, rng_for(*key)) - img
    assert diff[r, c] > 0.3  # the metal itself is bright
    # Every streak is a full line through the metal: the field is point-symmetric about it.
    half = min(r, c, N - 1 - r, N - 1 - c)
    win = diff[r - half : r + half + 1, c - half : c + half + 1]
    flipped = win[::-1, ::-1]
    assert np.corrcoef(win.ravel(), flipped.ravel())[0, 1] > 0.8
    # and the streaks cross the whole image, reaching every border
    streak = np.abs(diff) > 0.02
    assert streak.mean() > 0.1
    assert streak[0].any() and streak[-1].any() and streak[:, 0].any() and streak[:, -1].any()


def test_beam_hardening_cups_a_uniform_disk_as_predicted() -> None:
    mu, radius = 0.5, 100.0
    disk = np.where(np.hypot(YY, XX) < radius, mu, 0.0).astype(np.float32)
    deficit = disk - _call(ct.beam_hardening, disk, 1.0, rng_for("bh"))
    # FBP of the p^2 deficit of a disk is (8 mu^2 / pi) sqrt(R^2 - r^2) / N: a bowl (Brooks & Di Chiro).
    assert deficit[128, 128] == pytest.approx(8 * mu**2 * (radius / N) / np.pi, rel=0.05)
    assert deficit[128, 128] > deficit[128, 178] > deficit[128, 208] > deficit[128, 223] > 0
    assert abs(deficit[128, 248]) < 0.02  # air outside the object is left alone


def test_photon_starvation_streaks_run_along_the_most_attenuating_direction() -> None:
    wide = (((XX / 110.0) ** 2 + (YY / 40.0) ** 2) < 1.0).astype(np.float32) * 0.5
    diff = _call(ct.photon_starvation, wide, 0.1, rng_for("t", "ps")) - wide
    along = np.abs(np.diff(diff, axis=1)).mean()  # horizontal neighbours: same streak
    across = np.abs(np.diff(diff, axis=0)).mean()
    assert along < across / 3
    # the noise lives on the rays through the thick middle, not above the patient
    assert diff[118:138].std() > 10 * diff[:20].std()


def test_ring_artifact_is_radially_symmetric_about_the_centre() -> None:
    img = np.full((N, N), 0.5, np.float32)
    out = _call(ct.ring_artifact, img, 0.1, rng_for("t", "ring"))
    assert out.std() > 0.01
    np.testing.assert_array_equal(out, np.rot90(out))
    np.testing.assert_array_equal(out, out[::-1, ::-1])


def test_window_shift_is_the_linear_window_remap() -> None:
    ramp = np.tile(np.linspace(0.0, 1.0, N, dtype=np.float32), (N, 1))
    for i in range(8):
        a, b = ct.window_edges(rng_for("win", i))
        s = 1.5
        width_at_max_move = 1.0 + ct.WINDOW_MAX_MOVE * (b - a)
        assert width_at_max_move >= ct.WINDOW_MIN_WIDTH - 1e-9
        out = get_perturbation("window_shift").apply(ramp, s, rng_for("win", i)).image
        expected = np.clip((ramp - s * a) / (1.0 + s * (b - a)), 0.0, 1.0)
        np.testing.assert_allclose(out, expected, atol=1e-6)
        assert (np.diff(out[0]) >= 0).all()  # windowing never reorders intensities


@pytest.mark.parametrize("name", ["metal_streaks", "beam_hardening", "photon_starvation", "ring_artifact",
                                  "window_shift"])
def test_ssim_non_increasing_and_reaches_low_band(name: str, ct_image: np.ndarray) -> None:
    spec = get_perturbation(name)
    values = [ssim(ct_image, spec.apply(ct_image, float(s), rng_for("test", name)).image)
              for s in np.linspace(spec.weakest, spec.strongest, 8)]
    assert values[0] >= 0.98
    assert (np.diff(values) <= 1e-3).all(), np.round(values, 4)
    # A pure widening of the window cannot take flat CT soft tissue much below 0.7 (documented).
    assert values[-1] < (0.7 if name == "window_shift" else 0.6), np.round(values, 4)
