"""Box prompts from ground-truth masks: one box per target (the whole mask, or each instance)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from medrobust_lib.config.segmentation import PromptConfig
from medrobust_lib.data.boxes import instance_boxes, mask_to_box
from medrobust_lib.data.sample import Sample
from medrobust_lib.seeding import rng_for
from medrobust_lib.types import BoolMask, Boxes, InstanceMap


def _shape_box(box: np.ndarray, sample: Sample, cfg: PromptConfig, hw: tuple[int, int], salt: str) -> np.ndarray:
    """``box`` (4,) grown by the margin, jittered (seeded by sample and ``salt``), clipped."""
    h, w = hw
    b = box.astype(np.float64)
    b += np.array([-cfg.margin, -cfg.margin, cfg.margin, cfg.margin])
    if cfg.jitter > 0:
        size = np.array([b[2] - b[0], b[3] - b[1]] * 2)
        d = rng_for(cfg.seed, sample.dataset, sample.sample_id, "box-jitter", salt).uniform(-1, 1, 4)
        b += d * cfg.jitter * size
    return np.clip(b, 0, [w, h, w, h]).astype(np.float32)


@dataclass(frozen=True)
class PromptTargets:
    """The box prompts of one image and what each is scored against.

    ``boxes``: float32 (K, 4) pixel XYXY (end exclusive). ``instances``: the int32 (H, W)
    instance map the boxes belong to, or None when the sample's whole mask is one target (then
    K is 0 or 1). ``ids``: int32 (K,) the instance id of each box (box k targets
    ``instances == ids[k]``); empty when ``instances`` is None. ``n_instances``: the targets the
    sample has (instances present before a spatial perturbation; 1 or 0 without instances), so
    ``n_instances - K`` were moved out of view."""

    boxes: Boxes
    instances: InstanceMap | None
    ids: np.ndarray
    n_instances: int


def prompt_targets(sample: Sample, cfg: PromptConfig, *, salt: str = "", mask: BoolMask | None = None,
                   instances: InstanceMap | None = None) -> PromptTargets:
    """The box prompts of ``sample`` (or of ``mask`` / ``instances`` when given: the ground truth
    moved by a spatial perturbation). A sample with an instance map gets one box per instance
    present, in id order (the jitter of box k is seeded with its id, so it does not depend on
    which other instances are in view); otherwise one tight box over the mask (none when empty)."""
    inst = sample.instances if instances is None else instances
    if inst is None:
        return PromptTargets(prompt_boxes(sample, cfg, salt=salt, mask=mask), None, np.zeros(0, np.int32),
                             1 if (sample.mask is not None and sample.mask.any()) else 0)
    n_total = int(sample.instances.max()) if sample.instances is not None and sample.instances.size else 0
    raw = instance_boxes(inst)
    ids = np.array([i + 1 for i in range(len(raw)) if not np.isnan(raw[i]).any()], np.int32)
    hw = (int(inst.shape[0]), int(inst.shape[1]))
    boxes = np.stack([_shape_box(raw[i - 1], sample, cfg, hw, f"{salt}#{i}") for i in ids]) if len(ids) else \
        np.zeros((0, 4), np.float32)
    return PromptTargets(boxes.astype(np.float32), inst, ids, max(n_total, int(inst.max()) if inst.size else 0))


def prompt_boxes(sample: Sample, cfg: PromptConfig, *, salt: str = "", mask: BoolMask | None = None) -> Boxes:
    """(K, 4) float32 pixel XYXY box prompts: for a sample with instances (``Sample.instances``)
    one per instance (:func:`prompt_targets`), else (1, 4) for the sample's mask (or ``mask``
    when given, e.g. the mask moved by a spatial perturbation). An empty mask gives (0, 4)."""
    if sample.instances is not None and mask is None:
        return prompt_targets(sample, cfg, salt=salt).boxes
    m = sample.mask if mask is None else mask
    if m is None:
        raise ValueError(f"sample {sample.sample_id} has no mask to derive a box prompt from")
    box = mask_to_box(m)
    if box is None:
        return np.zeros((0, 4), np.float32)
    return _shape_box(box, sample, cfg, (int(m.shape[0]), int(m.shape[1])), salt)[None, :]
