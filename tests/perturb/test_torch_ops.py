"""OpenCV's operations as torch operations (:mod:`medrobust_lib.perturb.torch_ops`) against cv2."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
import torch

from medrobust_lib.perturb import torch_ops as T
from medrobust_lib.perturb.families.blur import _gaussian_dct, disk_kernel, motion_kernel

BORDERS = {"reflect101": cv2.BORDER_REFLECT_101, "reflect": cv2.BORDER_REFLECT, "replicate": cv2.BORDER_REPLICATE}


@pytest.fixture(scope="module", autouse=True)
def one_thread(one_torch_thread: None) -> None:
    """Every test of this module on one torch thread (tests/conftest.py)."""


@pytest.fixture(scope="module")
def img() -> np.ndarray:
    g = np.random.default_rng(0)
    return np.asarray(cv2.GaussianBlur(g.random((40, 52, 3), dtype=np.float32), (0, 0), 1.0), np.float32)


@pytest.mark.parametrize("border", list(BORDERS))
@pytest.mark.parametrize("sigma", [0.1, 0.9, 2.4, 7.5])
def test_gaussian_blur_equals_cv2(img: np.ndarray, border: str, sigma: float) -> None:
    ref = cv2.GaussianBlur(img, (0, 0), sigma, borderType=BORDERS[border])
    got = T.to_images(T.gaussian_blur(T.as_batch([img]), sigma, border))[0]  # type: ignore[arg-type]
    assert np.abs(got - ref).max() < 1e-6


def test_per_item_sigmas_and_kernels(img: np.ndarray) -> None:
    x = T.as_batch([img, img[..., 0:1].repeat(3, 2)])
    got = T.to_images(T.gaussian_blur(x, [1.0, 3.0]))
    assert np.abs(got[0] - cv2.GaussianBlur(img, (0, 0), 1.0)).max() < 1e-6
    assert np.abs(got[1] - cv2.GaussianBlur(img[..., 0:1].repeat(3, 2), (0, 0), 3.0)).max() < 1e-6
    kernels = [motion_kernel(5.0, 0.3).astype(np.float32), disk_kernel(9.5).astype(np.float32)]  # direct, FFT
    for k in kernels:
        ref = cv2.filter2D(img, -1, k, borderType=cv2.BORDER_REFLECT_101)
        assert np.abs(T.to_images(T.filter2d(T.as_batch([img]), [k]))[0] - ref).max() < 1e-5
    delta = np.zeros((3, 3), np.float32)
    delta[1, 1] = 1.0
    assert torch.equal(T.filter2d(T.as_batch([img]), [delta]), T.as_batch([img]))  # exactly the input


@pytest.mark.parametrize("border", ["constant", *BORDERS])
def test_remap_equals_cv2(img: np.ndarray, border: str) -> None:
    g = np.random.default_rng(1)
    mx = (g.random((30, 44)) * 80 - 14).astype(np.float32)
    my = (g.random((30, 44)) * 64 - 12).astype(np.float32)
    cv_border = cv2.BORDER_CONSTANT if border == "constant" else BORDERS[border]
    ref = cv2.remap(img, mx, my, cv2.INTER_LINEAR, borderMode=cv_border, borderValue=0)
    got = T.to_images(T.remap(T.as_batch([img]), torch.from_numpy(mx), torch.from_numpy(my), border))[0]  # type: ignore[arg-type]
    assert np.abs(got - ref).max() < 1e-6
    ref_n = cv2.remap(img, mx, my, cv2.INTER_NEAREST, borderMode=cv_border, borderValue=0)
    got_n = T.to_images(T.remap(T.as_batch([img]), torch.from_numpy(mx), torch.from_numpy(my), border, "nearest"))[0]  # type: ignore[arg-type]
    np.testing.assert_array_equal(got_n, ref_n)


@pytest.mark.parametrize("interpolation,flag", [("area", cv2.INTER_AREA), ("linear", cv2.INTER_LINEAR),
                                                ("cubic", cv2.INTER_CUBIC)])
@pytest.mark.parametrize("size", [(10, 13), (33, 41), (80, 104), (61, 30), (40, 90)])
def test_resize_equals_cv2(img: np.ndarray, interpolation: str, flag: int, size: tuple[int, int]) -> None:
    if interpolation == "area" and size == (61, 30):  # one axis shrinks, the other grows
        with pytest.raises(ValueError, match="unsupported"):
            T.resize(T.as_batch([img]), size, "area")
        return
    ref = cv2.resize(img, (size[1], size[0]), interpolation=flag)
    got = T.to_images(T.resize(T.as_batch([img]), size, interpolation))[0]  # type: ignore[arg-type]
    assert np.abs(got - ref).max() < 1e-5


def test_gaussian_dct_equals_the_cpu_blur(img: np.ndarray) -> None:
    got = T.to_images(T.gaussian_dct(T.as_batch([img]), 30.0))[0]
    assert np.abs(got - _gaussian_dct(img, 30.0)).max() < 1e-6


def test_borders_and_errors() -> None:
    assert T.border_index(4, 2, 2, "reflect101").tolist() == [2, 1, 0, 1, 2, 3, 2, 1]
    assert T.border_index(4, 2, 2, "reflect").tolist() == [1, 0, 0, 1, 2, 3, 3, 2]
    assert T.border_index(3, 5, 0, "reflect101").tolist() == [1, 0, 1, 2, 1, 0, 1, 2]
    with pytest.raises(ValueError, match="constant"):
        T.border_index(4, 1, 1, "constant")
    with pytest.raises(ValueError, match="known"):
        T.resize_matrix(4, 2, "lanczos")  # type: ignore[arg-type]
    assert isinstance(T.cv2_remap_quantises(), bool)
