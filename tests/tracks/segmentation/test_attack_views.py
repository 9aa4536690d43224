"""The chunked attack gradients equal the one-pass gradient (up to float summation order): a batch of
one-box images taken one image at a time (ImageChunks), and many boxes on one image decoded a few at a
time (MultiBoxView with a box chunk)."""

from __future__ import annotations

import torch

from medrobust_lib.attacks.linf import _input_grad
from medrobust_lib.models.sam import SamSegmenter, arch_for, build_sam
from medrobust_lib.tracks.segmentation.attack_views import ImageChunks, MultiBoxView


def _model() -> SamSegmenter:
    return SamSegmenter(build_sam(arch_for("tiny", "sam"), seed=0), "sam", "tiny", "0")  # type: ignore[arg-type]


def test_image_chunks_give_the_one_pass_gradient() -> None:
    m = _model()
    g = torch.Generator().manual_seed(0)
    x = torch.rand((3, 3, 64, 64), generator=g)
    boxes = torch.tensor([[8.0, 8.0, 40.0, 40.0], [4.0, 10.0, 30.0, 60.0], [20.0, 20.0, 60.0, 50.0]])
    y = (torch.rand((3, 1, 64, 64), generator=g) > 0.5).float()
    whole = _input_grad(m, x, boxes, y)
    chunked = ImageChunks(m, 1).input_grad(x, boxes, y)
    assert chunked.shape == whole.shape and torch.allclose(chunked, whole, atol=1e-6, rtol=1e-4)


def test_multibox_chunks_give_the_one_pass_gradient() -> None:
    m = _model()
    g = torch.Generator().manual_seed(1)
    x = torch.rand((1, 3, 64, 64), generator=g)
    boxes = torch.tensor([[8.0, 8.0, 24.0, 24.0], [30.0, 4.0, 60.0, 20.0], [10.0, 36.0, 40.0, 62.0],
                          [44.0, 40.0, 62.0, 60.0]])
    y = (torch.rand((4, 1, 64, 64), generator=g) > 0.5).float()
    owner = torch.zeros(4, dtype=torch.long)
    whole = _input_grad(MultiBoxView(m, owner), x, boxes, y)
    chunked = MultiBoxView(m, owner, box_chunk=1).input_grad(x, boxes, y)
    assert torch.allclose(chunked, whole, atol=1e-6, rtol=1e-4)
