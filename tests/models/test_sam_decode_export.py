"""The decoder module that is exported (:mod:`medrobust_lib.models.sam_decode_export`) computes what
:meth:`SamSegmenter.decode_low` computes: on the LiteMedSAM release and on the tiny SAM (another width),
for both mask selections, with M embeddings of different images paired with M boxes and with one
image's embedding shared by all its boxes (what the exported graph takes); its attentions with the
per-prompt projections moved onto the prompt tokens equal segment-anything's; a decoder that is not
segment-anything's is refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from medrobust_lib.models.litemedsam import load_litemedsam
from medrobust_lib.models.sam import SamSegmenter, arch_for, build_sam
from medrobust_lib.models.sam_decode_export import DecodeLowForExport, image_to_tokens, tokens_to_image

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
def test_one_embedding_shared_by_all_boxes_decodes_as_decode_low(selection: str) -> None:
    """What the exported graph takes: one image's embedding (1, C, e, e) for all its boxes, the first
    block's image-side terms computed once and broadcast; the same logits as the embedding repeated."""
    seg = load_litemedsam(runtime="pytorch")
    seg.mask_selection = selection
    emb = _embeddings(seg, 1)
    with torch.no_grad():
        ref = seg.decode_low(emb.expand(len(BOXES), -1, -1, -1), BOXES).numpy()
        got = DecodeLowForExport(seg)(emb, BOXES).numpy()
        one = DecodeLowForExport(seg)(emb, BOXES[2:3]).numpy()
    assert got.shape == ref.shape == (4, 1, 256, 256)
    np.testing.assert_allclose(got, ref, atol=1e-4, rtol=1e-5)
    assert np.array_equal(got > 0, ref > 0)
    np.testing.assert_allclose(one[0], got[2], atol=1e-4, rtol=1e-5)  # a box's logits do not depend on the others


def test_decode_images_is_decode_low_of_each_boxs_image() -> None:
    """:meth:`SamSegmenter.decode_images` (E embeddings, each box's image index) equals
    ``decode_low`` with the embeddings repeated per box, in the boxes' order."""
    seg = SamSegmenter(build_sam(arch_for("tiny", "sam"), seed=1), "sam", "tiny", "0")
    emb = _embeddings(seg, 3)
    owner = torch.tensor([2, 0, 0, 2])
    with torch.no_grad():
        got = seg.decode_images(emb, owner, BOXES).numpy()
        ref = torch.cat([seg.decode_low(emb[k : k + 1], BOXES[i : i + 1]) for i, k in enumerate(owner.tolist())]).numpy()
    np.testing.assert_allclose(got, ref, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("selection", ["single", "best_iou"])
@pytest.mark.parametrize("on_tokens", [True, False])
def test_the_tiny_sam_decodes_as_decode_low(selection: str, on_tokens: bool) -> None:
    """A 64-wide decoder (upscaling 64 -> 16 -> 8 channels) with random weights, in both layouts
    (``projections_on_tokens`` False: segment-anything's attention modules, the bench's reference),
    with paired embeddings and with one shared by the boxes."""
    seg = SamSegmenter(build_sam(arch_for("tiny", "sam"), seed=1), "sam", "tiny", "0", mask_selection=selection)
    emb = _embeddings(seg, 3)
    with torch.no_grad():
        ref = seg.decode_low(emb, BOXES[:3]).numpy()
        got = DecodeLowForExport(seg, projections_on_tokens=on_tokens)(emb, BOXES[:3]).numpy()
        ref1 = seg.decode_low(emb[:1].expand(3, -1, -1, -1), BOXES[:3]).numpy()
        got1 = DecodeLowForExport(seg, projections_on_tokens=on_tokens)(emb[:1], BOXES[:3]).numpy()
    np.testing.assert_allclose(got, ref, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(got1, ref1, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("image_batch", [3, 1])
def test_the_attentions_with_projections_on_the_tokens_are_segment_anythings(image_batch: int) -> None:
    """:func:`tokens_to_image` and :func:`image_to_tokens` compute segment-anything's ``Attention``
    (the release's own layers, random inputs at its sizes: 3 prompts of 7 tokens, 4,096 image tokens
    of 256 channels): image tokens per prompt, or one image's tokens for all prompts (``shared``)."""
    seg = load_litemedsam(runtime="pytorch")
    layer = seg.sam.mask_decoder.transformer.layers[1]
    g = torch.Generator().manual_seed(5)
    tokens = torch.randn(3, 7, 256, generator=g)
    image = torch.randn(image_batch, 4096, 256, generator=g)
    key_pe = torch.randn(1, 4096, 256, generator=g)
    with torch.no_grad():
        t2i = layer.cross_attn_token_to_image
        ref = t2i(q=tokens, k=image + key_pe, v=image)
        got = tokens_to_image(t2i, tokens, image + key_pe, image)
        np.testing.assert_allclose(got.numpy(), ref.numpy(), atol=2e-5, rtol=1e-5)
        i2t = layer.cross_attn_image_to_token
        ref = i2t(q=image + key_pe, k=tokens, v=tokens)
        assert ref.shape == (3, 4096, 256)
        for shared in ([False, True] if image_batch == 1 else [False]):
            got = image_to_tokens(i2t, image + key_pe, tokens, tokens, shared)
            np.testing.assert_allclose(got.numpy(), ref.numpy(), atol=2e-5, rtol=1e-5)


def test_a_decoder_that_is_not_segment_anythings_is_refused() -> None:
    seg = SamSegmenter(build_sam(arch_for("tiny", "sam"), seed=1), "sam", "tiny", "0")
    ups = seg.sam.mask_decoder.output_upscaling
    ups[2] = torch.nn.GELU(approximate="tanh")
    with pytest.raises(ValueError, match="exact"):
        DecodeLowForExport(seg)
    ups[2] = torch.nn.ReLU()
    with pytest.raises(ValueError, match="not segment-anything's mask upscaling"):
        DecodeLowForExport(seg)
