"""The fast SAM image-encoder engine: attention through ``scaled_dot_product_attention`` with the
decomposed relative-position bias folded into the dot product.

segment-anything's ``Attention.forward`` materialises the full score matrix ``(B*heads, N, N)``,
adds the decomposed relative-position terms with two einsums and a broadcast add, then runs softmax
outside any fused kernel. With ``N = H*W`` tokens of a ``H x W`` grid (64 x 64 in the global
blocks at 1024 px, 14 x 14 in the windows) and the query's position terms::

    rel_h[n, kh] = q[n] . Rh[row(n), kh]      (B*heads, N, H)
    rel_w[n, kw] = q[n] . Rw[col(n), kw]      (B*heads, N, W)
    score[n, m]  = scale * q[n] . k[m] + rel_h[n, row(m)] + rel_w[n, col(m)]

the bias is a row term plus a column term of the key, so it is itself a dot product::

    q'[n] = [q[n], rel_h[n] / scale, rel_w[n] / scale]            width C + H + W
    k'[m] = [k[m], onehot_H(row(m)),  onehot_W(col(m))]
    scale * q'[n] . k'[m] == score[n, m]

and ``scaled_dot_product_attention(q', k', v', scale=scale)`` with ``v'`` = ``v`` zero-padded to
the same width computes the reference attention output in its first C columns, through the fused
(flash / memory-efficient) kernels on CUDA that never materialise the scores. The padded width is
rounded up to a multiple of 8 (zeros in q', k' and v' change nothing) so the CUDA kernels accept
it. v is padded only where the kernel SDPA picks needs equal widths (:func:`pads_v`): not on the
CPU (the math kernel takes a narrower v) and not on Hopper with cuDNN attention.

The patch embedding runs as one matrix product (:class:`FastPatchEmbed`). Modules are patched
in place (:func:`use_engine` swaps the ``__class__`` of every encoder ``Attention`` and
``PatchEmbed``), so parameters, buffers and state-dict keys stay segment-anything's: checkpoints
load unchanged, fine-tuning strategies (LoRA on ``qkv``) keep working, and the reference engine is
the same object with the original class restored. ``tests/models/test_sam_fast.py`` checks fast
against reference on the same weights for SAM, MedSAM, SAM-Med2D (adapters) and the demo
architecture.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
import torch.nn.functional as F
from segment_anything.modeling.image_encoder import Attention, PatchEmbed, get_rel_pos

Engine = Literal["fast", "reference"]
ENGINES: tuple[str, ...] = ("fast", "reference")


def _round_up(n: int, k: int) -> int:
    return (n + k - 1) // k * k


class FastAttention(Attention):
    """segment-anything's encoder ``Attention`` (same parameters) computed with fused SDPA.

    Input tokens (B, H, W, C) -> (B, H, W, C), equal to ``Attention.forward`` up to floating-point
    reassociation. Made by re-classing an ``Attention`` (:func:`use_engine`), never constructed.
    Whether v is zero-padded to the folded width: ``auto_pad_v``, set per module by
    :func:`use_engine` from the device (:func:`pads_v`), unless the class-wide override ``pad_v``
    is set (``bench/gpu_seg_bench.py`` measures both).
    """

    pad_v: bool | None = None
    auto_pad_v: bool = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, h, w, _ = x.shape
        n = h * w
        # (3, B, heads, N, head_dim)
        qkv = self.qkv(x).reshape(b, n, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        hd = q.shape[-1]
        if self.use_rel_pos:
            pad = self.auto_pad_v if self.pad_v is None else self.pad_v
            q, k, v = fold_rel_pos(q, k, v, self.rel_pos_h, self.rel_pos_w, (h, w), self.scale, pad)
        out = F.scaled_dot_product_attention(q, k, v, scale=self.scale)[..., :hd]
        out = out.permute(0, 2, 1, 3).reshape(b, h, w, -1)
        return self.proj(out)


def fold_rel_pos(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rel_pos_h: torch.Tensor,
                 rel_pos_w: torch.Tensor, hw: tuple[int, int], scale: float,
                 pad_v: bool | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fold segment-anything's decomposed relative-position bias into q and k (module docstring).

    ``q``, ``k``, ``v``: (B, heads, N, C) with ``N = H * W`` tokens in row-major order; the
    relative-position tables (2H-1, C) and (2W-1, C) as in ``add_decomposed_rel_pos`` (queries and
    keys on the same grid). Returns q', k' of width ``round_up(C + H + W, 8)`` and v zero-padded to
    that width when ``pad_v`` (default: off the CPU, where the flash kernel wants equal widths), else v.
    All in q's dtype (bf16 under autocast).
    """
    h, w = hw
    bsz, heads, n, c = q.shape
    rh = get_rel_pos(h, h, rel_pos_h).to(q.dtype)  # (H, H, C): [query row, key row]
    rw = get_rel_pos(w, w, rel_pos_w).to(q.dtype)  # (W, W, C)
    r_q = q.reshape(bsz, heads, h, w, c)
    rel_h = torch.einsum("bnhwc,hkc->bnhwk", r_q, rh).reshape(bsz, heads, n, h)
    rel_w = torch.einsum("bnhwc,wkc->bnhwk", r_q, rw).reshape(bsz, heads, n, w)
    width = _round_up(c + h + w, 8)
    extra = width - c - h - w
    parts_q = [q, rel_h / scale, rel_w / scale]
    rows = torch.eye(h, dtype=q.dtype, device=q.device).repeat_interleave(w, dim=0)  # (N, H)
    cols = torch.eye(w, dtype=q.dtype, device=q.device).repeat(h, 1)  # (N, W)
    ind = torch.cat([rows, cols], dim=1).expand(bsz, heads, n, h + w)
    parts_k = [k, ind]
    if extra:
        z = q.new_zeros(bsz, heads, n, extra)
        parts_q.append(z)
        parts_k.append(z)
    q2 = torch.cat(parts_q, dim=-1)
    k2 = torch.cat(parts_k, dim=-1)
    if pad_v is None:
        pad_v = q.device.type != "cpu"
    v2 = F.pad(v, (0, width - c)) if pad_v else v
    return q2, k2, v2


class FastPatchEmbed(PatchEmbed):
    """segment-anything's ``PatchEmbed`` (same ``proj`` convolution parameters) as one matrix
    product: the non-overlapping k x k patches (stride k, no padding) are unfolded into rows of
    ``C_in * k * k`` values in the weight's (channel, row, column) order and multiplied by the
    reshaped convolution weight. Input (B, C_in, H, W) -> tokens (B, H/k, W/k, C) contiguous, equal
    to ``PatchEmbed.forward`` up to floating-point reassociation.

    Why: with 3 input channels cuDNN has no tensor-core kernel for the strided convolution (an
    H200 profile of the compiled fast encoder showed ``implicit_convolve_sgemm`` at 8.5% of the
    time for 0.5% of the FLOPs); as a GEMM it runs on the tensor cores like every other linear
    layer. A convolution with overlapping or padded windows keeps the reference forward.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        conv = self.proj
        kh, kw = conv.kernel_size
        if tuple(conv.stride) != (kh, kw) or any(conv.padding) or conv.groups != 1:  # type: ignore[arg-type]
            return super().forward(x)
        b, c, h, w = x.shape
        gh, gw = h // kh, w // kw
        patches = x[:, :, : gh * kh, : gw * kw].reshape(b, c, gh, kh, gw, kw).permute(0, 2, 4, 1, 3, 5)
        weight = conv.weight.reshape(conv.out_channels, c * kh * kw)
        return F.linear(patches.reshape(b, gh, gw, c * kh * kw), weight, conv.bias)


def encoder_attention_modules(sam: torch.nn.Module) -> list[Attention]:
    """Every ``Attention`` of the image encoder (reference or fast)."""
    encoder: Any = getattr(sam, "image_encoder", sam)
    return [m for m in encoder.modules() if isinstance(m, Attention)]


def use_engine(sam: torch.nn.Module, engine: str) -> torch.nn.Module:
    """Switch the image encoder's attention modules to ``engine`` in place (returns ``sam``).
    Parameters and state-dict keys are untouched; switching back restores the reference class."""
    if engine not in ENGINES:
        raise ValueError(f"unknown SAM engine {engine!r}; valid: {', '.join(ENGINES)}")
    cls = FastAttention if engine == "fast" else Attention
    for m in encoder_attention_modules(sam):
        m.__class__ = cls
        if engine == "fast":
            m.auto_pad_v = pads_v(m.qkv.weight.device)  # type: ignore[attr-defined]
    encoder: Any = getattr(sam, "image_encoder", sam)
    for m in encoder.modules():
        if isinstance(m, PatchEmbed):
            m.__class__ = FastPatchEmbed if engine == "fast" else PatchEmbed
    return sam


def pads_v(device: torch.device) -> bool:
    """Whether the fast attention zero-pads v to the folded width on ``device``.

    No on the CPU (the math kernel takes a narrower v). On CUDA only where SDPA has no kernel
    for a narrower v worth taking: cuDNN's attention (Hopper and newer, when enabled) takes
    v at its own width, which skips the padded columns' wasted work in ``P @ V``, so there v is
    not padded. Measured on an H200 (ViT-B 1024 px, batch 16, eager): 173 img/s unpadded on
    cuDNN vs 162 padded; the memory-efficient kernel, the fallback elsewhere, ran unpadded v at
    118 img/s, so other GPUs keep the padding (flash, equal widths only).
    """
    if device.type != "cuda":
        return False
    major, _ = torch.cuda.get_device_capability(device)
    return not (major >= 9 and torch.backends.cuda.cudnn_sdp_enabled())


def engine_of(sam: torch.nn.Module) -> str:
    """'fast' when every encoder attention module is fast, 'reference' when none is."""
    mods = encoder_attention_modules(sam)
    fast = [isinstance(m, FastAttention) for m in mods]
    if fast and all(fast):
        return "fast"
    if not any(fast):
        return "reference"
    return "mixed"


def default_engine(device: str | torch.device) -> str:
    """'fast' on CUDA, 'reference' elsewhere (the fast path is checked on the CPU too, but the
    reference stays the default where no speed is at stake)."""
    return "fast" if torch.device(device).type == "cuda" else "reference"


_COMPILED: dict[tuple[int, str], tuple[torch.nn.Module, Any]] = {}


def compiled_encoder(encoder: torch.nn.Module, mode: str = "default") -> Any:
    """``torch.compile`` of the image encoder, cached per (module, mode) for the life of the
    process so every partition evaluated in one process reuses the compiled graph."""
    key = (id(encoder), mode)
    if key not in _COMPILED:
        # the entry keeps the encoder alive, so its id cannot be reused by another module
        _COMPILED[key] = (encoder, torch.compile(encoder, mode=mode, dynamic=False))
    return _COMPILED[key][1]
