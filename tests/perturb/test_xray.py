"""Behaviour tests for the X-ray perturbation family."""

from __future__ import annotations

from collections.abc import Callable

import cv2
import numpy as np
import pydicom
import pytest
from pydicom.data import get_testdata_file

from medrobust_lib.perturb.calibrate import DEFAULT_BANDS, calibrate
from medrobust_lib.perturb.families import xray
from medrobust_lib.perturb.spec import get_perturbation, list_perturbations
from medrobust_lib.perturb.ssim import ssim
from medrobust_lib.seeding import rng_for
from medrobust_lib.types import ALL_MODALITIES

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


def test_family_registers_the_five_types() -> None:
    assert set(list_perturbations(family="xray")) == {"scatter", "underexposure", "overexposure", "grid_lines",
                                                      "window_level"}


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


@pytest.mark.parametrize("name", ["scatter", "underexposure", "overexposure", "grid_lines", "window_level"])
def test_ssim_non_increasing_and_reaches_low_band(name: str, chest: np.ndarray) -> None:
    spec = get_perturbation(name)
    values = [ssim(chest, spec.apply(chest, float(s), rng_for("test", name)).image)
              for s in np.linspace(spec.weakest, spec.strongest, 8)]
    assert values[0] >= 0.98
    assert (np.diff(values) <= 1e-3).all(), np.round(values, 4)
    assert values[-1] < 0.6, np.round(values, 4)


class _FixedDraw:
    """A stand-in generator whose uniform draws sit at fraction ``t`` of their interval."""

    def __init__(self, t: float) -> None:
        self.t = t

    def uniform(self, low: float, high: float) -> float:
        return low + (high - low) * self.t


# lo 0.2, hi 1.0: range R 0.8, centre 0.6
TINY = np.array([[0.2, 0.3, 0.5], [0.6, 0.8, 1.0]], np.float32)


@pytest.mark.parametrize(("u", "expected"), [
    # s 0.4, u +0.5: centre 0.6 + 0.5 * 0.4 * 0.8 = 0.76, width 0.8 * (1 - 0.2) = 0.64, window [0.44, 1.08]:
    # y = (x - 0.44) / 0.64 * 0.8 + 0.2 = 1.25 (x - 0.44) + 0.2, clipped to [0.2, 1.0] (darker)
    (0.5, [[0.2, 0.2, 0.275], [0.4, 0.65, 0.9]]),
    # u -0.5: centre 0.44, window [0.12, 0.76]: y = 1.25 (x - 0.12) + 0.2 (brighter, the top clipped)
    (-0.5, [[0.3, 0.425, 0.675], [0.8, 1.0, 1.0]]),
    # u 0: window [0.28, 0.92]: contrast stretched 1.25x about the centre
    (0.0, [[0.2, 0.225, 0.475], [0.6, 0.85, 1.0]]),
])
def test_window_level_known_answers(u: float, expected: list[list[float]]) -> None:
    out = _call(xray.window_level, TINY, 0.4, _FixedDraw((u + 1.0) / 2.0))
    np.testing.assert_allclose(out, expected, atol=1e-6)
    # an RGB image is windowed on its range over all channels, each pixel by the same map
    rgb = np.stack([TINY, np.full_like(TINY, 0.5), TINY[::-1]], axis=-1)
    out_rgb = _call(xray.window_level, rgb, 0.4, _FixedDraw((u + 1.0) / 2.0))
    assert out_rgb.shape == rgb.shape
    np.testing.assert_allclose(out_rgb[..., 0], expected, atol=1e-6)
    np.testing.assert_allclose(out_rgb[..., 2], np.asarray(expected)[::-1], atol=1e-6)


def test_window_level_strength_zero_and_a_flat_image_are_unchanged(camera: np.ndarray) -> None:
    spec = get_perturbation("window_level")
    assert spec.modalities == ("xray", "ct") and spec.weakest == 0.0
    for k in range(4):
        np.testing.assert_array_equal(spec.apply(camera, 0.0, rng_for("wl", k)).image, camera)
        flat = np.full((16, 16), 0.3, np.float32)
        np.testing.assert_array_equal(spec.apply(flat, spec.strongest, rng_for("wl", k)).image, flat)


def test_window_level_is_seeded_and_draws_once() -> None:
    img = np.tile(np.linspace(0.1, 0.9, 32, dtype=np.float32), (32, 1))
    spec = get_perturbation("window_level")
    a = spec.apply(img, 0.6, rng_for("wl", "seed")).image
    b = spec.apply(img, 0.6, rng_for("wl", "seed")).image
    assert a.tobytes() == b.tobytes()
    assert not np.array_equal(a, spec.apply(img, 0.6, rng_for("wl", "other")).image)
    states = []
    for s in (0.0, 0.3, spec.strongest):  # the same single draw at every strength
        g = rng_for("wl", "seed")
        spec.apply(img, s, g)
        states.append(g.bit_generator.state["state"]["state"])
    assert len(set(states)) == 1
    ref = rng_for("wl", "seed")
    ref.uniform(-1.0, 1.0)
    assert ref.bit_generator.state["state"]["state"] == states[0]


def test_window_level_moves_every_pixel_one_way(camera: np.ndarray) -> None:
    spec = get_perturbation("window_level")
    outs = np.stack([spec.apply(camera, float(s), rng_for("wl", "mono")).image
                     for s in np.linspace(0.0, spec.strongest, 10)])
    moves = np.diff(outs, axis=0)
    assert ((moves >= -1e-6).all(axis=0) | (moves <= 1e-6).all(axis=0)).all()


@pytest.mark.parametrize("k", range(6))
def test_window_level_ssim_falls_with_strength_on_a_real_image(k: int, camera: np.ndarray) -> None:
    spec = get_perturbation("window_level")
    u, _, _ = xray.window_level_params(camera, rng_for("wl", k))
    values = [ssim(camera, spec.apply(camera, float(s), rng_for("wl", k)).image)
              for s in np.linspace(spec.weakest, spec.strongest, 10)]
    assert values[0] == pytest.approx(1.0)
    assert (np.diff(values) <= 1e-4).all(), np.round(values, 4)
    assert values[-1] < 0.6, (u, np.round(values, 4))  # the camera reaches the lowest band at every draw


def test_window_level_is_for_xray_and_ct_only() -> None:
    having = {m for m in ALL_MODALITIES if "window_level" in list_perturbations(modality=m, n_channels=1)}
    assert having == {"xray", "ct"}


def test_window_level_calibrates_into_every_band_on_the_chest_film(chest: np.ndarray) -> None:
    spec = get_perturbation("window_level")
    for k in range(4):
        for lv, band in DEFAULT_BANDS.items():
            c = calibrate(spec, chest, band, ("wl", k))
            assert c.band_reached, (k, lv, c.strength, c.ssim)
