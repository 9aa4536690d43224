"""The repeated-image shortcut of :mod:`medrobust_lib.models.shared_image`, on a stand-in image
processor that records what it was asked to process (the real processors: the architecture matrix
in ``test_vlm_architectures.py``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from medrobust_lib.models.shared_image import shared_image


class _Recorder:
    """Returns one row per image (pixel tensor, per-image list) or, with ``flat``, patches without a
    per-image leading dimension (as Qwen2-VL does)."""

    def __init__(self, flat: bool = False) -> None:
        self.calls: list[int] = []
        self.flat = flat
        self.size = {"height": 4}

    def __call__(self, images: list[Any], **kwargs: Any) -> dict[str, Any]:
        flat = [x[0] if isinstance(x, list) else x for x in images]
        self.calls.append(len(flat))
        pix = torch.stack([torch.as_tensor(im, dtype=torch.float32).mean() * torch.ones(2, 3) for im in flat])
        if self.flat:
            return {"pixel_values": pix.reshape(-1, 3), "grid": torch.tensor([[1, 2]] * len(flat))}
        return {"pixel_values": pix, "num_crops": [0] * len(flat), "sizes": np.ones((len(flat), 2))}


class _Processor:
    def __init__(self, inner: _Recorder) -> None:
        self.image_processor = inner

    def __call__(self, images: list[Any]) -> dict[str, Any]:
        return self.image_processor(images)


def test_a_repeated_image_is_processed_once_and_tiled() -> None:
    rec = _Recorder()
    proc = _Processor(rec)
    im = np.full((4, 4, 3), 7, np.uint8)
    want = proc([im] * 5)
    with shared_image(proc) as w:
        got = proc([im] * 5)
        assert proc.image_processor.size == {"height": 4}  # attributes reach the real processor
        nested = proc([[im]] * 3)
    assert proc.image_processor is rec
    assert rec.calls == [5, 1, 1] and w is not None and w.n_shared == 2
    assert torch.equal(got["pixel_values"], want["pixel_values"]) and got["num_crops"] == [0] * 5
    assert np.array_equal(got["sizes"], want["sizes"])
    assert nested["pixel_values"].shape == (3, 2, 3)


def test_distinct_or_unshaped_inputs_take_the_ordinary_path() -> None:
    rec = _Recorder()
    proc = _Processor(rec)
    a, b = np.zeros((4, 4, 3), np.uint8), np.zeros((4, 4, 3), np.uint8)  # equal content, distinct objects
    with shared_image(proc) as w:
        proc([a, b])
        proc([a])
    assert rec.calls == [2, 1] and w is not None and w.n_shared == 0
    flat = _Recorder(flat=True)
    proc = _Processor(flat)
    want = proc([a] * 3)
    with shared_image(proc) as w:
        got = proc([a] * 3)
    assert flat.calls == [3, 1, 3]  # one copy tried, its patches are not per image: every copy processed
    assert w is not None and w.n_shared == 0 and torch.equal(got["pixel_values"], want["pixel_values"])


def test_a_processor_without_an_image_processor_is_left_alone() -> None:
    class _TextOnly:
        pass

    proc = _TextOnly()
    with shared_image(proc) as w:
        assert w is None
    assert not hasattr(proc, "image_processor")
