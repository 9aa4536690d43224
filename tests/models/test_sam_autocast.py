"""The segmenter must not switch off an autocast region its caller opened (the training loop's
bf16 AMP): its own autocast is a no-op unless it was given an ``autocast_dtype`` on CUDA."""

from __future__ import annotations

import torch

from medrobust_lib.models.sam import SamSegmenter, arch_for, build_sam


def test_outer_autocast_reaches_the_model() -> None:
    """Under the caller's bf16 autocast the encoder really computes in bf16 (its outputs carry
    bf16 rounding); with ``autocast(enabled=False)`` inside, they were bit-identical to fp32."""
    seg = SamSegmenter(build_sam(arch_for("tiny", "sam"), seed=0), "sam", "tiny", "0")
    x = torch.rand(1, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    boxes = torch.tensor([[8.0, 8.0, 40.0, 40.0]])
    with torch.no_grad():
        plain, plain_logits = seg.embed(x), seg.forward_logits(x, boxes)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            amp, amp_logits = seg.embed(x), seg.forward_logits(x, boxes)
    for a, b in ((plain, amp), (plain_logits, amp_logits)):
        diff = (a.float() - b.float()).abs().max().item()
        assert 0.0 < diff < 0.25 * a.float().abs().max().item()
