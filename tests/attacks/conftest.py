"""A tiny SAM trained for a few seconds on synthetic blobs, so attack tests have something to break.

Images: 256 x 256 grayscale (replicated to 3 channels) in [0, 1], a textured background and one
rotated ellipse that is brighter or darker than it; the prompt is the ellipse's tight box (pixel
XYXY, end exclusive), the target its mask. All randomness comes from ``np.random.Generator`` /
seeded ``torch.Generator`` objects; the global RNGs are never seeded.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from medrobust_lib.metrics.segmentation import binarize, dice_batch
from medrobust_lib.models.sam import ARCHS, SamSegmenter, build_sam

SIZE = 256
TRAIN_STEPS_MAX = 150
BATCH = 8
LR = 1e-3
DICE_TARGET = 0.6


@dataclass(frozen=True)
class BlobBatch:
    images: torch.Tensor  # (B, 3, H, W) float32 in [0, 1]
    boxes: torch.Tensor  # (B, 4) float32 pixel XYXY
    masks: torch.Tensor  # (B, 1, H, W) float32 in {0, 1}


def make_blobs(rng: np.random.Generator, n: int, size: int = SIZE) -> BlobBatch:
    """n synthetic images with one bright or dark rotated ellipse each."""
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    images = np.empty((n, size, size), np.float32)
    masks = np.empty((n, size, size), bool)
    boxes = np.empty((n, 4), np.float32)
    for i in range(n):
        bg = rng.uniform(0.3, 0.7)
        img = bg + 0.06 * rng.standard_normal((size, size)).astype(np.float32)
        a, b = rng.uniform(18, 60), rng.uniform(10, 35)
        cx, cy = rng.uniform(70, size - 70, size=2)
        th = rng.uniform(0, np.pi)
        u = (xx - cx) * np.cos(th) + (yy - cy) * np.sin(th)
        v = -(xx - cx) * np.sin(th) + (yy - cy) * np.cos(th)
        m = (u / a) ** 2 + (v / b) ** 2 <= 1.0
        img[m] += rng.choice([-1.0, 1.0]) * rng.uniform(0.2, 0.3)
        images[i] = np.clip(img, 0.0, 1.0)
        masks[i] = m
        rows, cols = np.nonzero(m)
        boxes[i] = (cols.min(), rows.min(), cols.max() + 1, rows.max() + 1)
    x = torch.from_numpy(images)[:, None].expand(-1, 3, -1, -1).contiguous()
    return BlobBatch(x, torch.from_numpy(boxes), torch.from_numpy(masks)[:, None].float())


def clean_dice(model: SamSegmenter, data: BlobBatch) -> float:
    with torch.no_grad():
        prob = torch.sigmoid(model.forward_logits(data.images, data.boxes))
    return float(dice_batch(binarize(prob[:, 0].numpy()), data.masks[:, 0].numpy() > 0.5).mean())


@dataclass(frozen=True)
class TrainedTiny:
    model: SamSegmenter
    heldout: BlobBatch
    clean_dice: float
    steps: int
    seconds: float


def train_tiny() -> TrainedTiny:
    """build_sam(ARCHS['tiny']) behind SamSegmenter, AdamW-trained with model.loss until held-out
    clean Dice > DICE_TARGET (checked every 10 steps from step 40, at most TRAIN_STEPS_MAX steps); returned in
    eval mode."""
    t0 = time.perf_counter()
    model = SamSegmenter(build_sam(ARCHS["tiny"], seed=0), "sam", "tiny", "test")
    rng = np.random.default_rng(20240601)
    heldout = make_blobs(np.random.default_rng(7), 8)
    opt = torch.optim.AdamW(model.sam.parameters(), lr=LR)
    score, step = 0.0, 0
    model.sam.train()
    for step in range(1, TRAIN_STEPS_MAX + 1):
        batch = make_blobs(rng, BATCH)
        loss = model.loss(model.forward_logits(batch.images, batch.boxes), batch.masks)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step >= 40 and step % 10 == 0:
            model.sam.eval()
            score = clean_dice(model, heldout)
            model.sam.train()
            if score > DICE_TARGET:
                break
    opt.zero_grad(set_to_none=True)
    model.sam.eval()
    return TrainedTiny(model, heldout, score, step, time.perf_counter() - t0)


_TRAINED: list[TrainedTiny] = []


@pytest.fixture(scope="session", params=["reference", "fast"])
def trained_tiny(request: pytest.FixtureRequest) -> TrainedTiny:
    """The trained tiny SAM (:func:`train_tiny`, trained once per session), served with each image
    encoder engine (same weights; the fast engine's SDPA attention is patched into a copy), so
    every attack property is checked on both; fails if it did not learn."""
    import copy

    if not _TRAINED:
        _TRAINED.append(train_tiny())
    out = _TRAINED[0]
    if out.clean_dice <= DICE_TARGET:
        pytest.fail(f"tiny SAM reached held-out Dice {out.clean_dice:.3f} <= {DICE_TARGET} after {out.steps} steps")
    if request.param == "reference":
        return out
    fast = SamSegmenter(copy.deepcopy(out.model.sam), "sam", "tiny", "test", engine="fast")
    return TrainedTiny(fast, out.heldout, clean_dice(fast, out.heldout), out.steps, out.seconds)
