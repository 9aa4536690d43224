"""Segmentation losses on logits."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def soft_dice_loss(logits: torch.Tensor, target: torch.Tensor, eps: float = 1.0) -> torch.Tensor:
    """1 - soft Dice per sample, averaged; logits and target (B, 1, H, W), target in {0, 1}."""
    p = torch.sigmoid(logits).flatten(1)
    t = target.flatten(1).to(p.dtype)
    inter = (p * t).sum(1)
    return (1 - (2 * inter + eps) / (p.sum(1) + t.sum(1) + eps)).mean()


def dice_bce_loss(logits: torch.Tensor, target: torch.Tensor, w_dice: float = 0.7, w_bce: float = 0.3) -> torch.Tensor:
    """0.7 soft Dice + 0.3 BCE (weights configurable), the house default."""
    bce = F.binary_cross_entropy_with_logits(logits, target.to(logits.dtype))
    return w_dice * soft_dice_loss(logits, target) + w_bce * bce
