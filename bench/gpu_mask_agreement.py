"""How far bf16 moves SAM masks from the fp32 reference, for the fast engine and for
segment-anything's own modules under bf16 autocast (issue 15's GPU bar: pixel agreement >= 99.5%
and mask IoU >= 0.99). Random weights with non-zero relative-position tables (as
``tests/models/test_sam_fast.py``) at ViT-B 1024 px and a small SAM-Med2D with adapters; random
images and boxes. Prints one table.

Run on a CUDA machine, from the repository root: ``python -m bench.gpu_mask_agreement``.
"""

from __future__ import annotations

import copy
from dataclasses import replace

import torch

from medrobust_lib.models.sam import ARCHS, SamArch, SamSegmenter, build_sam

SMALL = replace(ARCHS["vit_b"], encoder_embed_dim=64, encoder_depth=2, encoder_num_heads=2,
                encoder_global_attn_indexes=(1,), image_size=128, window_size=3, prompt_embed_dim=64,
                decoder_mlp_dim=128, decoder_num_heads=2, iou_head_hidden_dim=32, mask_in_chans=8)


def model(arch: SamArch) -> torch.nn.Module:
    m = build_sam(arch, seed=0)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "rel_pos" in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
    return m


def inputs(size: int, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.rand((n, 3, size, size), generator=g)
    lo = torch.randint(0, size // 2, (n, 2), generator=g).float()
    hi = lo + torch.randint(size // 8, size // 2, (n, 2), generator=g).float()
    return x.cuda(), torch.cat([lo, hi], dim=1).cuda()


def main() -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    print("| model | compared with fp32 reference | pixel agreement | mask IoU | share of |logit| < 0.05 |")
    print("|---|---|---|---|---|")
    for label, family, arch, n, seed in [("ViT-B 1024 px", "sam", ARCHS["vit_b"], 2, 11),
                                         ("small SAM-Med2D (adapters)", "sam_med2d", replace(SMALL, adapter=True), 8, 5)]:
        m = model(arch)
        ref = SamSegmenter(m, family, "r", "0", device="cuda", engine="reference")  # type: ignore[arg-type]
        x, boxes = inputs(ref.image_size, n, seed)
        with torch.no_grad():
            base = ref.forward_logits(x, boxes)
        others = {
            "fast, bf16 autocast (default)": SamSegmenter(copy.deepcopy(m), family, "f", "0", device="cuda",  # type: ignore[arg-type]
                                                          engine="fast"),
            "reference modules, bf16 autocast": SamSegmenter(copy.deepcopy(m), family, "b", "0", device="cuda",  # type: ignore[arg-type]
                                                             engine="reference", autocast_dtype=torch.bfloat16),
        }
        fp32 = SamSegmenter(copy.deepcopy(m), family, "f32", "0", device="cuda", engine="fast")  # type: ignore[arg-type]
        fp32.autocast_dtype = None  # the fast engine without autocast: the fold alone
        others["fast, fp32 (TF32 off)"] = fp32
        a = base > 0
        for name, seg in others.items():
            with torch.no_grad():
                b = seg.forward_logits(x, boxes) > 0
            union = float((a | b).sum())
            iou = float((a & b).sum()) / union if union else 1.0
            near = float((base.abs() < 0.05).float().mean())
            print(f"| {label} | {name} | {float((a == b).float().mean()):.4%} | {iou:.4f} | {near:.2%} |")


if __name__ == "__main__":
    main()
