from __future__ import annotations

import numpy as np
import pytest
from skimage.metrics import structural_similarity

from medrobust_lib.perturb.ssim import ssim
from medrobust_lib.seeding import rng_for


@pytest.mark.parametrize("sigma", [0.0, 0.02, 0.1, 0.3])
def test_matches_skimage_gray(gray_image: np.ndarray, sigma: float) -> None:
    noisy = np.clip(gray_image + sigma * rng_for("ssim", sigma).standard_normal(gray_image.shape), 0, 1).astype(np.float32)
    ref = structural_similarity(gray_image, noisy, data_range=1.0)
    assert abs(ssim(gray_image, noisy) - ref) < 1e-4


@pytest.mark.parametrize("shape", [(64, 80, 3), (7, 7, 3), (31, 17, 3)])
def test_matches_skimage_rgb_and_odd_shapes(shape: tuple[int, int, int]) -> None:
    g = rng_for("ssim-rgb", shape)
    a = g.random(shape, dtype=np.float32)
    b = np.clip(a + 0.2 * g.standard_normal(shape), 0, 1).astype(np.float32)
    ref = structural_similarity(a, b, data_range=1.0, channel_axis=-1)
    assert abs(ssim(a, b) - ref) < 1e-4
    ref_gray = structural_similarity(a[..., 0], b[..., 0], data_range=1.0)
    assert abs(ssim(a[..., 0], b[..., 0]) - ref_gray) < 1e-4


def test_identity_and_errors(gray_image: np.ndarray) -> None:
    assert ssim(gray_image, gray_image) == pytest.approx(1.0, abs=1e-12)
    with pytest.raises(ValueError, match="equal shapes"):
        ssim(gray_image, gray_image[:-1])
    with pytest.raises(ValueError, match="at least 7x7"):
        ssim(gray_image[:5, :5], gray_image[:5, :5])
