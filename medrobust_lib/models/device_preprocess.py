"""LiteMedSAM's official preprocessing as a device operation, for batches that are already on the
device (the device perturbation feed, :mod:`medrobust_lib.perturb.torch_engine`).

The official steps (:func:`medrobust_lib.models.litemedsam.official_input`, on the host with
OpenCV): the image as uint8 RGB (``rint(x * 255)``), ``cv2.resize`` of the longest side to 256 with
``INTER_AREA`` (uint8 out), min-max over the resized image, zero padding to 256 x 256. On the
device (:func:`official_input_device`) the resize is OpenCV's own interpolation weights as two
matrices (:func:`medrobust_lib.perturb.torch_ops.resize`) in float64: before rounding it is within
half a uint8 step of cv2's uint8 output when shrinking and within 0.75 of a step when enlarging
(OpenCV enlarges uint8 images with 11-bit fixed-point weights), i.e. within 1/255 on the [0, 1]
scale. With ``quantise`` (default) the input is quantised as the official script does, shrunk
values are rounded as OpenCV rounds them (half up on its 2 x 2 fast path, half to even otherwise)
and enlarging runs OpenCV's fixed-point arithmetic, which reproduces cv2's uint8 output (the tests
compare the model inputs on the demo images at 200 to 1024 px). The host path stays the
reference: the official equality test and ``preprocess: exact`` on host images use it unchanged.
"""

from __future__ import annotations

import numpy as np
import torch

from medrobust_lib.perturb.torch_ops import resize, resize_matrix

IMAGE_SIZE = 256


def longest_side_size(h: int, w: int, target: int = IMAGE_SIZE) -> tuple[int, int]:
    """(new_h, new_w) of the official longest-side resize, ``int(side * target / max(h, w) + 0.5)``
    (also :func:`medrobust_lib.models.litemedsam.resized_size`)."""
    scale = target * 1.0 / max(h, w)
    return int(h * scale + 0.5), int(w * scale + 0.5)


RESIZE_COEF_BITS = 11
"""OpenCV's fixed-point weight precision for uint8 linear resizing (``INTER_RESIZE_COEF_BITS``)."""


def _fixed_point_weights(n_in: int, n_out: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """OpenCV's uint8 weights of an enlarging INTER_AREA resize along one axis (linear, two taps):
    (n_out, 2) source indices and (n_out, 2) integer weights (``round(w * 2048)``, 0 for no tap)."""
    r = resize_matrix(n_in, n_out, "area")
    idx = np.zeros((n_out, 2), np.int64)
    wts = np.zeros((n_out, 2), np.int64)
    for i in range(n_out):
        nz = np.nonzero(r[i])[0][:2]
        idx[i, : len(nz)] = nz
        wts[i, : len(nz)] = np.rint(r[i, nz] * (1 << RESIZE_COEF_BITS))
    return torch.from_numpy(idx).to(device), torch.from_numpy(wts).to(device)


def area_resize_u8(x: torch.Tensor, size: tuple[int, int], *, quantise: bool = True) -> torch.Tensor:
    """``cv2.resize(u8, (w', h'), INTER_AREA)`` of (B, C, H, W) values on the 0-255 scale, float64 out.

    Shrinking: OpenCV's weights in float64, then (``quantise``) rounded as cv2 rounds its uint8
    result (half up on its exact 2 x 2 path, half to even otherwise). Enlarging (cv2 then
    interpolates linearly in fixed point): with ``quantise``, OpenCV's integer arithmetic (11-bit
    weights; the vertical pass ``((b0 (S0 >> 4)) >> 16 + (b1 (S1 >> 4)) >> 16 + 2) >> 2``), which
    needs integer inputs; without, the float weights."""
    h, w = x.shape[-2:]
    nh, nw = size
    if (nh, nw) == (h, w):
        return x.to(torch.float64)
    if not quantise or (nh <= h and nw <= w):
        r = resize(x.to(torch.float64), (nh, nw), "area")
        if not quantise:
            return r
        return torch.floor(r + 0.5) if (h == 2 * nh and w == 2 * nw) else torch.round(r)
    # enlarging: cv2's fixed-point linear pass, exact in float64 (every value stays below 2**53)
    iw, ww = _fixed_point_weights(w, nw, x.device)
    ih, wh = _fixed_point_weights(h, nh, x.device)
    z = x.to(torch.float64)
    rows = z.index_select(-1, iw[:, 0]) * ww[:, 0].double() + z.index_select(-1, iw[:, 1]) * ww[:, 1].double()
    s = torch.round(rows).to(torch.int64)  # (B, C, H, nw), the horizontal sums
    s0 = s.index_select(-2, ih[:, 0]) >> 4
    s1 = s.index_select(-2, ih[:, 1]) >> 4
    b0, b1 = wh[:, 0][:, None], wh[:, 1][:, None]
    return (((b0 * s0) >> 16) + ((b1 * s1) >> 16) + 2 >> 2).to(torch.float64)


def official_input_device(images: torch.Tensor, *, quantise: bool = True) -> torch.Tensor:
    """(B, 3, H, W) float in [0, 1] on any device -> LiteMedSAM's model input (B, 3, 256, 256)
    float32 on that device (module docstring): uint8 quantisation (``quantise``), INTER_AREA
    longest-side resize, min-max per image over all channels (float64), zero padding bottom/right.
    Without ``quantise`` it is the float computation of
    :func:`medrobust_lib.models.litemedsam.differentiable_input` (no rounding)."""
    b, c, h, w = images.shape
    nh, nw = longest_side_size(h, w)
    x = images.to(torch.float64) * 255.0
    if quantise:
        x = torch.round(x).clamp_(0.0, 255.0)
    r = area_resize_u8(x, (nh, nw), quantise=quantise)
    lo = r.amin(dim=(1, 2, 3), keepdim=True)
    hi = r.amax(dim=(1, 2, 3), keepdim=True)
    norm = (r - lo) / (hi - lo).clamp_min(1e-8)
    return torch.nn.functional.pad(norm.to(torch.float32), (0, IMAGE_SIZE - nw, 0, IMAGE_SIZE - nh))
