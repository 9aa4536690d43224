"""Perturbation specifications and the perturbation registry.

A perturbation is a pure function of ``(image, strength, rng)``. All randomness enters through the
``numpy.random.Generator``; callers derive it from ``(seed, dataset, sample_id, perturbation)``
without the level, so the random field is shared by every level (common random numbers) and SSIM
moves with strength alone.

Two kinds of functions are registered:

* ``intensity``: ``fn(image, strength, rng) -> image``. Masks and boxes are returned unchanged.
* ``spatial``: ``fn(image, strength, rng) -> (map_x, map_y)``, float32 ``(H, W)`` backward
  coordinate maps in pixels (output pixel ``(y, x)`` samples the input at ``(map_y[y, x],
  map_x[y, x])``), as for ``cv2.remap``. The image is resampled bilinearly with a zero border,
  the mask with nearest neighbour, and each box by warping its rasterised rectangle and taking the
  tight box of the result, so image, mask and boxes always move with the same draw.

Levels at any resolution: a type whose strength is a length in pixels (blur widths, cell sizes,
displacements) declares ``scales_with_size``; its ``strength_range`` and default ``levels`` are
stated for images whose longer side is :data:`REFERENCE_SIZE` pixels, and on a larger image the
distance of the cap (and of each default level) from the weakest strength grows by
:func:`size_factor` (the longer side over :data:`REFERENCE_SIZE`, at least 1). The strength stays in
pixels of the image it is applied to, so outputs at up to 256 px are unchanged.

Smoothing types (``smoothing``: blur widths and cell sizes, whose strongest possible output is the
image's mean) stretch their cap further, by :func:`cap_factor` (``f * min(f, 4)``: quadratically up to
1024 px, then a fixed fraction of the longer side), because on a large smooth image SSIM's 7x7 window
stays close to 1 until the kernel covers a good part of the image: measured on the CT demo image
upsampled to 1024 px, Gaussian blur at the linearly stretched cap (sigma 96) gives SSIM 0.695, the
image's mean (the limit of any blur) 0.650, and sigma 384 (the cap of :func:`cap_factor`) 0.661. Their
default levels stretch linearly, as for the other types in pixels.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Literal

import cv2
import numpy as np

from medrobust_lib.data.boxes import mask_to_box
from medrobust_lib.registry import Registry
from medrobust_lib.types import ALL_MODALITIES, BoolMask, Boxes, FloatImage, InstanceMap, parse_modality

Geometry = Literal["intensity", "spatial"]
Channels = Literal["any", "rgb"]

REFERENCE_SIZE = 256
"""Longer image side (pixels) at which the ranges of ``scales_with_size`` types are stated."""


def size_factor(shape: tuple[int, ...]) -> float:
    """How many times :data:`REFERENCE_SIZE` the longer side of an image of ``shape`` ((H, W) or
    (H, W, C)) is, at least 1.0 (smaller images keep the stated ranges)."""
    return max(1.0, max(int(shape[0]), int(shape[1])) / REFERENCE_SIZE)


CAP_GROWTH_MAX = 4.0
"""The most by which a ``smoothing`` type's cap outgrows the linear stretch (reached at 1024 px)."""
CAP_RULE = "smoothing-f*min(f,4)|limit-extent-above-1024"
"""Names the cap rule in the fingerprints of chunks whose images are larger than :data:`REFERENCE_SIZE`."""


def cap_factor(shape: tuple[int, ...], smoothing: bool) -> float:
    """How far the cap of a ``scales_with_size`` type moves from its weakest strength on an image of
    ``shape``, relative to :data:`REFERENCE_SIZE`: :func:`size_factor` ``f``, and for a ``smoothing``
    type ``f * min(f, CAP_GROWTH_MAX)`` (1.0 at up to 256 px either way)."""
    f = size_factor(shape)
    return f * min(f, CAP_GROWTH_MAX) if smoothing else f


@dataclass(frozen=True)
class PerturbOutput:
    """Result of one perturbation: image float32 in [0, 1] (same shape as the input), mask bool
    (H, W) or None, boxes float32 (N, 4) pixel XYXY or None, instances int32 (H, W) label map
    (moved with the mask by a spatial type; an instance moved out of view has no pixel left) or
    None. The content hash of an output (:func:`medrobust_lib.perturb.engine.output_hash`) covers
    image, mask and boxes; the instances follow the mask's draw."""

    image: FloatImage
    mask: BoolMask | None
    boxes: Boxes | None
    instances: InstanceMap | None = None


@dataclass(frozen=True)
class PerturbationSpec:
    """One registered perturbation type.

    ``strength_range`` is ``(weakest, strongest)`` in the type's own unit when ``inverse`` is
    false, and ``(strongest, weakest)`` sorted ascending when ``inverse`` is true (a smaller value
    is stronger, e.g. JPEG quality). ``levels`` are default strengths for severity 1..5, used as
    the calibration start. At the weakest strength the output must be (near) identical to the
    input (SSIM >= 0.98), which the contract tests check.

    ``scales_with_size``: the strength is a length in pixels; ``strength_range`` and ``levels`` hold
    for images up to :data:`REFERENCE_SIZE` pixels and stretch away from the weakest strength by
    :func:`size_factor` on larger ones (:meth:`strength_range_for`, :meth:`level_start`).
    ``smoothing`` (with ``scales_with_size``): the type averages a neighbourhood whose size is the
    strength, so its strongest output tends to the image's mean; its cap stretches by
    :func:`cap_factor` (faster than its default levels). ``limit_extent`` (a smoothing type whose
    cap stops short of its own limit on very large images): a strength, as a multiple of the
    image's longer side, near which the output reaches that limit (pixelate 0.5: cells of half the
    image, the four quadrant means; motion blur 2.0: near the means along lines); on images larger
    than ``CAP_GROWTH_MAX * REFERENCE_SIZE`` (1024 px) the cap is at least that strength, so outputs
    at up to 1024 px do not change.

    ``strength_is_intensity``: the strength is a noise standard deviation or amplitude on the image's
    [0, 1] intensity scale (Gaussian, Rician, photon-starvation noise), so it can be compared with the
    image's own value range: the perturbation manifest warns when a calibrated strength exceeds it
    (:func:`strength_warning`; a near-black image needs noise larger than its content to reach a band).
    """

    name: str
    family: str
    modalities: tuple[str, ...]
    geometry: Geometry
    strength_range: tuple[float, float]
    levels: tuple[float, float, float, float, float]
    reference: str
    fn: Callable[..., object] = field(repr=False, compare=False)
    inverse: bool = False
    integer: bool = False
    channels: Channels = "any"
    unit: str = ""
    scales_with_size: bool = False
    smoothing: bool = False
    limit_extent: float | None = None
    strength_is_intensity: bool = False

    @property
    def weakest(self) -> float:
        return self.strength_range[1] if self.inverse else self.strength_range[0]

    @property
    def strongest(self) -> float:
        """The cap at :data:`REFERENCE_SIZE` (see :meth:`strongest_for` for a given image)."""
        return self.strength_range[0] if self.inverse else self.strength_range[1]

    def _stretch(self, value: float, shape: tuple[int, ...] | None, cap: bool = False) -> float:
        """``value`` moved away from the weakest strength by the image's size factor (for the ``cap``
        of a ``smoothing`` type, by :func:`cap_factor`)."""
        if not self.scales_with_size or shape is None:
            return value
        f = cap_factor(shape, self.smoothing and cap)
        out = value if f == 1.0 else self.weakest + (value - self.weakest) * f
        if cap and self.limit_extent is not None and size_factor(shape) > CAP_GROWTH_MAX and not self.inverse:
            out = max(out, self.weakest + self.limit_extent * max(int(shape[0]), int(shape[1])))
        return out

    def strength_range_for(self, shape: tuple[int, ...] | None) -> tuple[float, float]:
        """``strength_range`` for an image of ``shape`` (ascending; the stated range when ``shape`` is
        None, the type does not scale or the image is at most :data:`REFERENCE_SIZE` pixels)."""
        lo, hi = self.strength_range
        if self.inverse:
            return self._stretch(lo, shape, cap=True), hi
        return lo, self._stretch(hi, shape, cap=True)

    def strongest_for(self, shape: tuple[int, ...] | None) -> float:
        """The strongest strength on an image of ``shape``."""
        return self._stretch(self.strongest, shape, cap=True)

    def level_start(self, level: int, shape: tuple[int, ...] | None = None) -> float:
        """The default strength of severity ``level`` (1..5) on an image of ``shape``, clamped."""
        return self.clamp(self._stretch(self.levels[level - 1], shape), shape)

    def for_shape(self, shape: tuple[int, ...] | None) -> PerturbationSpec:
        """This type as seen on an image of ``shape``: for a ``scales_with_size`` type, a copy whose
        ``strength_range`` and ``levels`` are the stretched ones (so a search in the type's own
        coordinates covers the image's whole range); otherwise ``self``. The copy applies exactly
        as ``self`` does (``apply`` clamps to the image's range either way)."""
        if not self.scales_with_size or shape is None or size_factor(shape) == 1.0:
            return self
        levels = tuple(self.level_start(lv, shape) for lv in range(1, len(self.levels) + 1))
        return replace(self, strength_range=self.strength_range_for(shape), levels=levels,  # type: ignore[arg-type]
                       scales_with_size=False)

    def applies_to(self, modality: str, n_channels: int) -> bool:
        """Whether the type is defined for this modality and channel count (1 or 3)."""
        if modality not in self.modalities:
            return False
        return self.channels == "any" or n_channels == 3

    def clamp(self, strength: float, shape: tuple[int, ...] | None = None) -> float:
        """``strength`` limited to the range for an image of ``shape`` (None: the stated range),
        rounded for integer types."""
        lo, hi = self.strength_range_for(shape)
        s = float(min(max(strength, lo), hi))
        return float(round(s)) if self.integer else s

    def apply(
        self,
        image: FloatImage,
        strength: float,
        rng: np.random.Generator,
        *,
        mask: BoolMask | None = None,
        boxes: Boxes | None = None,
        instances: InstanceMap | None = None,
    ) -> PerturbOutput:
        """Apply at ``strength`` (clamped to the range for this image's size). Pure: the inputs are
        not modified. ``instances`` (int32 (H, W) label map) move like the mask."""
        _check_image(image)
        if mask is not None and mask.shape != image.shape[:2]:
            raise ValueError(f"mask shape {mask.shape} does not match image shape {image.shape[:2]}")
        if self.channels == "rgb" and image.ndim != 3:
            raise ValueError(f"perturbation {self.name!r} needs an RGB image, got shape {image.shape}")
        s = self.clamp(strength, image.shape)
        if self.geometry == "intensity":
            out = np.asarray(self.fn(image, s, rng), dtype=np.float32)
            return PerturbOutput(
                image=_finish(out, image.shape),
                mask=None if mask is None else mask.copy(),
                boxes=None if boxes is None else np.asarray(boxes, np.float32).copy(),
                instances=None if instances is None else instances.copy(),
            )
        maps = self.fn(image, s, rng)
        if not (isinstance(maps, tuple) and len(maps) == 2):
            raise RuntimeError(f"spatial perturbation {self.name!r} must return (map_x, map_y)")
        map_x: np.ndarray = np.asarray(maps[0], np.float32)
        map_y: np.ndarray = np.asarray(maps[1], np.float32)
        warped = remap_image(image, map_x, map_y)
        return PerturbOutput(
            image=_finish(warped, image.shape),
            mask=None if mask is None else remap_mask(mask, map_x, map_y),
            boxes=None if boxes is None else remap_boxes(boxes, map_x, map_y, image.shape[:2]),
            instances=None if instances is None else remap_labels(instances, map_x, map_y),
        )


def _check_image(image: FloatImage) -> None:
    if image.dtype != np.float32:
        raise ValueError(f"images must be float32 in [0, 1], got dtype {image.dtype}")
    if image.ndim not in (2, 3) or (image.ndim == 3 and image.shape[2] != 3):
        raise ValueError(f"images must be (H, W) or (H, W, 3), got shape {image.shape}")


def _finish(out: np.ndarray, shape: tuple[int, ...]) -> FloatImage:
    if out.shape != shape:
        raise RuntimeError(f"perturbation changed the image shape {shape} -> {out.shape}")
    out = np.nan_to_num(out, nan=0.0, posinf=1.0, neginf=0.0)
    return np.clip(out, 0.0, 1.0).astype(np.float32, copy=False)


def identity_maps(h: int, w: int) -> tuple[np.ndarray, np.ndarray]:
    """Backward maps of the identity transform, float32 (H, W) each."""
    ys, xs = np.mgrid[0:h, 0:w].astype(np.float32)
    return xs, ys


def affine_maps(h: int, w: int, matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Backward maps for a forward 2x3 affine ``matrix`` acting on (x, y) pixel coordinates."""
    inv = cv2.invertAffineTransform(np.asarray(matrix, np.float64))
    xs, ys = identity_maps(h, w)
    map_x = inv[0, 0] * xs + inv[0, 1] * ys + inv[0, 2]
    map_y = inv[1, 0] * xs + inv[1, 1] * ys + inv[1, 2]
    return map_x.astype(np.float32), map_y.astype(np.float32)


def remap_image(image: FloatImage, map_x: np.ndarray, map_y: np.ndarray) -> FloatImage:
    out = cv2.remap(image, map_x, map_y, interpolation=cv2.INTER_LINEAR,
                    borderMode=cv2.BORDER_CONSTANT, borderValue=0)
    return np.asarray(out, np.float32).reshape(image.shape)


def remap_mask(mask: BoolMask, map_x: np.ndarray, map_y: np.ndarray) -> BoolMask:
    out = cv2.remap(mask.astype(np.uint8), map_x, map_y, interpolation=cv2.INTER_NEAREST,
                    borderMode=cv2.BORDER_CONSTANT, borderValue=0)
    return out.astype(bool)


def remap_labels(labels: InstanceMap, map_x: np.ndarray, map_y: np.ndarray) -> InstanceMap:
    """An int32 label map resampled with nearest neighbour (exact for ids below 2**24) and a zero
    border, as :func:`remap_mask` moves the mask."""
    out = cv2.remap(labels.astype(np.float32), map_x, map_y, interpolation=cv2.INTER_NEAREST,
                    borderMode=cv2.BORDER_CONSTANT, borderValue=0)
    return np.rint(out).astype(np.int32)


def remap_boxes(boxes: Boxes, map_x: np.ndarray, map_y: np.ndarray, hw: tuple[int, int]) -> Boxes:
    """Move each XYXY box by warping its filled rectangle; a box warped out of view becomes
    ``[nan, nan, nan, nan]`` (kept, so box indices stay aligned with their labels)."""
    h, w = hw
    out = np.full((len(boxes), 4), np.nan, np.float32)
    for i, (x0, y0, x1, y1) in enumerate(np.asarray(boxes, np.float64)):
        rect = np.zeros((h, w), bool)
        rect[max(int(np.floor(y0)), 0) : int(np.ceil(y1)), max(int(np.floor(x0)), 0) : int(np.ceil(x1))] = True
        box = mask_to_box(remap_mask(rect, map_x, map_y))
        if box is not None:
            out[i] = box
    return out


PERTURBATIONS: Registry[PerturbationSpec] = Registry("perturbation")


def perturbation(
    name: str,
    *,
    family: str,
    strength_range: tuple[float, float],
    levels: tuple[float, float, float, float, float],
    reference: str,
    modalities: tuple[str, ...] = ALL_MODALITIES,
    geometry: Geometry = "intensity",
    inverse: bool = False,
    integer: bool = False,
    channels: Channels = "any",
    unit: str = "",
    scales_with_size: bool = False,
    smoothing: bool = False,
    limit_extent: float | None = None,
    strength_is_intensity: bool = False,
) -> Callable[[Callable[..., object]], Callable[..., object]]:
    """Register ``fn`` as perturbation ``name`` (decorator). Raises on a duplicate name.
    ``scales_with_size``: the strength is a length in pixels; ``smoothing``: a neighbourhood size
    whose cap grows faster; ``limit_extent``, ``strength_is_intensity``: see :class:`PerturbationSpec`."""
    if smoothing and not scales_with_size:
        raise ValueError(f"{name}: smoothing needs scales_with_size")
    if limit_extent is not None and (not smoothing or inverse or limit_extent <= 0):
        raise ValueError(f"{name}: limit_extent needs a smoothing type with ascending strength and a positive value")

    def wrap(fn: Callable[..., object]) -> Callable[..., object]:
        lo, hi = strength_range
        if not lo < hi:
            raise ValueError(f"{name}: strength_range must be ascending, got {strength_range}")
        seq = list(levels) if not inverse else [-v for v in levels]
        if any(b <= a for a, b in zip(seq, seq[1:], strict=False)):
            raise ValueError(f"{name}: default levels must get strictly stronger, got {levels}")
        PERTURBATIONS.register(
            name,
            PerturbationSpec(
                name=name, family=family, modalities=tuple(modalities), geometry=geometry,
                strength_range=(float(lo), float(hi)), levels=tuple(float(v) for v in levels),  # type: ignore[arg-type]
                reference=reference, fn=fn, inverse=inverse, integer=integer, channels=channels, unit=unit,
                scales_with_size=scales_with_size, smoothing=smoothing, limit_extent=limit_extent,
                strength_is_intensity=strength_is_intensity,
            ),
        )
        return fn

    return wrap


def strength_warning(spec: PerturbationSpec, strength: float, image: FloatImage) -> str | None:
    """A warning when a ``strength_is_intensity`` type's ``strength`` exceeds the image's own value
    range (max - min over all pixels and channels, [0, 1] units), else None: such noise swamps the
    content (typically an image scaled to a sliver of [0, 1], e.g. 16-bit data divided by 65535)."""
    if not spec.strength_is_intensity or not np.isfinite(strength):
        return None
    value_range = float(np.max(image)) - float(np.min(image)) if image.size else 0.0
    if strength <= value_range:
        return None
    what = spec.unit.split(" ", 1)[0] if spec.unit.startswith("sigma") else "strength"
    return f"{spec.name} {what} {strength:.2g} exceeds the image's value range {value_range:.2g}"


def get_perturbation(name: str) -> PerturbationSpec:
    return PERTURBATIONS.get(name)


def list_perturbations(pattern: str = "*", *, modality: str | None = None, n_channels: int | None = None,
                       **filters: object) -> list[str]:
    """Registered type names matching ``pattern`` and filters (e.g. ``family="mri"``); with
    ``modality`` (case-insensitive; an unknown one is a ValueError listing the valid ones) and
    optionally ``n_channels``, only the types that apply to such images."""
    names = PERTURBATIONS.list(pattern, **filters)
    if modality is not None:
        modality = parse_modality(modality).value
        names = [n for n in names if PERTURBATIONS.get(n).applies_to(modality, n_channels or 3)]
    return names
