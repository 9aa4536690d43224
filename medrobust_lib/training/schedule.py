"""Learning-rate factors shared by the trainers (:mod:`medrobust_lib.training.train`,
:mod:`medrobust_lib.training.vlm_train`)."""

from __future__ import annotations


def linear_with_warmup(step: int, warmup_steps: int, total_steps: int) -> float:
    """The learning-rate factor of transformers' ``get_linear_schedule_with_warmup`` at ``step``:
    ``step / warmup_steps`` during the warmup (0 at step 0), then a linear decay from 1 to 0 at
    ``total_steps`` (0 after it). The reference benchmark trains its VLM LoRA with it."""
    if step < warmup_steps:
        return step / max(1, warmup_steps)
    return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))
