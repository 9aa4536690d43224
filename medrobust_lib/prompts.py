"""Box prompts from masks, drawn as the segmentation config's prompt protocol
(:class:`~medrobust_lib.config.segmentation.PromptConfig`, recorded with every result row)."""

from __future__ import annotations

import numpy as np

from medrobust_lib.config.segmentation import PromptConfig
from medrobust_lib.data.boxes import mask_to_box
from medrobust_lib.data.sample import Sample
from medrobust_lib.seeding import rng_for
from medrobust_lib.types import Boxes


def prompt_boxes(sample: Sample, cfg: PromptConfig, *, salt: str = "", mask: np.ndarray | None = None) -> Boxes:
    """(1, 4) float32 pixel XYXY box for the sample's mask (or ``mask`` when given, e.g. the
    mask moved by a spatial perturbation). An empty mask gives a (0, 4) array."""
    m = sample.mask if mask is None else mask
    if m is None:
        raise ValueError(f"sample {sample.sample_id} has no mask to derive a box prompt from")
    box = mask_to_box(m)
    if box is None:
        return np.zeros((0, 4), np.float32)
    h, w = m.shape
    b = box.astype(np.float64)
    b += np.array([-cfg.margin, -cfg.margin, cfg.margin, cfg.margin])
    if cfg.jitter > 0:
        size = np.array([b[2] - b[0], b[3] - b[1]] * 2)
        d = rng_for(cfg.seed, sample.dataset, sample.sample_id, "box-jitter", salt).uniform(-1, 1, 4)
        b += d * cfg.jitter * size
    b = np.clip(b, 0, [w, h, w, h])
    return b.astype(np.float32)[None, :]
