"""The SAM mask decoder's arithmetic in the layout an exported graph runs fastest: the module that
:mod:`medrobust_lib.models.onnx_engine` exports for :meth:`SamSegmenter.decode_low`.

It computes what ``decode_low`` computes with segment-anything's own weights and modules (prompt
encoder, attention layers, MLPs and norms of the two-way transformer, hypernetwork MLPs, IoU head);
the two-way blocks' forward is written out (:func:`_two_way_block`, segment-anything's
``TwoWayAttentionBlock.forward`` step for step) so that the layout and the order of the products can
differ, which changes nothing but fp32 rounding (about 3e-5 at logits of 40, the same as the
exporter's own graph of ``decode_low``; masks identical on the official fixtures):

* the positional encoding is a constant in token layout (1, e*e, C), added by broadcasting, and the
  no-mask dense embedding is a (1, C, 1, 1) broadcast: no per-prompt copies of either;
* the output upscaling (two stride-2 2 x 2 transposed convolutions, LayerNorm2d, GELU) runs on the
  transformer's tokens as they come, channels last: each transposed convolution is one matrix
  product whose columns are (sub-row, sub-column, channel), the LayerNorm a normalisation over the
  last axis; the mask is put back in image order once, on its single channel, instead of moving the
  32-channel 256 x 256 features.

* five per-prompt projections of the e*e image tokens are applied to the few prompt tokens
  instead, by associativity (:func:`tokens_to_image`, :func:`image_to_tokens`): every
  image-to-token output projection (128 -> 256, applied to the tokens' values before the attention
  weights, its bias split over the heads, whose weights each sum to 1), and where the image tokens
  are per prompt (after the first block's update) the token-to-image key projections (256 -> 128;
  a score ``q_h . (W_k x + b_k)_h`` is ``(W_k_h^T q_h) . x + q_h . b_k_h``) and the image-to-token
  query projection (an image-to-token score ``(W_q x + b_q)_h . k_h`` is ``x . (W_q_h^T k_h) +
  b_q_h . k_h``). Each (e*e x 256) x (256 x 128) product becomes an (e*e x 256) x (256 x H*T) one:
  for LiteMedSAM (4,096 image tokens, T = 7 prompt tokens, H = 8 heads) 0.27 -> 0.12 GFLOP, so a
  prompt's decoder goes from about 2.7 to 1.9 GFLOP (the first block's shared projections, 0.8
  GFLOP a call, not counted); the output upscaling (0.8 GFLOP) is unchanged. The token-to-image
  value projections stay on the image tokens (see :func:`tokens_to_image`).

Measured on 2 cores (ONNX Runtime, 4 prompts per call, LiteMedSAM, both graphs interleaved in one
process): 20.9 -> 17.8 ms per prompt (docs/performance.md, sixth session); one embedding shared by
the 4 prompts of a call: 18 -> 15 ms, and on the 125-box image 25 % less end to end with AVX2
kernels (seventh session); the projections on the tokens (``python -m bench.decoder_layout_bench``):
21.9 -> 17.8 ms with AVX2 kernels, 15.3 -> 12.9 ms with this machine's own (ninth session).
"""

from __future__ import annotations

import math
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
    the image tokens become per prompt at the end of that block. After it, and for that block's
    image-to-token output, the per-prompt projections act on the prompt tokens (module docstring).

    ``projections_on_tokens`` False runs segment-anything's own attention modules after that block
    too (the eighth session's graph): what ``bench/decoder_layout_bench.py`` measures the default
    against."""

    def __init__(self, seg: SamSegmenter, projections_on_tokens: bool = True) -> None:
        super().__init__()
        self.sam = seg.sam  # registered, so the exporter sees the parameters
        self.mask_selection = seg.mask_selection
        self.projections_on_tokens = projections_on_tokens
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
        for i, layer in enumerate(tr.layers):  # TwoWayTransformer.forward, broadcast positional encoding
            if self.projections_on_tokens:
                # one image's tokens serve every prompt only in the first block (decided by structure,
                # not by the keys' batch: a graph traced with one prompt must still be right for many)
                shared = i == 0 and embeddings.shape[0] == 1
                queries, keys = _two_way_block(layer, queries, keys, tokens, key_pe, shared=shared)
            else:
                queries, keys = layer(queries=queries, keys=keys, query_pe=tokens, key_pe=key_pe)
        final = tr.final_attn_token_to_image
        if self.projections_on_tokens:
            attn = tokens_to_image(final, queries + tokens, keys + key_pe, keys)
        else:
            attn = final(q=queries + tokens, k=keys + key_pe, v=keys)
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


def _two_way_block(layer: Any, queries: torch.Tensor, keys: torch.Tensor, query_pe: torch.Tensor,
                   key_pe: torch.Tensor, shared: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """segment-anything's ``TwoWayAttentionBlock.forward``: prompt tokens ``queries`` (M, T, C) and
    image tokens ``keys`` (M, N, C), or (1, N, C) one image's tokens for all M prompts when
    ``shared``, whose image-side projections are then computed once (segment-anything's own
    broadcasting); otherwise they move onto the tokens (:func:`tokens_to_image`,
    :func:`image_to_tokens`). Returns the new queries (M, T, C) and keys (M, N, C)."""
    if layer.skip_first_layer_pe:
        queries = layer.self_attn(q=queries, k=queries, v=queries)
    else:
        q = queries + query_pe
        queries = queries + layer.self_attn(q=q, k=q, v=queries)
    queries = layer.norm1(queries)
    k = keys + key_pe  # the same sum for both cross attentions: the keys change only after them
    q = queries + query_pe
    if shared:
        attn_out = layer.cross_attn_token_to_image(q=q, k=k, v=keys)
    else:
        attn_out = tokens_to_image(layer.cross_attn_token_to_image, q, k, keys)
    queries = layer.norm2(queries + attn_out)
    queries = layer.norm3(queries + layer.mlp(queries))
    q = queries + query_pe
    attn_out = image_to_tokens(layer.cross_attn_image_to_token, k, q, queries, shared)
    return queries, layer.norm4(keys + attn_out)


def _heads(attn: Any) -> tuple[int, int]:
    """(heads, channels per head) of a segment-anything ``Attention``."""
    return attn.num_heads, attn.internal_dim // attn.num_heads


def tokens_to_image(attn: Any, q_in: torch.Tensor, k_in: torch.Tensor, v_in: torch.Tensor) -> torch.Tensor:
    """segment-anything's ``Attention(q=q_in, k=k_in, v=v_in)`` with few queries (prompt tokens,
    (M, T, C)) over many keys (image tokens, (M, N, C) or (1, N, C)), the key projection applied on
    the query side: per head h, scores ``(q_h W_k_h) x^T + q_h . b_k_h`` over sqrt(channels per
    head), softmax over the N keys, then the values' own projection and the output projection.
    (M, T, C) float32.

    The values keep their projection: moving it onto the attention-weighted image tokens
    (``(p_h x) W_v_h^T``) is as many FLOP fewer again, but on the official fixture it moved the
    exported graph's logits further from the official script's (xray_0009: 0.80 -> 1.03 of the
    tolerance, ninth session)."""
    m, t, c = q_in.shape
    h, d = _heads(attn)
    q = attn.q_proj(q_in).reshape(m, t, h, d).transpose(1, 2)  # (M, H, T, d)
    qk = torch.einsum("mhtd,hdc->mhtc", q, attn.k_proj.weight.reshape(h, d, c)).reshape(m, h * t, c)
    qb = torch.einsum("mhtd,hd->mht", q, attn.k_proj.bias.reshape(h, d)).reshape(m, h * t, 1)
    p = torch.softmax((qk @ k_in.transpose(1, 2) + qb) / math.sqrt(d), dim=-1)  # (M, H*T, N)
    v = attn.v_proj(v_in).reshape(v_in.shape[0], -1, h, d).transpose(1, 2)  # (M or 1, H, N, d)
    out = p.reshape(m, h, t, -1) @ v  # (M, H, T, d)
    return attn.out_proj(out.transpose(1, 2).reshape(m, t, h * d))


def image_to_tokens(attn: Any, q_in: torch.Tensor, k_in: torch.Tensor, v_in: torch.Tensor, shared: bool) -> torch.Tensor:
    """segment-anything's ``Attention(q=q_in, k=k_in, v=v_in)`` with many queries (image tokens,
    (M, N, C), or (1, N, C) for all M prompts when ``shared``) over few keys (prompt tokens,
    (M, T, C)): the output projection is applied to each head's values, ``v_h W_o_h^T`` plus the
    output bias over the H heads (each head's weights sum to 1), before the attention weights;
    unless ``shared``, the query projection moves onto the keys too (scores ``x (W_q_h^T k_h^T) +
    b_q_h . k_h``). (M, N, C) float32."""
    m, t, c = k_in.shape
    n = q_in.shape[1]
    h, d = _heads(attn)
    k = attn.k_proj(k_in).reshape(m, t, h, d).transpose(1, 2)  # (M, H, T, d)
    v = attn.v_proj(v_in).reshape(m, t, h, d).transpose(1, 2)
    if shared:  # one projection of the image tokens for all prompts, as segment-anything broadcasts it
        q = attn.q_proj(q_in).reshape(1, n, h, d).transpose(1, 2)  # (1, H, N, d)
        p = torch.softmax((q @ k.transpose(2, 3)) / math.sqrt(d), dim=-1).transpose(1, 2)  # (M, N, H, T)
    else:
        g = torch.einsum("hdc,mhtd->mcht", attn.q_proj.weight.reshape(h, d, c), k).reshape(m, c, h * t)
        qb = torch.einsum("hd,mhtd->mht", attn.q_proj.bias.reshape(h, d), k).reshape(m, 1, h * t)
        p = torch.softmax(((q_in @ g + qb) / math.sqrt(d)).reshape(m, n, h, t), dim=-1)
    vw = torch.einsum("mhtd,chd->mhtc", v, attn.out_proj.weight.reshape(c, h, d)) + attn.out_proj.bias / h
    return p.reshape(m, n, h * t) @ vw.reshape(m, h * t, c)
