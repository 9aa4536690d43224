"""Timing helpers shared by the GPU segmentation benches (:mod:`bench.gpu_seg_bench`,
:mod:`bench.litemedsam_bench`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch


def sync(dev: torch.device) -> None:
    """Wait for the device's queued work (CUDA); nothing on the CPU."""
    if dev.type == "cuda":
        torch.cuda.synchronize()


def timed(fn: Callable[[], Any], dev: torch.device, iters: int, warmup: int = 1) -> float:
    """Seconds per call after ``warmup`` calls: the fastest of ``iters`` timed calls (the least
    disturbed by other load on a shared machine)."""
    for _ in range(warmup):
        fn()
    best = float("inf")
    for _ in range(iters):
        sync(dev)
        t0 = time.perf_counter()
        fn()
        sync(dev)
        best = min(best, time.perf_counter() - t0)
    return best
