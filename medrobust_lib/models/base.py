"""Model protocols.

Segmentation convention: images enter as float32 in [0, 1], (H, W) or (H, W, 3) numpy arrays, or
as torch tensors (B, 3, H, W) in [0, 1] on the differentiable path (grayscale is replicated to
three channels). Boxes are pixel XYXY (end exclusive) in the coordinates of the input image.
Outputs are foreground probabilities in [0, 1] at the input resolution; a pixel is foreground
when its probability is > 0.5.

Which model class serves a configured segmentation family or VLM kind is in
:mod:`medrobust_lib.models.factory`; every model class satisfies one of these protocols (checked
statically by mypy beside each model class, and at run time on tiny real models by the tests).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

from medrobust_lib.types import Boxes, FloatImage

if TYPE_CHECKING:  # annotations only: an API-only evaluation never imports torch
    import torch


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
    (:class:`medrobust_lib.models.hf_vlm.HFVisionLanguageModel`); the API model class is a
    :class:`VisionLanguageEndpoint` (per-request results: outcome, latency, cache hit) and the
    evaluation's runner (:class:`medrobust_lib.tracks.vlm.model.Runner`) maps both onto one
    interface."""

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


class GenerateFromCapped(ABC):
    """``generate`` for a local model that implements ``generate_capped`` (answers with, per answer,
    whether it hit the token cap): the answers alone."""

    @abstractmethod
    def generate_capped(self, images: Sequence[np.ndarray | None], prompts: Sequence[str], *,
                        max_new_tokens: int = 32, batch_size: int = 8) -> list[tuple[str, bool]]:
        """Greedy answers, each with whether it hit ``max_new_tokens`` without ending."""

    def generate(self, images: Sequence[np.ndarray | None], prompts: Sequence[str], *, max_new_tokens: int = 32,
                 batch_size: int = 8) -> list[str]:
        """Greedy answers, one per (image, prompt)."""
        return [text for text, _ in self.generate_capped(images, prompts, max_new_tokens=max_new_tokens,
                                                         batch_size=batch_size)]


@runtime_checkable
class EndpointResult(Protocol):
    """One request's result from a :class:`VisionLanguageEndpoint`: the answer ``text`` (None
    when there is none), its ``outcome`` (``ok``, ``refused`` or an infrastructure failure such as
    ``timeout``), wall ``latency_s``, whether it came from the response cache, a short ``error``
    and the first token's top ``logprobs`` when the endpoint returned them."""

    @property
    def text(self) -> str | None: ...

    @property
    def outcome(self) -> str: ...

    @property
    def latency_s(self) -> float: ...

    @property
    def cache_hit(self) -> bool: ...

    @property
    def error(self) -> str | None: ...

    @property
    def logprobs(self) -> dict[str, float] | None: ...


@runtime_checkable
class VisionLanguageEndpoint(Protocol):
    """A vision-language model behind a remote endpoint
    (:class:`medrobust_lib.models.api_vlm.ApiVLM`). It cannot promise
    :meth:`VisionLanguageModel.score` (an endpoint may return no log-probabilities, and every
    request has an outcome of its own), so it answers with one :class:`EndpointResult` per input
    instead of raising; the evaluation's runner maps both kinds onto one interface. Same image and
    prompt conventions as :class:`VisionLanguageModel`."""

    model_id: str

    def generate(self, images: Sequence[np.ndarray | None], prompts: Sequence[str]) -> Sequence[EndpointResult]:
        """One result per (image, prompt), in input order; a failed request is a result, never an
        exception."""
        ...

    def score_results(self, images: Sequence[np.ndarray | None], prompts: Sequence[str]
                      ) -> Sequence[EndpointResult]:
        """One result per input for a one-token answer with the first token's top log-probabilities
        (``logprobs`` None where the endpoint returned none)."""
        ...

    def close(self) -> None:
        """Release connections and caches."""
        ...
