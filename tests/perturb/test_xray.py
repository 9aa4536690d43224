"""Behaviour tests for the X-ray perturbation family."""

from __future__ import annotations

from collections.abc import Callable

import cv2
import numpy as np
import pydicom
import pytest
from pydicom.data import get_testdata_file

from medrobust_lib.perturb.families import xray
from medrobust_lib.perturb.spec import get_perturbation, list_perturbations
from medrobust_lib.perturb.ssim import ssim
from medrobust_lib.seeding import rng_for

N = 256


def _call(fn: Callable[..., object], *args: object) -> np.ndarray:
    """Call a registered perturbation function directly (unclipped), typed as an array."""
    return np.asarray(fn(*args), np.float32)


@pytest.fixture(scope="module")
def chest() -> np.ndarray:
    """pydicom-data's RG1_UNCI.dcm (a chest radiograph, MONOCHROME1; ships in the wheel), inverted
    to bone-bright, 0.5/99.5 percentile window, 256x256."""
    a = pydicom.dcmread(str(get_testdata_file("RG1_UNCI.dcm"))).pixel_array.astype(np.float32)
    lo, hi = np.percentile(a, [0.5, 99.5])
    img = 1.0 - np.clip((a - lo) / (hi - lo), 0.0, 1.0)
    return np.asarray(cv2.resize(img, (N, N), interpolation=cv2.INTER_AREA), np.float32)


def test_family_registers_the_four_types() -> None:
    assert set(list_perturbations(family="xray")) == {"scatter", "underexposure", "overexposure", "grid_lines"}


def test_scatter_scales_fine_detail_contrast_by_one_minus_s() -> None:
    checker = (0.25 + 0.5 * ((np.add.outer(np.arange(N), np.arange(N)) % 2) == 1)).astype(np.float32)
    s = 0.6
    out = _call(xray.scatter, checker, s, rng_for("t"))
    # the broad scatter kernel sees the checkerboard as its mean, 0.5
    np.testing.assert_allclose(out[8:-8, 8:-8], 0.5 + (1 - s) * (checker[8:-8, 8:-8] - 0.5), atol=2e-3)
    assert out.mean() == pytest.approx(checker.mean(), abs=1e-3)


def test_underexposure_noise_follows_poisson_statistics() -> None:
    x, s = 0.5, 1.0  # a tenth of the dose
    out = _call(xray.underexposure, np.full((N, N), x, np.float32), s, rng_for("t", "dose"))
    d = 10.0**-s
    gain = d**xray.UNDEREXPOSURE_DARKENING
    assert out.mean() == pytest.approx(gain * x, rel=0.01)  # darker
    expected_std = gain * np.sqrt(x * (1 / d - 1) / xray.REFERENCE_PHOTONS)
    assert out.std() == pytest.approx(expected_std, rel=0.03)
    # variance grows linearly with the signal (quantum noise), not a constant floor
    ramp = np.repeat(np.array([0.1, 0.4], np.float32), N // 2)[:, None] * np.ones((1, N), np.float32)
    noisy = _call(xray.underexposure, ramp, s, rng_for("t", "dose2"))
    assert noisy[N // 2 :].var() / noisy[: N // 2].var() == pytest.approx(4.0, rel=0.1)


def test_overexposure_is_gain_then_clip() -> None:
    ramp = np.tile(np.linspace(0.0, 1.0, N, dtype=np.float32), (N, 1))
    out = get_perturbation("overexposure").apply(ramp, 1.0, rng_for("t")).image
    np.testing.assert_allclose(out, np.minimum(ramp * np.e, 1.0), rtol=1e-6)
    assert (out[:, ramp[0] >= np.exp(-1.0)] == 1.0).all()  # burned out


def test_grid_lines_are_periodic_at_the_drawn_frequency() -> None:
    c, m = 0.8, 0.5
    for i in range(4):
        freq, theta, _ = xray.grid_params(rng_for("grid", i))
        out = _call(xray.grid_lines, np.full((N, N), c, np.float32), m, rng_for("grid", i))
        assert out.min() == pytest.approx(c * (1 - m), abs=0.01) and out.max() == pytest.approx(c, abs=0.01)
        spec = np.abs(np.fft.fft2(out - out.mean()))
        ky, kx = np.unravel_index(np.argmax(spec), spec.shape)
        ky, kx = (ky + N // 2) % N - N // 2, (kx + N // 2) % N - N // 2  # signed
        want = np.array([freq * np.sin(theta) * N, freq * np.cos(theta) * N])
        got = np.array([ky, kx], np.float64)
        assert min(np.abs(got - want).max(), np.abs(got + want).max()) <= 1.0


@pytest.mark.parametrize("name", ["scatter", "underexposure", "overexposure", "grid_lines"])
def test_ssim_non_increasing_and_reaches_low_band(name: str, chest: np.ndarray) -> None:
    spec = get_perturbation(name)
    values = [ssim(chest, spec.apply(chest, float(s), rng_for("test", name)).image)
              for s in np.linspace(spec.weakest, spec.strongest, 8)]
    assert values[0] >= 0.98
    assert (np.diff(values) <= 1e-3).all(), np.round(values, 4)
    assert values[-1] < 0.6, np.round(values, 4)
