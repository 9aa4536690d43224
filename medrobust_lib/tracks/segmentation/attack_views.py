"""The views of a segmenter that FGSM / PGD attack (:mod:`medrobust_lib.attacks.linf`) in the
segmentation track: a grayscale image attacked through its one stored channel (:class:`GrayView`),
several box prompts on one image (:class:`MultiBoxView`), and an attack gradient split into chunks
that fit a memory budget (:class:`AttackChunks`, :class:`ImageChunks`, :func:`chunked_grad`). Each
view exposes ``forward_logits`` (and ``input_grad`` where it chunks), forwards every other attribute
to the model it wraps, and names the wrapped ``sam`` module so that ``attacks.linf.eval_mode`` finds it.
Shapes: images (B, C, H, W) float in [0, 1], boxes (M, 4) pixel XYXY, targets (M, 1, H, W)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

ATTACK_GRAD_BUDGET = 1536 * 2**20
"""Bytes of autograd state one attack gradient may hold: with the rest of the process (torch, the
weights, images, clean scores) an attack then stays within 4 GB resident. Compared with the
model's own estimate ``grad_bytes(h, w)`` (:meth:`medrobust_lib.models.litemedsam.LiteMedSamSegmenter.grad_bytes`;
a model without one is not chunked)."""


@dataclass(frozen=True)
class AttackChunks:
    """How an attack's gradient is split to keep its autograd graph within :data:`ATTACK_GRAD_BUDGET`:
    ``images`` per backward pass over a batch of one-box samples; ``boxes`` per decoder pass of a
    sample with many box prompts (its image encoded once, that graph kept for the whole gradient).

    The loss is a mean over prompts of per-prompt terms (:func:`medrobust_lib.models.losses.dice_bce_loss`:
    soft Dice averaged per prompt, BCE over equally sized masks), so the gradient of a batch's loss
    is the sum over chunks of ``n_chunk / n`` times each chunk's loss gradient: the same gradient of
    the same batches (same PGD random starts); only floating-point summation order and the
    kernels' batch shapes differ. A batch that fits one chunk runs the attack's single pass."""

    images: int
    boxes: int

    @classmethod
    def for_model(cls, model: Any, h: int, w: int, budget: int = ATTACK_GRAD_BUDGET) -> AttackChunks:
        """Chunks for ``model`` on H x W images; a model without ``grad_bytes`` is not chunked."""
        est = getattr(model, "grad_bytes", None)
        if est is None:
            return cls(_UNCHUNKED, _UNCHUNKED)
        per_image, per_box = est(h, w)
        return cls(max(1, budget // max(1, per_image)), max(1, (budget - per_image) // max(1, per_box)))


_UNCHUNKED = 1 << 30


def chunked_grad(loss: Callable[[Any, slice], Any], x: Any, n: int, size: int) -> Any:
    """d/dx of the mean over ``n`` prompts, as the sum over chunks ``c`` of ``size`` prompts of
    ``len(c) / n * d loss(x, c) / dx`` (``loss``: the chunk's mean loss; ``x`` a leaf, each chunk's
    graph freed before the next is built)."""
    import torch

    total = None
    for i in range(0, n, size):
        c = slice(i, min(n, i + size))
        with torch.enable_grad():
            part = loss(x, c) * ((c.stop - c.start) / n)
        (g,) = torch.autograd.grad(part, x)
        total = g if total is None else total + g
    return total


class ImageChunks:
    """A segmenter attacked on a batch of one-box images, its input gradient taken ``size`` images
    at a time (:class:`AttackChunks`)."""

    def __init__(self, model: Any, size: int) -> None:
        self._model = model
        self._size = size
        self.sam = model.sam  # visible to attacks.linf.eval_mode, which scans module attributes

    def input_grad(self, images: Any, boxes: Any, targets: Any) -> Any:
        def loss(x: Any, c: slice) -> Any:
            logits = self._model.forward_logits(x[c], boxes[c])
            return self._model.loss(logits, targets[c].to(logits.device))

        return chunked_grad(loss, images.detach().requires_grad_(True), int(images.shape[0]), self._size)

    def forward_logits(self, images: Any, boxes: Any) -> Any:
        return self._model.forward_logits(images, boxes)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


class MultiBoxView:
    """A segmenter seen with several box prompts on one image: ``forward_logits(images (1, C, H, W),
    boxes (M, 4))`` encodes the image once and decodes all M boxes -> (M, 1, H, W), so an attack
    (``prompt_owner``: the image of each box) takes every instance's loss in one gradient. With more
    than ``box_chunk`` boxes, ``input_grad`` keeps the encoder's graph once and decodes the boxes
    ``box_chunk`` at a time, accumulating the gradient at the image embedding (:class:`AttackChunks`)."""

    def __init__(self, model: Any, owner: Any, box_chunk: int = _UNCHUNKED) -> None:
        self._model = model
        self.prompt_owner = owner
        self.sam = model.sam  # visible to attacks.linf.eval_mode, which scans module attributes
        self._box_chunk = box_chunk
        if len(owner) > box_chunk:
            self.input_grad = self._input_grad

    def _inner(self) -> Any:
        return self._model._model if isinstance(self._model, GrayView) else self._model

    def forward_logits(self, images: Any, boxes: Any) -> Any:
        _, c, h, w = images.shape
        x = images.expand(-1, 3, -1, -1) if c == 1 else images
        inner = self._inner()
        emb = inner.embed(x).index_select(0, self.prompt_owner)
        return inner.decode_batch(emb, boxes, h, w)

    def _input_grad(self, images: Any, boxes: Any, targets: Any) -> Any:
        import torch

        _, c, h, w = images.shape
        inner = self._inner()
        x = images.detach().requires_grad_(True)
        with torch.enable_grad():
            emb = inner.embed(x.expand(-1, 3, -1, -1) if c == 1 else x)
        e = emb.detach().requires_grad_(True)  # the decoder chunks' graphs end here

        def loss(es: Any, ch: slice) -> Any:
            logits = inner.decode_batch(es.expand(ch.stop - ch.start, -1, -1, -1), boxes[ch], h, w)
            return inner.loss(logits, targets[ch].to(logits.device))

        g_emb = chunked_grad(loss, e, int(boxes.shape[0]), self._box_chunk)
        (g,) = torch.autograd.grad(emb, x, grad_outputs=g_emb)
        return g

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


class GrayView:
    """A segmenter seen through a one-channel input: (B, 1, H, W) is replicated to three channels
    inside the differentiable path, so attacks perturb the grayscale image itself."""

    def __init__(self, model: Any) -> None:
        self._model = model
        self.sam = model.sam  # visible to attacks.linf.eval_mode, which scans module attributes

    def forward_logits(self, images: Any, boxes: Any) -> Any:
        return self._model.forward_logits(images.expand(-1, 3, -1, -1), boxes)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)
