"""Behaviour tests for the generic geometric family (rotation, scaling, translation)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import cast

import cv2
import numpy as np
import pytest

from medrobust_lib.data.boxes import mask_to_boxes
from medrobust_lib.perturb.spec import get_perturbation, identity_maps
from medrobust_lib.perturb.ssim import ssim
from medrobust_lib.seeding import rng_for

TYPES = ["rotation", "scaling", "translation"]
N = 128
C = (N - 1) / 2.0  # image centre in pixel-centre coordinates


@pytest.fixture()
def square() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A dim textured image with a bright off-centre square, its mask and its box."""
    rng = np.random.default_rng(0)
    img = (0.2 + 0.1 * rng.random((N, N))).astype(np.float32)
    mask = np.zeros((N, N), bool)
    mask[30:50, 76:100] = True
    img[mask] = 0.95
    return img, mask, mask_to_boxes(mask)


def _expected_box(box: np.ndarray, forward: Callable[[float, float], tuple[float, float]]) -> np.ndarray:
    """Tight XYXY box of the forward-mapped pixel centres of ``box`` (end exclusive)."""
    x0, y0, x1, y1 = box
    corners = np.array([[x0, y0], [x1 - 1, y0], [x0, y1 - 1], [x1 - 1, y1 - 1]], np.float64)
    pts = np.array([forward(x, y) for x, y in corners])
    return np.array([pts[:, 0].min(), pts[:, 1].min(), pts[:, 0].max() + 1, pts[:, 1].max() + 1])


def _maps(name: str, img: np.ndarray, strength: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    mx, my = cast(tuple[np.ndarray, np.ndarray], get_perturbation(name).fn(img, strength, rng))
    return mx, my


def _check_aligned(out_img: np.ndarray, out_mask: np.ndarray) -> None:
    # bright image pixels are exactly the (warped) mask, up to a 1-pixel interpolation rim
    eroded = cv2.erode(out_mask.astype(np.uint8), np.ones((3, 3), np.uint8)).astype(bool)
    dilated = cv2.dilate(out_mask.astype(np.uint8), np.ones((3, 3), np.uint8)).astype(bool)
    assert eroded.sum() > 50
    assert out_img[eroded].min() > 0.9
    assert out_img[~dilated].max() < 0.35


def test_rotation_moves_image_mask_and_box_together(square: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
    img, mask, boxes = square
    spec = get_perturbation("rotation")
    key = ("t", "rot")
    sign = 1.0 if rng_for(*key).random() < 0.5 else -1.0
    theta = math.radians(sign * 30.0)
    out = spec.apply(img, 30.0, rng_for(*key), mask=mask, boxes=boxes)
    assert out.mask is not None and out.boxes is not None
    _check_aligned(out.image, out.mask)

    # positive angles turn counter-clockwise as displayed (y axis pointing down)
    def forward(x: float, y: float) -> tuple[float, float]:
        dx, dy = x - C, y - C
        return C + math.cos(theta) * dx + math.sin(theta) * dy, C - math.sin(theta) * dx + math.cos(theta) * dy

    np.testing.assert_allclose(out.boxes[0], _expected_box(boxes[0], forward), atol=1.5)
    np.testing.assert_allclose(out.boxes[0], mask_to_boxes(out.mask)[0], atol=1.0)
    # the centre is fixed and a pure rotation keeps the square's area
    assert abs(int(out.mask.sum()) - int(mask.sum())) < 0.05 * mask.sum()
    assert out.image[int(C), int(C)] == pytest.approx(img[int(C), int(C)], abs=0.06)


def test_rotation_sign_flips_with_the_draw() -> None:
    angles = set()
    for i in range(8):
        _, my = _maps("rotation", np.zeros((N, N), np.float32), 10.0, rng_for("sign", i))
        # backward map: the output pixel right of the centre samples above (ccw) or below (cw) it
        angles.add(float(np.sign(my[int(C), N - 1] - C)))
    assert angles == {-1.0, 1.0}


def test_scaling_zooms_about_the_centre(square: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
    img, mask, boxes = square
    spec = get_perturbation("scaling")
    for want_in in (True, False):
        key = next(("t", i) for i in range(100) if (rng_for("t", i).random() < 0.5) == want_in)
        scale = 2.0 ** (0.5 if want_in else -0.5)
        out = spec.apply(img, 0.5, rng_for(*key), mask=mask, boxes=boxes)
        assert out.mask is not None and out.boxes is not None
        _check_aligned(out.image, out.mask)

        def forward(x: float, y: float, s: float = scale) -> tuple[float, float]:
            return C + s * (x - C), C + s * (y - C)

        expected = _expected_box(boxes[0], forward)
        np.testing.assert_allclose(out.boxes[0], expected, atol=1.5)
        assert out.mask.sum() == pytest.approx(scale**2 * mask.sum(), rel=0.08)  # area scales by s^2
        if not want_in:
            assert out.image[0, 0] == 0.0 and out.image[-1, -1] == 0.0  # zoom-out border is black


def test_translation_shifts_by_the_fraction_along_the_drawn_direction(
        square: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
    img, mask, boxes = square
    spec = get_perturbation("translation")
    key = ("t", "shift")
    phi = rng_for(*key).uniform(0.0, 2.0 * math.pi)
    s = 0.1
    dx, dy = s * N * math.cos(phi), s * N * math.sin(phi)
    out = spec.apply(img, s, rng_for(*key), mask=mask, boxes=boxes)
    assert out.mask is not None and out.boxes is not None
    _check_aligned(out.image, out.mask)
    np.testing.assert_allclose(out.boxes[0], boxes[0] + np.array([dx, dy, dx, dy]), atol=1.0)
    assert out.mask.sum() == mask.sum()
    # a shift of the whole image moves the other content by the same amount
    mx, my = _maps("translation", img, s, rng_for(*key))
    xs, ys = identity_maps(N, N)
    np.testing.assert_allclose(xs - mx, dx, atol=1e-3)
    np.testing.assert_allclose(ys - my, dy, atol=1e-3)


@pytest.mark.parametrize("name", TYPES)
def test_weakest_is_the_identity(name: str, camera: np.ndarray) -> None:
    spec = get_perturbation(name)
    assert spec.apply(camera, spec.weakest, rng_for("id", name)).image.tobytes() == camera.tobytes()


@pytest.mark.parametrize("name", TYPES)
def test_ssim_monotone_and_reaches_low_ssim(name: str, camera: np.ndarray) -> None:
    spec = get_perturbation(name)
    grid = np.linspace(spec.weakest, spec.strongest, 8)
    values = [ssim(camera, spec.apply(camera, float(s), rng_for("mono", name)).image) for s in grid]
    assert values[0] >= 0.98
    assert np.all(np.diff(values) <= 1e-3), np.round(values, 4)
    assert values[-1] < 0.6
