"""Run a processor's image processor once when one processor call repeats one image.

:meth:`~medrobust_lib.models.hf_vlm.HFVisionLanguageModel.score_variants` asks many prompts about
ONE image (the paraphrases of a question). The transformers processor still resizes, rescales and
normalises every copy of that image, although only the text differs: on the demo that was most of
the taxonomy track's preprocessing. :func:`shared_image` wraps the processor's ``image_processor``
for the duration of such a call: when the images of a call are all the same array object (a flat
list ``[im, im, ...]`` or one image per prompt ``[[im], [im], ...]``), the image processor runs on
one copy and every per-image output is repeated (a leading dimension of 1 becomes ``n``, a
one-element list becomes ``n`` elements). The processor's own text handling (image-token expansion,
chat layout, ``token_type_ids``) is untouched, so the call returns what the processor returns for
the copies; an output whose layout is not per image (Qwen2-VL's flattened patches) makes the
wrapper run the original call on every copy instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np


class _SharedImageProcessor:
    """Forwards everything to ``inner``; a call whose images are one repeated object is processed once."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.n_shared = 0  # calls answered from one processed copy (tests check the fast path ran)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def __call__(self, images: Any, *args: Any, **kwargs: Any) -> Any:
        one, n = _one_copy(images)
        if one is None or n < 2:
            return self._inner(images, *args, **kwargs)
        out = self._inner(one, *args, **kwargs)
        tiled = {key: _repeat(value, n) for key, value in out.items()}
        if any(v is None for v in tiled.values()):  # not per image: process every copy as the processor would
            return self._inner(images, *args, **kwargs)
        out.update(tiled)
        self.n_shared += 1
        return out


def _one_copy(images: Any) -> tuple[Any, int]:
    """``([im], n)`` for ``[im] * n``, ``([[im]], n)`` for ``[[im]] * n`` (the same object each
    time); ``(None, 0)`` for anything else."""
    if not isinstance(images, list | tuple) or not images:
        return None, 0
    first = images[0]
    if isinstance(first, list | tuple):
        if len(first) != 1 or not all(isinstance(x, list | tuple) and len(x) == 1 and x[0] is first[0]
                                      for x in images):
            return None, 0
        return [[first[0]]], len(images)
    if not all(x is first for x in images):
        return None, 0
    return [first], len(images)


def _repeat(value: Any, n: int) -> Any:
    """``value`` (the output for one image) repeated for ``n`` images; None when its layout is not
    one entry per image."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.repeat(n, *([1] * (value.dim() - 1))) if value.dim() >= 1 and value.shape[0] == 1 else None
    if isinstance(value, np.ndarray):
        return np.repeat(value, n, axis=0) if value.ndim >= 1 and value.shape[0] == 1 else None
    if isinstance(value, list):
        return value * n if len(value) == 1 else None
    return None


@contextmanager
def shared_image(processor: Any) -> Iterator[Any]:
    """Within the block, ``processor``'s image processor processes a repeated image once (see the
    module docstring). Yields the wrapper (its ``n_shared`` counts the calls it shortened); a
    processor without an ``image_processor`` is left as it is (yields None)."""
    inner = getattr(processor, "image_processor", None)
    if inner is None:
        yield None
        return
    wrapper = _SharedImageProcessor(inner)
    processor.image_processor = wrapper
    try:
        yield wrapper
    finally:
        processor.image_processor = inner
