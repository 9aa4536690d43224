"""Supervised pretraining of the tiny demo LLaVA's vision tower: where the target is, before any text.

A 2-layer CLIP tower trained from scratch only through the language model's loss learns modality and
brightness but never where the target lies: side, height and size stay one constant answer, and
grounding stays at zero (``tools/vlm_attribute_probe.py``). Real LLaVAs start from a pretrained
tower. The demo pretrains its own tower on the demo's ground truth (train split and the synthetic
corpus, :mod:`medrobust_lib.demo.corpus`), with a linear head on every patch token that is thrown
away afterwards. The head predicts:

- the patch's target fraction (the mask averaged over the patch; binary cross-entropy);
- the target's box, ``[x0, y0, x1, y1]`` as fractions of width and height (sigmoid; squared error
  times :data:`BOX_WEIGHT`);
- its side (centre in the left half), height (centre in the upper half) and size (``large``) as
  three binary labels (binary cross-entropy).

Every token predicts the image-level targets, so every token the language model later sees carries
them. Images are used with their flips, and the targets move with the flip: by default the four
flips (none, left-right, up-down, both) are stored as rows (the committed weights' recipe); with
``transposes`` each batch draws one of the eight symmetries of the square per image instead
(:func:`symmetry_batch`), so the set is one copy of the images in memory.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from medrobust_lib.data.sample import Sample
from medrobust_lib.demo.alignment import flip_array
from medrobust_lib.demo.manifest import DemoSample
from medrobust_lib.seeding import rng_for

BOX_WEIGHT = 10.0
"""Weight of the box's squared error (fractions: errors are small numbers) in the summed loss."""

N_GLOBAL = 7
"""Image-level targets per image: box (4), left, upper, large."""

FLIPS = ("", "h", "v", "hv")

BOX_LOSSES = ("mse", "l1_giou")
"""``mse``: :data:`BOX_WEIGHT` times the squared error of the fractions. ``l1_giou``: 5 times the
mean absolute error plus 1 - generalised IoU (DETR's box loss), which keeps pulling on small boxes
whose squared errors are tiny."""


def tower_targets(mask: npt.NDArray[np.bool_], grid: int, large: bool) -> tuple[np.ndarray, np.ndarray]:
    """(patch, image) targets of one mask (H, W) bool, H and W divisible by ``grid``.

    ``patch``: float32 (grid * grid,) in [0, 1], the target fraction of each patch, row-major from
    the top-left. ``image``: float32 (7,): the box ``x0, y0, x1, y1`` as fractions (end exclusive:
    ``x1 = (last column + 1) / W``), then 1.0/0.0 for centre in the left half, centre in the upper
    half, ``large``. Raises ValueError for an empty mask or a size the grid does not divide."""
    h, w = mask.shape
    if h % grid or w % grid:
        raise ValueError(f"mask {h}x{w} is not divisible into a {grid}x{grid} grid")
    yx = np.argwhere(mask)
    if not len(yx):
        raise ValueError("empty mask: no target to pretrain on")
    patch = mask.astype(np.float32).reshape(grid, h // grid, grid, w // grid).mean(axis=(1, 3)).reshape(-1)
    (y0, x0), (y1, x1) = yx.min(0), yx.max(0) + 1
    cy, cx = yx.mean(0)
    image = np.array([x0 / w, y0 / h, x1 / w, y1 / h, cx < w / 2, cy < h / 2, large], np.float32)
    return patch, image


def tower_set(processor: Any, samples: dict[tuple[str, str], Sample], truth: dict[tuple[str, str], DemoSample],
              grid: int, flips: tuple[str, ...] = ("",)) -> tuple[Any, Any, Any]:
    """(pixel values (N, 3, S, S), patch targets (N, grid * grid), image targets (N, 7)) as float32
    tensors for every sample with a mask and ground truth, each of its ``flips`` one row (``""``:
    as it is; ``h``, ``v``, ``hv``: flipped)."""
    import torch

    from medrobust_lib.training.vlm_train import _rgb_u8

    pics, patches, images = [], [], []
    for key, s in sorted(samples.items()):
        t = truth.get(key)
        if t is None or s.mask is None or not s.mask.any():
            continue
        for flip in flips:
            pics.append(_rgb_u8(flip_array(s.image, flip)))
            p, g = tower_targets(flip_array(s.mask, flip).astype(bool), grid, t.size == "large")
            patches.append(p)
            images.append(g)
    if not pics:
        raise ValueError("no sample with a target mask and ground truth to pretrain the tower on")
    pixels = processor.image_processor(pics, return_tensors="pt")["pixel_values"]
    return pixels, torch.tensor(np.stack(patches)), torch.tensor(np.stack(images))


def _overlap(a: Any, b: Any) -> tuple[Any, Any]:
    """(intersection, union) areas of boxes ``a`` and ``b`` (..., 4) XYXY; a negative side counts as 0."""
    import torch

    ix = (torch.minimum(a[..., 2], b[..., 2]) - torch.maximum(a[..., 0], b[..., 0])).clamp(min=0)
    iy = (torch.minimum(a[..., 3], b[..., 3]) - torch.maximum(a[..., 1], b[..., 1])).clamp(min=0)
    inter = ix * iy
    area_a = (a[..., 2] - a[..., 0]).clamp(min=0) * (a[..., 3] - a[..., 1]).clamp(min=0)
    area_b = (b[..., 2] - b[..., 0]).clamp(min=0) * (b[..., 3] - b[..., 1]).clamp(min=0)
    return inter, (area_a + area_b - inter).clamp(min=1e-6)


def _box_iou(a: Any, b: Any) -> Any:
    inter, union = _overlap(a, b)
    return inter / union


def _giou(a: Any, b: Any) -> Any:
    """Generalised IoU of boxes ``a`` and ``b`` (..., 4) XYXY: IoU less the share of the smallest
    enclosing box that neither covers; in [-1, 1]."""
    import torch

    inter, union = _overlap(a, b)
    hull = ((torch.maximum(a[..., 2], b[..., 2]) - torch.minimum(a[..., 0], b[..., 0]))
            * (torch.maximum(a[..., 3], b[..., 3]) - torch.minimum(a[..., 1], b[..., 1]))).clamp(min=1e-6)
    return inter / union - (hull - union) / hull


def symmetry_batch(x: Any, p: Any, g: Any, codes: npt.NDArray[np.int64], grid: int) -> tuple[Any, Any, Any]:
    """Apply one symmetry of the square per row: bit 0 of ``codes`` flips left-right, bit 1 up-down,
    bit 2 transposes (after the flips). ``x`` (B, 3, S, S) pixels, ``p`` (B, grid * grid) row-major
    patch targets, ``g`` (B, 7) image targets as :func:`tower_targets` returns them; new tensors
    are returned (the inputs are not changed). The box, the left/upper labels and the patch grid
    move with the image; ``large`` does not change. The labels flip exactly as recomputing them
    from the flipped mask would, except for a centre less than one pixel left of (or above) the
    middle, where :func:`tower_targets`' strict ``<`` puts both the mask and its mirror image on
    one side."""
    import torch

    x, p, g = x.clone(), p.reshape(-1, grid, grid).clone(), g.clone()
    for bit, dim in ((1, -1), (2, -2)):
        rows = torch.from_numpy(np.flatnonzero(codes & bit))
        if len(rows):
            x[rows], p[rows] = x[rows].flip(dim), p[rows].flip(dim)
            lo, hi, side = (0, 2, 4) if bit == 1 else (1, 3, 5)
            g[rows, lo], g[rows, hi] = 1 - g[rows, hi], 1 - g[rows, lo]
            g[rows, side] = 1 - g[rows, side]
    rows = torch.from_numpy(np.flatnonzero(codes & 4))
    if len(rows):
        x[rows], p[rows] = x[rows].transpose(-1, -2).clone(), p[rows].transpose(-1, -2).clone()
        g[rows] = g[rows][:, [1, 0, 3, 2, 5, 4, 6]]
    return x, p.reshape(len(codes), -1), g


def pretrain_tower(model: Any, processor: Any, train: dict[tuple[str, str], Sample],
                   val: dict[tuple[str, str], Sample], truth: dict[tuple[str, str], DemoSample], *, steps: int,
                   lr: float, batch_size: int, seed: int, eval_every: int = 1000, box_loss: str = "mse",
                   transposes: bool = False, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Pretrain ``model``'s vision tower (a transformers LLaVA) for ``steps`` on ``train`` (its four
    flips as rows; with ``transposes``, one of the eight symmetries per image drawn for each batch,
    :func:`symmetry_batch`), with the box loss ``box_loss`` (:data:`BOX_LOSSES`), and report on ``val``
    (unflipped) every ``eval_every`` steps: the val loss, box IoU (mean and share >= 0.5) and
    side/height/size accuracy of the head. AdamW, ``lr`` decayed on a cosine to a tenth at ``steps``,
    gradient norm clipped at 1; batches drawn from a generator keyed by (seed, stage). The tower keeps
    the weights of the evaluation with the best mean val accuracy of side, height and size (what the
    language stages ask about; the later step on a tie; the last step is always evaluated). The val loss
    is no guide here: its patch term overfits while the attributes still improve. Returns a summary for
    ``training.json``.
    """
    import torch

    tower = model.model.vision_tower
    width = tower.config.hidden_size
    grid = tower.config.image_size // tower.config.patch_size
    if box_loss not in BOX_LOSSES:
        raise ValueError(f"box_loss must be one of {BOX_LOSSES}, got {box_loss!r}")
    x_tr, p_tr, g_tr = tower_set(processor, train, truth, grid, flips=("",) if transposes else FLIPS)
    x_va, p_va, g_va = tower_set(processor, val, truth, grid)
    with torch.random.fork_rng(devices=[]):
        torch.random.manual_seed(int(rng_for(seed, "demo-vlm", "tower-head").integers(2**31)))
        head = torch.nn.Linear(width, 1 + N_GLOBAL)
    params = [*tower.parameters(), *head.parameters()]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 0.1 + 0.45 * (1 + math.cos(math.pi * min(i, steps) / steps)))
    order = rng_for(seed, "demo-vlm", "tower-batches")

    def forward(x: Any, p: Any, g: Any) -> tuple[Any, Any, Any]:
        out = head(tower(x, output_hidden_states=True).hidden_states[-1][:, 1:])  # (B, tokens, 8)
        bce = torch.nn.functional.binary_cross_entropy_with_logits
        box = torch.sigmoid(out[..., 1:5])
        want = g[:, None, :4].expand_as(box)
        if box_loss == "mse":
            box_term = BOX_WEIGHT * ((box - want) ** 2).mean()
        else:
            box_term = 5.0 * (box - want).abs().mean() + (1 - _giou(box, want)).mean()
        loss = bce(out[..., 0], p) + box_term + bce(out[..., 5:], g[:, None, 4:].expand(-1, out.shape[1], -1))
        return loss, box.mean(1), torch.sigmoid(out[..., 5:]).mean(1)

    history: list[dict[str, float]] = []
    best: tuple[float, int, dict[str, Any]] | None = None
    tower.train()
    for step in range(1, steps + 1):
        idx = torch.from_numpy(order.integers(0, len(x_tr), size=batch_size))
        batch = x_tr[idx], p_tr[idx], g_tr[idx]
        if transposes:
            batch = symmetry_batch(*batch, order.integers(0, 8, size=batch_size), grid)
        loss, _, _ = forward(*batch)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        if step % eval_every == 0 or step == steps:
            with torch.no_grad():
                vl, box, attrs = forward(x_va, p_va, g_va)
                iou = _box_iou(box, g_va[:, :4])
                acc = ((attrs > 0.5).float() == g_va[:, 4:]).float().mean(0)
            row = {"step": step, "train_loss": float(loss.detach()), "val_loss": float(vl),
                   "val_box_iou": float(iou.mean()), "val_box_acc50": float((iou >= 0.5).float().mean()),
                   "val_side_acc": float(acc[0]), "val_height_acc": float(acc[1]), "val_size_acc": float(acc[2])}
            history.append(row)
            score = (row["val_side_acc"] + row["val_height_acc"] + row["val_size_acc"]) / 3
            if best is None or score >= best[0]:
                best = (score, step, {k: v.detach().clone() for k, v in tower.state_dict().items()})
            if log:
                log("tower " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()))
    if best is not None:
        tower.load_state_dict(best[2])
    tower.eval()
    chosen = next((h for h in history if best is not None and h["step"] == best[1]), {})
    return {"steps": steps, "n_train": len(x_tr), "n_val": len(x_va), "best_step": best[1] if best else 0,
            "best": chosen, "final": history[-1] if history else {}, "history": history}
