"""Which arithmetic a model runs in: a suite's ``precision`` (``fp32``, ``bf16`` or ``auto``) resolved
for the device it runs on.

bf16 autocast is fast only where the hardware computes in bf16: on a CPU with AVX512-BF16 or AMX
(oneDNN's native bf16 kernels; LiteMedSAM 2.2x faster than fp32 on such a 2-core machine) and on a
CUDA device that supports bf16. On a CPU without them (e.g. AVX2 only) oneDNN emulates bf16 and the
same model runs about 10x slower than in fp32 (measured on an AMD EPYC with AVX2: a 3-convolution
stage-0 block 62 ms in fp32, 662 ms under bf16 autocast). ``auto`` therefore takes bf16 only where it
is native, and fp32 elsewhere; every result row records the arithmetic that ran (``precision``)."""

from __future__ import annotations

from collections.abc import Callable

import torch

PRECISIONS: tuple[str, ...] = ("fp32", "bf16", "auto")


def _flag(name: str) -> bool:
    """One of ``torch.cpu``'s capability probes (``_is_avx512_bf16_supported``, ...); False where this
    torch build lacks it."""
    probe: Callable[[], bool] | None = getattr(torch.cpu, name, None)
    return bool(probe()) if probe is not None else False


def native_bf16(device: str) -> bool:
    """Whether ``device`` (``cpu``, ``cuda``, ``cuda:1``) computes bf16 natively: CUDA with bf16
    support, or a CPU with AVX512-BF16 or AMX tiles."""
    if device.startswith("cuda"):
        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    return _flag("_is_avx512_bf16_supported") or _flag("_is_amx_tile_supported")


def resolve_precision(precision: str, device: str) -> str:
    """``fp32`` / ``bf16`` as given; ``auto`` -> ``bf16`` where :func:`native_bf16`, else ``fp32``.

    Raises:
        ValueError: a precision other than ``fp32``, ``bf16`` or ``auto``."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; valid: {', '.join(PRECISIONS)}")
    if precision == "auto":
        return "bf16" if native_bf16(device) else "fp32"
    return precision
