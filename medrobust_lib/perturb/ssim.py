"""Structural similarity with the house settings (docs/design.md, section 3).

Uniform 7x7 window, K1 = 0.01, K2 = 0.03, data_range = 1.0, sample covariance (N / (N - 1)), the
mean taken over the valid interior (a 3-pixel border is cropped) and then over channels: the
definition of ``skimage.metrics.structural_similarity(a, b, data_range=1.0, channel_axis=-1 or
None)``.

Cheaper exact formulation: the interior of skimage's reflect-padded filter is exactly the valid
7x7 box mean, so only valid windows are used; the window means are OpenCV box filters in float32,
every channel in one call; and the clean image's half
(its window means and variances) is computed once per image by :class:`SSIMReference`, so an
evaluation filters three planes instead of five. Agrees with skimage to within about 3e-7 (the tests
require 1e-4). :func:`ssim` is ``SSIMReference(a)(b)``, bit for bit, so a recorded SSIM can be
recomputed from the two images alone.

:func:`ssim_torch` is the same definition on torch tensors (any device; several candidate
images against one clean image in one call), :func:`ssim_nchw` on batches of (clean, candidate)
pairs (the device perturbation engine); on CPU they agree with :func:`ssim` to better than 1e-6
(tests).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import cv2
import numpy as np

from medrobust_lib.types import FloatImage

if TYPE_CHECKING:
    import torch

WIN = 7
K1 = 0.01
K2 = 0.03
_PAD = (WIN - 1) // 2
_COV_NORM = WIN * WIN / (WIN * WIN - 1)


def _check_pair(shape_a: tuple[int, ...], shape_b: tuple[int, ...]) -> None:
    if shape_a != shape_b:
        raise ValueError(f"SSIM needs equal shapes, got {shape_a} and {shape_b}")


def _check_size(shape: tuple[int, ...]) -> None:
    if len(shape) not in (2, 3):
        raise ValueError(f"SSIM needs (H, W) or (H, W, C) images, got shape {shape}")
    if min(shape[:2]) < WIN:
        raise ValueError(f"SSIM needs images of at least {WIN}x{WIN}, got {shape[:2]}")


def _valid_box(z: np.ndarray) -> np.ndarray:
    """7x7 window means at every valid position: (H - 6, W - 6[, C]) float32. OpenCV filters up
    to 4 channels per call; more channels are filtered one at a time."""
    if z.ndim == 3 and z.shape[2] > 4:
        return np.stack([_valid_box(np.ascontiguousarray(z[..., c])) for c in range(z.shape[2])], axis=-1)
    out = cv2.boxFilter(z, ddepth=-1, ksize=(WIN, WIN), normalize=True, borderType=cv2.BORDER_REFLECT)
    return np.asarray(out[_PAD:-_PAD, _PAD:-_PAD], np.float32)


class SSIMReference:
    """SSIM against one fixed (clean) image; its window statistics are computed once.

    ``SSIMReference(a)(b) == ssim(a, b)`` exactly. ``a``: (H, W) or (H, W, C), H, W >= 7, any
    real dtype (used as float32), values in [0, data_range].
    """

    def __init__(self, a: FloatImage, data_range: float = 1.0) -> None:
        _check_size(a.shape)
        self.shape: tuple[int, ...] = tuple(a.shape)
        self._x = np.ascontiguousarray(a, dtype=np.float32)
        self._c1 = np.float32((K1 * data_range) ** 2)
        self._c2 = np.float32((K2 * data_range) ** 2)
        ux = _valid_box(self._x)
        uxx = _valid_box(self._x * self._x)
        cov = np.float32(_COV_NORM)
        self._ux = ux
        self._ux2 = ux * ux
        self._vx = cov * (uxx - self._ux2)

    def __call__(self, b: FloatImage) -> float:
        """SSIM(a, b) as a float in [-1, 1]; 1.0 for identical images."""
        _check_pair(self.shape, tuple(b.shape))
        y = np.ascontiguousarray(b, dtype=np.float32)
        cov = np.float32(_COV_NORM)
        uy = _valid_box(y)
        uyy = _valid_box(y * y)
        uxy = _valid_box(self._x * y)
        uxuy = self._ux * uy
        vxy = cov * (uxy - uxuy)
        vy = cov * (uyy - uy * uy)
        # the same operations in the same order on both sides, so identical images give exactly 1
        num = (2 * uxuy + self._c1) * (2 * vxy + self._c2)
        den = (self._ux2 + uy * uy + self._c1) * (self._vx + vy + self._c2)
        s = num / den
        if s.ndim == 3:  # mean per channel, then over channels (as skimage)
            return float(s.reshape(-1, s.shape[2]).mean(axis=0, dtype=np.float64).mean())
        return float(s.mean(dtype=np.float64))


def ssim(a: FloatImage, b: FloatImage, data_range: float = 1.0) -> float:
    """SSIM of two images of equal shape, (H, W) or (H, W, C), both at least 7x7. Returns a float
    in [-1, 1]; 1.0 for identical images."""
    _check_pair(tuple(a.shape), tuple(b.shape))
    return SSIMReference(a, data_range)(b)


def ssim_torch(a: torch.Tensor, b: torch.Tensor, data_range: float = 1.0,
               dtype: torch.dtype | None = None) -> torch.Tensor:
    """SSIM on torch, on the tensors' device.

    Args:
        a: the clean image, (H, W) or (H, W, C).
        b: one image of ``a``'s shape, or a batch (N, *a.shape) of candidates.
        dtype: computation dtype (default float64, where CPU and GPU agree with :func:`ssim` to
            better than 1e-6; float32 is faster on a GPU and agrees to about 1e-6).

    Returns:
        float64 tensor: a scalar for one image, (N,) for a batch.
    """
    import torch

    _check_size(tuple(a.shape))
    single = tuple(b.shape) == tuple(a.shape)
    if not single and tuple(b.shape[1:]) != tuple(a.shape):
        raise ValueError(f"SSIM needs equal shapes, got {tuple(a.shape)} and {tuple(b.shape)}")
    dt = dtype or torch.float64
    x = a.to(dtype=dt)
    y = (b[None] if single else b).to(device=x.device, dtype=dt)
    if x.ndim == 2:
        x, y = x[None], y[:, None]  # (1, H, W), (N, 1, H, W)
    else:
        x, y = x.permute(2, 0, 1), y.permute(0, 3, 1, 2)  # (C, H, W), (N, C, H, W)
    per_image = ssim_nchw(x[None].expand_as(y), y, data_range, dt)
    return per_image[0] if single else per_image


def ssim_nchw(x: torch.Tensor, y: torch.Tensor, data_range: float = 1.0, dtype: torch.dtype | None = None) -> torch.Tensor:
    """SSIM of image pairs on torch: ``x`` and ``y`` (N, C, H, W) (H, W >= 7), pair ``i`` being
    ``(x[i], y[i])``; computed in ``dtype`` (default float64). Returns float64 (N,): the same
    definition as :func:`ssim` (mean over the valid windows per channel, then over channels)."""
    import torch
    import torch.nn.functional as F

    if tuple(x.shape) != tuple(y.shape) or x.ndim != 4:
        raise ValueError(f"SSIM pairs need equal (N, C, H, W) shapes, got {tuple(x.shape)} and {tuple(y.shape)}")
    _check_size(tuple(x.shape[2:]))
    dt = dtype or torch.float64
    x, y = x.to(dtype=dt), y.to(device=x.device, dtype=dt)

    def box(z: torch.Tensor) -> torch.Tensor:
        return F.avg_pool2d(z, WIN, stride=1)

    c1, c2 = (K1 * data_range) ** 2, (K2 * data_range) ** 2
    ux, uy = box(x), box(y)
    vx = _COV_NORM * (box(x * x) - ux * ux)
    vy = _COV_NORM * (box(y * y) - uy * uy)
    vxy = _COV_NORM * (box(x * y) - ux * uy)
    s = ((2 * ux * uy + c1) * (2 * vxy + c2)) / ((ux * ux + uy * uy + c1) * (vx + vy + c2))
    return s.to(torch.float64).mean(dim=(2, 3)).mean(dim=1)
