"""Behaviour tests for the angiography perturbation family."""

from __future__ import annotations

from collections.abc import Callable

import cv2
import numpy as np
import pydicom
import pytest
from pydicom.data import get_testdata_file

from medrobust_lib.perturb.families import angio
from medrobust_lib.perturb.spec import get_perturbation, list_perturbations
from medrobust_lib.perturb.ssim import ssim
from medrobust_lib.seeding import rng_for

N = 256


def _call(fn: Callable[..., object], *args: object) -> np.ndarray:
    """Call a registered perturbation function directly (unclipped), typed as an array."""
    return np.asarray(fn(*args), np.float32)


@pytest.fixture(scope="module")
def radiograph() -> np.ndarray:
    """An X-ray projection image standing in for an angiogram: pydicom-data's RG1_UNCI.dcm,
    displayed bone-bright, 256x256."""
    a = pydicom.dcmread(str(get_testdata_file("RG1_UNCI.dcm"))).pixel_array.astype(np.float32)
    lo, hi = np.percentile(a, [0.5, 99.5])
    img = 1.0 - np.clip((a - lo) / (hi - lo), 0.0, 1.0)
    return np.asarray(cv2.resize(img, (N, N), interpolation=cv2.INTER_AREA), np.float32)


def test_family_registers_haze() -> None:
    assert list_perturbations(family="angio") == ["haze"]
    assert get_perturbation("haze").modalities == ("angiography",)


def test_haze_raises_dark_pixels_more_than_bright_ones() -> None:
    ramp = np.tile(np.linspace(0.0, 1.0, N, dtype=np.float32), (N, 1))
    s = 0.4
    out = _call(angio.haze, ramp, s, rng_for("t", "haze"))
    airlight = angio.haze_airlight(rng_for("t", "haze"), N, N)
    assert airlight.min() >= angio.HAZE_RANGE[0] and airlight.max() <= angio.HAZE_RANGE[1]
    np.testing.assert_allclose(out, ramp * (1 - s) + s * airlight, atol=1e-6)
    lift = out - ramp
    assert (lift[:, 0] > 0.25).all() and (lift[:, -1] <= 0).all()  # black lifted, white veiled
    # at every pixel (same veil), a dark vessel is lifted more than bright background
    dark = _call(angio.haze, np.full((N, N), 0.1, np.float32), s, rng_for("t", "haze")) - 0.1
    bright = _call(angio.haze, np.full((N, N), 0.8, np.float32), s, rng_for("t", "haze")) - 0.8
    assert (dark > bright + 0.25).all()
    # contrast between any two pixels shrinks by exactly 1 - s
    np.testing.assert_allclose(np.diff(out, axis=1) - np.diff(s * airlight, axis=1), (1 - s) * np.diff(ramp, axis=1),
                               atol=1e-5)


def test_haze_puts_the_same_gray_veil_on_rgb_channels() -> None:
    rgb = np.zeros((64, 64, 3), np.float32)
    out = _call(angio.haze, rgb, 0.5, rng_for("t", "rgb"))
    assert out.shape == rgb.shape
    np.testing.assert_array_equal(out[..., 0], out[..., 1])
    np.testing.assert_array_equal(out[..., 0], out[..., 2])


def test_ssim_non_increasing_and_reaches_low_band(radiograph: np.ndarray) -> None:
    spec = get_perturbation("haze")
    values = [ssim(radiograph, spec.apply(radiograph, float(s), rng_for("test", "haze")).image)
              for s in np.linspace(spec.weakest, spec.strongest, 8)]
    assert values[0] >= 0.98
    assert (np.diff(values) <= 1e-3).all(), np.round(values, 4)
    assert values[-1] < 0.6, np.round(values, 4)
