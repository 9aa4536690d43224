"""Behaviour tests for the endoscopy family (specular_reflection, bubbles, blood,
endoscopy_overexposure)."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
from skimage import data

from medrobust_lib.perturb.spec import get_perturbation
from medrobust_lib.perturb.ssim import ssim
from medrobust_lib.seeding import rng_for

TYPES = ["specular_reflection", "bubbles", "blood", "endoscopy_overexposure"]


@pytest.fixture(scope="module")
def scene() -> np.ndarray:
    """float32 (256, 256, 3): skimage's coffee, cropped square (glossy red surfaces, like mucosa)."""
    crop = data.coffee()[0:400, 100:500]
    return np.asarray(cv2.resize(crop, (256, 256), interpolation=cv2.INTER_AREA), np.float32) / 255.0


def _flat(value: float | tuple[float, float, float], shape: tuple[int, int] = (256, 256)) -> np.ndarray:
    return np.broadcast_to(np.asarray(value, np.float32), shape + (3,)).copy()


def test_specular_reflection_saturates_to_white_and_only_brightens() -> None:
    spec = get_perturbation("specular_reflection")
    img = _flat((0.6, 0.3, 0.25))
    outs = [spec.apply(img, s, rng_for("t", "spec")).image for s in (0.05, 0.15)]
    white = [np.all(o >= 0.999, axis=2) for o in outs]
    assert 0.0 < white[0].mean() < white[1].mean()  # saturated highlights, growing
    assert white[1][white[0]].all()
    for o in outs:
        assert (o >= img - 1e-6).all()
    # the soft edge: there are pixels between the tissue colour and white
    edge = np.any(outs[1] > img + 0.05, axis=2) & ~white[1]
    assert edge.sum() > 0.1 * white[1].sum()


def test_bubbles_brighten_with_rims_and_cover_less_than_the_nominal_area() -> None:
    spec = get_perturbation("bubbles")
    img = _flat(0.3)
    cover = []
    outs = []
    for s in (0.2, 0.5):
        out = spec.apply(img, s, rng_for("t", "bub")).image
        assert (out >= img - 1e-6).all()  # a film scatters light back: nothing gets darker
        assert out.max() > 0.9  # bright rims and glints
        cover.append(float(np.any(out > 0.31, axis=2).mean()))
        outs.append(out)
        assert 0.4 * s < cover[-1] < s  # overlaps make the covered area smaller than nominal
    assert cover[0] < cover[1]
    # new bubbles slide in beneath: pixels already inside a bubble mostly keep their look
    inside = np.any(outs[0] > 0.31, axis=2)
    same: np.ndarray = np.all(np.isclose(outs[0], outs[1], atol=1e-5), axis=2)
    assert same[inside].mean() > 0.9


def test_blood_absorbs_green_and_blue_far_more_than_red_over_the_covered_fraction() -> None:
    spec = get_perturbation("blood")
    img = _flat(0.6)
    for s in (0.3, 0.6):
        out = spec.apply(img, s, rng_for("t", "blood")).image
        hit = np.any(out < 0.6 * 0.99, axis=2)
        assert hit.mean() == pytest.approx(s, abs=0.06)  # strength is the covered fraction
        ratio = out[hit] / 0.6
        assert (ratio[:, 0] > ratio[:, 1]).all() and (ratio[:, 0] > ratio[:, 2]).all()
        assert (out <= img + 1e-6).all()  # absorption only


def test_overexposure_is_a_linear_light_gain_peaking_at_the_hot_spot_then_clips_and_blooms() -> None:
    spec = get_perturbation("endoscopy_overexposure")
    img = _flat(0.5)
    out = spec.apply(img, 0.5, rng_for("t", "exp")).image  # no pixel reaches full well
    gain = (out.astype(np.float64) / 0.5) ** 2.2 - 1.0
    assert gain.max() == pytest.approx(0.5, rel=2e-3)  # extra gain at the hot spot = strength
    assert (gain > 0).all() and gain.min() < 0.5 * gain.max()
    # strong: the hot spot saturates, and the spill reaches black pixels next to it
    half = np.zeros((256, 256, 3), np.float32)
    half[:, 96:160] = 0.9
    strong = spec.apply(half, 20.0, rng_for("t", "exp")).image
    assert (strong[:, 96:160] >= 0.999).mean() > 0.3
    assert strong[:, 80:96].min(axis=2).max() > 0.2  # bloom next to the saturated strip
    assert strong[:, :8].max() < strong[:, 88:96].max()  # ... fading with distance
    # gains only rise with strength
    weaker = spec.apply(half, 5.0, rng_for("t", "exp")).image
    assert (strong >= weaker - 1e-6).all()


@pytest.mark.parametrize("name", TYPES)
def test_ssim_falls_monotonically_and_reaches_low_values(name: str, scene: np.ndarray) -> None:
    spec = get_perturbation(name)
    grid = np.linspace(spec.weakest, spec.strongest, 8)
    values = [ssim(scene, spec.apply(scene, float(s), rng_for("ssim", name)).image) for s in grid]
    assert values[0] >= 0.98
    assert (np.diff(values) <= 1e-3).all(), np.round(values, 4)
    assert values[-1] < 0.6, np.round(values, 4)
