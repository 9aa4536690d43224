"""Known-answer and policy tests for IoU / Dice on binarised masks."""

from __future__ import annotations

import numpy as np
import pytest

from medrobust_lib.metrics.segmentation import (
    EMPTY_GT_POLICY,
    MaskMetricAccumulator,
    binarize,
    dice,
    dice_batch,
    iou,
    iou_batch,
)


def _mask(rows: list[str]) -> np.ndarray:
    return np.array([[c == "#" for c in r] for r in rows], dtype=bool)


PRED = _mask(["##..",
              "##..",
              "....",
              "...."])
GT = _mask([".##.",
            ".##.",
            ".##.",
            "...."])


def test_known_answer_by_hand() -> None:
    # |P & G| = 2, |P| = 4, |G| = 6, |P | G| = 8.
    assert iou(PRED, GT) == pytest.approx(2 / 8)
    assert dice(PRED, GT) == pytest.approx(2 * 2 / (4 + 6))


def test_identical_and_disjoint() -> None:
    assert iou(GT, GT) == 1.0 and dice(GT, GT) == 1.0
    assert iou(PRED, ~PRED) == 0.0 and dice(PRED, ~PRED) == 0.0


def test_empty_ground_truth_policy() -> None:
    empty = np.zeros((4, 4), bool)
    assert EMPTY_GT_POLICY == "both_empty_1_else_0"
    assert iou(empty, empty) == 1.0 and dice(empty, empty) == 1.0
    assert iou(PRED, empty) == 0.0 and dice(PRED, empty) == 0.0
    # A missed non-empty ground truth is an ordinary zero.
    assert iou(empty, GT) == 0.0 and dice(empty, GT) == 0.0


def test_shape_mismatch_and_non_bool_raise() -> None:
    with pytest.raises(ValueError, match="same shape"):
        iou(PRED, GT[:3])
    with pytest.raises(ValueError, match="same shape"):
        dice_batch(PRED[None], GT[None, :3])
    with pytest.raises(ValueError, match="binarize"):
        dice(PRED.astype(np.float32), GT)


def test_binarize_is_strict_greater_than_threshold() -> None:
    prob = np.array([0.0, 0.5, 0.5001, 1.0], np.float32)
    np.testing.assert_array_equal(binarize(prob), [False, False, True, True])
    np.testing.assert_array_equal(binarize(prob, 0.9), [False, False, False, True])
    assert binarize(prob).dtype == np.bool_


def test_dice_iou_relation_on_random_masks() -> None:
    rng = np.random.default_rng(0)
    pred = rng.random((50, 16, 16)) < rng.random((50, 1, 1))
    gt = rng.random((50, 16, 16)) < rng.random((50, 1, 1))
    pred[0] = False
    gt[0] = False  # both empty: the relation holds under the policy too
    j, d = iou_batch(pred, gt), dice_batch(pred, gt)
    np.testing.assert_allclose(d, 2 * j / (1 + j), rtol=0, atol=1e-12)
    assert j[0] == 1.0 and d[0] == 1.0


def test_batched_matches_single() -> None:
    rng = np.random.default_rng(1)
    pred = rng.random((6, 8, 8)) > 0.5
    gt = rng.random((6, 8, 8)) > 0.6
    gt[2] = False
    np.testing.assert_array_equal(iou_batch(pred, gt), [iou(p, g) for p, g in zip(pred, gt, strict=True)])
    np.testing.assert_array_equal(dice_batch(pred, gt), [dice(p, g) for p, g in zip(pred, gt, strict=True)])
    assert iou_batch(pred, gt).dtype == np.float64 and iou_batch(pred, gt).shape == (6,)


def test_accumulator_collects_single_and_batches() -> None:
    acc = MaskMetricAccumulator()
    assert np.isnan(acc.compute()["iou"])
    acc.update(PRED, GT)
    acc.update(np.stack([GT, PRED]), np.stack([GT, np.zeros_like(PRED)]))
    out = acc.compute()
    assert out["n"] == 3 and out["empty_gt_policy"] == EMPTY_GT_POLICY
    np.testing.assert_allclose(acc.per_sample()["iou"], [0.25, 1.0, 0.0])
    assert out["iou"] == pytest.approx(1.25 / 3)
    assert out["dice"] == pytest.approx((0.4 + 1.0 + 0.0) / 3)
    acc.reset()
    assert acc.compute()["n"] == 0
