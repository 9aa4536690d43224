"""Behaviour tests for the generic noise family (gaussian, salt-and-pepper, speckle)."""

from __future__ import annotations

import numpy as np
import pytest

from medrobust_lib.perturb.spec import get_perturbation
from medrobust_lib.perturb.ssim import ssim
from medrobust_lib.seeding import rng_for

TYPES = ["gaussian_noise", "salt_pepper_noise", "speckle_noise"]


def _flat(value: float, shape: tuple[int, ...] = (256, 256)) -> np.ndarray:
    return np.full(shape, value, np.float32)


def test_gaussian_noise_is_zero_mean_with_std_sigma_and_scales_one_field() -> None:
    spec = get_perturbation("gaussian_noise")
    img = _flat(0.5)
    out = spec.apply(img, 0.05, rng_for("t", "gauss")).image - img
    assert abs(out.mean()) < 0.002
    assert out.std() == pytest.approx(0.05, rel=0.03)
    # common random numbers: a stronger level is the same field, scaled
    out2 = spec.apply(img, 0.1, rng_for("t", "gauss")).image - img
    np.testing.assert_allclose(out2, 2.0 * out, atol=1e-6)
    # RGB channels get independent noise
    rgb = spec.apply(_flat(0.5, (64, 64, 3)), 0.05, rng_for("t", "gauss")).image
    assert abs(np.corrcoef(rgb[..., 0].ravel(), rgb[..., 1].ravel())[0, 1]) < 0.1


def test_salt_pepper_hits_the_fraction_of_whole_pixels_half_white_half_black() -> None:
    spec = get_perturbation("salt_pepper_noise")
    img = _flat(0.5, (256, 256, 3))
    out = spec.apply(img, 0.1, rng_for("t", "sp")).image
    hit = np.any(out != 0.5, axis=2)
    assert hit.mean() == pytest.approx(0.1, abs=0.005)
    # whole pixels: all channels of a hit pixel take the same extreme value
    vals = out[hit]
    assert np.all(vals == vals[:, :1]) and set(np.unique(vals)) == {0.0, 1.0}
    assert (vals[:, 0] == 1.0).mean() == pytest.approx(0.5, abs=0.03)
    # nested: every pixel hit at a weaker strength is hit, with the same value, at a stronger one
    weak = spec.apply(img, 0.03, rng_for("t", "sp")).image
    weak_hit = np.any(weak != 0.5, axis=2)
    assert np.all(hit[weak_hit]) and np.array_equal(weak[weak_hit], out[weak_hit])


def test_speckle_is_multiplicative() -> None:
    spec = get_perturbation("speckle_noise")
    img = _flat(0.0)
    img[:, 128:] = 0.4
    out = spec.apply(img, 0.2, rng_for("t", "speckle")).image
    assert np.all(out[:, :128] == 0.0)  # black stays black
    bright = out[:, 128:] - 0.4
    assert abs(bright.mean()) < 0.002
    assert bright.std() == pytest.approx(0.4 * 0.2, rel=0.03)  # std proportional to the signal


@pytest.mark.parametrize("name", TYPES)
def test_ssim_monotone_and_reaches_low_ssim(name: str, camera: np.ndarray) -> None:
    spec = get_perturbation(name)
    grid = np.linspace(spec.weakest, spec.strongest, 8)
    values = [ssim(camera, spec.apply(camera, float(s), rng_for("mono", name)).image) for s in grid]
    assert values[0] >= 0.98
    assert np.all(np.diff(values) <= 1e-3), np.round(values, 4)
    assert values[-1] < 0.6
