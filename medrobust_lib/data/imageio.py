"""Reading and writing single images in the medrobust convention.

Every reader returns ``float32`` arrays with values in ``[0, 1]``: ``(H, W)`` for grayscale and
``(H, W, 3)`` for RGB (channel order R, G, B). Rows are image rows (y), columns are image columns
(x); row 0 is the first row stored in the file.

The mapping from stored values to ``[0, 1]`` is always linear (with clipping for windows) and is
described by an *intensity record*, a plain JSON-friendly dict::

    {"mapping": "linear", "low": L, "high": H, "invert": bool, "clipped": bool,
     "source": "bit_depth" | "actual_range" | "declared" | "npy" | "options" | "file" | "percentile",
     "unit": str, ...}

so that ``native = L + y' * (H - L)`` with ``y' = 1 - y`` when ``invert`` is true and ``y'`` = ``y``
otherwise (see :func:`intensity_to_native`). Values that were clipped by a window (``clipped``)
cannot be recovered beyond the window edges. 8-bit files use ``L = 0, H = 255``; 16-bit files
``L = 0, H = 65535`` when read with :func:`read_image` (source ``bit_depth``), and their own
``[min, max]`` (source ``actual_range``) or a declared ``intensity_range`` (source ``declared``,
clipped) when read by a dataset reader (:func:`raw_to_float`). DICOM records additionally carry ``rescale_slope`` / ``rescale_intercept``
(``native`` is then the rescaled value, e.g. HU for CT; stored = (native - intercept) / slope).

Formats: PNG (8/16-bit), JPEG, TIFF, BMP (decoded by OpenCV, converted from BGR to RGB; EXIF
orientation is deliberately ignored so that images stay aligned with their masks, which are
stored in raw pixel order), ``.npy`` (float32 in [0, 1] only), DICOM (``.dcm``/``.dicom``, see
:func:`read_dicom`) and 2-D NIfTI (``.nii``/``.nii.gz``, see :func:`read_nifti_2d`). RGBA drops
alpha; gray+alpha drops alpha. A file that cannot be used raises
:class:`~medrobust_lib.data.sample.SampleError` with reason ``empty_file``, ``unreadable_image``,
``truncated``, ``too_large``, ``too_small``, ``unreadable_dicom``, ``unsupported_dicom``,
``unreadable_nifti`` or ``unsupported_nifti``.

Limits (hostile or broken files are refused before they cost memory): the declared size is read
from the header first (PIL's lazy open for rasters, Rows x Columns x SamplesPerPixel for DICOM,
the NIfTI header) and a 2-D image of more than :func:`current_max_pixels` pixels (default
:data:`DEFAULT_MAX_PIXELS`, the suite's ``max_pixels``; set with :func:`pixel_limit`) is refused
as ``too_large`` without allocating it; a side under :data:`MIN_SIDE` pixels is ``too_small`` (the
7x7 SSIM window needs at least that). PNG and JPEG are decoded by OpenCV only: a file whose header
parses but whose image data ends early or is corrupt is ``truncated`` (never completed with zeros
by a lenient decoder); TIFF and BMP may fall back to PIL. A multi-frame DICOM decodes only the
requested frame.
"""

from __future__ import annotations

import io
import os
import tempfile
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any, BinaryIO, Literal

import cv2
import numpy as np
import numpy.typing as npt

from medrobust_lib.data import image_headers
from medrobust_lib.data.sample import SampleError
from medrobust_lib.types import DEFAULT_MAX_PIXELS, BoolMask, FloatImage

RASTER_EXTENSIONS: tuple[str, ...] = (".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp")
DICOM_EXTENSIONS: tuple[str, ...] = (".dcm", ".dicom")
NIFTI_EXTENSIONS: tuple[str, ...] = (".nii", ".nii.gz")
SUPPORTED_EXTENSIONS: tuple[str, ...] = RASTER_EXTENSIONS + (".npy",) + DICOM_EXTENSIONS + NIFTI_EXTENSIONS

LUMA_WEIGHTS: tuple[float, float, float] = (0.299, 0.587, 0.114)
"""ITU-R BT.601 luma weights for R, G, B (the same weights as OpenCV/PIL gray conversion)."""

DEFAULT_PERCENTILES: tuple[float, float] = (0.5, 99.5)
"""Percentile window used when neither the options nor the file give one."""

MIN_SIDE: int = 7
"""Smallest height and width a reader accepts (the SSIM window is 7x7)."""

_MAX_PIXELS: ContextVar[int] = ContextVar("medrobust_max_pixels", default=DEFAULT_MAX_PIXELS)


def current_max_pixels() -> int:
    """The pixel limit in force (see :func:`pixel_limit`)."""
    return _MAX_PIXELS.get()


@contextmanager
def pixel_limit(max_pixels: int | None) -> Iterator[None]:
    """Decode with at most ``max_pixels`` pixels per 2-D image inside the block (None: keep the
    current limit). Context-local, so threads and concurrent loads do not see each other's."""
    if max_pixels is None:
        yield
        return
    if max_pixels < MIN_SIDE * MIN_SIDE:
        raise ValueError(f"max_pixels must be at least {MIN_SIDE * MIN_SIDE}, got {max_pixels}")
    token = _MAX_PIXELS.set(int(max_pixels))
    try:
        yield
    finally:
        _MAX_PIXELS.reset(token)


def check_declared_size(height: int, width: int, where: str | os.PathLike[str], *, frames: int = 1) -> None:
    """Raise SampleError ``too_large`` when a declared ``height x width`` image exceeds the pixel
    limit (call it before anything is decoded)."""
    limit = current_max_pixels()
    if int(height) * int(width) > limit:
        extra = f" ({frames} frames)" if frames > 1 else ""
        raise SampleError("too_large", f"{where}: declares {width} x {height} = {int(height) * int(width):,} "
                                       f"pixels{extra}, over max_pixels {limit:,}; not decoded")


def check_min_size(height: int, width: int, where: str | os.PathLike[str]) -> None:
    """Raise SampleError ``too_small`` when a side is under :data:`MIN_SIDE` pixels."""
    if int(height) < MIN_SIDE or int(width) < MIN_SIDE:
        raise SampleError("too_small", f"{where}: {width} x {height} pixels; at least {MIN_SIDE} x {MIN_SIDE} needed")


# --------------------------------------------------------------------------------------------------
# small helpers


def file_extension(path: str | os.PathLike[str]) -> str:
    """Lower-case extension, with ``.nii.gz`` treated as one extension."""
    name = Path(path).name.lower()
    if name.endswith(".nii.gz"):
        return ".nii.gz"
    return Path(name).suffix


def _check_nonempty(path: Path) -> None:
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise SampleError("missing_file", str(path)) from None
    if size == 0:
        raise SampleError("empty_file", str(path))


def _check_complete(data: bytes, ext: str, path: Path) -> None:
    """Reject truncated PNG/JPEG files that a lenient decoder might still partially decode."""
    if ext == ".png":
        if not data.startswith(b"\x89PNG\r\n\x1a\n"):
            raise SampleError("unreadable_image", f"{path}: not a PNG file")
        if data.rfind(b"IEND") < 0:
            raise SampleError("truncated", f"{path}: truncated PNG (no IEND chunk)")
    elif ext in (".jpg", ".jpeg"):
        if not data.startswith(b"\xff\xd8"):
            raise SampleError("unreadable_image", f"{path}: not a JPEG file")
        # Inside entropy-coded data 0xFF is always stuffed, so FFD9 after the last scan header is
        # the real end-of-image marker (an EXIF thumbnail's EOI comes before the main scan).
        if data.rfind(b"\xff\xd9") < data.rfind(b"\xff\xda"):
            raise SampleError("truncated", f"{path}: truncated JPEG (no EOI marker)")


def _raster_header(f: BinaryIO, ext: str, path: Path) -> tuple[int, int, int, int, Any]:
    """``(height, width, bands, bytes_per_sample, tiff_tags)`` from the header of an open raster
    file, reading at most :data:`~medrobust_lib.data.image_headers.HEADER_BUDGET` bytes (PNG: the
    fixed-place IHDR; others: PIL's lazy open, which reads no pixel data). ``tiff_tags`` is PIL's
    ``tag_v2`` for a TIFF (else None). SampleError ``unreadable_image`` when no header parses."""
    from PIL import Image

    if ext == ".png":
        ihdr = image_headers.png_ihdr(f.read(33))
        f.seek(0)
        if ihdr is None:
            raise SampleError("unreadable_image", f"{path}: not a PNG file (no IHDR chunk first)")
        return (*ihdr, None)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # PIL's DecompressionBombWarning: the limit here is ours
            with Image.open(image_headers.BoundedReader(f)) as im:  # type: ignore[arg-type]
                width, height = im.size
                bands = len(im.getbands())
                bps = 1 if im.mode in ("1", "L", "P", "RGB", "RGBA", "LA", "PA", "CMYK", "YCbCr") else 4
                tags = dict(im.tag_v2) if hasattr(im, "tag_v2") else None
    except Image.DecompressionBombError as e:  # over PIL's own hard limit: certainly over ours
        raise SampleError("too_large", f"{path}: over PIL's hard limit, so over max_pixels "
                                       f"{current_max_pixels():,} too: {e}") from None
    except Exception as e:  # PIL raises many types for broken headers
        raise SampleError("unreadable_image", f"{path}: {type(e).__name__}: {e}") from None
    f.seek(0)
    return int(height), int(width), bands, bps, tags


def rgb_to_gray(image: FloatImage) -> FloatImage:
    """BT.601 luminance of an RGB float image; grayscale input is returned unchanged.

    (H, W, 3) float32 in [0, 1] -> (H, W) float32 in [0, 1]."""
    if image.ndim == 2:
        return image
    w = np.asarray(LUMA_WEIGHTS, np.float32)
    out = image[..., 0] * w[0] + image[..., 1] * w[1] + image[..., 2] * w[2]
    return np.clip(out, 0.0, 1.0).astype(np.float32)


def gray_to_rgb(image: FloatImage) -> FloatImage:
    """Replicate a grayscale (H, W) image into (H, W, 3); RGB input is returned unchanged."""
    if image.ndim == 3:
        return image
    return np.repeat(image[..., None], 3, axis=2).astype(np.float32)


def _bit_depth_record(bits: int) -> dict[str, Any]:
    return {
        "mapping": "linear",
        "low": 0.0,
        "high": float(2**bits - 1),
        "invert": False,
        "clipped": False,
        "source": "bit_depth",
        "unit": "stored",
        "bit_depth": bits,
    }


def intensity_to_native(image: npt.ArrayLike, intensity: Mapping[str, Any]) -> npt.NDArray[np.float64]:
    """Invert an intensity record: map a [0, 1] image back to native units (float64).

    For a window the result is exact inside the window; clipped values come back as the window
    edges. For DICOM the native unit is the rescaled value (HU for CT)."""
    if intensity.get("mapping") != "linear":
        raise ValueError(f"unknown intensity mapping {intensity.get('mapping')!r}; valid: linear")
    y = np.asarray(image, np.float64)
    if intensity.get("invert", False):
        y = 1.0 - y
    low = float(intensity["low"])
    high = float(intensity["high"])
    return low + y * (high - low)


def window_to_unit(values: npt.ArrayLike, low: float, high: float, *, invert: bool = False) -> FloatImage:
    """Map ``[low, high]`` linearly to ``[0, 1]`` with clipping (then ``1 - y`` if ``invert``).

    Works on any shape; returns float32. ``high`` must exceed ``low``."""
    if not high > low:
        raise ValueError(f"window high ({high}) must be greater than low ({low})")
    v = np.asarray(values, np.float64)
    y = np.clip((v - low) / (high - low), 0.0, 1.0)
    if invert:
        y = 1.0 - y
    return y.astype(np.float32)


def percentile_window(
    values: npt.ArrayLike, percentiles: Sequence[float] = DEFAULT_PERCENTILES
) -> tuple[float, float]:
    """``(low, high)`` = the given percentiles of the finite values; a constant image gets
    ``high = low + 1`` so that the mapping stays defined (and maps everything to 0)."""
    v = np.asarray(values, np.float64)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return 0.0, 1.0
    lo, hi = np.percentile(v, [float(percentiles[0]), float(percentiles[1])])
    lo, hi = float(lo), float(hi)
    if not hi > lo:
        hi = lo + 1.0
    return lo, hi


def window_record(
    low: float,
    high: float,
    *,
    source: str,
    unit: str,
    invert: bool = False,
    percentiles: Sequence[float] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """The intensity record for a clipped linear window ``[low, high] -> [0, 1]``."""
    rec: dict[str, Any] = {
        "mapping": "linear",
        "low": float(low),
        "high": float(high),
        "center": (float(low) + float(high)) / 2.0,
        "width": float(high) - float(low),
        "invert": bool(invert),
        "clipped": True,
        "source": source,
        "unit": unit,
    }
    if percentiles is not None:
        rec["percentiles"] = [float(p) for p in percentiles]
    rec.update(extra)
    return rec


def resolve_window(
    values: npt.ArrayLike,
    *,
    window_center: float | None,
    window_width: float | None,
    file_window: tuple[float, float] | None = None,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
) -> tuple[float, float, str]:
    """Pick the window: explicit options, else the file's (center, width), else percentiles.

    Returns ``(low, high, source)`` with ``low = c - w/2`` and ``high = c + w/2``."""
    if window_center is not None or window_width is not None:
        if window_center is None or window_width is None:
            raise ValueError("give both window_center and window_width, or neither")
        if not window_width > 0:
            raise ValueError(f"window_width must be > 0, got {window_width}")
        return window_center - window_width / 2, window_center + window_width / 2, "options"
    if file_window is not None and file_window[1] > 0:
        c, w = file_window
        return c - w / 2, c + w / 2, "file"
    lo, hi = percentile_window(values, percentiles)
    return lo, hi, "percentile"


# --------------------------------------------------------------------------------------------------
# raster formats


def read_raw(path: str | os.PathLike[str]) -> np.ndarray:
    """Decode a PNG/JPEG/TIFF/BMP file to its stored integer values.

    Returns uint8 or uint16, shaped (H, W) or (H, W, 3) in RGB order (alpha dropped). Raises
    SampleError ``empty_file`` for a zero-byte file, ``too_large`` when the header declares more
    pixels than :func:`current_max_pixels` (nothing decoded), ``truncated`` for a PNG/JPEG whose
    data ends early or is corrupt, ``unreadable_image`` for an undecodable file or an unsupported
    sample type (float or 32-bit rasters). Sides under :data:`MIN_SIDE` are checked by the image
    readers and ``medrobust perturb`` (:func:`check_min_size`), not here, so small masks still read."""
    p = Path(path)
    ext = file_extension(p)
    if ext not in RASTER_EXTENSIONS:
        raise ValueError(f"read_raw handles {', '.join(RASTER_EXTENSIONS)}; got {p.name!r}")
    try:
        with p.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                raise SampleError("empty_file", str(p))
            # The header first, from a bounded read; the file is read only when its size fits what
            # the header declares (a 64 x 64 PNG followed by 10 GB is refused, not read).
            height, width, bands, bps, tiff_tags = _raster_header(f, ext, p)
            check_declared_size(height, width, p)
            image_headers.check_file_bound(size, height, width, p, bands=bands, bytes_per_sample=bps)
            data = f.read(size)
    except FileNotFoundError:
        raise SampleError("missing_file", str(p)) from None
    except OSError as e:  # a folder, no permission, an I/O error
        raise SampleError("unreadable_image", f"{p}: {e}") from None
    _check_complete(data, ext, p)
    if ext in (".jpg", ".jpeg"):
        image_headers.check_jpeg_scans(data, p)
    if tiff_tags is not None:
        image_headers.check_tiff_strips(tiff_tags, len(data), p)
    jpeg_warnings: list[str] = []
    try:
        if ext in (".jpg", ".jpeg"):
            with image_headers.capture_libjpeg_warnings() as jpeg_warnings:
                arr = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
        else:
            arr = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    except cv2.error as e:
        raise SampleError("unreadable_image", f"{p}: {e}") from None
    if jpeg_warnings:  # libjpeg filled what it could not decode with grey: an error, not data
        raise SampleError("truncated", f"{p}: {width} x {height} JPEG whose image data is cut or corrupt "
                                       f"(libjpeg: {jpeg_warnings[0].strip()})")
    if arr is None:
        if ext in (".png", ".jpg", ".jpeg"):
            # The header parsed (above) but the image data did not decode: cut short or corrupt.
            # No second, lenient decoder: PIL would return the missing rows as zeros.
            raise SampleError("truncated", f"{p}: {width} x {height} {ext[1:].upper()} whose image data "
                                           "ends early or is corrupt")
        arr = _pil_fallback(data, p)
    if arr.shape[0] != height or arr.shape[1] != width:
        raise SampleError("truncated", f"{p}: decoded {arr.shape[1]} x {arr.shape[0]}, header says "
                                       f"{width} x {height}")
    if arr.dtype not in (np.uint8, np.uint16):
        raise SampleError("unreadable_image", f"{p}: unsupported sample type {arr.dtype} (need 8/16-bit)")
    if arr.ndim == 3 and arr.shape[2] == 1:
        arr = arr[..., 0]
    if arr.ndim == 3:
        if arr.shape[2] == 2:  # gray + alpha
            arr = arr[..., 0]
        elif arr.shape[2] == 3:
            arr = cv2.cvtColor(arr, cv2.COLOR_BGR2RGB)
        elif arr.shape[2] == 4:
            arr = cv2.cvtColor(arr, cv2.COLOR_BGRA2RGB)
        else:
            raise SampleError("unreadable_image", f"{p}: unsupported channel count {arr.shape[2]}")
    if arr.ndim not in (2, 3) or arr.shape[0] == 0 or arr.shape[1] == 0:
        raise SampleError("unreadable_image", f"{p}: unsupported shape {arr.shape}")
    return np.ascontiguousarray(arr)


def _pil_fallback(data: bytes, path: Path) -> np.ndarray:
    """Second decoder for TIFF/BMP files OpenCV rejects (never PNG/JPEG); returns a BGR(A)-ordered
    array like cv2."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as opened:
            opened.load()
            im: Image.Image = opened
            if im.mode in ("P", "PA", "CMYK", "YCbCr", "LAB", "HSV"):
                im = im.convert("RGBA" if "A" in im.mode or "transparency" in im.info else "RGB")
            arr = np.asarray(im)
    except Exception as e:  # PIL raises many types for broken files
        raise SampleError("unreadable_image", f"{path}: {type(e).__name__}: {e}") from None
    if arr.dtype == np.bool_:
        arr = arr.astype(np.uint8) * 255
    if arr.dtype in (np.int32, np.uint32) and arr.size and arr.min() >= 0 and arr.max() <= 65535:
        arr = arr.astype(np.uint16)  # PIL stores 16-bit grayscale PNG/TIFF as mode I
    if arr.ndim == 3 and arr.shape[2] in (3, 4):
        arr = arr[..., [2, 1, 0] + ([3] if arr.shape[2] == 4 else [])]
    return arr


IntensityScaling = Literal["bit_depth", "actual_range"]
"""How :func:`raw_to_float` maps an image wider than 8 bits without a declared range."""


def check_intensity_range(value: Sequence[float], name: str = "intensity_range") -> tuple[float, float]:
    """``(low, high)`` as floats; ValueError naming ``name`` unless both are finite and low < high."""
    if len(value) != 2:
        raise ValueError(f"{name} must be [low, high], got {list(value)}")
    low, high = float(value[0]), float(value[1])
    if not (np.isfinite(low) and np.isfinite(high)) or not low < high:
        raise ValueError(f"{name} must be [low, high] with finite low < high, got [{low:g}, {high:g}]")
    return low, high


def range_record(low: float, high: float, *, source: str, clipped: bool, **extra: Any) -> dict[str, Any]:
    """The intensity record of the linear map ``[low, high] -> [0, 1]`` of stored values
    (``source`` ``actual_range`` or ``declared``; ``high == low`` for a constant image, which maps to 0)."""
    return {"mapping": "linear", "low": float(low), "high": float(high), "invert": False, "clipped": clipped,
            "source": source, "unit": "stored", **extra}


def scale_to_unit(
    values: np.ndarray, intensity_range: Sequence[float] | None, **extra: Any
) -> tuple[FloatImage, dict[str, Any]]:
    """Stored values (any real dtype, any shape) -> float32 in [0, 1] and the intensity record.

    With ``intensity_range`` = ``[low, high]`` (declared): ``(v - low) / (high - low)`` clipped to
    [0, 1] (source ``declared``). Without: the image's own ``[min, max]`` over all pixels and
    channels maps to [0, 1] (source ``actual_range``; a constant image maps to 0 and its record has
    ``high == low``). ``extra`` is added to the record (e.g. ``bit_depth``). Non-finite values are
    ``unreadable_image``."""
    v = np.asarray(values, np.float64)
    if v.size == 0 or not np.isfinite(v).all():
        raise SampleError("unreadable_image", "image has no values or non-finite values")
    if intensity_range is not None:
        low, high = check_intensity_range(intensity_range)
        y = np.clip((v - low) / (high - low), 0.0, 1.0)
        return y.astype(np.float32), range_record(low, high, source="declared", clipped=True, **extra)
    low, high = float(v.min()), float(v.max())
    y = (v - low) / (high - low) if high > low else np.zeros_like(v)
    return y.astype(np.float32), range_record(low, high, source="actual_range", clipped=False, **extra)


def raw_to_float(
    raw: np.ndarray,
    *,
    intensity_range: Sequence[float] | None = None,
    scaling: IntensityScaling = "bit_depth",
) -> tuple[FloatImage, dict[str, Any]]:
    """Stored raster values (uint8 or uint16) -> float32 [0, 1] image and its intensity record.

    ``intensity_range`` (declared ``[low, high]`` in stored values) maps that range to [0, 1] with
    clipping, whatever the bit depth. Otherwise uint8 is divided by 255 (source ``bit_depth``),
    and uint16 by 65535 with ``scaling="bit_depth"`` (the default: files medrobust writes itself,
    :func:`write_image`) or by its own ``[min, max]`` with ``scaling="actual_range"`` (what the
    dataset readers use: a 16-bit file rarely fills 0..65535, e.g. a microscopy image stored in
    0..235 would come in near-black)."""
    if raw.dtype not in (np.uint8, np.uint16):
        raise SampleError("unreadable_image", f"unsupported sample type {raw.dtype}")
    bits = 8 if raw.dtype == np.uint8 else 16
    if intensity_range is not None:
        return scale_to_unit(raw, intensity_range, bit_depth=bits)
    if bits == 8:
        return (raw.astype(np.float32) / np.float32(255.0)), _bit_depth_record(8)
    if scaling == "actual_range":
        return scale_to_unit(raw, None, bit_depth=bits)
    if scaling != "bit_depth":
        raise ValueError(f"scaling must be 'bit_depth' or 'actual_range', got {scaling!r}")
    return (raw.astype(np.float32) / np.float32(65535.0)), _bit_depth_record(16)


def npy_header(path: Path) -> tuple[tuple[int, ...], bool, np.dtype[Any], int, int]:
    """``(shape, fortran_order, dtype, data_offset, file_size)`` of a ``.npy`` file from its header
    alone (at most NumPy's 10,000-byte header limit is read). SampleError ``empty_file``,
    ``missing_file``, ``unreadable_image`` (not a .npy file, or an object array: pickles are refused)."""
    try:
        with path.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                raise SampleError("empty_file", str(path))
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
            elif version in ((2, 0), (3, 0)):
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
            else:
                raise ValueError(f"unsupported .npy format version {version}")
            offset = f.tell()
    except FileNotFoundError:
        raise SampleError("missing_file", str(path)) from None
    except SampleError:
        raise
    except Exception as e:  # not a .npy file, a header over NumPy's limit, a UTF-8 error...
        raise SampleError("unreadable_image", f"{path}: {type(e).__name__}: {e}") from None
    if dtype.hasobject:
        raise SampleError("unreadable_image", f"{path}: object array (a pickle); refused")
    return tuple(int(d) for d in shape), bool(fortran), dtype, int(offset), int(size)


def check_npy_bound(path: Path, shape: tuple[int, ...], dtype: np.dtype[Any], offset: int, size: int) -> None:
    """SampleError ``truncated`` when the file holds fewer bytes than its header's array,
    ``too_large`` when it holds more (nothing after the array is ever read)."""
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if size < offset + expected:
        raise SampleError("truncated", f"{path}: {size:,} bytes, its header's {shape} {dtype} array needs "
                                       f"{offset + expected:,}")
    if size > offset + expected:
        raise SampleError("too_large", f"{path}: {size:,} bytes, more than the {offset + expected:,} its "
                                       f"header's {shape} {dtype} array takes; not read")


def _read_npy(path: Path) -> FloatImage:
    """A float32 (H, W) or (H, W, 3) ``.npy`` in [0, 1]: the header's shape is checked against
    ``max_pixels`` and the file's size against the header before exactly the declared bytes are read."""
    shape, fortran, dtype, offset, size = npy_header(path)
    if len(shape) in (2, 3):
        check_declared_size(shape[0], shape[1], path)
    check_npy_bound(path, shape, dtype, offset, size)
    try:
        with path.open("rb") as f:
            f.seek(offset)
            flat = np.fromfile(f, dtype=dtype, count=int(np.prod(shape, dtype=np.int64)))
        arr = flat.reshape(shape, order="F" if fortran else "C")
    except Exception as e:
        raise SampleError("unreadable_image", f"{path}: {type(e).__name__}: {e}") from None
    if not isinstance(arr, np.ndarray) or arr.dtype != np.float32:
        raise SampleError(
            "unreadable_image", f"{path}: wrong dtype {getattr(arr, 'dtype', type(arr))}, need float32"
        )
    if arr.ndim == 3 and arr.shape[2] == 1:
        arr = arr[..., 0]
    if arr.ndim not in (2, 3) or (arr.ndim == 3 and arr.shape[2] != 3) or 0 in arr.shape:
        raise SampleError("unreadable_image", f"{path}: wrong shape {arr.shape}, need (H, W) or (H, W, 3)")
    if not np.isfinite(arr).all() or arr.min() < 0.0 or arr.max() > 1.0:
        raise SampleError("unreadable_image", f"{path}: values outside [0, 1] or not finite")
    return np.ascontiguousarray(arr)


# --------------------------------------------------------------------------------------------------
# DICOM


def _first_number(value: Any) -> float | None:
    """First element of a (possibly multi-valued) DICOM numeric element, or None."""
    if value is None:
        return None
    try:
        if isinstance(value, str | bytes):
            return float(value)
        if hasattr(value, "__len__") and hasattr(value, "__getitem__"):
            return float(value[0]) if len(value) else None
        return float(value)
    except (TypeError, ValueError, IndexError):
        return None


DICOM_DEFER_BYTES: int = 1 << 20
"""Elements larger than this are not read with the DICOM header (they are read, if at all, after
the size checks)."""


def _check_embedded_frame(ds: Any, p: Path, rows: int, cols: int, n_frames: int, index: int) -> None:
    """For an encapsulated (compressed) transfer syntax: the requested frame's own JPEG / JPEG-LS /
    JPEG 2000 header must not declare more pixels than the DICOM header's ``rows x cols``
    (SampleError ``too_large``, nothing decoded) and must match it (``unreadable_dicom``)."""
    tsyntax = getattr(getattr(ds, "file_meta", None), "TransferSyntaxUID", None)
    if tsyntax is None or not getattr(tsyntax, "is_encapsulated", False):
        return
    from pydicom.encaps import get_frame

    try:
        data = get_frame(ds.PixelData, index, number_of_frames=n_frames)
    except Exception as e:
        raise SampleError("unreadable_dicom", f"{p}: frame {index}: {type(e).__name__}: {e}") from None
    size = image_headers.embedded_frame_size(bytes(data[:1 << 16]) if len(data) > 1 << 16 else bytes(data))
    if size is None:
        return  # RLE or an unknown codestream: its decoder allocates the DICOM header's size
    h, w = size
    if h * w > rows * cols:
        raise SampleError("too_large", f"{p}: frame {index}'s compressed data declares {w} x {h} pixels, more than "
                                       f"the {cols} x {rows} of the DICOM header; not decoded")
    if (h, w) != (rows, cols):
        raise SampleError("unreadable_dicom", f"{p}: frame {index}'s compressed data declares {w} x {h} pixels, "
                                              f"the DICOM header {cols} x {rows}")


def read_dicom(
    path: str | os.PathLike[str],
    *,
    window_center: float | None = None,
    window_width: float | None = None,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
    keep_rgb: bool = False,
    frame: int | None = None,
) -> tuple[FloatImage, dict[str, Any]]:
    """Read one 2-D DICOM image and map it to [0, 1].

    Monochrome: ``value = stored * RescaleSlope + RescaleIntercept`` (HU for CT), then the window
    ``[c - w/2, c + w/2] -> [0, 1]`` linearly with clipping, where (c, w) come from the arguments,
    else the file's first WindowCenter/WindowWidth, else the ``percentiles`` of the rescaled
    values. This is the plain linear window (not the DICOM LINEAR function with its -0.5/-1
    offsets); VOI LUT sequences and SIGMOID functions are ignored. MONOCHROME1 is inverted after
    windowing so that bright means dense/high for every file.

    Colour (RGB, YBR_* which pydicom converts to RGB, PALETTE COLOR): divided by the maximum of
    the stored bit depth; converted to BT.601 luminance (H, W) unless ``keep_rgb``.

    Returns ``(image, meta)`` with ``meta["intensity"]`` (see module docstring) and
    ``meta["dicom"]`` (modality, photometric interpretation, pixel spacing, ...). Multi-frame files
    need ``frame``. Raises SampleError ``empty_file``, ``unreadable_dicom`` or ``unsupported_dicom``.
    """
    import pydicom
    from pydicom.pixels import apply_color_lut

    p = Path(path)
    _check_nonempty(p)
    # The header first, without the pixel data (and with any large element left unread), then
    # the declared size against max_pixels and the file's size against what the header allows.
    try:
        head = pydicom.dcmread(p, force=True, stop_before_pixels=True, defer_size=DICOM_DEFER_BYTES)
        photometric = str(head.get("PhotometricInterpretation", "MONOCHROME2")).strip().upper()
        n_frames = int(head.get("NumberOfFrames", 1) or 1)
        rows, cols = int(head.get("Rows", 0) or 0), int(head.get("Columns", 0) or 0)
        spp = int(head.get("SamplesPerPixel", 1) or 1)
        bits_alloc = int(head.get("BitsAllocated", 16) or 16)
    except Exception as e:
        raise SampleError("unreadable_dicom", f"{p}: {type(e).__name__}: {e}") from None
    check_declared_size(rows, cols, p, frames=n_frames)
    image_headers.check_file_bound(p.stat().st_size, rows, cols, p, bands=spp,
                                   bytes_per_sample=max(1, (bits_alloc + 7) // 8), frames=max(1, n_frames))
    if n_frames > 1:
        if frame is None:
            raise SampleError("unsupported_dicom", f"{p}: {n_frames} frames; set the frame option")
        if not 0 <= frame < n_frames:
            raise SampleError("unsupported_dicom", f"{p}: frame {frame} out of range 0..{n_frames - 1}")
    elif frame not in (None, 0):
        raise SampleError("unsupported_dicom", f"{p}: single-frame file, frame {frame} requested")
    try:
        ds = pydicom.dcmread(p, force=True)  # bounded: the file fits what the header declares
    except Exception as e:
        raise SampleError("unreadable_dicom", f"{p}: {type(e).__name__}: {e}") from None
    if not any(k in ds for k in ("PixelData", "FloatPixelData", "DoubleFloatPixelData")):
        raise SampleError("unreadable_dicom", f"{p}: no pixel data")
    _check_embedded_frame(ds, p, rows, cols, n_frames, frame or 0)
    try:
        if n_frames > 1:
            from pydicom.pixels import pixel_array

            arr = np.asarray(pixel_array(ds, index=frame))  # decodes only that frame
        else:
            arr = np.asarray(ds.pixel_array)
    except Exception as e:
        raise SampleError("unreadable_dicom", f"{p}: {type(e).__name__}: {e}") from None

    bits_stored = int(ds.get("BitsStored", 8 * arr.dtype.itemsize) or 8 * arr.dtype.itemsize)
    dicom_meta: dict[str, Any] = {
        "modality": str(ds.get("Modality", "")),
        "photometric_interpretation": photometric,
        "rows": int(arr.shape[0]),
        "columns": int(arr.shape[1]) if arr.ndim >= 2 else 0,
        "bits_stored": bits_stored,
        "transfer_syntax": str(getattr(getattr(ds, "file_meta", None), "TransferSyntaxUID", "")),
        "frame": frame,
    }
    spacing = ds.get("PixelSpacing", None) or ds.get("ImagerPixelSpacing", None)
    if spacing is not None:
        try:
            dicom_meta["pixel_spacing_mm"] = [float(s) for s in spacing]
        except (TypeError, ValueError):
            pass

    meta: dict[str, Any] = {"dicom": dicom_meta}
    if photometric in ("MONOCHROME1", "MONOCHROME2"):
        if arr.ndim != 2:
            raise SampleError("unsupported_dicom", f"{p}: monochrome pixel array has shape {arr.shape}")
        slope = _first_number(ds.get("RescaleSlope", None))
        intercept = _first_number(ds.get("RescaleIntercept", None))
        slope = 1.0 if slope is None or slope == 0 else slope
        intercept = 0.0 if intercept is None else intercept
        if not (np.isfinite(slope) and np.isfinite(intercept)):
            raise SampleError("unreadable_dicom", f"{p}: RescaleSlope {slope} / RescaleIntercept {intercept} "
                                                  "is not a finite number")
        values = arr.astype(np.float64) * slope + intercept
        wc = _first_number(ds.get("WindowCenter", None))
        ww = _first_number(ds.get("WindowWidth", None))
        file_window = (wc, ww) if wc is not None and ww is not None else None
        low, high, source = resolve_window(
            values,
            window_center=window_center,
            window_width=window_width,
            file_window=file_window,
            percentiles=percentiles,
        )
        invert = photometric == "MONOCHROME1"
        image = window_to_unit(values, low, high, invert=invert)
        rescale_type = str(ds.get("RescaleType", "") or "").strip()
        if rescale_type == "US":  # the DICOM code for "unspecified"
            rescale_type = ""
        unit = "HU" if dicom_meta["modality"] == "CT" else (rescale_type or "rescaled")
        meta["intensity"] = window_record(
            low,
            high,
            source=source,
            unit=unit,
            invert=invert,
            percentiles=percentiles if source == "percentile" else None,
            rescale_slope=float(slope),
            rescale_intercept=float(intercept),
        )
        return np.ascontiguousarray(image), meta

    if photometric == "PALETTE COLOR":
        try:
            arr = np.asarray(apply_color_lut(arr, ds))
        except Exception as e:
            raise SampleError("unreadable_dicom", f"{p}: palette: {type(e).__name__}: {e}") from None
        bits = 8 * arr.dtype.itemsize
    elif photometric in ("RGB", "YBR_FULL", "YBR_FULL_422", "YBR_ICT", "YBR_RCT", "YBR_PARTIAL_420"):
        bits = bits_stored
    else:
        raise SampleError("unsupported_dicom", f"{p}: photometric interpretation {photometric}")
    if arr.ndim != 3 or arr.shape[2] != 3:
        raise SampleError("unsupported_dicom", f"{p}: colour pixel array has shape {arr.shape}")
    rec = _bit_depth_record(bits)
    rgb = np.clip(arr.astype(np.float64) / rec["high"], 0.0, 1.0).astype(np.float32)
    if keep_rgb:
        rec["color"] = "rgb"
        meta["intensity"] = rec
        return np.ascontiguousarray(rgb), meta
    rec["color"] = "bt601_luminance"
    meta["intensity"] = rec
    return rgb_to_gray(rgb), meta


# --------------------------------------------------------------------------------------------------
# NIfTI


def check_nifti_bound(path: Path, img: Any) -> None:
    """SampleError ``too_large`` when a NIfTI file is larger than its header allows: for ``.nii``
    the voxel offset plus the declared voxels, for ``.nii.gz`` :func:`image_headers.max_file_bytes`
    of them (nothing after the declared voxels is ever read)."""
    shape = tuple(int(d) for d in img.shape)
    itemsize = int(np.dtype(img.get_data_dtype()).itemsize)
    voxels = int(np.prod(shape, dtype=np.int64))
    size = path.stat().st_size
    if file_extension(path) == ".nii":
        offset = int(img.header.get("vox_offset", 352) or 352)
        bound = offset + voxels * itemsize + image_headers.FILE_SLACK
    else:
        bound = image_headers.max_file_bytes(1, voxels, 1, itemsize)
    if size > bound:
        raise SampleError("too_large", f"{path}: {size:,} bytes, more than the {bound:,} its header's {shape} "
                                       "array can take; not read")


def nifti_slice_to_image(slice_2d: np.ndarray) -> np.ndarray:
    """The display convention for a 2-D slice of a NIfTI array: the two remaining voxel axes
    ``(a, b)`` in stored order are transposed to ``(b, a)``, so image rows follow the later
    stored axis and columns the earlier one. For an axial slice (``arr[:, :, k]``) of a volume
    stored x, y, z this gives rows = y (the anterior-posterior axis) and columns = x (left-right).
    No flips are applied: row 0 is voxel index 0 of that axis, as stored."""
    return np.ascontiguousarray(slice_2d.T)


def read_nifti_2d(
    path: str | os.PathLike[str],
    *,
    window_center: float | None = None,
    window_width: float | None = None,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
) -> tuple[FloatImage, dict[str, Any]]:
    """Read a 2-D NIfTI image (or a 3-D one with a single slice) and map it to [0, 1].

    Singleton axes are dropped, the slice is transposed per :func:`nifti_slice_to_image`, and the
    values (after the header's scl_slope/scl_inter) are windowed by the given center/width, else
    by the ``percentiles`` of the image. Raises SampleError ``empty_file``, ``unreadable_nifti`` or
    ``unsupported_nifti``."""
    import nibabel as nib

    p = Path(path)
    _check_nonempty(p)
    try:
        img = nib.load(str(p))
        shape = tuple(int(d) for d in img.shape)  # type: ignore[attr-defined]
    except Exception as e:
        raise SampleError("unreadable_nifti", f"{p}: {type(e).__name__}: {e}") from None
    plane = [d for d in shape if d != 1]
    if len(plane) != 2:
        raise SampleError("unsupported_nifti", f"{p}: shape {shape} is not a single 2-D slice")
    check_declared_size(plane[1], plane[0], p)  # from the header, before any voxel is read
    check_nifti_bound(p, img)
    try:
        data = np.asarray(img.dataobj, dtype=np.float32)  # type: ignore[attr-defined]
    except Exception as e:
        raise SampleError("unreadable_nifti", f"{p}: {type(e).__name__}: {e}") from None
    squeezed = np.squeeze(data)
    values = nifti_slice_to_image(squeezed)
    low, high, source = resolve_window(
        values, window_center=window_center, window_width=window_width, percentiles=percentiles
    )
    image = window_to_unit(values, low, high)
    rec = window_record(
        low, high, source=source, unit="stored", percentiles=percentiles if source == "percentile" else None
    )
    return image, {"intensity": rec, "nifti": {"shape": [int(s) for s in data.shape]}}


# --------------------------------------------------------------------------------------------------
# public entry points


def read_image_meta(
    path: str | os.PathLike[str],
    *,
    to_gray: bool = False,
    window_center: float | None = None,
    window_width: float | None = None,
    keep_rgb: bool = True,
) -> tuple[FloatImage, dict[str, Any]]:
    """Like :func:`read_image` but also returns metadata with the ``intensity`` record.

    ``window_center``/``window_width`` apply to DICOM and NIfTI only; ``keep_rgb`` (default True
    here: keep what the file has) applies to colour DICOM."""
    p = Path(path)
    ext = file_extension(p)
    meta: dict[str, Any]
    if ext in RASTER_EXTENSIONS:
        raw = read_raw(p)
        image, rec = raw_to_float(raw)
        meta = {"intensity": rec}
    elif ext == ".npy":
        image = _read_npy(p)
        meta = {
            "intensity": {
                "mapping": "linear",
                "low": 0.0,
                "high": 1.0,
                "invert": False,
                "clipped": False,
                "source": "npy",
                "unit": "unit",
            }
        }
    elif ext in DICOM_EXTENSIONS:
        image, meta = read_dicom(
            p, window_center=window_center, window_width=window_width, keep_rgb=keep_rgb and not to_gray
        )
    elif ext in NIFTI_EXTENSIONS:
        image, meta = read_nifti_2d(p, window_center=window_center, window_width=window_width)
    else:
        raise ValueError(
            f"unsupported image extension {ext!r} for {p.name!r}; valid: {', '.join(SUPPORTED_EXTENSIONS)}"
        )
    if to_gray and image.ndim == 3:
        image = rgb_to_gray(image)
        meta["intensity"] = {**meta["intensity"], "color": "bt601_luminance"}
    return image, meta


def read_image(path: str | os.PathLike[str], *, to_gray: bool = False) -> FloatImage:
    """Read an image file as float32 in [0, 1]: (H, W) if the file is grayscale, (H, W, 3) RGB if it
    is colour (a colour file whose channels happen to be equal stays (H, W, 3)); ``to_gray``
    converts colour to BT.601 luminance. 8-bit values are divided by 255 and 16-bit by 65535.
    DICOM and NIfTI use their windows (see :func:`read_dicom`, :func:`read_nifti_2d`)."""
    return read_image_meta(path, to_gray=to_gray)[0]


def _validate_unit_image(image: np.ndarray) -> np.ndarray:
    arr = np.asarray(image)
    if arr.dtype != np.float32:
        raise ValueError(f"image must be float32, got {arr.dtype}")
    if arr.ndim == 3 and arr.shape[2] == 1:
        arr = arr[..., 0]
    if arr.ndim not in (2, 3) or (arr.ndim == 3 and arr.shape[2] != 3):
        raise ValueError(f"image must be (H, W) or (H, W, 3), got {arr.shape}")
    if arr.size == 0:
        raise ValueError("image is empty")
    if not np.isfinite(arr).all() or arr.min() < 0.0 or arr.max() > 1.0:
        raise ValueError("image values must be finite and within [0, 1]")
    return arr


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder and ``os.replace``: a
    reader sees the old file or the new one, never a part (the folder is created when missing)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_image(
    path: str | os.PathLike[str], image: FloatImage, bit_depth: Literal[8, 16] | None = None
) -> Path:
    """Write a float32 [0, 1] image losslessly: PNG (``.png``) or ``.npy`` (float32, exact).

    PNG bit depth defaults to 16 for grayscale (keeps precision; round-trip error <= 0.5/65535)
    and 8 for RGB (round-trip error <= 0.5/255); values are rounded to the nearest level. The file
    is written atomically (temporary file + rename). Returns the path."""
    p = Path(path)
    arr = _validate_unit_image(image)
    ext = file_extension(p)
    if ext == ".npy":

        stream = io.BytesIO()
        np.save(stream, np.ascontiguousarray(arr, np.float32), allow_pickle=False)
        atomic_write(p, stream.getvalue())
        return p
    if ext != ".png":
        raise ValueError(f"write_image writes .png or .npy (lossless); got {p.name!r}")
    if bit_depth is None:
        bit_depth = 16 if arr.ndim == 2 else 8
    if bit_depth not in (8, 16):
        raise ValueError(f"bit_depth must be 8 or 16, got {bit_depth}")
    scale = 255.0 if bit_depth == 8 else 65535.0
    scaled = np.rint(arr.astype(np.float64) * scale)
    q: npt.NDArray[np.integer[Any]] = scaled.astype(np.uint8) if bit_depth == 8 else scaled.astype(np.uint16)
    encoded = cv2.cvtColor(q, cv2.COLOR_RGB2BGR) if q.ndim == 3 else q
    ok, buf = cv2.imencode(".png", encoded, [cv2.IMWRITE_PNG_COMPRESSION, 3])
    if not ok:
        raise OSError(f"PNG encoding failed for {p}")
    atomic_write(p, buf.tobytes())
    return p


def write_mask(path: str | os.PathLike[str], mask: BoolMask) -> Path:
    """Write a bool (H, W) mask as an 8-bit PNG with 0 = background and 255 = foreground."""
    p = Path(path)
    m = np.asarray(mask)
    if m.ndim != 2 or m.size == 0:
        raise ValueError(f"mask must be a non-empty (H, W) array, got {m.shape}")
    if file_extension(p) != ".png":
        raise ValueError(f"write_mask writes .png; got {p.name!r}")
    ok, buf = cv2.imencode(".png", m.astype(bool).astype(np.uint8) * 255)
    if not ok:
        raise OSError(f"PNG encoding failed for {p}")
    atomic_write(p, buf.tobytes())
    return p
