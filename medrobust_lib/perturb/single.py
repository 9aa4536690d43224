"""Perturbing one image file from the shell (``medrobust perturb``)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from medrobust_lib.data.boxes import mask_to_boxes
from medrobust_lib.data.sample import SampleError
from medrobust_lib.paths import refuse_input
from medrobust_lib.perturb.calibrate import DEFAULT_BANDS, calibrate
from medrobust_lib.perturb.spec import get_perturbation, list_perturbations
from medrobust_lib.types import ALL_MODALITIES, SEVERITY_LEVELS, parse_modality


def types_for(type_arg: str, modality: str | None, n_channels: int) -> list[str]:
    """Names selected by ``--type``: one name, or 'all' = the generic types plus the modality's
    own types, restricted to those defined for the image's channel count."""
    if type_arg != "all":
        spec = get_perturbation(type_arg)
        if spec.channels == "rgb" and n_channels != 3:
            raise ValueError(f"perturbation {type_arg!r} needs an RGB image; this image is grayscale")
        return [type_arg]
    mod = parse_modality(modality).value if modality else None
    out = []
    for name in list_perturbations():
        spec = get_perturbation(name)
        generic = set(spec.modalities) == set(ALL_MODALITIES)
        if (generic or (mod is not None and mod in spec.modalities)) and (spec.channels == "any" or n_channels == 3):
            out.append(name)
    return out


def levels_for(level_arg: str) -> list[int]:
    if level_arg == "all":
        return list(SEVERITY_LEVELS)
    try:
        lv = int(level_arg)
    except ValueError:
        raise ValueError(f"--level must be 1..5 or 'all', got {level_arg!r}") from None
    if lv not in SEVERITY_LEVELS:
        raise ValueError(f"--level must be 1..5 or 'all', got {lv}")
    return [lv]


def perturb_file(
    input_path: Path, type_arg: str, level_arg: str, *, modality: str | None = None, seed: int = 0,
    mask_path: Path | None = None, output: Path | None = None, output_dir: Path | None = None, fmt: str = "png",
    window_center: float | None = None, window_width: float | None = None,
) -> Iterator[dict[str, Any]]:
    """Calibrate and write each requested (type, level); yields one record per output.

    The random key is (seed, 'cli', file stem, type), so a re-run is byte-identical. A grayscale
    input stays grayscale and RGB stays RGB; ``.npy`` outputs are exactly the float32 array the
    SSIM was measured on. Files written to ``output_dir`` are named
    ``<file name with '.' as '_'>__<type>__L<level>.<fmt>`` (:func:`output_stem`), so ``cam.png``
    and ``cam.tif`` never overwrite each other. DICOM and NIfTI inputs are windowed with
    ``window_center``/``window_width`` (both or neither; default: the file's window, else
    percentiles) and every record carries the applied ``window`` (``center``, ``width``, ``low``,
    ``high``, ``source``: options, file or percentile); other inputs refuse the window options.
    """
    from medrobust_lib.data.imageio import (
        DICOM_EXTENSIONS,
        NIFTI_EXTENSIONS,
        check_min_size,
        file_extension,
        read_image,
        read_image_meta,
        write_image,
    )

    if not input_path.is_file():
        raise FileNotFoundError(f"input image not found: {input_path}")
    if mask_path is not None and not mask_path.is_file():  # a FIFO or a device would block the read forever
        raise ValueError(f"--mask {mask_path} is not a regular file")
    if (output is None) == (output_dir is None):
        raise ValueError("give exactly one of --output FILE or --output-dir DIR")
    inputs = [input_path] + ([mask_path] if mask_path is not None else [])
    if output is not None:
        refuse_input(output, inputs)
        refuse_input(output.with_name(output.stem + "_mask.png"), inputs)
    for flag, value in (("--window-center", window_center), ("--window-width", window_width)):
        if value is not None and not math.isfinite(value):
            raise ValueError(f"{flag} must be a finite number, got {value}")
    windowed = file_extension(input_path) in (*DICOM_EXTENSIONS, *NIFTI_EXTENSIONS)
    if (window_center is not None or window_width is not None) and not windowed:
        raise ValueError(f"--window-center/--window-width apply to DICOM and NIfTI input only, not {input_path.name}")
    try:  # a file that cannot be used is bad input: one clear ValueError, never a traceback
        image, meta = read_image_meta(input_path, window_center=window_center, window_width=window_width)
        check_min_size(image.shape[0], image.shape[1], input_path)
        m = read_image(mask_path) if mask_path is not None else None
    except SampleError as exc:
        raise ValueError(f"cannot use {exc.detail or input_path} ({exc.reason})") from None
    if not np.isfinite(image).all():  # NaN voxels, a NaN/Inf DICOM rescale: nothing sound can be calibrated on it
        bad = int((~np.isfinite(image)).sum())
        raise ValueError(f"cannot use {input_path}: {bad} pixel(s) are NaN or infinite after reading "
                         "(check the file's values and its rescale slope / intercept)")
    window = window_of(meta.get("intensity", {})) if windowed else None
    mask = None
    if m is not None:
        m2 = m if m.ndim == 2 else m.max(axis=2)
        if m2.shape != image.shape[:2]:
            raise ValueError(f"mask shape {m2.shape} does not match image shape {image.shape[:2]}")
        mask = m2 > 0.5
    boxes = mask_to_boxes(mask) if mask is not None else None
    n_channels = 1 if image.ndim == 2 else 3
    types = types_for(type_arg, modality, n_channels)
    levels = levels_for(level_arg)
    if output is not None and len(types) * len(levels) != 1:
        raise ValueError(f"--output takes one (type, level); {len(types)} types x {len(levels)} levels "
                         "were selected: use --output-dir")
    if output is not None and output.suffix.lower() not in (".png", ".npy"):
        raise ValueError(f"--output must end in .png or .npy, got {output.name}")
    stem = input_path.name.split(".")[0]  # the random key (unchanged: outputs stay byte-identical)
    name = output_stem(input_path)
    for t in types:
        spec = get_perturbation(t)
        for lv in levels:
            c = calibrate(spec, image, DEFAULT_BANDS[lv], (seed, "cli", stem, t), mask=mask, boxes=boxes)
            if output is not None:
                path = output
            else:
                assert output_dir is not None
                path = output_dir / f"{name}__{t}__L{lv}.{fmt}"
                refuse_input(path, inputs)
                refuse_input(path.with_name(path.stem + "_mask.png"), inputs)
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.suffix == ".npy":
                np.save(path, c.output.image.astype(np.float32))
            else:
                write_image(path, c.output.image, bit_depth=16 if c.output.image.ndim == 2 else 8)
            rec: dict[str, Any] = {"perturbation": t, "level": lv, "strength": c.strength, "ssim": c.ssim,
                                   "band_reached": c.band_reached, "n_ssim_evals": c.n_ssim_evals, "path": str(path)}
            if window is not None:
                rec["window"] = window
            if c.output.mask is not None and spec.geometry == "spatial":  # an intensity type leaves the mask as it was
                mpath = path.with_name(path.stem + "_mask.png")
                write_image(mpath, c.output.mask.astype(np.float32), bit_depth=8)
                rec["mask_path"] = str(mpath)
            yield rec


def output_stem(path: Path) -> str:
    """The file-name stem of ``path``'s outputs: its whole name with dots as underscores
    (``cam.png`` -> ``cam_png``, ``scan.nii.gz`` -> ``scan_nii_gz``), unique per input file."""
    return path.name.replace(".", "_")


def window_of(intensity: dict[str, Any]) -> dict[str, Any] | None:
    """The applied intensity window of a DICOM/NIfTI read (``meta["intensity"]``) as a JSON-ready
    dict, or None when the mapping was not a window."""
    if "center" not in intensity:
        return None
    return {k: intensity[k] for k in ("center", "width", "low", "high", "source", "unit", "invert") if k in intensity}
