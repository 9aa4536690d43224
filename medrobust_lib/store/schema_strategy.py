"""Schema of the strategy ranking table (kept apart so the mart imports no pandas/scipy)."""

from __future__ import annotations

RANKING_TABLE = "strategy_ranking_stats"
RANKING_COLUMNS: tuple[tuple[str, str], ...] = (
    ("model", "VARCHAR"), ("strategy", "VARCHAR"), ("evaluated_as", "VARCHAR"), ("checkpoint", "VARCHAR"),
    ("kind", "VARCHAR"), ("n_samples", "INTEGER"), ("n_conditions", "INTEGER"), ("n_rows", "INTEGER"),
    ("n_failed", "INTEGER"), ("mean_iou_drop", "DOUBLE"), ("iou_drop_ci_low", "DOUBLE"),
    ("iou_drop_ci_high", "DOUBLE"), ("mean_dice_drop", "DOUBLE"), ("dice_drop_ci_low", "DOUBLE"),
    ("dice_drop_ci_high", "DOUBLE"), ("clean_iou", "DOUBLE"), ("clean_dice", "DOUBLE"),
    ("n_trainable", "BIGINT"), ("rank", "INTEGER"), ("ref_strategy", "VARCHAR"), ("n_pairs", "INTEGER"),
    ("iou_drop_diff", "DOUBLE"), ("iou_drop_diff_ci_low", "DOUBLE"), ("iou_drop_diff_ci_high", "DOUBLE"),
    ("wilcoxon_p", "DOUBLE"), ("wilcoxon_q", "DOUBLE"),
)

RANKING_VIEW = "strategy_ranking"
