"""The SAM mask decoder's arithmetic in the layout an exported graph runs fastest: the module that
:mod:`medrobust_lib.models.onnx_engine` exports for :meth:`SamSegmenter.decode_low`.

It computes what ``decode_low`` computes, term for term, with segment-anything's own weights and
modules (prompt encoder, two-way transformer blocks, hypernetwork MLPs, IoU head); only the layout
differs, which changes nothing but the order of the fp32 sums (about 3e-5 at logits of 40, the
same as the exporter's own graph of ``decode_low``; masks identical on the official fixtures):

* the positional encoding is a constant in token layout (1, e*e, C), added by broadcasting, and the
  no-mask dense embedding is a (1, C, 1, 1) broadcast: no per-prompt copies of either;
* the output upscaling (two stride-2 2 x 2 transposed convolutions, LayerNorm2d, GELU) runs on the
  transformer's tokens as they come, channels last: each transposed convolution is one matrix
  product whose columns are (sub-row, sub-column, channel), the LayerNorm a normalisation over the
  last axis; the mask is put back in image order once, on its single channel, instead of moving the
  32-channel 256 x 256 features.

Measured on 2 cores (ONNX Runtime, 4 prompts per call, LiteMedSAM, both graphs interleaved in one
process): 20.9 -> 17.8 ms per prompt (docs/performance.md, sixth session); one embedding shared by
the 4 prompts of a call: 18 -> 15 ms, and on the 125-box image 25 % less end to end with AVX2
kernels (seventh session).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812

from medrobust_lib.models.sam import SamSegmenter


class DecodeLowForExport(torch.nn.Module):
    """:meth:`SamSegmenter.decode_low` of ``seg`` (fp32, no autocast) for export: embeddings
    float32 (M, C, e, e) paired with M boxes float32 (M, 4) XYXY in model-grid pixels, or one
    embedding (1, C, e, e) shared by all M boxes -> logits float32 (M, 1, 4e, 4e) of the selected
    mask (``seg.mask_selection``: ``single`` or ``best_iou``). The decoder's upscaling must be
    segment-anything's (ConvTranspose2d k=2 s=2, LayerNorm2d, GELU, ConvTranspose2d k=2 s=2, GELU);
    anything else raises ValueError here.

    One shared embedding is what the exported graph takes (:data:`~medrobust_lib.models.litemedsam.DECODER_GRAPH`):
    the image-side terms of the first two-way block (the token-to-image keys and values and the
    image-to-token queries, three 256 -> 128 projections of all e*e image tokens) are computed once
    and broadcast over the prompts, as segment-anything's own modules do when handed a batch of one;
    the image tokens become per prompt at the end of that block."""

    def __init__(self, seg: SamSegmenter) -> None:
        super().__init__()
        self.sam = seg.sam  # registered, so the exporter sees the parameters
        self.mask_selection = seg.mask_selection
        ups = list(self.sam.mask_decoder.output_upscaling)
        kinds = [type(m).__name__ for m in ups]
        if kinds != ["ConvTranspose2d", "LayerNorm2d", "GELU", "ConvTranspose2d", "GELU"] or any(
                m.kernel_size != (2, 2) or m.stride != (2, 2) for m in (ups[0], ups[3])):
            raise ValueError(f"not segment-anything's mask upscaling: {kinds}")
        if any(getattr(m, "approximate", "none") != "none" for m in (ups[2], ups[4])):
            raise ValueError("the upscaling's GELU is not the exact (erf) one")

    def forward(self, embeddings: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
        sam: Any = self.sam
        pe, md = sam.prompt_encoder, sam.mask_decoder
        _, c, eh, ew = embeddings.shape
        b = boxes.shape[0]
        sparse = pe._embed_boxes(boxes)  # what prompt_encoder(boxes=...) embeds, without the dense expand
        out_tokens = torch.cat([md.iou_token.weight, md.mask_tokens.weight], dim=0)
        tokens = torch.cat([out_tokens.unsqueeze(0).expand(b, -1, -1), sparse], dim=1)
        src = embeddings + pe.no_mask_embed.weight.reshape(1, -1, 1, 1)
        keys = src.flatten(2).permute(0, 2, 1)  # (M or 1, e*e, C): (M, e*e, C) after the first block
        key_pe = pe.get_dense_pe().flatten(2).permute(0, 2, 1)  # (1, e*e, C): a constant of the graph
        tr = md.transformer
        queries = tokens
        for layer in tr.layers:  # TwoWayTransformer.forward, with the broadcast positional encoding
            queries, keys = layer(queries=queries, keys=keys, query_pe=tokens, key_pe=key_pe)
        attn = tr.final_attn_token_to_image(q=queries + tokens, k=keys + key_pe, v=keys)
        hs = tr.norm_final_attn(queries + attn)
        up = self._upscale(keys)  # (M, e*e*16, C/8), rows (y, x, i1, j1, i2, j2)
        if self.mask_selection == "single":
            hyper = md.output_hypernetworks_mlps[0](hs[:, 1, :]).unsqueeze(-1)  # (M, C/8, 1)
            masks = up @ hyper
        else:  # best_iou: the three multimask outputs (tokens 1..3), highest predicted IoU wins
            hyper = torch.stack([md.output_hypernetworks_mlps[i](hs[:, 1 + i, :]) for i in range(1, md.num_mask_tokens)],
                                dim=-1)  # (M, C/8, 3)
            best = md.iou_prediction_head(hs[:, 0, :])[:, 1:].argmax(dim=1)
            masks = torch.gather(up @ hyper, 2, best.view(b, 1, 1).expand(-1, up.shape[1], 1))
        # (y, x, i1, j1, i2, j2) -> pixel (4y + 2 i1 + i2, 4x + 2 j1 + j2)
        masks = masks.reshape(b, eh, ew, 2, 2, 2, 2).permute(0, 1, 3, 5, 2, 4, 6)
        return masks.reshape(b, 1, 4 * eh, 4 * ew)

    def _upscale(self, tokens: torch.Tensor) -> torch.Tensor:
        """segment-anything's ``output_upscaling`` on (M, e*e, C) tokens, channels last: (M, e*e*16, C/8)."""
        ct1, ln, _, ct2, _ = self.sam.mask_decoder.output_upscaling
        b = tokens.shape[0]
        c1, c2 = ct1.out_channels, ct2.out_channels
        # ConvTranspose2d k=2 s=2: out[co, 2y+i, 2x+j] = bias[co] + sum_ci in[ci, y, x] * W[ci, co, i, j]
        w1 = ct1.weight.permute(0, 2, 3, 1).reshape(ct1.in_channels, 4 * c1)  # columns (i, j, co)
        y = (tokens @ w1 + ct1.bias.repeat(4)).reshape(b, -1, c1)
        u = y.mean(-1, keepdim=True)  # LayerNorm2d's own formula, over the channels
        s = (y - u).pow(2).mean(-1, keepdim=True)
        y = F.gelu(ln.weight * ((y - u) / torch.sqrt(s + ln.eps)) + ln.bias)
        w2 = ct2.weight.permute(0, 2, 3, 1).reshape(c1, 4 * c2)
        return F.gelu(y @ w2 + ct2.bias.repeat(4)).reshape(b, -1, c2)
