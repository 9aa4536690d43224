"""The perturbation types in PyTorch: one port per type whose CPU implementation is tensor
arithmetic, for the device engine (:mod:`medrobust_lib.perturb.torch_engine`).

A port splits a type into what the strength does not touch and what it does:

* ``prepare(image, rng)`` runs on the host once per (image, type): it makes exactly the random
  draws of the CPU implementation, from the same generator (:func:`medrobust_lib.seeding.rng_for`
  of the same key), in the same order, so the device sees the same random field and the same
  (image, type, level, seed) gives the same output on either engine; and it computes the fields
  that depend on the clean image and the draws only (a rasterised streak pattern, a projector's
  reconstruction, a smoothed noise field) with the CPU code itself (the families' own helpers).
  Arrays shaped like the image are returned as (C, H, W) (:func:`chw`; an (H, W) field as
  (1, H, W), broadcasting over the channels).
* ``apply(x, s, f)`` runs on the device for a batch: ``x`` the clean images (B, C, H, W) float32,
  ``s`` the strengths (clamped to the type's range, one per item; items may be different images
  of one shape and different strengths), ``f`` the items' prepared values (:class:`Fields`). It
  returns the output before the spec's final clipping (intensity types) or the backward maps
  (spatial types), with the CPU implementation's operations in its order and precision (float32,
  float64 where the CPU computes in float64), so the outputs agree to float rounding.

Two types stay on the host (:data:`HOST_ONLY`, with the reason).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np
import torch

from medrobust_lib.perturb import torch_ops as T
from medrobust_lib.perturb.families import angio, blur, ct, derm, digital, endo, mri, oct, path, us, xray
from medrobust_lib.perturb.families.geometric import rotation_matrix
from medrobust_lib.perturb.field_ops import coverage_opacity, disc_labels

HOST_ONLY: dict[str, str] = {
    "jpeg_compression": "a library codec (libjpeg through OpenCV: integer DCT, quantisation and entropy "
                        "coding, chroma subsampling and upsampling); a tensor re-implementation would not "
                        "reproduce libjpeg's rounding, so the output would not match the CPU's",
    "hair": "OpenCV rasterises the strands (cv2.polylines, 1/16-px fixed point) and takes an exact Euclidean "
            "distance transform of a strength-dependent set of them (the rendered strands change with the "
            "strength); neither has an exact tensor counterpart",
}
"""Types without a device port, and why; they stay on the host workers."""

F32 = np.float32


def chw(a: np.ndarray) -> np.ndarray:
    """An image-shaped array (H, W) or (H, W, C) as (C, H, W) float32 ((1, H, W) for (H, W))."""
    a = np.asarray(a, np.float32)
    return a[None] if a.ndim == 2 else np.ascontiguousarray(np.moveaxis(a, -1, 0))


class Prepared:
    """One (image, type, key): the clean image and the port's prepared values, each array copied
    to ``device`` once, on first use (:meth:`tensor`), and kept for every strength and level."""

    def __init__(self, name: str, image: np.ndarray, values: dict[str, Any], device: torch.device | str) -> None:
        self.name = name
        self.shape: tuple[int, ...] = tuple(image.shape)
        self.values = values
        self.device = torch.device(device)
        self.clean = T.as_batch([image], self.device)[0]  # (C, H, W) float32
        self._tensors: dict[str, torch.Tensor] = {}

    def tensor(self, key: str) -> torch.Tensor:
        t = self._tensors.get(key)
        if t is None:
            v = self.values[key]
            t = (v if isinstance(v, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(v))).to(self.device)
            self._tensors[key] = t
        return t


class Fields:
    """The prepared values of a batch's items: :meth:`t` stacks an array value into a (B, ...)
    tensor on the device (from each item's device copy), :meth:`v` lists a value per item."""

    def __init__(self, items: Sequence[Prepared]) -> None:
        self.items = list(items)

    def t(self, name: str) -> torch.Tensor:
        return torch.stack([it.tensor(name) for it in self.items])

    def v(self, name: str) -> list[Any]:
        return [it.values[name] for it in self.items]


Prepare = Callable[[np.ndarray, np.random.Generator], dict[str, Any]]
Apply = Callable[[torch.Tensor, list[float], Fields], Any]


@dataclass(frozen=True)
class Port:
    """The device form of one type: ``prepare`` on the host, ``apply`` on the device (module
    docstring). ``spatial``: ``apply`` returns backward maps ``(map_x, map_y)``, (B, H, W) float32."""

    name: str
    prepare: Prepare
    apply: Apply
    spatial: bool = False


PORTS: dict[str, Port] = {}


def port(name: str, prepare: Prepare | None = None, spatial: bool = False) -> Callable[[Apply], Apply]:
    """Register ``apply`` as the device port of type ``name`` (no draws when ``prepare`` is None)."""

    def wrap(fn: Apply) -> Apply:
        if name in PORTS or name in HOST_ONLY:
            raise KeyError(f"device port {name!r} is already defined")
        PORTS[name] = Port(name, prepare or (lambda image, rng: {}), fn, spatial)
        return fn

    return wrap


def col(values: Sequence[float] | np.ndarray, x: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Per-item scalars as a (B, 1, 1, 1) tensor on ``x``'s device: each value rounded to ``dtype``
    on the host (the CPU's ``np.float32(...)`` of a float64 value)."""
    arr = np.asarray(values, np.float64 if dtype == torch.float64 else np.float32)
    return torch.from_numpy(arr.reshape(-1, 1, 1, 1)).to(x.device)


def _identity_where_zero(x: torch.Tensor, s: list[float], out: torch.Tensor) -> torch.Tensor:
    """``out`` with the items at strength <= 0 replaced by the input (the CPU returns the image
    unchanged there)."""
    zero = [i for i, v in enumerate(s) if v <= 0.0]
    if zero:
        out = out.clone()
        out[zero] = x[zero]
    return out


# ---- generic noise -----------------------------------------------------------------------------


def _normal_field(image: np.ndarray, rng: np.random.Generator) -> dict[str, Any]:
    return {"n": chw(rng.standard_normal(image.shape, dtype=F32))}


@port("gaussian_noise", _normal_field)
def _gaussian_noise(x: torch.Tensor, s: list[float], f: Fields) -> torch.Tensor:
    return x + col(s, x) * f.t("n")


def _salt_pepper_prepare(image: np.ndarray, rng: np.random.Generator) -> dict[str, Any]:
    h, w = image.shape[:2]
    u = rng.random((h, w), dtype=F32)
    salt = rng.random((h, w), dtype=F32) < 0.5
    return {"u": u[None], "salt": salt[None]}


@port("salt_pepper_noise", _salt_pepper_prepare)
def _salt_pepper(x: torch.Tensor, s: list[float], f: Fields) -> torch.Tensor:
    hit = f.t("u") < col(s, x)  # float32 comparison, as numpy compares a float32 field with a float
    salt = f.t("salt")
    out = torch.where(hit & salt, torch.ones_like(x), x)
    return torch.where(hit & ~salt, torch.zeros_like(x), out)


@port("speckle_noise", _normal_field)
def _speckle(x: torch.Tensor, s: list[float], f: Fields) -> torch.Tensor:
    return x + x * (col(s, x) * f.t("n"))


# ---- blur --------------------------------------------------------------------------------------


@port("gaussian_blur")
def _gaussian_blur(x: torch.Tensor, s: list[float], f: Fields) -> torch.Tensor:
    out = x.clone()
    direct = [i for i, v in enumerate(s) if 0.0 < v <= blur._GAUSSIAN_DIRECT_MAX_SIGMA]
    if direct:
        out[direct] = T.gaussian_blur(x[direct], [s[i] for i in direct], "reflect101")
    for i, v in enumerate(s):
        if v > blur._GAUSSIAN_DIRECT_MAX_SIGMA:
            out[i : i + 1] = T.gaussian_dct(x[i : i + 1], v)
    return out


def _kernel_blur(x: torch.Tensor, s: list[float], kernels: list[np.ndarray | None]) -> torch.Tensor:
    out = x.clone()
    small = [i for i, k in enumerate(kernels) if k is not None and k.shape[0] <= T.DIRECT_MAX]
    large = [i for i, k in enumerate(kernels) if k is not None and k.shape[0] > T.DIRECT_MAX]
    for idx in (small, large):  # the CPU's two paths: direct up to 11 px (exact for a delta kernel), else FFT
        if idx:
            out[idx] = T.filter2d(x[idx], [np.asarray(kernels[i], np.float32) for i in idx], "reflect101")
    return out


@port("motion_blur", lambda image, rng: {"angle": float(rng.uniform(0.0, math.pi))})
def _motion_blur(x: torch.Tensor, s: list[float], f: Fields) -> torch.Tensor:
    return _kernel_blur(x, s, [blur.motion_kernel(v, a) if v > 0.0 else None for v, a in zip(s, f.v("angle"), strict=True)])


@port("defocus_blur")
def _defocus_blur(x: torch.Tensor, s: list[float], f: Fields) -> torch.Tensor:
    return _kernel_blur(x, s, [blur.disk_kernel(v) if v > 0.0 else None for v in s])


# ---- geometric -------------------------------------------------------------------------------


def _affine(x: torch.Tensor, matrices: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
    """Backward maps (B, H, W) float32 of forward 2x3 affine matrices, computed as
    :func:`medrobust_lib.perturb.spec.affine_maps` does (float64, then float32)."""
    h, w = x.shape[-2:]
    inv = torch.from_numpy(np.stack([cv2.invertAffineTransform(np.asarray(m, np.float64)) for m in matrices]))
    inv = inv.to(x.device)[:, :, :, None, None]
    ys, xs = torch.meshgrid(torch.arange(h, dtype=torch.float64, device=x.device),
                            torch.arange(w, dtype=torch.float64, device=x.device), indexing="ij")
    map_x = inv[:, 0, 0] * xs + inv[:, 0, 1] * ys + inv[:, 0, 2]
    map_y = inv[:, 1, 0] * xs + inv[:, 1, 1] * ys + inv[:, 1, 2]
    return map_x.float(), map_y.float()


def _sign_prepare(image: np.ndarray, rng: np.random.Generator) -> dict[str, Any]:
    return {"sign": 1.0 if rng.random() < 0.5 else -1.0}


@port("rotation", _sign_prepare, spatial=True)
def _rotation(x: torch.Tensor, s: list[float], f: Fields) -> tuple[torch.Tensor, torch.Tensor]:
    h, w = x.shape[-2:]
    return _affine(x, [rotation_matrix(h, w, sg * v) for v, sg in zip(s, f.v("sign"), strict=True)])


@port("scaling", _sign_prepare, spatial=True)
def _scaling(x: torch.Tensor, s: list[float], f: Fields) -> tuple[torch.Tensor, torch.Tensor]:
    h, w = x.shape[-2:]
    centre = ((w - 1) / 2.0, (h - 1) / 2.0)
    return _affine(x, [cv2.getRotationMatrix2D(centre, 0.0, 2.0 ** (sg * v)) for v, sg in zip(s, f.v("sign"), strict=True)])


@port("translation", lambda image, rng: {"phi": float(rng.uniform(0.0, 2.0 * math.pi))}, spatial=True)
def _translation(x: torch.Tensor, s: list[float], f: Fields) -> tuple[torch.Tensor, torch.Tensor]:
    h, w = x.shape[-2:]
    return _affine(x, [np.array([[1.0, 0.0, v * w * math.cos(p)], [0.0, 1.0, v * h * math.sin(p)]])
                       for v, p in zip(s, f.v("phi"), strict=True)])


# ---- digital ---------------------------------------------------------------------------------


def _interp(table: torch.Tensor, t: np.ndarray, dim: int) -> torch.Tensor:
    """:func:`medrobust_lib.perturb.families.digital._interp` on a float64 tensor."""
    n = table.shape[dim]
    i = np.minimum(np.floor(t).astype(np.int64), n - 2)
    frac = torch.from_numpy(t - i).to(table.device)
    shape = [1] * table.ndim
    shape[dim] = -1
    idx = torch.from_numpy(i).to(table.device)
    lo = table.index_select(dim, idx)
    hi = table.index_select(dim, idx + 1)
    return lo + (hi - lo) * frac.reshape(shape)


def _cell_average(x: torch.Tensor, factor: float) -> torch.Tensor:
    """:func:`medrobust_lib.perturb.families.digital._cell_average` of one item (1, C, H, W): the
    integral image in float64, read at fractional cell corners."""
    h, w = x.shape[-2:]
    by, cy = digital._cells(h, factor)
    bx, cx = digital._cells(w, factor)
    table = torch.nn.functional.pad(x.to(torch.float64).cumsum(-1).cumsum(-2), (1, 0, 1, 0))
    corners = _interp(_interp(table, by, -2), bx, -1)
    sums = corners[..., 1:, 1:] - corners[..., :-1, 1:] - corners[..., 1:, :-1] + corners[..., :-1, :-1]
    area = torch.from_numpy(np.outer(np.diff(by), np.diff(bx))).to(x.device)
    means = (sums / area).to(torch.float32)
    return means.index_select(-2, torch.from_numpy(cy).to(x.device)).index_select(-1, torch.from_numpy(cx).to(x.device))


@port("pixelate")
def _pixelate(x: torch.Tensor, s: list[float], f: Fields) -> torch.Tensor:
    return torch.cat([x[i : i + 1] if max(v, 1.0) == 1.0 else _cell_average(x[i : i + 1], max(v, 1.0))
                      for i, v in enumerate(s)])


def _contrast_prepare(image: np.ndarray, rng: np.random.Generator) -> dict[str, Any]:
    m = np.asarray(cv2.mean(image)[: 1 if image.ndim == 2 else 3], F32)
    return {"m": m.reshape(-1, 1, 1)}


@port("contrast", _contrast_prepare)
def _contrast(x: torch.Tensor, s: list[float], f: Fields) -> torch.Tensor:
    return x - (x - f.t("m")) * col(s, x)


@port("brightness", lambda image, rng: {"sign": 1.0 if rng.random() < 0.5 else -1.0})
def _brightness(x: torch.Tensor, s: list[float], f: Fields) -> torch.Tensor:
    return x + col(f.v("sign"), x) * col(s, x)


def _saturation_prepare(image: np.ndarray, rng: np.random.Generator) -> dict[str, Any]:
    desaturate = bool(rng.random() < 0.5)
    return {"desaturate": desaturate, "y": chw((image @ digital._LUMA)[..., None])}


@port("saturation", _saturation_prepare)
def _saturation(x: torch.Tensor, s: list[float], f: Fields) -> torch.Tensor:
    gain = col([-v if d else 9.0 * v for v, d in zip(s, f.v("desaturate"), strict=True)], x)
    return x + (x - f.t("y")) * gain


# ---- angiography, X-ray --------------------------------------------------------------------------


@port("haze", lambda image, rng: {"veil": chw(angio.haze_airlight(rng, *image.shape[:2]))})
def _haze(x: torch.Tensor, s: list[float], f: Fields) -> torch.Tensor:
    s32 = np.asarray(s, F32)
    return x * col(F32(1.0) - s32, x) + col(s32, x) * f.t("veil")


@port("scatter", lambda image, rng: {"blurred": chw(xray.large_blur(image))})
def _scatter(x: torch.Tensor, s: list[float], f: Fields) -> torch.Tensor:
    s32 = np.asarray(s, F32)
    return _identity_where_zero(x, s, col(F32(1.0) - s32, x) * x + col(s32, x) * f.t("blurred"))


@port("underexposure", _normal_field)
def _underexposure(x: torch.Tensor, s: list[float], f: Fields) -> torch.Tensor:
    d = [10.0 ** (-v) for v in s]
    var = col([(1.0 / di - 1.0) / xray.REFERENCE_PHOTONS for di in d], x)
    sigma = torch.sqrt(x.clamp_min(0.0) * var)
    out = col([di**xray.UNDEREXPOSURE_DARKENING for di in d], x) * (x + sigma * f.t("n"))
    return _identity_where_zero(x, s, out)


@port("overexposure")
def _overexposure(x: torch.Tensor, s: list[float], f: Fields) -> torch.Tensor:
    return x * col([math.exp(v) for v in s], x)


def _grid_prepare(image: np.ndarray, rng: np.random.Generator) -> dict[str, Any]:
    h, w = image.shape[:2]
    freq, theta, phase = xray.grid_params(rng)
    ys, xs = np.mgrid[0:h, 0:w].astype(F32)
    u = xs * F32(np.cos(theta)) + ys * F32(np.sin(theta))
    stripes = F32(0.5) * (1.0 + np.cos(F32(2.0 * np.pi * freq) * u + F32(phase)))
    return {"stripes": stripes[None]}


@port("grid_lines", _grid_prepare)
def _grid_lines(x: torch.Tensor, s: list[float], f: Fields) -> torch.Tensor:
    return x * (1.0 - col(s, x) * f.t("stripes"))


def _window_level_prepare(image: np.ndarray, rng: np.random.Generator) -> dict[str, Any]:
    u, lo, hi = xray.window_level_params(image, rng)
    return {"u": u, "lo": lo, "hi": hi}


@port("window_level", _window_level_prepare)
def _window_level(x: torch.Tensor, s: list[float], f: Fields) -> torch.Tensor:
    u, lo, hi = f.v("u"), f.v("lo"), f.v("hi")
    flat = [v <= 0.0 or b <= a for v, a, b in zip(s, lo, hi, strict=True)]
    maps = [(0.0, 1.0) if z else xray.window_level_map(v, w, a, b)
            for v, w, a, b, z in zip(s, u, lo, hi, flat, strict=True)]
    out = (x - col([m[0] for m in maps], x)) * col([m[1] for m in maps], x) + col(lo, x)
    out = torch.minimum(torch.maximum(out, col(lo, x)), col(hi, x))
    keep = [i for i, z in enumerate(flat) if z]  # strength 0 or a constant image: unchanged, as on the CPU
    if keep:
        out[keep] = x[keep]
    return out


# ---- CT ------------------------------------------------------------------------------------------


def _metal_prepare(image: np.ndarray, rng: np.random.Generator) -> dict[str, Any]:
    lines, core = ct.metal_fields(image, ct.metal_draws(rng, *image.shape[:2]))
    return {"lines": lines[None], "core": core[None]}


@port("metal_streaks", _metal_prepare)
def _metal_streaks(x: torch.Tensor, s: list[float], f: Fields) -> torch.Tensor:
    field = col(s, x) * f.t("lines") + col([4.0 * v for v in s], x) * f.t("core")
    return _identity_where_zero(x, s, x + field)


@port("beam_hardening", lambda image, rng: {"err": ct.beam_hardening_error(image)[None]})
def _beam_hardening(x: torch.Tensor, s: list[float], f: Fields) -> torch.Tensor:
    return _identity_where_zero(x, s, x - col(s, x) * f.t("err"))


def _starvation_prepare(image: np.ndarray, rng: np.random.Generator) -> dict[str, Any]:
    h, w = image.shape[:2]
    n_bins = int(np.ceil(np.hypot(h, w))) + 3
    offsets = np.deg2rad(rng.uniform(-ct.STARVATION_SPREAD_DEG, ct.STARVATION_SPREAD_DEG, size=ct.STARVATION_ANGLES))
    noise = rng.standard_normal((ct.STARVATION_ANGLES, n_bins))
    return {"field": ct.starvation_field(image, offsets, noise)[None]}


@port("photon_starvation", _starvation_prepare)
def _photon_starvation(x: torch.Tensor, s: list[float], f: Fields) -> torch.Tensor:
    return _identity_where_zero(x, s, x + col(s, x) * f.t("field"))


def _ring_prepare(image: np.ndarray, rng: np.random.Generator) -> dict[str, Any]:
    h, w = image.shape[:2]
    prof = ct.ring_profile(rng, h, w, 0.25)
    return {"field": prof[ct._radius_index(h, w, 0.25)][None]}


@port("ring_artifact", _ring_prepare)
def _ring_artifact(x: torch.Tensor, s: list[float], f: Fields) -> torch.Tensor:
    return _identity_where_zero(x, s, x + col(s, x) * f.t("field"))


@port("window_shift", lambda image, rng: {"edges": ct.window_edges(rng)})
def _window_shift(x: torch.Tensor, s: list[float], f: Fields) -> torch.Tensor:
    ab = f.v("edges")
    lower = col([v * a for v, (a, _) in zip(s, ab, strict=True)], x)
    width = col([1.0 + v * (b - a) for v, (a, b) in zip(s, ab, strict=True)], x)
    return (x - lower) / width


# ---- MRI -----------------------------------------------------------------------------------------


def _magnitude(k: torch.Tensor) -> torch.Tensor:
    return torch.fft.ifft2(k).abs().to(torch.float32)


def _kspace(x: torch.Tensor) -> torch.Tensor:
    return torch.fft.fft2(x.to(torch.float32))


def _motion_prepare(image: np.ndarray, rng: np.random.Generator) -> dict[str, Any]:
    h, w = image.shape[:2]
    traj = mri.motion_trajectory(rng, h) * mri.MOTION_RMS_SHIFT
    cycles = mri._freqs(h)[:, None] * traj[:, 0:1] + mri._freqs(w)[None, :] * traj[:, 1:2]
    angle = (2.0 * np.pi * (cycles - np.round(cycles))).astype(F32)
    return {"cos": np.cos(angle)[None], "sin": np.sin(angle)[None]}


@port("kspace_motion", _motion_prepare)
def _kspace_motion(x: torch.Tensor, s: list[float], f: Fields) -> torch.Tensor:
    real = col([1.0 - v for v in s], x) + col(s, x) * f.t("cos")
    imag = col([-v for v in s], x) * f.t("sin")
    return _identity_where_zero(x, s, _magnitude(_kspace(x) * torch.complex(real, imag)))


@port("bias_field", lambda image, rng: {"p": mri.bias_log_field(rng, *image.shape[:2])[None]})
def _bias_field(x: torch.Tensor, s: list[float], f: Fields) -> torch.Tensor:
    return x * torch.exp(col(s, x) * f.t("p"))


@port("ghosting", lambda image, rng: {"period": mri.ghost_period(rng)})
def _ghosting(x: torch.Tensor, s: list[float], f: Fields) -> torch.Tensor:
    h = x.shape[-2]
    ky = mri._freqs(h).astype(np.float64)
    mods = [(1.0 - v + v * np.cos(2.0 * np.pi * ky / p)).astype(np.complex64) for v, p in zip(s, f.v("period"), strict=True)]
    mod = torch.from_numpy(np.stack(mods)).to(x.device)[:, None, :, None]
    return _identity_where_zero(x, s, _magnitude(_kspace(x) * mod))


def _rician_prepare(image: np.ndarray, rng: np.random.Generator) -> dict[str, Any]:
    n1 = rng.standard_normal(image.shape, dtype=F32)
    n2 = rng.standard_normal(image.shape, dtype=F32)
    return {"n1": chw(n1), "n2": chw(n2)}


@port("rician_noise", _rician_prepare)
def _rician(x: torch.Tensor, s: list[float], f: Fields) -> torch.Tensor:
    sc = col(s, x)
    return torch.sqrt((x + sc * f.t("n1")) ** 2 + (sc * f.t("n2")) ** 2)


@port("gibbs_ringing")
def _gibbs(x: torch.Tensor, s: list[float], f: Fields) -> torch.Tensor:
    h, w = x.shape[-2:]
    wh = torch.from_numpy(np.stack([mri._truncation_weights(h, max(v, 0.0)) for v in s])).to(x.device)
    ww = torch.from_numpy(np.stack([mri._truncation_weights(w, max(v, 0.0)) for v in s])).to(x.device)
    win = (wh[:, :, None] * ww[:, None, :])[:, None]
    return _identity_where_zero(x, s, _magnitude(_kspace(x) * win))


@port("kspace_spike", lambda image, rng: {"spikes": mri.spike_draw(rng, *image.shape[:2])})
def _kspace_spike(x: torch.Tensor, s: list[float], f: Fields) -> torch.Tensor:
    k = _kspace(x)
    peak = k.abs().amax(dim=(-2, -1)).to(torch.complex128)  # (B, C), per channel
    for i, (v, (pos, phase, rel)) in enumerate(zip(s, f.v("spikes"), strict=True)):
        for (ky, kx), ph, r in zip(pos, phase, rel, strict=True):
            k[i, :, int(ky), int(kx)] += (v * r * ph * peak[i]).to(torch.complex64)
    return _magnitude(k)


# ---- dermoscopy ----------------------------------------------------------------------------------


def _vignetting_prepare(image: np.ndarray, rng: np.random.Generator) -> dict[str, Any]:
    h, w = image.shape[:2]
    cx, cy = rng.normal(0.0, 0.05, size=2)
    half_diag = 0.5 * float(np.hypot(h, w))
    xs = (np.arange(w, dtype=F32) - (w - 1) / 2 - float(cx) * w) / half_diag
    ys = (np.arange(h, dtype=F32) - (h - 1) / 2 - float(cy) * h) / half_diag
    return {"r2": (ys[:, None] ** 2 + xs[None, :] ** 2)[None]}


@port("vignetting", _vignetting_prepare)
def _vignetting(x: torch.Tensor, s: list[float], f: Fields) -> torch.Tensor:
    gain = 1.0 / (1.0 + col([v * v for v in s], x) * f.t("r2")) ** 2
    return _identity_where_zero(x, s, x * gain)


def _reflection_prepare(image: np.ndarray, rng: np.random.Generator) -> dict[str, Any]:
    h, w = image.shape[:2]
    n = derm._N_SPOTS
    centres = rng.uniform(0.08, 0.92, size=(n, 2))
    rel = rng.uniform(0.5, 1.5, size=n)
    aspect = rng.uniform(0.35, 1.0, size=n)
    angle = rng.uniform(0.0, np.pi, size=n)
    core = rng.uniform(0.4, 0.75, size=n)
    tint = 1.0 - rng.uniform(0.0, 0.06, size=3)
    side = float(min(h, w))
    spots = np.stack([centres[:, 0] * w, centres[:, 1] * h, rel * side, rel * aspect * side, angle, core], axis=1)
    light = np.asarray(derm._colour(image, tint), F32).reshape(-1, 1, 1)
    return {"spots": spots, "light": light}


def _ellipse_alpha(x: torch.Tensor, s: list[float], spots: list[np.ndarray]) -> torch.Tensor:
    """:func:`medrobust_lib.perturb.families.derm._ellipse_alpha` over the whole image, (B, 1, H, W):
    outside each spot's box its opacity is exactly 0, as the CPU leaves it."""
    b, _, h, w = x.shape
    dev = x.device
    keep = torch.ones((b, 1, h, w), dtype=torch.float32, device=dev)
    xs = torch.arange(w, dtype=torch.float32, device=dev)
    ys = torch.arange(h, dtype=torch.float32, device=dev)
    for j in range(spots[0].shape[0]):
        cols = np.array([sp[j] for sp in spots])  # (B, 6): cx, cy, a, b, angle, lo
        a_s, b_s = cols[:, 2] * np.asarray(s), cols[:, 3] * np.asarray(s)
        on = a_s >= 1e-3
        reach = a_s + 1.0
        x0 = np.maximum(np.floor(cols[:, 0] - reach), 0)
        x1 = np.minimum(np.ceil(cols[:, 0] + reach) + 1, w)
        y0 = np.maximum(np.floor(cols[:, 1] - reach), 0)
        y1 = np.minimum(np.ceil(cols[:, 1] + reach) + 1, h)
        on &= (x0 < x1) & (y0 < y1)
        if not on.any():
            continue
        dx = xs[None, None, None, :] - col(cols[:, 0], x)
        dy = ys[None, None, :, None] - col(cols[:, 1], x)
        c, sn = col(np.cos(cols[:, 4]), x), col(np.sin(cols[:, 4]), x)
        u = (c * dx + sn * dy) / col(np.where(on, a_s, 1.0), x)
        v = (-sn * dx + c * dy) / col(np.maximum(b_s, 1e-3), x)
        q = torch.sqrt(u * u + v * v)
        t = ((1.0 - q) / col(1.0 - cols[:, 5], x)).clamp(0.0, 1.0)
        alpha = t * t * (3 - 2 * t) * col(on.astype(np.float64), x)
        keep = keep * (1.0 - alpha)
    return 1.0 - keep


@port("light_reflection", _reflection_prepare)
def _light_reflection(x: torch.Tensor, s: list[float], f: Fields) -> torch.Tensor:
    a = _ellipse_alpha(x, s, f.v("spots"))
    return _identity_where_zero(x, s, x + a * (f.t("light") - x))


# ---- endoscopy -----------------------------------------------------------------------------------


def _specular_prepare(image: np.ndarray, rng: np.random.Generator) -> dict[str, Any]:
    h, w = image.shape[:2]
    side = float(min(h, w))
    centres = rng.uniform(0.1, 0.9, size=(endo._N_CLUSTERS, 1, 2))
    offsets = rng.normal(0.0, 1.0, size=(endo._N_CLUSTERS, endo._N_SUB, 2))
    radii = rng.uniform(0.15, 0.6, size=(endo._N_CLUSTERS, endo._N_SUB))
    pos = centres * np.array([w, h]) + offsets * endo._CLUSTER_SPREAD * side
    return {"px": pos[..., 0].reshape(-1), "py": pos[..., 1].reshape(-1), "radii": radii.reshape(-1), "side": side}


@port("specular_reflection", _specular_prepare)
def _specular(x: torch.Tensor, s: list[float], f: Fields) -> torch.Tensor:
    b, _, h, w = x.shape
    dev = x.device
    px, py, radii = np.stack(f.v("px")), np.stack(f.v("py")), np.stack(f.v("radii"))
    sig = radii * (np.asarray(s) * np.asarray(f.v("side")))[:, None]  # (B, blobs), float64
    xs = torch.arange(w, dtype=torch.float32, device=dev)
    ys = torch.arange(h, dtype=torch.float32, device=dev)
    field = torch.zeros((b, 1, h, w), dtype=torch.float32, device=dev)
    for j in range(sig.shape[1]):
        reach = 1.7 * sig[:, j] + 1.0
        x0 = np.maximum(np.floor(px[:, j] - reach), 0)
        x1 = np.minimum(np.ceil(px[:, j] + reach) + 1, w)
        y0 = np.maximum(np.floor(py[:, j] - reach), 0)
        y1 = np.minimum(np.ceil(py[:, j] + reach) + 1, h)
        on = (x0 < x1) & (y0 < y1) & (sig[:, j] >= 1e-3)
        if not on.any():
            continue
        sg = col(np.where(on, sig[:, j], 1.0), x)
        gx = torch.exp(-0.5 * ((xs[None, None, None, :] - col(px[:, j], x)) / sg) ** 2)
        gy = torch.exp(-0.5 * ((ys[None, None, :, None] - col(py[:, j], x)) / sg) ** 2)
        # outside its box a blob is below the 0.25 at which the highlight starts: skipping it there
        # (the CPU) or taking the maximum (here) gives the same opacity
        field = torch.maximum(field, gy * gx * col(on.astype(np.float64), x))
    alpha = T.smoothstep((field - 0.25) / 0.35)
    return _identity_where_zero(x, s, x + alpha * (1.0 - x))


def _disc_prepare(image: np.ndarray, cxy: np.ndarray, r: np.ndarray) -> dict[str, Any]:
    """The per-image part of :func:`medrobust_lib.perturb.field_ops.layer_discs`: the label map of
    all discs (the topmost, i.e. earliest, disc covering each pixel; ``len(r)`` where none). The
    label map of the first ``n`` discs is ``min(labels, n)`` with ``n`` for labels >= n, because
    each disc is rasterised on its own and earlier discs lie on top."""
    h, w = image.shape[:2]
    labels = disc_labels(h, w, cxy[:, 0], cxy[:, 1], r)
    return {"cxy": cxy, "r": r, "labels": labels.astype(np.int64)}


Look = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, Fields], tuple[torch.Tensor, torch.Tensor]]


def _layer_discs(x: torch.Tensor, s: list[float], f: Fields, look: Look) -> torch.Tensor:
    """:func:`medrobust_lib.perturb.field_ops.layer_discs` for a batch: the partly opaque disc over its
    box, then the fully opaque discs (per-pixel centre and radius from the label map) on top.
    ``look(x, bx, by, rr, f)`` takes per-pixel or per-item (B, 1, H, W)-broadcastable centres and
    radii (float32) and returns (the disc's look (B, C, H, W), its anti-aliased edge (B, 1, H, W))."""
    b, _, h, w = x.shape
    dev = x.device
    out = x.clone()
    n_discs = len(f.v("r")[0])
    n_full, partial, boxes = [], [], np.zeros((b, 4), np.int64)
    for i, (v, cxy, r) in enumerate(zip(s, f.v("cxy"), f.v("r"), strict=True)):
        opacity = coverage_opacity(np.pi * r * r, v * h * w)
        n = int(np.count_nonzero(opacity >= 1.0))
        n_full.append(n)
        op = float(opacity[n]) if n < len(r) else 0.0
        if op > 0:
            cx, cy, rad = float(cxy[n, 0]), float(cxy[n, 1]), float(r[n])
            x0, x1 = max(int(np.floor(cx - rad - 1)), 0), min(int(np.ceil(cx + rad + 1)) + 1, w)
            y0, y1 = max(int(np.floor(cy - rad - 1)), 0), min(int(np.ceil(cy + rad + 1)) + 1, h)
            if not (x0 < x1 and y0 < y1):
                op = 0.0
            boxes[i] = (y0, y1, x0, x1)
        partial.append((op, n))
    if any(op > 0 for op, _ in partial):
        idx = [min(n, n_discs - 1) for _, n in partial]
        bx = col([f.v("cxy")[i][j, 0] for i, j in enumerate(idx)], x)
        by = col([f.v("cxy")[i][j, 1] for i, j in enumerate(idx)], x)
        rr = col([f.v("r")[i][j] for i, j in enumerate(idx)], x)
        seen, edge = look(x, bx, by, rr, f)
        ys = torch.arange(h, device=dev)[None, None, :, None]
        xs = torch.arange(w, device=dev)[None, None, None, :]
        bt = torch.from_numpy(boxes).to(dev)[:, :, None, None, None]
        inside = (ys >= bt[:, 0]) & (ys < bt[:, 1]) & (xs >= bt[:, 2]) & (xs < bt[:, 3])
        a = edge * col([op for op, _ in partial], x) * inside
        out = out + a * (seen - out)
    if any(n_full):
        labels = f.t("labels")  # (B, H, W), n_discs where no disc
        limit = torch.as_tensor(n_full, device=dev)[:, None, None]
        lab = torch.where(labels < limit, labels, torch.full_like(labels, n_discs))
        # one row per disc plus a far-away dummy for uncovered pixels (its disc edge is 0 there)
        tab = np.zeros((b, n_discs + 1, 3), np.float32)
        for i, (cxy, r) in enumerate(zip(f.v("cxy"), f.v("r"), strict=True)):
            tab[i, :n_discs, 0], tab[i, :n_discs, 1], tab[i, :n_discs, 2] = cxy[:, 0], cxy[:, 1], r
            tab[i, n_discs] = (-1e4, -1e4, 1.0)
        tt = torch.from_numpy(tab).to(dev)
        flat = lab.reshape(b, -1)
        per_pixel = [tt[:, :, k].gather(1, flat).reshape(b, 1, h, w) for k in range(3)]
        seen, edge = look(x, per_pixel[0], per_pixel[1], per_pixel[2], f)
        full = torch.as_tensor([n > 0 for n in n_full], device=dev)[:, None, None, None]
        out = torch.where(full, out + edge * (seen - out), out)
    return _identity_where_zero(x, s, out)


def _disc_port(name: str, prepare: Prepare, look: Look) -> None:
    """Register a disc-layering type: :func:`_layer_discs` with the type's ``look``."""
    port(name, prepare)(lambda x, s, f: _layer_discs(x, s, f, look))


def _bubbles_prepare(image: np.ndarray, rng: np.random.Generator) -> dict[str, Any]:
    h, w = image.shape[:2]
    side = float(min(h, w))
    cxy = rng.uniform(0.0, 1.0, size=(endo._N_BUBBLES, 2)) * np.array([w, h])
    r = np.exp(rng.uniform(np.log(0.02), np.log(0.12), size=endo._N_BUBBLES)) * side
    glint_dir = float(rng.uniform(0.0, 2 * np.pi))
    return {**_disc_prepare(image, cxy, r), "glint": glint_dir}


def _bubble_look(x: torch.Tensor, bx: torch.Tensor, by: torch.Tensor, rr: torch.Tensor, f: Fields
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`medrobust_lib.perturb.families.endo._bubble_look` over the whole image."""
    _, _, h, w = x.shape
    inv_r = 1.0 / rr
    dx = torch.arange(w, dtype=torch.float32, device=x.device)[None, None, None, :] - bx
    dy = torch.arange(h, dtype=torch.float32, device=x.device)[None, None, :, None] - by
    u, v = dx * inv_r, dy * inv_r
    rho2 = u * u + v * v
    rho = torch.sqrt(rho2)
    mag = 0.65 + 0.35 * torch.clamp(rho2, max=1.0)
    map_x = (bx + dx * mag).expand_as(rho)[:, 0]
    map_y = (by + dy * mag).expand_as(rho)[:, 0]
    seen = T.remap(x, map_x, map_y, "reflect")
    rim = torch.clamp(1.0 - ((rho - 0.93) * (1.0 / 0.09)) ** 2, min=0.0)
    g = f.v("glint")
    gx = col([0.45 * math.cos(d) for d in g], x)
    gy = col([0.45 * math.sin(d) for d in g], x)
    glint = torch.clamp(1.0 - (rho2 - 2 * (gx * u + gy * v) + 0.45**2) * (1.0 / 0.2**2), min=0.0)
    white = torch.clamp(0.85 * rim * rim + glint * glint, max=1.0)
    keep = 0.85 * (1.0 - white)
    look = 1.0 - keep * (1.0 - seen)
    edge = ((1.0 - rho) / inv_r + 0.5).clamp(0.0, 1.0)
    return look, edge


_disc_port("bubbles", _bubbles_prepare, _bubble_look)


def _blood_prepare(image: np.ndarray, rng: np.random.Generator) -> dict[str, Any]:
    h, w = image.shape[:2]
    grid = rng.normal(0.0, 1.0, size=(endo._BLOOD_GRID, endo._BLOOD_GRID)).astype(F32)
    blurred = cv2.GaussianBlur(grid, (0, 0), endo._BLOOD_GRID / 12, borderType=cv2.BORDER_REFLECT)
    field = np.asarray(cv2.resize(blurred, (w, h), interpolation=cv2.INTER_CUBIC), F32)
    return {"field": field[None], "sorted": np.sort(field, axis=None), "soft": 0.15 * float(field.std()) + 1e-6}


def _quantile(sorted_values: np.ndarray, q: float) -> float:
    """``np.quantile(a, q)`` (linear method) from ``a`` sorted: numpy's interpolation formula, so the
    threshold needs no partition of the field per strength."""
    n = sorted_values.size
    virtual = (n - 1) * q
    lo = min(int(np.floor(virtual)), n - 1)
    hi = min(lo + 1, n - 1)
    a, b = sorted_values[lo], sorted_values[hi]
    diff = float(b - a)  # in the data's dtype, then interpolated in float64, as numpy's _lerp
    gamma = float(virtual - lo)
    return float(b) - diff * (1 - gamma) if gamma >= 0.5 else float(a) + diff * gamma


@port("blood", _blood_prepare)
def _blood(x: torch.Tensor, s: list[float], f: Fields) -> torch.Tensor:
    field = f.t("field")
    thr = col([_quantile(srt, 1.0 - v) if v > 0 else 0.0 for v, srt in zip(s, f.v("sorted"), strict=True)], x)
    cover = T.smoothstep((field - thr) / col(f.v("soft"), x) + 0.5)
    depth = cover * col([1.5 * v for v in s], x) * (0.7 + 0.3 * T.smoothstep(field - thr))
    mu = torch.from_numpy(endo._BLOOD_MU).to(x.device)[None, :, None, None]
    trans = torch.exp(-depth * mu)
    if x.shape[1] == 1:
        trans = torch.einsum("bchw,c->bhw", trans, torch.from_numpy(endo._LUMA).to(x.device))[:, None]
    return _identity_where_zero(x, s, x * trans)


def _endo_exposure_prepare(image: np.ndarray, rng: np.random.Generator) -> dict[str, Any]:
    h, w = image.shape[:2]
    hx, hy = rng.uniform(0.25, 0.75, size=2)
    r0 = rng.uniform(0.25, 0.45) * min(h, w)
    xs = (np.arange(w, dtype=F32) - F32(hx * w)) / F32(r0)
    ys = (np.arange(h, dtype=F32) - F32(hy * h)) / F32(r0)
    return {"profile": (1.0 / (1.0 + ys[:, None] ** 2 + xs[None, :] ** 2))[None]}


@port("endoscopy_overexposure", _endo_exposure_prepare)
def _endo_exposure(x: torch.Tensor, s: list[float], f: Fields) -> torch.Tensor:
    h, w = x.shape[-2:]
    gain = 1.0 + col(s, x) * f.t("profile")
    exposed = x ** 2.2 * gain
    excess = torch.clamp(exposed - 1.0, min=0.0)
    small = T.resize(excess, (max(h // 4, 1), max(w // 4, 1)), "area")
    small = T.gaussian_blur(small, endo._BLOOM_SIGMA * min(h, w) / 4, "reflect")
    bloom = T.resize(small, (h, w), "linear")
    exposed = exposed + endo._BLOOM * bloom
    return _identity_where_zero(x, s, torch.clamp(exposed, max=1.0) ** (1.0 / 2.2))


# ---- OCT, fundus -------------------------------------------------------------------------------------


def _shadow_prepare(image: np.ndarray, rng: np.random.Generator) -> dict[str, Any]:
    h, w = image.shape[:2]
    centre = rng.uniform(0.0, 1.0, size=oct._N_SHADOWS) * w
    rel = rng.uniform(0.5, 1.5, size=oct._N_SHADOWS)
    depth = rng.uniform(0.15, 0.5, size=oct._N_SHADOWS) * h
    ys = np.arange(h, dtype=F32)
    below = np.stack([oct.smoothstep((ys - F32(d)) / F32(3.0)) for d in depth])  # (bands, H)
    return {"centre": centre, "rel": rel, "below": below}


@port("oct_shadow", _shadow_prepare)
def _oct_shadow(x: torch.Tensor, s: list[float], f: Fields) -> torch.Tensor:
    b, _, h, w = x.shape
    xs = torch.arange(w, dtype=torch.float32, device=x.device)
    below = f.t("below")  # (B, bands, H)
    centre, rel = np.stack(f.v("centre")), np.stack(f.v("rel"))
    sv = np.asarray(s)
    atten = col(0.97 * np.sqrt(np.maximum(sv, 0.0)), x)
    trans = torch.ones((b, 1, h, w), dtype=torch.float32, device=x.device)
    for j in range(centre.shape[1]):
        half = col(sv * 0.15 * w * rel[:, j], x)
        across = T.smoothstep((half - (xs - col(centre[:, j], x)).abs()) / 2.0 + 0.5)  # (B, 1, 1, W)
        trans = trans * (1.0 - (atten * below[:, j][:, None, :, None]) * across)
    return _identity_where_zero(x, s, x * trans)


@port("oct_blink", lambda image, rng: {"u": float(rng.uniform(0.0, 1.0))})
def _oct_blink(x: torch.Tensor, s: list[float], f: Fields) -> torch.Tensor:
    w = x.shape[-1]
    gains = []
    for v, u in zip(s, f.v("u"), strict=True):
        width = float(v) * w
        lo = u * (w - width)
        centre, half = lo + 0.5 * width, 0.5 * width
        xs = np.arange(w, dtype=F32) + F32(0.5)
        lost = np.clip(F32(half + 0.5) - np.abs(xs - F32(centre)), 0.0, 1.0)
        lost = np.minimum(lost, F32(width))
        gains.append(1.0 - F32(1.0 - oct._BLINK_FLOOR) * lost)
    gain = torch.from_numpy(np.stack(gains)).to(x.device)[:, None, None, :]
    return _identity_where_zero(x, s, x * gain)


def _oct_motion_prepare(image: np.ndarray, rng: np.random.Generator) -> dict[str, Any]:
    w = image.shape[1]
    knots = rng.normal(0.0, 1.0, size=oct._MOTION_KNOTS) + np.linspace(-1.0, 1.0, oct._MOTION_KNOTS) * rng.normal(0.0, 1.0)
    profile = cv2.resize(knots.astype(F32)[None, :], (w, 1), interpolation=cv2.INTER_CUBIC)[0]
    profile = profile / max(float(np.abs(profile).max()), 1e-6)
    return {"profile": profile.astype(F32)}


@port("oct_motion", _oct_motion_prepare, spatial=True)
def _oct_motion(x: torch.Tensor, s: list[float], f: Fields) -> tuple[torch.Tensor, torch.Tensor]:
    b, _, h, w = x.shape
    ys, xs = torch.meshgrid(torch.arange(h, dtype=torch.float32, device=x.device),
                            torch.arange(w, dtype=torch.float32, device=x.device), indexing="ij")
    shift = col([max(v, 0.0) for v in s], x)[:, 0] * f.t("profile")[:, None, :]
    return xs.expand(b, -1, -1), ys + shift


def _speckle_prepare(image: np.ndarray, rng: np.random.Generator) -> dict[str, Any]:
    h, w = image.shape[:2]
    field = rng.standard_normal(size=(2, h, w), dtype=F32)
    k1 = cv2.getGaussianKernel(5, oct._SPECKLE_GRAIN, cv2.CV_32F)
    norm = F32(1.0 / (np.sqrt(2.0) * float(np.sum(k1 * k1))))
    re = cv2.sepFilter2D(field[0], -1, k1, k1, borderType=cv2.BORDER_REFLECT) * norm
    im = cv2.sepFilter2D(field[1], -1, k1, k1, borderType=cv2.BORDER_REFLECT) * norm
    return {"re": np.asarray(re, F32)[None], "im": np.asarray(im, F32)[None]}


@port("oct_speckle", _speckle_prepare)
def _oct_speckle(x: torch.Tensor, s: list[float], f: Fields) -> torch.Tensor:
    re = f.t("re") * col(s, x) + col([math.sqrt(max(1.0 - v * v, 0.0)) for v in s], x)
    im = f.t("im") * col(s, x)
    return _identity_where_zero(x, s, x * torch.sqrt(re * re + im * im))


def _illumination_prepare(image: np.ndarray, rng: np.random.Generator) -> dict[str, Any]:
    h, w = image.shape[:2]
    px, py = rng.uniform(0.2, 0.8, size=2)
    width = rng.uniform(0.15, 0.35)
    theta = rng.uniform(0.0, 2 * np.pi)
    mix = rng.uniform(0.3, 0.6)
    half_diag = 0.5 * float(np.hypot(h, w))
    xs = (np.arange(w, dtype=F32) - F32(px * w)) / F32(half_diag)
    ys = (np.arange(h, dtype=F32) - F32(py * h)) / F32(half_diag)
    d2 = ys[:, None] ** 2 + xs[None, :] ** 2
    ramp = F32(np.cos(theta)) * xs[None, :] + F32(np.sin(theta)) * ys[:, None]
    ramp = np.clip(0.5 + 0.5 * ramp, 0.0, 1.0)
    lit = np.exp(-d2 / F32(2 * width * width)) * (1.0 - F32(mix) * ramp)
    return {"lit": np.asarray(lit, F32)[None]}


@port("uneven_illumination", _illumination_prepare)
def _uneven_illumination(x: torch.Tensor, s: list[float], f: Fields) -> torch.Tensor:
    return _identity_where_zero(x, s, x * (1.0 - col(s, x) * (1.0 - f.t("lit"))))


# ---- pathology -------------------------------------------------------------------------------------


def _stain_prepare(image: np.ndarray, rng: np.random.Generator) -> dict[str, Any]:
    d = rng.normal(0.0, 1.0, size=6)
    d = d / max(float(np.linalg.norm(d)), 1e-12)
    od = -np.log(np.maximum(image.reshape(-1, 3), path._OD_EPS).astype(F32))
    conc = (od @ path.HED_FROM_RGB.astype(F32)).reshape(image.shape)
    return {"d": d, "conc": chw(conc)}


@port("stain_variation", _stain_prepare)
def _stain_variation(x: torch.Tensor, s: list[float], f: Fields) -> torch.Tensor:
    conc = f.t("conc")
    ds = f.v("d")
    scale = torch.from_numpy(np.stack([np.exp(v * d[:3]).astype(F32) for v, d in zip(s, ds, strict=True)]))
    shift = torch.from_numpy(np.stack([(v * path._STAIN_SHIFT * np.sign(d[:3]) * np.abs(d[3:])).astype(F32)
                                       for v, d in zip(s, ds, strict=True)]))
    new = torch.maximum(conc * scale.to(x.device)[:, :, None, None] + shift.to(x.device)[:, :, None, None],
                        conc.clamp(max=0.0))
    d_od = torch.einsum("bkhw,kc->bchw", new - conc, torch.from_numpy(path.RGB_FROM_HED.astype(F32)).to(x.device))
    return _identity_where_zero(x, s, x * torch.exp(-d_od))


def _slide_bubbles_prepare(image: np.ndarray, rng: np.random.Generator) -> dict[str, Any]:
    h, w = image.shape[:2]
    side = float(min(h, w))
    cxy = rng.uniform(0.0, 1.0, size=(path._N_BUBBLES, 2)) * np.array([w, h])
    r = np.exp(rng.uniform(np.log(0.05), np.log(0.25), size=path._N_BUBBLES)) * side
    blurred = cv2.GaussianBlur(image, (0, 0), max(side / 128.0, 0.5), borderType=cv2.BORDER_REFLECT)
    return {**_disc_prepare(image, cxy, r), "blurred": chw(np.asarray(blurred, F32).reshape(image.shape))}


def _slide_bubble_look(x: torch.Tensor, bx: torch.Tensor, by: torch.Tensor, rr: torch.Tensor, f: Fields
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`medrobust_lib.perturb.families.path._slide_bubble_look` over the whole image."""
    _, _, h, w = x.shape
    dx = torch.arange(w, dtype=torch.float32, device=x.device)[None, None, None, :] - bx
    dy = torch.arange(h, dtype=torch.float32, device=x.device)[None, None, :, None] - by
    dist = torch.sqrt(dx * dx + dy * dy)
    rim_width = 0.1 * rr + 1.5
    depth_in = (rr - dist) / rim_width
    rim = 1.0 - T.smoothstep(depth_in * 1.4 - 0.4)
    halo = torch.clamp(1.0 - ((depth_in - 1.3) * 2.5) ** 2, min=0.0)
    washed = path._GLASS + 0.4 * (f.t("blurred") - path._GLASS)
    washed = washed + 0.5 * halo * (1.0 - washed)
    look = washed * (1.0 - 0.85 * rim)
    edge = (rr - dist + 0.5).clamp(0.0, 1.0)
    return look, edge


_disc_port("slide_bubbles", _slide_bubbles_prepare, _slide_bubble_look)


def _fold_prepare(image: np.ndarray, rng: np.random.Generator) -> dict[str, Any]:
    h, w = image.shape[:2]
    theta = rng.uniform(0.0, 2 * np.pi)
    u = rng.uniform(0.5, 0.95)
    nx, ny = float(np.cos(theta)), float(np.sin(theta))
    half_extent = 0.5 * (abs(nx) * w + abs(ny) * h)
    t_fold = u * half_extent
    xs = np.arange(w, dtype=F32)[None, :] - F32((w - 1) / 2)
    ys = np.arange(h, dtype=F32)[:, None] - F32((h - 1) / 2)
    t = F32(nx) * xs + F32(ny) * ys
    below = F32(t_fold) - t
    map_x = (xs + F32((w - 1) / 2) + 2 * below * F32(nx)).astype(F32)
    map_y = (ys + F32((h - 1) / 2) + 2 * below * F32(ny)).astype(F32)
    flap = cv2.remap(image, map_x, map_y, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REFLECT_101)
    return {"below": below[None], "flap": chw(np.asarray(flap, F32).reshape(image.shape)),
            "extent": t_fold + half_extent}


@port("tissue_fold", _fold_prepare)
def _tissue_fold(x: torch.Tensor, s: list[float], f: Fields) -> torch.Tensor:
    below = f.t("below")
    width = col([float(v) * 0.9 * e for v, e in zip(s, f.v("extent"), strict=True)], x)
    band = (below + 0.5).clamp(0.0, 1.0) * (width - below + 0.5).clamp(0.0, 1.0)
    k = band * col([3.0 * float(v) for v in s], x)
    return _identity_where_zero(x, s, x * torch.pow(torch.clamp(f.t("flap"), min=path._OD_EPS), k))


# ---- ultrasound ------------------------------------------------------------------------------------


def _shadowing_prepare(image: np.ndarray, rng: np.random.Generator) -> dict[str, Any]:
    h, w = image.shape[:2]
    atten, surface = us.shadow_fields(us.shadow_geometry(rng, h, w), h, w)
    return {"atten": atten[None], "surface": surface[None]}


@port("acoustic_shadowing", _shadowing_prepare)
def _acoustic_shadowing(x: torch.Tensor, s: list[float], f: Fields) -> torch.Tensor:
    transmit = torch.exp(col([-v for v in s], x) * f.t("atten"))
    echo = col([1.0 - math.exp(-v) for v in s], x) * f.t("surface")
    out = x * transmit
    return _identity_where_zero(x, s, out + echo * (1.0 - out))


def _reverberation_prepare(image: np.ndarray, rng: np.random.Generator) -> dict[str, Any]:
    h, w = image.shape[:2]
    depth, thick, profile = us.reverberation_draw(rng, h, w)
    gray = image if image.ndim == 2 else image.mean(axis=2)
    return {"depth": depth, "thick": thick, "profile": profile, "rows": gray[(np.arange(h) % depth)][None]}


@port("reverberation", _reverberation_prepare)
def _reverberation(x: torch.Tensor, s: list[float], f: Fields) -> torch.Tensor:
    h = x.shape[-2]
    y = np.arange(h, dtype=np.float64)
    lines, band_amps = [], []
    for v, depth, thick in zip(s, f.v("depth"), f.v("thick"), strict=True):
        order = np.arange(1, h // depth + 2, dtype=np.float64)
        amp = max(v, 0.0) ** order
        lines.append((amp[None, :] * np.exp(-0.5 * ((y[:, None] - order[None, :] * depth) / thick) ** 2)).sum(axis=1))
        band_order = np.floor(y / depth)
        band_amps.append(np.where(band_order >= 1, max(v, 0.0) ** band_order, 0.0))
    dev = x.device
    ln = torch.from_numpy(np.stack(lines)).to(dev)[:, None, :, None]
    ba = torch.from_numpy(np.stack(band_amps)).to(dev)[:, None, :, None]
    band = f.t("rows").to(torch.float64) * ba
    echo = ((ln + band) * f.t("profile").to(dev)[:, None, None, :]).clamp(0.0, 1.0).to(torch.float32)
    return _identity_where_zero(x, s, 1.0 - (1.0 - x) * (1.0 - echo))


@port("depth_gain_variation", lambda image, rng: {"prof": us.tgc_profile(rng, image.shape[0])})
def _depth_gain(x: torch.Tensor, s: list[float], f: Fields) -> torch.Tensor:
    gains = np.stack([(10.0 ** (v * p / 20.0)).astype(F32) for v, p in zip(s, f.v("prof"), strict=True)])
    return x * torch.from_numpy(gains).to(x.device)[:, None, :, None]
