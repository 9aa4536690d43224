"""SAM-Med2D's image-encoder adapters, reimplemented on top of ``segment_anything``.

Reference: OpenGVLab/SAM-Med2D, ``segment_anything/modeling/image_encoder.py`` (classes
``Adapter_Layer`` and ``Block``) and ``segment_anything/build_sam.py``. The module and parameter
names below are the published ones, so the released state dict loads strictly.

Structure (every block of the ViT image encoder, global and windowed alike)::

    block.Adapter                      Adapter_Layer(dim, mlp_ratio=0.25)
        .channel  = Sequential(Linear(dim, dim*r, bias=False), ReLU,
                               Linear(dim*r, dim, bias=False), Sigmoid)
        .spatial  = Sequential(Conv2d(dim, dim, 3, stride=2, padding=1, bias=False), ReLU,
                               ConvTranspose2d(dim, dim, 4, stride=2, padding=1, bias=False), ReLU)
        .norm     = LayerNorm(dim)     # torch default eps 1e-5, not the encoder's 1e-6
        .avg_pool = AdaptiveAvgPool2d(1)   # no parameters

State-dict keys per block ``i`` (vit_b: dim 768, hidden 192)::

    image_encoder.blocks.{i}.Adapter.channel.0.weight   (dim*r, dim)
    image_encoder.blocks.{i}.Adapter.channel.2.weight   (dim, dim*r)
    image_encoder.blocks.{i}.Adapter.spatial.0.weight   (dim, dim, 3, 3)
    image_encoder.blocks.{i}.Adapter.spatial.2.weight   (dim, dim, 4, 4)
    image_encoder.blocks.{i}.Adapter.norm.weight        (dim,)
    image_encoder.blocks.{i}.Adapter.norm.bias          (dim,)

Adapter forward on tokens ``t`` (B, H, W, C)::

    z = t as (B, C, H, W)
    z_c = channel(avg_pool(z)) * z            # squeeze-excitation style channel gate
    out = norm((z + spatial(z_c)) as (B, H, W, C))

Block forward (the adapter runs in parallel with the MLP, on the same normed input, unscaled)::

    x = x + attn(norm1(x))                    # windowed as in SAM
    n = norm2(x)
    x = x + mlp(n) + Adapter(n)

Published build (``build_sam.py``, ``test.py``): ViT-B, ``image_size=256`` (16 x 16 tokens, so
``pos_embed`` is (1, 16, 16, 768)), ``window_size=14``, ``use_rel_pos=True``, global blocks 2, 5, 8,
11 (``rel_pos_h/w`` (31, 64) there, (27, 64) in windowed blocks), ``encoder_adapter=True``; prompt
encoder and mask decoder as SAM's with a 16 x 16 embedding grid. ``medrobust_lib.models.sam``'s
``arch_for("vit_b", "sam_med2d")`` builds exactly that.

Published checkpoint ``sam-med2d_b.pth``: ``torch.save({"model": state_dict, "optimizer": ...})``
as written by SAM-Med2D's ``train.py``. There the optimizer entry is the pickled
``torch.optim.Adam`` *object*, which ``torch.load(weights_only=True)`` refuses (its state is a
``collections.defaultdict``), so such a file has to be re-saved as ``{"model": state_dict}`` or
``.safetensors`` once before this project reads it.
"""

from __future__ import annotations

from typing import cast

import torch
from segment_anything.modeling.image_encoder import (
    Block,
    ImageEncoderViT,
    window_partition,
    window_unpartition,
)
from torch import nn


class AdapterLayer(nn.Module):
    """SAM-Med2D's ``Adapter_Layer``: a channel gate and a stride-2 conv / transposed-conv spatial
    branch with a skip connection, then LayerNorm.

    Input and output are encoder tokens (B, H, W, C) with even H and W (the spatial branch halves
    and restores the grid; 256 px gives 16 x 16).
    """

    def __init__(self, embed_dim: int, mlp_ratio: float = 0.25) -> None:
        super().__init__()
        hidden = int(embed_dim * mlp_ratio)
        if hidden < 1:
            raise ValueError(f"mlp_ratio {mlp_ratio} leaves no hidden units for embed_dim {embed_dim}")
        self.norm = nn.LayerNorm(embed_dim)
        self.avg_pool = nn.AdaptiveAvgPool2d(1)
        self.channel = nn.Sequential(
            nn.Linear(embed_dim, hidden, bias=False),
            nn.ReLU(),
            nn.Linear(hidden, embed_dim, bias=False),
            nn.Sigmoid(),
        )
        self.spatial = nn.Sequential(
            nn.Conv2d(embed_dim, embed_dim, kernel_size=3, stride=2, padding=1, bias=False),
            nn.ReLU(),
            nn.ConvTranspose2d(embed_dim, embed_dim, kernel_size=4, stride=2, padding=1, bias=False),
            nn.ReLU(),
        )

    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """SAM-Med2D's initialisation: Kaiming normal (fan_out, ReLU) on every linear/conv weight;
        LayerNorm at identity."""
        for m in self.modules():
            if isinstance(m, nn.Linear | nn.Conv2d | nn.ConvTranspose2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu", generator=generator)
        self.norm.reset_parameters()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = x.permute(0, 3, 1, 2)
        b, c = z.shape[:2]
        gate = self.channel(self.avg_pool(z).view(b, c)).view(b, c, 1, 1)
        z = z + self.spatial(gate * z)
        return self.norm(z.permute(0, 2, 3, 1))


class SamMed2dBlock(Block):
    """A ``segment_anything`` encoder ``Block`` with SAM-Med2D's parallel adapter.

    Instances are made by :func:`insert_adapters`, which re-classes existing blocks: the adapter
    reads ``norm2`` of the post-attention residual, an intermediate inside ``Block.forward``, so
    the original forward cannot be wrapped from outside; the attention half is re-run here with the
    block's own modules and segment-anything's windowing helpers (``tests/models`` checks it
    against ``Block.forward``).
    """

    Adapter: AdapterLayer

    def _attention_residual(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x
        x = self.norm1(x)
        if self.window_size > 0:
            h, w = x.shape[1], x.shape[2]
            x, pad_hw = window_partition(x, self.window_size)
        x = self.attn(x)
        if self.window_size > 0:
            x = window_unpartition(x, self.window_size, pad_hw, (h, w))
        return shortcut + x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Tokens (B, H, W, C) -> (B, H, W, C): ``x + mlp(n) + Adapter(n)``, ``n = norm2(x)``
        after the attention residual (summed in the published order)."""
        x = self._attention_residual(x)
        n = self.norm2(x)
        return x + self.mlp(n) + self.Adapter(n)


def insert_adapters(encoder: ImageEncoderViT, mlp_ratio: float = 0.25, *,
                    generator: torch.Generator | None = None) -> None:
    """Add SAM-Med2D's adapter to every block of ``encoder``, in place.

    Each block gains the submodule ``Adapter`` (state-dict prefix ``blocks.{i}.Adapter.``) and
    computes SAM-Med2D's block forward. Adapter weights are Kaiming-initialised from
    ``generator`` (or from the global RNG when None: ``build_sam`` calls this inside a
    ``fork_rng`` seeded by its ``seed``). The adapters take the dtype and device of the block.

    Raises:
        TypeError: ``encoder`` has no ``blocks`` of segment-anything ``Block``.
        ValueError: the encoder already has adapters.
    """
    blocks = getattr(encoder, "blocks", None)
    if not isinstance(blocks, nn.ModuleList) or not all(isinstance(b, Block) for b in blocks):
        raise TypeError(f"expected a segment_anything ImageEncoderViT, got {type(encoder).__name__}")
    if any(isinstance(b, SamMed2dBlock) for b in blocks):
        raise ValueError("this image encoder already has SAM-Med2D adapters")
    for block in blocks:
        ref = cast(nn.LayerNorm, block.norm1).weight
        adapter = AdapterLayer(int(ref.shape[0]), mlp_ratio)
        adapter.reset_parameters(generator)
        block.add_module("Adapter", adapter.to(device=ref.device, dtype=ref.dtype))
        block.__class__ = SamMed2dBlock
