"""The decoder module that is exported (:mod:`medrobust_lib.models.sam_decode_export`) computes what
:meth:`SamSegmenter.decode_low` computes: on the LiteMedSAM release and on the tiny SAM (another width),
for both mask selections, with M embeddings of different images paired with M boxes; a decoder that
is not segment-anything's is refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from medrobust_lib.models.litemedsam import load_litemedsam
from medrobust_lib.models.sam import SamSegmenter, arch_for, build_sam
from medrobust_lib.models.sam_decode_export import DecodeLowForExport

BOXES = torch.tensor([[40.0, 52.0, 200.0, 180.0], [0.0, 0.0, 255.0, 255.0], [97.0, 12.0, 130.0, 33.0],
                      [3.0, 150.0, 12.0, 161.0]])


def _embeddings(seg: SamSegmenter, n: int) -> torch.Tensor:
    """Encoder outputs of ``n`` different random images (M, C, e, e)."""
    x = torch.rand(n, 3, seg.image_size, seg.image_size, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        return seg.sam.image_encoder(x)


def _both(seg: SamSegmenter, emb: torch.Tensor, boxes: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    with torch.no_grad():
        return seg.decode_low(emb, boxes).numpy(), DecodeLowForExport(seg)(emb, boxes).numpy()


@pytest.mark.parametrize("selection", ["single", "best_iou"])
def test_the_release_decodes_as_decode_low(selection: str) -> None:
    seg = load_litemedsam(runtime="pytorch")
    seg.mask_selection = selection
    emb = _embeddings(seg, 2)[torch.tensor([0, 1, 1, 0])]  # two images, two boxes each, interleaved
    ref, got = _both(seg, emb, BOXES)
    assert got.shape == ref.shape == (4, 1, 256, 256)
    # real logits, not a degenerate output (the release trained only the single-mask token)
    assert np.abs(ref).max() > (5 if selection == "single" else 0.1)
    np.testing.assert_allclose(got, ref, atol=1e-4, rtol=1e-5)
    assert np.array_equal(got > 0, ref > 0)


@pytest.mark.parametrize("selection", ["single", "best_iou"])
def test_the_tiny_sam_decodes_as_decode_low(selection: str) -> None:
    """A 64-wide decoder (upscaling 64 -> 16 -> 8 channels) with random weights."""
    seg = SamSegmenter(build_sam(arch_for("tiny", "sam"), seed=1), "sam", "tiny", "0", mask_selection=selection)
    emb = _embeddings(seg, 3)
    ref, got = _both(seg, emb, BOXES[:3])
    np.testing.assert_allclose(got, ref, atol=1e-5, rtol=1e-5)


def test_a_decoder_that_is_not_segment_anythings_is_refused() -> None:
    seg = SamSegmenter(build_sam(arch_for("tiny", "sam"), seed=1), "sam", "tiny", "0")
    ups = seg.sam.mask_decoder.output_upscaling
    ups[2] = torch.nn.GELU(approximate="tanh")
    with pytest.raises(ValueError, match="exact"):
        DecodeLowForExport(seg)
    ups[2] = torch.nn.ReLU()
    with pytest.raises(ValueError, match="not segment-anything's mask upscaling"):
        DecodeLowForExport(seg)
