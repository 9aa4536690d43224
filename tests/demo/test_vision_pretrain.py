"""Supervised pretraining of the tiny LLaVA's vision tower: the targets are what the mask says, and a
short schedule learns where a target is."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from medrobust_lib.data.sample import Sample
from medrobust_lib.demo.vision_pretrain import tower_targets


def test_tower_targets_of_a_known_mask() -> None:
    mask = np.zeros((8, 8), bool)
    mask[0:2, 4:8] = True  # the top half of the two upper-right patches of a 4x4 grid (2x2 px each)
    mask[2, 4] = True
    patch, image = tower_targets(mask, 4, large=False)
    want = np.zeros(16, np.float32)
    want[[2, 3]] = 1.0       # row 0, columns 2 and 3: fully covered
    want[6] = 0.25           # row 1, column 2: one pixel of four
    np.testing.assert_allclose(patch, want)
    # box as fractions, end exclusive: columns 4..7 -> 0.5..1.0, rows 0..2 -> 0..3/8
    np.testing.assert_allclose(image[:4], [0.5, 0.0, 1.0, 3 / 8])
    assert image[4] == 0.0 and image[5] == 1.0 and image[6] == 0.0   # right half, upper half, small
    assert patch.dtype == np.float32 and image.dtype == np.float32


def test_tower_targets_reject_empty_masks_and_uneven_grids() -> None:
    with pytest.raises(ValueError, match="empty mask"):
        tower_targets(np.zeros((8, 8), bool), 4, large=True)
    with pytest.raises(ValueError, match="not divisible"):
        tower_targets(np.ones((8, 8), bool), 3, large=True)


@pytest.mark.parametrize("code", range(8))
def test_symmetry_batch_moves_the_targets_with_the_image(code: int) -> None:
    """Each of the eight symmetries applied to (pixels, patch targets, image targets) equals the
    targets of the mask transformed the same way (left-right flip, up-down flip, then transpose)."""
    import torch

    from medrobust_lib.demo.vision_pretrain import symmetry_batch

    rng = np.random.default_rng(code)
    masks, xs, ps, gs = [], [], [], []
    for _ in range(3):
        m = np.zeros((16, 16), bool)
        y, x = int(rng.integers(0, 5)), int(rng.integers(9, 13))  # upper right: centre clear of the middle
        m[y:y + int(rng.integers(2, 4)), x:x + int(rng.integers(2, 4))] = True
        p, g = tower_targets(m, 4, large=bool(rng.integers(2)))
        masks.append(m)
        xs.append(np.stack([m * 1.0, m * 2.0, rng.uniform(size=m.shape)]).astype(np.float32))
        ps.append(p)
        gs.append(g)
    codes = np.full(3, code, np.int64)
    inputs = torch.tensor(np.stack(xs)), torch.tensor(np.stack(ps)), torch.tensor(np.stack(gs))
    x, p, g = symmetry_batch(*inputs, codes, 4)
    for i, m in enumerate(masks):
        img = xs[i]
        if code & 1:
            m, img = m[:, ::-1], img[:, :, ::-1]
        if code & 2:
            m, img = m[::-1], img[:, ::-1]
        if code & 4:
            m, img = m.T, img.transpose(0, 2, 1)
        want_p, want_g = tower_targets(np.ascontiguousarray(m), 4, large=bool(gs[i][6]))
        np.testing.assert_allclose(p[i].numpy(), want_p)
        np.testing.assert_allclose(g[i].numpy(), want_g, atol=1e-6)
        np.testing.assert_array_equal(x[i].numpy(), img)
    for before, after in zip((np.stack(xs), np.stack(ps), np.stack(gs)), inputs, strict=True):
        np.testing.assert_array_equal(after.numpy(), before)  # the inputs are not changed


def _squares(n: int, offset: int, rng: np.random.Generator) -> tuple[dict, dict]:  # type: ignore[type-arg]
    samples, truth = {}, {}
    for i in range(n):
        img = rng.uniform(0.0, 0.3, (64, 64)).astype(np.float32)
        mask = np.zeros((64, 64), bool)
        r = int(rng.integers(4, 10))
        cx, cy = int(rng.integers(r, 64 - r)), int(rng.integers(r, 64 - r))
        mask[cy - r:cy + r, cx - r:cx + r] = True
        img[mask] = 0.9
        key = ("squares", f"s{offset + i}")
        samples[key] = Sample(key[1], key[0], "ct", img, mask)
        truth[key] = SimpleNamespace(size="large" if r >= 7 else "small")
    return samples, truth


def test_short_tower_pretraining_learns_where_the_target_is() -> None:
    """A bright square on noise: 150 steps of pretraining bring the head's side and height accuracy on
    held-out images well above chance and its box IoU up from the untrained tower's."""
    from medrobust_lib.demo.vision_pretrain import pretrain_tower
    from medrobust_lib.models.tiny_vlm import build_tiny_llava, build_tokenizer

    rng = np.random.default_rng(0)
    train, truth = _squares(96, 0, rng)
    val, vtruth = _squares(48, 1000, rng)
    model, proc = build_tiny_llava(build_tokenizer(["where"]), image_size=32, patch_size=8, text_hidden=32,
                                   vision_hidden=32, seed=0, position_std=1.0)
    first = pretrain_tower(model, proc, train, val, truth | vtruth, steps=1, lr=1e-3, batch_size=16, seed=0)
    out = pretrain_tower(model, proc, train, val, truth | vtruth, steps=150, lr=3e-3, batch_size=16, seed=0,
                         eval_every=50)
    final = out["final"]
    assert out["n_train"] == 4 * 96 and out["n_val"] == 48 and len(out["history"]) == 3
    assert final["val_side_acc"] >= 0.8 and final["val_height_acc"] >= 0.8
    assert final["val_box_iou"] > first["final"]["val_box_iou"] + 0.2
    assert final["val_loss"] < first["final"]["val_loss"]
    # the tower keeps the evaluation with the best mean attribute accuracy (the later one on a tie)
    def score(h: dict[str, float]) -> float:
        return (h["val_side_acc"] + h["val_height_acc"] + h["val_size_acc"]) / 3
    top = max(score(h) for h in out["history"])
    assert out["best"]["step"] == max(h["step"] for h in out["history"] if score(h) == top)
    assert out["best_step"] == out["best"]["step"]


def test_box_iou_and_generalised_iou_of_known_boxes() -> None:
    import torch

    from medrobust_lib.demo.vision_pretrain import _box_iou, _giou

    a = torch.tensor([[0.0, 0.0, 2.0, 2.0], [0.0, 0.0, 1.0, 1.0], [0.0, 0.0, 1.0, 1.0]])
    b = torch.tensor([[1.0, 1.0, 3.0, 3.0], [2.0, 0.0, 3.0, 1.0], [0.0, 0.0, 1.0, 1.0]])
    torch.testing.assert_close(_box_iou(a, b), torch.tensor([1 / 7, 0.0, 1.0]))
    # hull areas 9, 3, 1: IoU less the uncovered share of the hull (9 - 7) / 9, (3 - 2) / 3, 0
    torch.testing.assert_close(_giou(a, b), torch.tensor([1 / 7 - 2 / 9, -1 / 3, 1.0]))
