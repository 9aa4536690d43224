"""Behaviour tests for the generic digital family (JPEG, pixelate, contrast, brightness, saturation)."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
from skimage import data

from medrobust_lib.perturb.spec import get_perturbation
from medrobust_lib.perturb.ssim import ssim
from medrobust_lib.seeding import rng_for

LUMA = np.array([0.299, 0.587, 0.114], np.float32)


def _resize(img: np.ndarray) -> np.ndarray:
    return np.asarray(cv2.resize(img.astype(np.float32) / 255.0, (256, 256), interpolation=cv2.INTER_AREA),
                      np.float32)


@pytest.fixture(scope="module")
def astronaut() -> np.ndarray:
    return _resize(data.astronaut())


@pytest.fixture(scope="module")
def pathology() -> np.ndarray:
    return _resize(data.immunohistochemistry())


def _key_with_first_draw(tag: str, below_half: bool) -> tuple[str, int]:
    """A seed key whose generator's first ``random()`` is < 0.5 (``below_half``) or >= 0.5."""
    for i in range(100):
        if (rng_for(tag, i).random() < 0.5) == below_half:
            return (tag, i)
    raise AssertionError("no key found")


def test_jpeg_is_blocky_at_low_quality_and_near_lossless_at_100(camera: np.ndarray, astronaut: np.ndarray) -> None:
    spec = get_perturbation("jpeg_compression")
    best = spec.apply(camera, spec.weakest, rng_for("t")).image
    assert best.shape == camera.shape  # grayscale stays one channel
    assert np.abs(best - camera).max() < 3 / 255 and ssim(camera, best) > 0.99

    def boundary_ratio(img: np.ndarray) -> float:
        grad = np.abs(np.diff(img.astype(np.float64), axis=1)).mean(axis=0)
        edges = np.arange(7, img.shape[1] - 1, 8)  # between columns 8k-1 and 8k: 8x8 block seams
        return float(grad[edges].mean() / np.delete(grad, edges).mean())

    assert boundary_ratio(camera) < 1.2
    assert boundary_ratio(spec.apply(camera, 10, rng_for("t")).image) > 1.8
    # RGB is decoded back to RGB in the right channel order (mean colour kept)
    rgb = spec.apply(astronaut, 30, rng_for("t")).image
    np.testing.assert_allclose(rgb.mean(axis=(0, 1)), astronaut.mean(axis=(0, 1)), atol=0.01)


def test_pixelate_averages_cells_anchored_at_the_centre(camera: np.ndarray) -> None:
    spec = get_perturbation("pixelate")
    out = spec.apply(camera, 4.0, rng_for("t")).image
    blocks = camera.reshape(64, 4, 64, 4).mean(axis=(1, 3))
    np.testing.assert_allclose(out, np.repeat(np.repeat(blocks, 4, axis=0), 4, axis=1), atol=1e-6)
    # fractional cells: the 2.5-pixel cell [128, 130.5)^2 weights pixel 130 by its half overlap
    out = spec.apply(camera, 2.5, rng_for("t")).image
    w = np.array([1.0, 1.0, 0.5])
    ref = (np.outer(w, w) * camera[128:131, 128:131]).sum() / np.outer(w, w).sum()
    np.testing.assert_allclose(out[128:130, 128:130], ref, atol=1e-6)
    # continuous in the factor; the identity at 1
    a = spec.apply(camera, 3.0, rng_for("t")).image
    b = spec.apply(camera, 3.001, rng_for("t")).image
    assert np.abs(a - b).mean() < 1e-3
    assert spec.apply(camera, 1.0, rng_for("t")).image.tobytes() == camera.tobytes()


def test_contrast_keeps_the_mean_and_scales_deviations(astronaut: np.ndarray) -> None:
    spec = get_perturbation("contrast")
    img = (0.3 + 0.4 * astronaut).astype(np.float32)  # no clipping
    out = spec.apply(img, 0.6, rng_for("t")).image
    np.testing.assert_allclose(out.mean(axis=(0, 1)), img.mean(axis=(0, 1)), atol=1e-4)
    np.testing.assert_allclose(out.std(axis=(0, 1)), 0.4 * img.std(axis=(0, 1)), rtol=1e-3)


def test_brightness_shifts_by_strength_with_one_drawn_sign(camera: np.ndarray) -> None:
    spec = get_perturbation("brightness")
    img = (0.25 + 0.5 * camera).astype(np.float32)
    signs = set()
    for i in range(8):
        key = ("t", i)
        d1 = spec.apply(img, 0.1, rng_for(*key)).image - img
        d2 = spec.apply(img, 0.2, rng_for(*key)).image - img
        np.testing.assert_allclose(np.abs(d1), 0.1, atol=1e-6)  # a pure offset, no rescaling
        assert np.sign(d1).min() == np.sign(d1).max() == np.sign(d2).min()  # same sign at every strength
        signs.add(float(np.sign(d1[0, 0])))
    assert signs == {-1.0, 1.0}  # both darker and brighter are drawn
    dark = spec.apply(camera, 0.3, rng_for(*_key_with_first_draw("b", False))).image
    np.testing.assert_allclose(dark, np.clip(camera - 0.3, 0, 1), atol=1e-6)  # darkening clips to black


def test_saturation_keeps_luma_and_scales_chroma(astronaut: np.ndarray) -> None:
    spec = get_perturbation("saturation")
    img = (0.3 + 0.4 * astronaut).astype(np.float32)
    luma = img @ LUMA
    desat_key = _key_with_first_draw("s", True)
    gray = spec.apply(img, 1.0, rng_for(*desat_key)).image
    np.testing.assert_allclose(gray, np.repeat(luma[..., None], 3, axis=2), atol=1e-6)  # full grayscale
    over = spec.apply(img, 0.1, rng_for(*_key_with_first_draw("s", False))).image
    ok = np.all((over > 0) & (over < 1), axis=2)
    np.testing.assert_allclose((over @ LUMA)[ok], luma[ok], atol=1e-5)
    np.testing.assert_allclose((over - (over @ LUMA)[..., None])[ok], 1.9 * (img - luma[..., None])[ok], atol=1e-5)
    # an achromatic image has no chroma to change
    flat = np.repeat(img[..., :1], 3, axis=2)
    assert np.abs(spec.apply(flat, 0.5, rng_for(*desat_key)).image - flat).max() < 1e-6
    with pytest.raises(ValueError):
        spec.apply(img[..., 0], 0.5, rng_for("t"))  # RGB only


CASES = [
    ("jpeg_compression", "pathology", "mono"),
    ("pixelate", "camera", "mono"),
    ("contrast", "camera", "mono"),
    ("brightness", "camera", "mono"),
    ("saturation", "astronaut", "over"),
]


@pytest.mark.parametrize(("name", "image", "key"), CASES)
def test_ssim_monotone_and_reaches_low_ssim(name: str, image: str, key: str, request: pytest.FixtureRequest) -> None:
    img = request.getfixturevalue(image)
    spec = get_perturbation(name)
    seed = _key_with_first_draw("sat", False) if key == "over" else (key, name)
    grid = [spec.clamp(float(s)) for s in np.linspace(spec.weakest, spec.strongest, 8)]
    values = [ssim(img, spec.apply(img, s, rng_for(*seed)).image) for s in grid]
    assert values[0] >= 0.98
    assert np.all(np.diff(values) <= 1e-3), np.round(values, 4)
    assert values[-1] < 0.6


def test_desaturation_is_monotone_but_mild(astronaut: np.ndarray) -> None:
    spec = get_perturbation("saturation")
    seed = _key_with_first_draw("sat", True)
    values = [ssim(astronaut, spec.apply(astronaut, float(s), rng_for(*seed)).image) for s in np.linspace(0, 1, 8)]
    assert np.all(np.diff(values) <= 1e-3) and values[-1] > 0.85  # documented: only L1 reachable here
