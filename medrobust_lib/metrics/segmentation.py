"""Overlap metrics on binarised masks (docs/design.md, section 5).

A pixel is foreground when its probability is strictly greater than :data:`THRESHOLD` (0.5), the
same rule as :mod:`medrobust_lib.models.base`. IoU = |P & G| / |P | G| and Dice = 2 |P & G| /
(|P| + |G|), both in [0, 1], with the relation ``dice = 2 * iou / (1 + iou)`` holding exactly (also
under the empty-ground-truth policy).

Empty ground truth (:data:`EMPTY_GT_POLICY`, reported in outputs): a prediction that is empty as
well scores 1.0, any foreground predicted on an empty ground truth scores 0.0. (The second case
already follows from the formulas; the first is the 0/0 convention.)

Functional core plus one accumulator (MONAI's ``compute_dice`` / ``DiceMetric`` split): the pure
functions take whole arrays, :class:`MaskMetricAccumulator` collects per-sample scores over batches.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

EMPTY_GT_POLICY = "both_empty_1_else_0"
"""Empty ground truth: both empty -> 1.0; a prediction on empty ground truth -> 0.0."""
THRESHOLD = 0.5
"""Default binarisation threshold: foreground is ``prob > THRESHOLD``."""

_BOTH_EMPTY_SCORE = 1.0


def binarize(prob: npt.ArrayLike, threshold: float = THRESHOLD) -> npt.NDArray[np.bool_]:
    """Foreground mask ``prob > threshold`` (strict), same shape as ``prob``, dtype bool.

    ``prob``: probabilities in [0, 1], any shape (e.g. (H, W) or (N, H, W)).
    """
    return np.asarray(prob) > threshold


def _check_pair(pred: np.ndarray, gt: np.ndarray, min_ndim: int) -> None:
    if pred.shape != gt.shape:
        raise ValueError(f"prediction and ground truth must have the same shape, got {pred.shape} and {gt.shape}")
    if pred.ndim < min_ndim:
        raise ValueError(f"expected at least {min_ndim} dimensions, got shape {pred.shape}")
    for name, a in (("prediction", pred), ("ground truth", gt)):
        if a.dtype != np.bool_:
            raise ValueError(f"{name} must be a bool mask, got dtype {a.dtype}; binarize probabilities first "
                             "(medrobust_lib.metrics.binarize)")


def _counts(pred: np.ndarray, gt: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-sample |P & G|, |P|, |G| over all axes but the first, as int64 (N,)."""
    n = pred.shape[0]
    p = pred.reshape(n, -1)
    g = gt.reshape(n, -1)
    inter = np.count_nonzero(p & g, axis=1).astype(np.int64)
    return inter, np.count_nonzero(p, axis=1).astype(np.int64), np.count_nonzero(g, axis=1).astype(np.int64)


def iou_from_counts(inter: npt.ArrayLike, pred_n: npt.ArrayLike, gt_n: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """IoU from per-sample pixel counts |P & G|, |P|, |G| (non-negative integers, equal shapes, e.g.
    (N,)) -> float64 of the same shape in [0, 1]; 1.0 where both masks are empty
    (:data:`EMPTY_GT_POLICY`). The one IoU formula: the host metrics and the models that count
    pixels on their device (``SamSegmenter.score``) both end here."""
    i, p, g = (np.asarray(a, np.int64) for a in (inter, pred_n, gt_n))
    union = p + g - i
    out = np.full(i.shape, _BOTH_EMPTY_SCORE, np.float64)
    nz = union > 0
    out[nz] = i[nz] / union[nz]
    return out


def dice_from_counts(inter: npt.ArrayLike, pred_n: npt.ArrayLike, gt_n: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """Dice 2 |P & G| / (|P| + |G|) from per-sample pixel counts (as :func:`iou_from_counts`) ->
    float64 of the same shape in [0, 1]; 1.0 where both masks are empty."""
    i, p, g = (np.asarray(a, np.int64) for a in (inter, pred_n, gt_n))
    denom = p + g
    out = np.full(i.shape, _BOTH_EMPTY_SCORE, np.float64)
    nz = denom > 0
    out[nz] = 2.0 * i[nz] / denom[nz]
    return out


def iou_batch(pred: npt.NDArray[np.bool_], gt: npt.NDArray[np.bool_]) -> npt.NDArray[np.float64]:
    """IoU per sample: bool (N, H, W) (or (N, ...)) masks of equal shape -> float64 (N,) in [0, 1].

    Raises ValueError on a shape mismatch or non-bool input.
    """
    pred, gt = np.asarray(pred), np.asarray(gt)
    _check_pair(pred, gt, 1)
    return iou_from_counts(*_counts(pred, gt))


def dice_batch(pred: npt.NDArray[np.bool_], gt: npt.NDArray[np.bool_]) -> npt.NDArray[np.float64]:
    """Dice per sample: bool (N, H, W) (or (N, ...)) masks of equal shape -> float64 (N,) in [0, 1].

    Raises ValueError on a shape mismatch or non-bool input.
    """
    pred, gt = np.asarray(pred), np.asarray(gt)
    _check_pair(pred, gt, 1)
    return dice_from_counts(*_counts(pred, gt))


def iou(pred: npt.NDArray[np.bool_], gt: npt.NDArray[np.bool_]) -> float:
    """IoU of one bool (H, W) mask pair (any equal shape works), in [0, 1]; see :data:`EMPTY_GT_POLICY`."""
    p, g = np.asarray(pred), np.asarray(gt)
    _check_pair(p, g, 0)
    return float(iou_batch(p.reshape(1, -1), g.reshape(1, -1))[0])


def dice(pred: npt.NDArray[np.bool_], gt: npt.NDArray[np.bool_]) -> float:
    """Dice of one bool (H, W) mask pair (any equal shape works), in [0, 1]; see :data:`EMPTY_GT_POLICY`."""
    p, g = np.asarray(pred), np.asarray(gt)
    _check_pair(p, g, 0)
    return float(dice_batch(p.reshape(1, -1), g.reshape(1, -1))[0])


class MaskMetricAccumulator:
    """Collects per-sample IoU and Dice over batches (MONAI ``DiceMetric`` style).

    ``update`` takes bool masks (H, W) for one sample or (N, H, W) for a batch; ``compute`` returns
    the means, the sample count and the policy; ``per_sample`` the float64 arrays in update order.
    """

    def __init__(self) -> None:
        self._iou: list[np.ndarray] = []
        self._dice: list[np.ndarray] = []

    def update(self, pred: npt.NDArray[np.bool_], gt: npt.NDArray[np.bool_], batched: bool | None = None) -> None:
        """Add one sample (2-D masks) or a batch (3-D masks). ``batched`` overrides the ndim rule."""
        p, g = np.asarray(pred), np.asarray(gt)
        if batched is None:
            batched = p.ndim >= 3
        if not batched:
            p, g = p[None], g[None]
        self._iou.append(iou_batch(p, g))
        self._dice.append(dice_batch(p, g))

    def reset(self) -> None:
        self._iou.clear()
        self._dice.clear()

    def per_sample(self) -> dict[str, npt.NDArray[np.float64]]:
        """{"iou": (n,), "dice": (n,)} float64 in update order."""
        def cat(xs: list[np.ndarray]) -> npt.NDArray[np.float64]:
            return np.concatenate(xs) if xs else np.zeros(0, np.float64)

        return {"iou": cat(self._iou), "dice": cat(self._dice)}

    def compute(self) -> dict[str, float | int | str]:
        """{"iou": mean, "dice": mean, "n": count, "empty_gt_policy": EMPTY_GT_POLICY}; means are NaN
        when nothing was added."""
        ps = self.per_sample()
        n = int(ps["iou"].size)
        return {
            "iou": float(ps["iou"].mean()) if n else float("nan"),
            "dice": float(ps["dice"].mean()) if n else float("nan"),
            "n": n,
            "empty_gt_policy": EMPTY_GT_POLICY,
        }
