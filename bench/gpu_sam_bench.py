"""SAM image-encoder throughput on a GPU: fp32 vs bf16 autocast, ViT-B at 1024 px (the MedSAM /
SAM setting), random weights (speed does not depend on them). Prints a table of ratios against
the fp32 run in the same process, plus the max |difference| of the mask logits.

Run on a CUDA machine: ``python -m bench.gpu_sam_bench [--batch 8] [--iters 10]``."""

from __future__ import annotations

import argparse
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--iters", type=int, default=10)
    args = ap.parse_args()
    from segment_anything import sam_model_registry

    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device")
    dev = torch.device("cuda")
    torch.manual_seed(0)
    sam = sam_model_registry["vit_b"](checkpoint=None).to(dev).eval()
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.rand((args.batch, 3, 1024, 1024), generator=g, device=dev) * 255
    boxes = torch.tensor([[300.0, 300.0, 700.0, 700.0]], device=dev).repeat(args.batch, 1)[:, None, :]
    rows = []
    outs = {}
    for mode in ("fp32", "tf32", "bf16"):
        torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
        torch.backends.cudnn.allow_tf32 = mode == "tf32"
        ctx = torch.autocast("cuda", dtype=torch.bfloat16) if mode == "bf16" else torch.autocast("cuda", enabled=False)
        with torch.no_grad(), ctx:
            for _ in range(2):
                emb = sam.image_encoder(sam.preprocess(x))
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(args.iters):
                emb = sam.image_encoder(sam.preprocess(x))
            torch.cuda.synchronize()
            dt = (time.perf_counter() - t0) / args.iters
            lows = []
            for i in range(args.batch):  # the decoder takes one image embedding per prompt set
                sp, de = sam.prompt_encoder(points=None, boxes=boxes[i], masks=None)
                low, _ = sam.mask_decoder(image_embeddings=emb[i : i + 1], image_pe=sam.prompt_encoder.get_dense_pe(),
                                          sparse_prompt_embeddings=sp, dense_prompt_embeddings=de,
                                          multimask_output=False)
                lows.append(low.float())
        outs[mode] = torch.cat(lows)
        rows.append((mode, dt, args.batch / dt))
    base = rows[0][1]
    print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, batch {args.batch}, 1024 px ViT-B")
    print(f"{'mode':<6}{'s/batch':>10}{'img/s':>10}{'speedup':>10}{'max|dlogit|':>14}")
    for mode, dt, ips in rows:
        diff = float((outs[mode] - outs["fp32"]).abs().max())
        print(f"{mode:<6}{dt:>10.4f}{ips:>10.1f}{base / dt:>10.2f}{diff:>14.4f}")
    agree = float(((outs["bf16"] > 0) == (outs["fp32"] > 0)).float().mean())
    print(f"bf16 vs fp32 mask agreement (low-res logits > 0): {agree:.4f}")


if __name__ == "__main__":
    main()
