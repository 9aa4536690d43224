"""Task-specific prompt building and answer parsing: VQA (multiple choice, yes/no) and grounding."""

from __future__ import annotations

from medrobust_lib.vlm_tasks.grounding import (
    SCALES,
    box_iou,
    detect_scale,
    grounding_metrics,
    parse_box,
    to_pixels,
)
from medrobust_lib.vlm_tasks.vqa import (
    ChoiceResult,
    build_mc_prompt,
    extract_choice,
    extract_yes_no,
    is_refusal,
    yes_no_from_logprobs,
)

__all__ = [
    "SCALES",
    "ChoiceResult",
    "box_iou",
    "build_mc_prompt",
    "detect_scale",
    "extract_choice",
    "extract_yes_no",
    "grounding_metrics",
    "is_refusal",
    "parse_box",
    "to_pixels",
    "yes_no_from_logprobs",
]
