"""OpenCV's image operations as PyTorch tensor operations, for the device perturbation engine
(:mod:`medrobust_lib.perturb.torch_engine`).

Each function reproduces the OpenCV call the CPU perturbations make, on float32 batches
``(B, C, H, W)`` on any device, to float rounding (about 1e-6 on [0, 1] images; the tests compare
them with cv2 itself):

* borders (:func:`border_index`): ``cv2.borderInterpolate``'s rules (``constant``, ``replicate``,
  ``reflect`` = BORDER_REFLECT, ``reflect101`` = BORDER_REFLECT_101, OpenCV's default), for any
  pad width;
* :func:`gaussian_blur`: ``cv2.GaussianBlur(x, (0, 0), sigma)`` on float32 images: the kernel is
  ``cv2.getGaussianKernel(ksize, sigma, CV_32F)`` with OpenCV's size rule for float images
  (``round(8 sigma + 1) | 1``), applied separably;
* :func:`filter2d`: ``cv2.filter2D`` with a point-symmetric kernel and a reflected border, one
  kernel per batch item (FFT);
* :func:`remap`: ``cv2.remap`` with float maps (bilinear or nearest neighbour) and any border. OpenCV
  5 interpolates at the exact map coordinates; OpenCV 4 first rounds them to 1/32 pixel
  (``INTER_BITS``). :func:`cv2_remap_quantises` asks the installed cv2 once and :func:`remap`
  follows it, so the engines agree on either version;
* :func:`resize`: ``cv2.resize`` as two matrices (``R_h @ x @ R_w.T``): OpenCV's linear
  interpolation weights along each axis, read off ``cv2.resize`` of an identity matrix
  (:func:`resize_matrix`), so ``INTER_AREA``, ``INTER_LINEAR`` and ``INTER_CUBIC`` all use OpenCV's
  own coefficients.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from typing import Literal

import cv2
import numpy as np
import scipy.fft as sfft
import torch
import torch.nn.functional as F

Border = Literal["constant", "replicate", "reflect", "reflect101"]

@contextmanager
def full_float32() -> Iterator[None]:
    """Float32 convolutions and matrix products at full precision inside the block: no TF32 on
    NVIDIA GPUs (cuDNN allows it by default, which would cost about 1e-3 of relative precision);
    the previous settings are restored on exit."""
    matmul, conv = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, conv


# ---- borders ---------------------------------------------------------------------------------


def _fold(p: torch.Tensor, n: int, border: Border) -> torch.Tensor:
    """Integer positions ``p`` (any shape) folded into [0, n) by ``border`` (``constant``: clamped;
    callers mask the out-of-range positions themselves)."""
    if border in ("constant", "replicate") or n == 1:
        return p.clamp(0, n - 1)
    if border == "reflect101":
        period = 2 * n - 2
        q = torch.remainder(p, period)
        return torch.where(q >= n, period - q, q)
    if border == "reflect":
        period = 2 * n
        q = torch.remainder(p, period)
        return torch.where(q >= n, period - 1 - q, q)
    raise ValueError(f"unknown border {border!r}; known: constant, replicate, reflect, reflect101")


def border_index(n: int, before: int, after: int, border: Border, device: torch.device | str = "cpu") -> torch.Tensor:
    """Source index of each position ``-before .. n - 1 + after`` of an axis of ``n`` pixels
    extended by ``border`` (as ``cv2.borderInterpolate``; ``constant`` is not an index rule)."""
    if border == "constant":
        raise ValueError("a constant border has no source index; pad with zeros instead")
    p = torch.arange(-before, n + after, device=device)
    return _fold(p, n, border)


def pad(x: torch.Tensor, top: int, bottom: int, left: int, right: int, border: Border) -> torch.Tensor:
    """``cv2.copyMakeBorder`` of a (..., H, W) tensor (``constant`` pads zeros)."""
    if border == "constant":
        return F.pad(x, (left, right, top, bottom))
    h, w = x.shape[-2:]
    iy = border_index(h, top, bottom, border, x.device)
    ix = border_index(w, left, right, border, x.device)
    return x.index_select(-2, iy).index_select(-1, ix)


# ---- separable and FFT filters ---------------------------------------------------------------


def gaussian_ksize(sigma: float) -> int:
    """OpenCV's kernel size for ``ksize=(0, 0)`` on a float image: ``round(sigma * 8 + 1) | 1``."""
    return int(round(sigma * 8.0 + 1.0)) | 1


@lru_cache(maxsize=256)
def gaussian_kernel(sigma: float, ksize: int = 0) -> np.ndarray:
    """``cv2.getGaussianKernel(ksize, sigma, CV_32F)`` (float32 (K,)); ``ksize`` 0: OpenCV's size rule."""
    k = ksize or gaussian_ksize(sigma)
    return np.asarray(cv2.getGaussianKernel(k, sigma, cv2.CV_32F), np.float32).ravel()


def sep_filter(x: torch.Tensor, kx: torch.Tensor, ky: torch.Tensor, border: Border = "reflect101") -> torch.Tensor:
    """Separable correlation of (B, C, H, W) with 1-D kernels ``kx`` (along W) and ``ky`` (along H),
    odd lengths, centred, the border extended by ``border`` (``cv2.sepFilter2D``). A kernel may be
    (K,) for the whole batch or (B, K) per item (shorter ones zero-padded to a common K)."""
    b, c, h, w = x.shape

    def along(z: torch.Tensor, k: torch.Tensor, axis: int) -> torch.Tensor:
        kk = k if k.ndim == 2 else k[None].expand(b, -1)
        r = kk.shape[1] // 2
        if axis == 1:
            z = pad(z, 0, 0, r, r, border)
            weight = kk.to(z.dtype).repeat_interleave(c, 0)[:, None, None, :]
        else:
            z = pad(z, r, r, 0, 0, border)
            weight = kk.to(z.dtype).repeat_interleave(c, 0)[:, None, :, None]
        out = F.conv2d(z.reshape(1, b * c, *z.shape[2:]), weight, groups=b * c)
        return out.reshape(b, c, *out.shape[2:])

    return along(along(x, kx, 1), ky, 0)


def gaussian_blur(x: torch.Tensor, sigma: float | list[float], border: Border = "reflect101") -> torch.Tensor:
    """``cv2.GaussianBlur(x, (0, 0), sigma, borderType=border)`` of float32 (B, C, H, W); ``sigma``
    one value or one per batch item (each item its own OpenCV kernel)."""
    sigmas = [float(sigma)] * x.shape[0] if isinstance(sigma, (int, float)) else [float(s) for s in sigma]
    kernels = [gaussian_kernel(s) for s in sigmas]
    size = max(len(k) for k in kernels)
    stacked = np.zeros((len(kernels), size), np.float32)
    for i, k in enumerate(kernels):
        off = (size - len(k)) // 2
        stacked[i, off : off + len(k)] = k
    kt = torch.from_numpy(stacked).to(x.device)
    return sep_filter(x, kt, kt, border)


DIRECT_MAX = 11
"""Kernels up to this size are applied directly, larger ones by FFT (as
:func:`medrobust_lib.perturb.families.blur._filter`)."""


def filter2d(x: torch.Tensor, kernels: list[np.ndarray], border: Border = "reflect101") -> torch.Tensor:
    """``cv2.filter2D`` of float32 (B, C, H, W) with one square, odd-sized, point-symmetric kernel
    per batch item (so correlation equals convolution), on the image extended by ``border``: directly
    when every kernel is at most :data:`DIRECT_MAX` wide, else by FFT (the CPU blur's two paths,
    :func:`medrobust_lib.perturb.families.blur._filter`)."""
    b, c, h, w = x.shape
    r = max(k.shape[0] for k in kernels) // 2
    padded = pad(x, r, r, r, r, border)
    if 2 * r + 1 <= DIRECT_MAX:  # small kernels directly, as the CPU does (a delta kernel stays exact)
        weight = np.zeros((b, 2 * r + 1, 2 * r + 1), np.float32)
        for i, k in enumerate(kernels):
            off = r - k.shape[0] // 2
            weight[i, off : off + k.shape[0], off : off + k.shape[1]] = k
        wt = torch.from_numpy(weight).to(x.device, x.dtype).repeat_interleave(c, 0)[:, None]
        out = F.conv2d(padded.reshape(1, b * c, h + 2 * r, w + 2 * r), wt, groups=b * c)
        return out.reshape(b, c, h, w)
    shape = (sfft.next_fast_len(h + 2 * r, real=True), sfft.next_fast_len(w + 2 * r, real=True))
    stack = np.zeros((b, 2 * r + 1, 2 * r + 1), np.float32)
    for i, k in enumerate(kernels):
        off = r - k.shape[0] // 2
        stack[i, off : off + k.shape[0], off : off + k.shape[1]] = k
    kspec = torch.fft.rfft2(torch.from_numpy(stack).to(x.device), s=shape)
    spec = torch.fft.rfft2(padded, s=shape) * kspec[:, None]
    full = torch.fft.irfft2(spec, s=shape)
    return full[..., 2 * r : 2 * r + h, 2 * r : 2 * r + w].contiguous()


def gaussian_dct(x: torch.Tensor, sigma: float) -> torch.Tensor:
    """The untruncated Gaussian blur of (B, C, H, W) on the image extended by whole-sample
    reflection, computed on the DCT-I spectrum in float64 (as
    :func:`medrobust_lib.perturb.families.blur._gaussian_dct`): the DCT-I of n samples is the DFT of
    their even extension of period 2(n - 1). Returns float32."""
    out = x.to(torch.float64)
    for dim in (-2, -1):
        n = out.shape[dim]
        if n == 1:
            continue
        k = torch.arange(n, dtype=torch.float64, device=x.device)
        gain = torch.exp(-0.5 * (math.pi * sigma * k / (n - 1)) ** 2)
        ext = torch.cat([out, out.flip(dim).narrow(dim, 1, n - 2)], dim=dim)
        spec = torch.fft.rfft(ext, dim=dim)
        shape = [1] * out.ndim
        shape[dim] = n
        out = torch.fft.irfft(spec * gain.reshape(shape), n=2 * n - 2, dim=dim).narrow(dim, 0, n)
    return out.to(torch.float32)


# ---- resampling ------------------------------------------------------------------------------


@lru_cache(maxsize=1)
def cv2_remap_quantises() -> bool:
    """Whether the installed ``cv2.remap`` rounds float map coordinates to 1/32 pixel before
    bilinear interpolation (OpenCV 4's ``INTER_BITS``; OpenCV 5 interpolates exactly)."""
    img = np.array([[0.0, 1.0]], np.float32)
    mx = np.array([[0.01]], np.float32)  # 0.01 px rounds to 0/32
    my = np.zeros((1, 1), np.float32)
    out = cv2.remap(img, mx, my, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
    return float(out[0, 0]) == 0.0


def remap(x: torch.Tensor, map_x: torch.Tensor, map_y: torch.Tensor, border: Border = "constant",
          interpolation: Literal["linear", "nearest"] = "linear") -> torch.Tensor:
    """``cv2.remap`` of (B, C, H, W) at float pixel coordinates ``map_x``, ``map_y`` (B, H', W') (or
    (H', W') for the whole batch): output pixel (y, x) samples the input at (map_y, map_x);
    bilinear (``linear``) or nearest neighbour (coordinates rounded half to even, as cv2), the
    border extended by ``border`` (``constant``: zeros). Returns (B, C, H', W') in ``x``'s dtype."""
    b, c, h, w = x.shape
    if map_x.ndim == 2:
        map_x, map_y = map_x[None].expand(b, -1, -1), map_y[None].expand(b, -1, -1)
    ho, wo = map_x.shape[1:]
    flat = x.reshape(b, c, h * w)

    def sample(iy: torch.Tensor, ix: torch.Tensor) -> torch.Tensor:
        inside = (ix >= 0) & (ix < w) & (iy >= 0) & (iy < h) if border == "constant" else None
        idx = (_fold(iy, h, border) * w + _fold(ix, w, border)).reshape(b, 1, ho * wo).expand(-1, c, -1)
        v = flat.gather(2, idx).reshape(b, c, ho, wo)
        return v if inside is None else v * inside[:, None].to(v.dtype)

    if interpolation == "nearest":
        return sample(torch.round(map_y).long(), torch.round(map_x).long())
    mx, my = map_x.to(torch.float32), map_y.to(torch.float32)
    if cv2_remap_quantises():
        mx, my = torch.round(mx * 32.0) / 32.0, torch.round(my * 32.0) / 32.0
    fx0, fy0 = torch.floor(mx), torch.floor(my)
    fx, fy = (mx - fx0)[:, None].to(x.dtype), (my - fy0)[:, None].to(x.dtype)
    x0, y0 = fx0.long(), fy0.long()
    top = sample(y0, x0) * (1 - fx) + sample(y0, x0 + 1) * fx
    bottom = sample(y0 + 1, x0) * (1 - fx) + sample(y0 + 1, x0 + 1) * fx
    return top * (1 - fy) + bottom * fy


Interpolation = Literal["area", "linear", "cubic"]
_CV2_INTER = {"area": cv2.INTER_AREA, "linear": cv2.INTER_LINEAR, "cubic": cv2.INTER_CUBIC}


@lru_cache(maxsize=256)
def resize_matrix(n_in: int, n_out: int, interpolation: Interpolation) -> np.ndarray:
    """The (n_out, n_in) float64 matrix of ``cv2.resize`` along one axis (``cv2.resize`` of a float
    image is separable and linear: ``R_h @ x @ R_w.T``), read off ``cv2.resize`` of an identity so
    the weights are OpenCV's own (shrinking and enlarging alike)."""
    if interpolation not in _CV2_INTER:
        raise ValueError(f"unknown interpolation {interpolation!r}; known: {', '.join(_CV2_INTER)}")
    eye = np.eye(n_in, dtype=np.float64)
    r = cv2.resize(eye, (n_in, n_out), interpolation=_CV2_INTER[interpolation])
    return np.asarray(r, np.float64).reshape(n_out, n_in)


def resize(x: torch.Tensor, size: tuple[int, int], interpolation: Interpolation,
           dtype: torch.dtype | None = None) -> torch.Tensor:
    """``cv2.resize(x, (w', h'), interpolation)`` of (B, C, H, W) -> (B, C, h', w'), computed in
    ``dtype`` (default ``x``'s) and returned in ``x``'s dtype. ``area`` with one axis shrinking and the
    other enlarging is refused (OpenCV then switches both axes to linear weights)."""
    h, w = x.shape[-2:]
    nh, nw = size
    if interpolation == "area" and ((nh > h and nw < w) or (nh < h and nw > w)):
        # cv2 then interpolates both axes linearly, which per-axis weights of a shrink do not describe
        raise ValueError(f"INTER_AREA from {(h, w)} to {size} shrinks one axis and enlarges the other; unsupported")
    dt = dtype or x.dtype
    z = x.to(dt)
    if nh != h:
        rh = torch.as_tensor(resize_matrix(h, nh, interpolation), dtype=dt, device=x.device)
        z = torch.einsum("ih,bchw->bciw", rh, z)
    if nw != w:
        rw = torch.as_tensor(resize_matrix(w, nw, interpolation), dtype=dt, device=x.device)
        z = torch.einsum("jw,bchw->bchj", rw, z)
    return z.to(x.dtype)


# ---- small helpers ---------------------------------------------------------------------------


def smoothstep(t: torch.Tensor) -> torch.Tensor:
    """3t^2 - 2t^3 of ``t`` clipped to [0, 1] (:func:`medrobust_lib.perturb.field_ops.smoothstep`)."""
    t = t.clamp(0.0, 1.0)
    return t * t * (3.0 - 2.0 * t)


def as_batch(images: list[np.ndarray] | np.ndarray, device: torch.device | str = "cpu") -> torch.Tensor:
    """Same-shape float32 images (H, W) or (H, W, C) -> (B, C, H, W) float32 on ``device``."""
    arr = np.stack([np.asarray(im, np.float32) for im in images])
    t = torch.from_numpy(arr)
    t = t[:, None] if t.ndim == 3 else t.permute(0, 3, 1, 2)
    return t.contiguous().to(device)


def to_images(x: torch.Tensor) -> list[np.ndarray]:
    """(B, C, H, W) -> float32 host images, (H, W) for C = 1 and (H, W, C) otherwise."""
    host = x.detach().to("cpu", torch.float32)
    if host.shape[1] == 1:
        return [np.ascontiguousarray(a[0].numpy()) for a in host]
    return [np.ascontiguousarray(a.permute(1, 2, 0).numpy()) for a in host]
