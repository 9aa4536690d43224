"""Metrics: overlap scores on binarised masks and the statistics used to compare conditions."""

from __future__ import annotations

from medrobust_lib.metrics.segmentation import (
    EMPTY_GT_POLICY,
    THRESHOLD,
    MaskMetricAccumulator,
    binarize,
    dice,
    dice_batch,
    iou,
    iou_batch,
)
from medrobust_lib.metrics.stats import (
    MCNEMAR_EXACT_BELOW,
    WILCOXON_ZERO_METHOD,
    benjamini_hochberg,
    bootstrap_ci,
    mcnemar,
    paired_bootstrap_ci,
    pearson_with_ci,
    wilcoxon_paired,
)

__all__ = [
    "EMPTY_GT_POLICY",
    "MCNEMAR_EXACT_BELOW",
    "THRESHOLD",
    "WILCOXON_ZERO_METHOD",
    "MaskMetricAccumulator",
    "benjamini_hochberg",
    "binarize",
    "bootstrap_ci",
    "dice",
    "dice_batch",
    "iou",
    "iou_batch",
    "mcnemar",
    "paired_bootstrap_ci",
    "pearson_with_ci",
    "wilcoxon_paired",
]
