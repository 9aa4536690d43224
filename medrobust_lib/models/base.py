"""Model protocols.

Segmentation convention: images enter as float32 in [0, 1], (H, W) or (H, W, 3) numpy arrays, or
as torch tensors (B, 3, H, W) in [0, 1] on the differentiable path (grayscale is replicated to
three channels). Boxes are pixel XYXY (end exclusive) in the coordinates of the input image.
Outputs are foreground probabilities in [0, 1] at the input resolution; a pixel is foreground
when its probability is > 0.5.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np
import torch

from medrobust_lib.types import Boxes, FloatImage


@runtime_checkable
class SegmentationModel(Protocol):
    """A promptable segmentation model."""

    model_id: str
    checkpoint_hash: str

    def predict(self, images: Sequence[FloatImage], boxes: Sequence[Boxes]) -> list[np.ndarray]:
        """Probabilities per image: float32 (N_i, H, W) for the N_i boxes of image i. The image
        embedding is computed once per image and reused for all its boxes. Runs in eval mode
        under no_grad."""
        ...

    def forward_logits(self, images: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
        """Differentiable path: images (B, 3, H, W) float in [0, 1], boxes (B, 4) pixel XYXY ->
        logits (B, 1, H, W) at input resolution. The preprocessing is exactly the one
        ``predict`` uses, so attacks and fine-tuning see the evaluated model."""
        ...

    def loss(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Scalar training/attack loss for logits (B, 1, H, W) and target masks (B, 1, H, W) in {0, 1}."""
        ...


@runtime_checkable
class VisionLanguageModel(Protocol):
    """A vision-language model answering questions about images.

    Images: float32 in [0, 1], (H, W) or (H, W, 3), or None for a text-only prompt (the
    image-removal baseline). Decoding is greedy. Local models implement this directly
    (:class:`medrobust_lib.models.hf_vlm.HFVisionLanguageModel`); the API adapter returns richer
    per-request results (outcome, latency, cache hit) and the evaluation's runner
    (:class:`medrobust_lib.tracks.vlm.runner.Runner`) maps both onto one interface."""

    model_id: str

    def generate(self, images: Sequence[np.ndarray | None], prompts: Sequence[str], *, max_new_tokens: int = 32,
                 batch_size: int = 8) -> list[str]:
        """One answer per (image, prompt), in input order, prompt echo stripped."""
        ...

    def score(self, images: Sequence[np.ndarray | None], prompts: Sequence[str], options: Sequence[str], *,
              batch_size: int = 8) -> list[dict[str, float]]:
        """Natural-log probability of each option's first token as the next token after the
        generation prompt (over the whole vocabulary, so values are <= 0), one dict per input."""
        ...
