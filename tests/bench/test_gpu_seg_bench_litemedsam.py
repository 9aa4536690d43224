"""Smoke test of the LiteMedSAM rows of bench/gpu_seg_bench.py on the CPU (issue 29, item 6):
batch 1, fp32, one timed call per row, PGD with one step. About 10 forward passes of the packaged
LiteMedSAM (under 30 s on an idle 2-core machine)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from bench import gpu_seg_bench
from bench.litemedsam_bench import demo_items, litemedsam_table


@pytest.mark.slow  # about 10 passes of the real LiteMedSAM (11-14 s under make test); .ci/run runs it
def test_litemedsam_cpu_rows() -> None:
    lines, rows, flops = litemedsam_table(torch.device("cpu"), 1e12, batches=[1], iters=1, variants=["default"],
                                          threads=[torch.get_num_threads()], e2e=True, pgd_batch=1, pgd_steps=1,
                                          pgd_precisions=("fp32",), precisions=("fp32",))
    labels = [r.label for r in rows]
    assert [lab.split(",")[0] for lab in labels] == ["encoder", "end to end (predict: official pre/postprocessing)",
                                                   "PGD-1 (attacks.linf.pgd on forward_logits)"]
    assert all(r.ips > 0 and math.isfinite(r.ips) for r in rows)
    # the TinyViT encoder at 256 px: tens of GFLOP (74.9 G counted by torch.utils.flop_counter here)
    assert 50e9 < flops < 100e9
    enc = rows[0]
    assert enc.share == pytest.approx(enc.ips * flops / 1e12)
    assert math.isnan(rows[-1].share)
    header = lines[0]
    assert "encoder" in header and "whole forward" in header and len(lines) == 3 + len(rows)


def test_demo_items_boxes_enclose_the_disks() -> None:
    images, boxes = demo_items(3, size=64)
    for img, box in zip(images, boxes, strict=True):
        assert img.shape == (64, 64) and img.dtype.name == "float32" and 0 <= img.min() and img.max() <= 1
        x0, y0, x1, y1 = (int(round(v)) for v in box[0])
        inside = img[y0:y1, x0:x1]
        outside = img.copy()
        outside[y0:y1, x0:x1] = float("nan")
        assert inside.mean() > float(np_nanmean(outside)) + 0.2  # the bright disk fills the box


def np_nanmean(a: np.ndarray) -> float:
    return float(np.nanmean(a))


def test_cli_rejects_unknown_models() -> None:
    with pytest.raises(SystemExit):
        gpu_seg_bench.main(["--models", "litemedsam,bogus"])
