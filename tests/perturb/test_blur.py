"""Behaviour tests for the generic blur family (Gaussian, motion, defocus)."""

from __future__ import annotations

import math

import cv2
import numpy as np
import pytest

from medrobust_lib.perturb.families.blur import disk_kernel, motion_kernel
from medrobust_lib.perturb.spec import get_perturbation
from medrobust_lib.perturb.ssim import ssim
from medrobust_lib.seeding import rng_for

TYPES = ["gaussian_blur", "motion_blur", "defocus_blur"]


def _impulse(n: int = 81) -> np.ndarray:
    img = np.zeros((n, n), np.float32)
    img[n // 2, n // 2] = 1.0
    return img


def _moments(psf: np.ndarray) -> tuple[float, float, np.ndarray]:
    """Total mass, centroid offset from the centre, and the 2x2 (x, y) covariance of a PSF image."""
    n = psf.shape[0]
    ys, xs = np.mgrid[0:n, 0:n].astype(np.float64) - n // 2
    w = psf.astype(np.float64)
    mass = w.sum()
    cx, cy = (w * xs).sum() / mass, (w * ys).sum() / mass
    cov = np.array([[(w * xs * xs).sum(), (w * xs * ys).sum()], [(w * xs * ys).sum(), (w * ys * ys).sum()]]) / mass
    return float(mass), float(math.hypot(cx, cy)), cov


def test_gaussian_blur_psf_is_a_gaussian_of_std_sigma(camera: np.ndarray) -> None:
    spec = get_perturbation("gaussian_blur")
    psf = spec.apply(_impulse(), 3.0, rng_for("t")).image
    mass, offset, cov = _moments(psf)
    assert mass == pytest.approx(1.0, abs=1e-4) and offset < 1e-4
    np.testing.assert_allclose(np.diag(cov), [9.0, 9.0], rtol=0.02)  # variance sigma^2 per axis
    assert abs(cov[0, 1]) < 1e-3  # isotropic
    assert spec.apply(camera, 0.0, rng_for("t")).image.tobytes() == camera.tobytes()


def test_motion_blur_psf_is_a_centred_line_along_the_drawn_angle(camera: np.ndarray) -> None:
    spec = get_perturbation("motion_blur")
    length = 20.0
    angle = rng_for("t", "motion").uniform(0.0, math.pi)  # the one draw the type makes
    psf = spec.apply(_impulse(), length, rng_for("t", "motion")).image
    mass, offset, cov = _moments(psf)
    assert mass == pytest.approx(1.0, abs=1e-4) and offset < 1e-3  # centred: no shift of the image
    evals, evecs = np.linalg.eigh(cov)
    along = evecs[:, 1]
    assert abs(abs(along @ np.array([math.cos(angle), math.sin(angle)])) - 1.0) < 1e-3
    # uniform segment of length L: variance L^2 / 12 along it (plus the bilinear splat), ~0 across
    assert evals[1] == pytest.approx(length**2 / 12.0, rel=0.03)
    assert evals[0] < 0.3
    # continuous in the length, the identity at 0
    a = spec.apply(camera, 10.0, rng_for("t", "motion")).image
    b = spec.apply(camera, 10.01, rng_for("t", "motion")).image
    assert np.abs(a - b).max() < 2e-3
    assert spec.apply(camera, 0.0, rng_for("t", "motion")).image.tobytes() == camera.tobytes()
    np.testing.assert_allclose(motion_kernel(0.0, 0.3), [[0, 0, 0], [0, 1, 0], [0, 0, 0]], atol=1e-12)


def test_defocus_psf_is_a_uniform_disk(camera: np.ndarray) -> None:
    spec = get_perturbation("defocus_blur")
    r = 5.3
    psf = spec.apply(_impulse(), r, rng_for("t")).image
    n = psf.shape[0]
    ys, xs = np.mgrid[0:n, 0:n] - n // 2
    d = np.hypot(xs, ys)
    assert psf.sum() == pytest.approx(1.0, abs=1e-4)
    inner = psf[d <= r - 0.5]
    assert np.ptp(inner) < 1e-6 and inner.min() > 0  # flat top
    assert np.all(psf[d >= r + 0.5] < 1e-6)  # hard edge at the radius
    np.testing.assert_allclose(psf, psf.T, atol=1e-6)  # radially symmetric
    np.testing.assert_allclose(psf, psf[::-1, :], atol=1e-6)
    # continuous in the radius; the delta kernel at 0
    a = spec.apply(camera, 3.0, rng_for("t")).image
    b = spec.apply(camera, 3.001, rng_for("t")).image
    assert np.abs(a - b).max() < 2e-3
    np.testing.assert_allclose(disk_kernel(0.0), [[0, 0, 0], [0, 1, 0], [0, 0, 0]])
    # the large-kernel FFT path agrees with OpenCV's direct filter
    k = disk_kernel(9.0).astype(np.float32)
    ref = cv2.filter2D(camera, -1, k, borderType=cv2.BORDER_REFLECT_101)
    np.testing.assert_allclose(spec.apply(camera, 9.0, rng_for("t")).image, np.clip(ref, 0, 1), atol=1e-5)


@pytest.mark.parametrize("name", TYPES)
def test_ssim_monotone_and_reaches_low_ssim(name: str, camera: np.ndarray) -> None:
    spec = get_perturbation(name)
    grid = np.linspace(spec.weakest, spec.strongest, 8)
    values = [ssim(camera, spec.apply(camera, float(s), rng_for("mono", name)).image) for s in grid]
    assert values[0] >= 0.98
    assert np.all(np.diff(values) <= 1e-3), np.round(values, 4)
    assert values[-1] < 0.6
