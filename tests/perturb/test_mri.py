"""Behaviour tests for the MRI perturbation family (k-space physics)."""

from __future__ import annotations

from collections.abc import Callable

import cv2
import numpy as np
import pydicom
import pytest
from pydicom.data import get_testdata_file
from skimage import data

from medrobust_lib.perturb.families import mri
from medrobust_lib.perturb.spec import get_perturbation, list_perturbations
from medrobust_lib.perturb.ssim import ssim
from medrobust_lib.seeding import rng_for

N = 256


def _call(fn: Callable[..., object], *args: object) -> np.ndarray:
    """Call a registered perturbation function directly (unclipped), typed as an array."""
    return np.asarray(fn(*args), np.float32)


@pytest.fixture(scope="module")
def mr_image() -> np.ndarray:
    """pydicom's MR_small.dcm (ships in the wheel), 256x256, divided by its maximum."""
    a = pydicom.dcmread(str(get_testdata_file("MR_small.dcm"))).pixel_array.astype(np.float32)
    return np.clip(cv2.resize(a / a.max(), (N, N), interpolation=cv2.INTER_CUBIC), 0.0, 1.0)


@pytest.fixture(scope="module")
def phantom() -> np.ndarray:
    """Shepp-Logan phantom, 256x256 (it keeps the high frequencies the upsampled MR_small lacks)."""
    return np.asarray(cv2.resize(data.shepp_logan_phantom().astype(np.float32), (N, N),
                                 interpolation=cv2.INTER_AREA), np.float32)


def test_family_registers_the_six_types() -> None:
    assert set(list_perturbations(family="mri")) == {
        "kspace_motion", "bias_field", "ghosting", "rician_noise", "gibbs_ringing", "kspace_spike"}
    for name in list_perturbations(family="mri"):
        assert get_perturbation(name).modalities == ("mri",)


def test_kspace_motion_keeps_energy_and_position(mr_image: np.ndarray) -> None:
    # A pure phase ramp per line leaves |k-space| unchanged: the magnitude image keeps its energy
    # (Parseval); the k-space centre is acquired at the reference position, so no global shift.
    out = _call(mri.kspace_motion, mr_image, 1.0, rng_for("t", "motion"))
    np.testing.assert_allclose(np.sum(out.astype(np.float64) ** 2), np.sum(mr_image.astype(np.float64) ** 2), rtol=1e-4)
    assert ssim(mr_image, np.clip(out, 0, 1)) < 0.8
    a, b = mr_image - mr_image.mean(), out - out.mean()
    xcorr = np.real(np.fft.ifft2(np.fft.fft2(a) * np.conj(np.fft.fft2(b))))
    dy, dx = np.unravel_index(np.argmax(xcorr), xcorr.shape)
    assert min(dy, N - dy) <= 1 and min(dx, N - dx) <= 1  # at most a pixel of blur asymmetry


def test_bias_field_is_smooth_low_order_multiplicative_field() -> None:
    img = np.full((N, N), 0.05, np.float32)
    out = _call(mri.bias_field, img, 1.0, rng_for("t", "bias"))
    log_gain = np.log(out.astype(np.float64) / 0.05)
    # RMS log gain equals the strength, and the log gain is a cubic polynomial in (x, y).
    assert np.sqrt(np.mean(log_gain**2)) == pytest.approx(1.0, rel=1e-3)
    yy, xx = np.meshgrid(np.linspace(-1, 1, N), np.linspace(-1, 1, N), indexing="ij")
    basis = np.polynomial.legendre.legvander2d(yy.ravel(), xx.ravel(), [3, 3])
    coef, *_ = np.linalg.lstsq(basis, log_gain.ravel(), rcond=None)
    assert np.abs(basis @ coef - log_gain.ravel()).max() < 1e-4


def _key_with_period(period: int) -> tuple[str, int]:
    for i in range(200):
        if mri.ghost_period(rng_for("ghost", i)) == period:
            return ("ghost", i)
    raise AssertionError(f"no seed draws period {period}")


@pytest.mark.parametrize("period", [2, 4])
def test_ghosting_puts_replicas_at_n_over_p(mr_image: np.ndarray, period: int) -> None:
    a = 0.4
    out = _call(mri.ghosting, mr_image, a, rng_for(*_key_with_period(period)))
    shift = N // period
    if period == 2:
        expected = (1 - a) * mr_image + a * np.roll(mr_image, shift, axis=0)
    else:
        expected = (1 - a) * mr_image + a / 2 * (np.roll(mr_image, shift, axis=0) + np.roll(mr_image, -shift, axis=0))
    np.testing.assert_allclose(out, expected, atol=1e-4)


def test_rician_noise_on_zero_image_has_rayleigh_mean() -> None:
    sigma = 0.1
    out = _call(mri.rician_noise, np.zeros((N, N), np.float32), sigma, rng_for("t", "rician"))
    assert out.mean() == pytest.approx(sigma * np.sqrt(np.pi / 2), rel=0.02)
    assert out.min() >= 0.0


def test_gibbs_ringing_overshoots_at_edges_and_is_deterministic() -> None:
    step = np.full((N, N), 0.25, np.float32)
    step[:, N // 2 :] = 0.75
    out = _call(mri.gibbs_ringing, step, 0.75, rng_for("a"))
    np.testing.assert_array_equal(out, _call(mri.gibbs_ringing, step, 0.75, rng_for("b")))  # no randomness
    assert np.ptp(out, axis=0).max() < 1e-5  # a vertical edge rings only across it
    row = out[0]
    assert row.max() > 0.75 + 0.03  # overshoot next to the edge (Gibbs, ~9% of the jump)
    assert row[N // 2 + 20 : N - 20].min() < 0.75  # and oscillates back below the plateau
    np.testing.assert_allclose(_call(mri.gibbs_ringing, step, 0.0, rng_for("a")), step, atol=1e-6)


def test_kspace_spike_makes_a_plane_wave_at_the_drawn_frequency() -> None:
    key = next(("spike", i) for i in range(200) if (mri.spike_draw(rng_for("spike", i), N, N)[2][1:] == 0).all())
    pos, _, _ = mri.spike_draw(rng_for(*key), N, N)
    c, s = 0.5, 0.2
    out = _call(mri.kspace_spike, np.full((N, N), c, np.float32), s, rng_for(*key))
    # |c + s c e^{i k.r}| swings between c (1 - s) and c (1 + s).
    assert out.min() == pytest.approx(c * (1 - s), abs=0.01)
    assert out.max() == pytest.approx(c * (1 + s), abs=0.01)
    spec = np.abs(np.fft.fft2(out - out.mean()))
    peak = np.unravel_index(np.argmax(spec), spec.shape)
    ky, kx = int(pos[0, 0]), int(pos[0, 1])
    assert peak in {(ky, kx), ((-ky) % N, (-kx) % N)}


@pytest.mark.parametrize("name", ["kspace_motion", "bias_field", "ghosting", "rician_noise", "gibbs_ringing",
                                  "kspace_spike"])
def test_ssim_non_increasing_and_reaches_low_band(name: str, mr_image: np.ndarray, phantom: np.ndarray) -> None:
    # The upsampled MR_small has no content beyond a quarter of k-space, so Gibbs uses the phantom.
    img = phantom if name == "gibbs_ringing" else mr_image
    spec = get_perturbation(name)
    values = [ssim(img, spec.apply(img, float(s), rng_for("test", name)).image)
              for s in np.linspace(spec.weakest, spec.strongest, 8)]
    assert values[0] >= 0.98
    assert (np.diff(values) <= 1e-3).all(), np.round(values, 4)
    assert values[-1] < 0.6, np.round(values, 4)
