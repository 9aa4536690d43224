"""The reference benchmark's calibration protocol (``perturbations.calibration_mode: reference``).

The code published with the MedFM-Robust paper (``segmentation_generate_perb_all_V10_adpative_
efficient.py``: ``find_adaptive_param``, ``apply_perturbation_adaptive``, ``compute_ssim``) calibrates
a (type, level) once, on the **first image** of a dataset, and applies that strength to every other
image without looking at their SSIM:

- bisection over the type's strength range: at most 20 midpoints; a midpoint whose SSIM lies
  within the band widened by +/- 0.02 is accepted at once; otherwise the half whose SSIM moves
  toward the band's centre is kept (inverse types, where a smaller value is stronger, mirror the
  rule); after 20 misses the midpoint whose SSIM was closest to the band's centre is kept;
- SSIM on **per-image min-max-normalised** arrays (clean and perturbed each stretched to [0, 1]
  on their own), ``skimage`` settings (7x7 uniform window, data range 1), mean over channels.

Here the bisection runs over the medrobust type's own ``strength_range`` with its own generator
(the reference's types and ranges are its own); everything else is as published, which
``tests/reference_protocol/test_calibrate_reference.py`` checks against fixtures made by running the
reference's own functions (``tools/reference_protocol_fixtures.py``). The one departure: an
exception raised by a perturbation propagates (the reference silently moved the bracket), so it
becomes the row's counted ``error`` outcome.

:func:`medrobust_lib.perturb.engine.run_chunk` runs :func:`find_strength` on the first applicable
image by sample id and applies that strength to the others. The house SSIM (raw [0, 1] images) is
what the manifest records for every row, so tables stay comparable across modes; ``band_reached``
says whether that SSIM lies in the band.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from skimage.metrics import structural_similarity

from medrobust_lib.perturb.calibrate import Band
from medrobust_lib.perturb.spec import PerturbationSpec, PerturbOutput
from medrobust_lib.seeding import rng_for
from medrobust_lib.types import BoolMask, Boxes, FloatImage

MAX_ITERATIONS = 20
TOLERANCE = 0.02


def minmax(image: np.ndarray) -> np.ndarray:
    """The reference's ``_normalize_for_metrics``: ``(x - min) / (max - min)`` over the whole array
    (all channels), in the array's own dtype; all zeros when ``max - min <= 1e-8``."""
    lo, hi = image.min(), image.max()
    if hi - lo > 1e-8:
        return (image - lo) / (hi - lo)
    return np.zeros_like(image)


def reference_ssim(clean: FloatImage, perturbed: FloatImage) -> float:
    """The reference's ``compute_ssim``: ``skimage.metrics.structural_similarity`` (7x7 uniform
    window, data range 1, computed in float32 for float32 input, as skimage does) of the two
    min-max-normalised arrays, channel by channel and averaged for (H, W, C) input. The house
    :func:`~medrobust_lib.perturb.ssim.ssim` computes in float64 and differs by ~1e-6."""
    a, b = minmax(clean), minmax(perturbed)
    if a.ndim == 3:
        return float(np.mean([structural_similarity(a[:, :, c], b[:, :, c], data_range=1.0)
                              for c in range(a.shape[2])]))
    return float(structural_similarity(a, b, data_range=1.0))


def find_strength(
    spec: PerturbationSpec,
    image: FloatImage,
    band: Band,
    key: Sequence[object],
    *,
    mask: BoolMask | None = None,
    boxes: Boxes | None = None,
    max_iterations: int = MAX_ITERATIONS,
    tolerance: float = TOLERANCE,
) -> tuple[float, float, PerturbOutput, int]:
    """The reference's ``find_adaptive_param`` on one image. Returns (strength as applied, i.e.
    ``spec.clamp`` of the midpoint; its min-max SSIM; the output; SSIM evaluations)."""
    lo_band, hi_band = band
    p_min, p_max = spec.strength_range
    target = (lo_band + hi_band) / 2
    best: tuple[float, float, PerturbOutput] | None = None
    best_diff = float("inf")
    n = 0
    for _ in range(max_iterations):
        param = (p_min + p_max) / 2
        out = spec.apply(image, param, rng_for(*key), mask=mask, boxes=boxes)
        value = reference_ssim(image, out.image)
        n += 1
        diff = abs(value - target)
        if diff < best_diff:
            best_diff, best = diff, (param, value, out)
        if lo_band - tolerance <= value <= hi_band + tolerance:
            return spec.clamp(param), value, out, n
        if spec.inverse:
            if value > target:
                p_max = param
            else:
                p_min = param
        elif value > target:
            p_min = param
        else:
            p_max = param
    assert best is not None  # max_iterations >= 1
    return spec.clamp(best[0]), best[1], best[2], n
