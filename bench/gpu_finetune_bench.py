"""Fine-tuning step time of every strategy on a GPU: SAM ViT-B at 1024 px (the MedSAM setting),
random weights, the training step of ``finetune.train.train_segmenter`` (forward under autocast,
0.7 Dice + 0.3 BCE, backward, clipping, AdamW), fp32 against bf16 autocast in the same process.
Prints trainable parameters, s/step, the bf16 speed-up and peak memory per strategy, then runs
``train_segmenter`` itself for a few steps on CUDA (its AMP path) when OpenCV is importable.

Run on a CUDA machine: ``python -m bench.gpu_finetune_bench [--batch 2] [--steps 8]``."""

from __future__ import annotations

import argparse
import time

import torch


def _step_time(seg: object, params: list[torch.nn.Parameter], x: torch.Tensor, boxes: torch.Tensor,
               y: torch.Tensor, bf16: bool, steps: int) -> tuple[float, float]:
    from medrobust_lib.models.losses import dice_bce_loss

    opt = torch.optim.AdamW(params, lr=1e-5)
    torch.cuda.reset_peak_memory_stats()
    times = []
    loss = torch.tensor(float("nan"))
    for i in range(steps + 2):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            logits = seg.forward_logits(x, boxes)  # type: ignore[attr-defined]
        loss = dice_bce_loss(logits.float(), y, 0.7, 0.3)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        torch.cuda.synchronize()
        if i >= 2:  # two warm-up steps
            times.append(time.perf_counter() - t0)
    if not torch.isfinite(loss):
        raise RuntimeError("non-finite loss")
    return sum(times) / len(times), torch.cuda.max_memory_allocated() / 2**30


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device")
    from medrobust_lib.models.sam import SamSegmenter, arch_for, build_sam
    from medrobust_lib.training.strategies import STRATEGIES, StrategyConfig, apply_strategy

    try:
        import peft  # noqa: F401

        strategies = list(STRATEGIES)
    except ImportError:
        strategies = [s for s in STRATEGIES if s != "lora"]
        print("peft not installed here: lora skipped")
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.rand((args.batch, 3, 1024, 1024), generator=g, device=dev)
    boxes = torch.tensor([[300.0, 280.0, 700.0, 720.0]], device=dev).repeat(args.batch, 1)
    y = torch.zeros((args.batch, 1, 1024, 1024), device=dev)
    y[:, :, 320:680, 340:660] = 1
    print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, SAM ViT-B 1024 px, batch {args.batch}")
    print("| strategy | trainable | fp32 s/step | bf16 s/step | bf16 speed-up | peak GiB fp32 | peak GiB bf16 |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in strategies:
        row = []
        for bf16 in (False, True):
            seg = SamSegmenter(build_sam(arch_for("vit_b", "sam"), seed=0), "sam", "vit_b", "0", device="cuda")
            rep = apply_strategy(seg, StrategyConfig(name), seed=0)
            seg.sam.to(dev).train()
            params = [p for n, p in seg.sam.named_parameters() if rep.is_trainable(n)]
            for n, p in seg.sam.named_parameters():
                p.requires_grad_(rep.is_trainable(n))
            row.append(_step_time(seg, params, x, boxes, y, bf16, args.steps))
            del seg, params
            torch.cuda.empty_cache()
        (t32, m32), (t16, m16) = row
        print(f"| {name} | {rep.n_trainable:,} | {t32:.3f} | {t16:.3f} | {t32 / t16:.2f}x | {m32:.1f} | {m16:.1f} |",
              flush=True)
    try:
        import cv2  # noqa: F401  (train.py imports it for augmentation)
    except ImportError:
        print("OpenCV not installed here: train_segmenter's CUDA path not run")
        return
    import numpy as np

    from medrobust_lib.data.sample import Sample
    from medrobust_lib.training.train import TrainConfig, train_segmenter

    rng = np.random.default_rng(0)
    samples = []
    for i in range(6):
        img = rng.random((64, 64, 3), dtype=np.float32)
        m = np.zeros((64, 64), bool)
        m[10 + i : 40 + i, 12:44] = True
        samples.append(Sample(f"s{i}", "synthetic", "ct", img, mask=m))
    seg = SamSegmenter(build_sam(arch_for("tiny", "sam"), seed=0), "sam", "tiny", "0", device="cuda")
    t0 = time.perf_counter()
    res = train_segmenter(seg, samples[:4], samples[4:], TrainConfig(max_steps=6, batch_size=2, eval_every=3))
    print(f"train_segmenter on {seg.device} (bf16 autocast): {res.steps} steps, val Dice {res.best_val_dice:.3f}, "
          f"{time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
