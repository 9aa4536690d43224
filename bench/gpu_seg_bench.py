"""SAM-family evaluation engine benchmark (issue 15). One run prints one table.

On CUDA (ViT-B at 1024 px, random weights: speed does not depend on them):
  * the measured bf16 matmul bound (TFLOP/s, square 8192 matmuls);
  * encoder FLOP per image (``torch.utils.flop_counter``, reference encoder);
  * encoder img/s and share of the bound for reference fp32, reference bf16 (autocast), fast bf16
    (the product's path), the fast engine with a bf16 weights copy, fast bf16 compiled per
    ``--compile-modes`` (with and without the copy); ``--backends`` adds rows with each SDPA
    backend forced and with v unpadded; ``--profile FILE`` writes the top kernels of the product's
    path (compiled when measured);
  * end-to-end ``evaluate_perturbed`` img/s (eager, or compiled with ``--e2e-compile MODE``) over a
    demo partition with real regeneration by the feed's worker processes (images resized to the model's 1024 px), and its ratio to encoder-only
    and to the pure forward (``score`` on the already regenerated images);
  * PGD-10 img/s (fast engine, bf16 autocast, fp32 input gradients); peak memory.
Without CUDA the same table runs on the CPU with the tiny demo architecture and ViT-B at small
batch (bf16 there is CPU autocast; compiled rows only with ``--compile``), so it always runs.

``--models litemedsam`` (or ``sam,litemedsam``) adds the LiteMedSAM section (issue 29,
:mod:`bench.litemedsam_bench`): encoder FLOP, encoder-only and end-to-end img/s with shares of the
same bf16 bound, fp32 and bf16 autocast, on the CPU also ``channels_last`` and thread-count
variants, and PGD-10 img/s through ``attacks.linf.pgd``.

Run from the repository root: ``.venv/bin/python -m bench.gpu_seg_bench [--batch 16] [--iters 5] [--archs tiny,vit_b]
[--models sam,litemedsam]``.
"""

from __future__ import annotations

import argparse
import copy
import resource
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch

from bench.timing import sync, timed
from medrobust_lib.attacks.linf import pgd, torch_generator_for
from medrobust_lib.models.sam import SamSegmenter, arch_for, build_sam


def matmul_bound(dev: torch.device, dtype: torch.dtype) -> float:
    """Measured matmul throughput in FLOP/s (the bound the encoder shares are quoted against)."""
    n = 8192 if dev.type == "cuda" else 1024
    a = torch.randn(n, n, device=dev, dtype=dtype)
    b = torch.randn(n, n, device=dev, dtype=dtype)
    dt = timed(lambda: a @ b, dev, iters=20 if dev.type == "cuda" else 5)
    return 2 * n**3 / dt


def encoder_flops(seg: SamSegmenter) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    # on the meta device: shapes only, so counting costs nothing even for ViT-H on a CPU
    enc = copy.deepcopy(seg.sam.image_encoder).to("meta")
    x = torch.zeros(1, 3, seg.image_size, seg.image_size, device="meta")
    with torch.no_grad(), FlopCounterMode(display=False) as fc:
        enc(x)
    return int(fc.get_total_flops())


def autocast(dev: torch.device, on: bool) -> AbstractContextManager[Any]:
    return torch.autocast(dev.type, dtype=torch.bfloat16) if on else nullcontext()


def peak_memory(dev: torch.device) -> str:
    if dev.type == "cuda":
        return f"{torch.cuda.max_memory_allocated() / 2**30:.2f} GiB (CUDA)"
    return f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB (process RSS)"


def _sdpa_backend(name: str) -> AbstractContextManager[Any]:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(getattr(SDPBackend, name))


def encoder_rows(arch_name: str, dev: torch.device, batch: int, iters: int, bound: float, compile_modes: list[str],
                 profile: Path | None = None, backends: bool = False, quick: bool = False) -> tuple[list[tuple[str, float, float]], int, float]:
    """Encoder img/s per variant. The product's path is ``fast bf16`` (``SamSegmenter.encode``:
    on CUDA a bf16 copy of the encoder, SDPA choosing its kernel); the other rows isolate one
    choice each (autocast over fp32 weights, a forced SDPA backend, v not padded, compilation)."""
    from medrobust_lib.models.sam_fast import FastAttention

    arch = arch_for(arch_name, "sam")
    ref = SamSegmenter(build_sam(arch, seed=0), "sam", "ref", "0", device=str(dev), engine="reference",
                       autocast_dtype=None)
    fast = SamSegmenter(copy.deepcopy(ref.sam), "sam", "fast", "0", device=str(dev), engine="fast")
    flops = encoder_flops(ref)
    x = torch.rand(batch, 3, arch.image_size, arch.image_size, device=dev)
    inp = fast.preprocess(x)
    cuda = dev.type == "cuda"

    def module(enc: Any, bf16: bool) -> Callable[[], None]:
        def run() -> None:
            with torch.no_grad(), autocast(dev, bf16):
                enc(inp)
        return run

    def product(seg: SamSegmenter, ctx: Callable[[], AbstractContextManager[Any]] = nullcontext,
                pad_v: bool | None = None) -> Callable[[], None]:
        def run() -> None:
            FastAttention.pad_v = pad_v
            try:
                with torch.no_grad(), ctx():
                    seg.encode(inp)
            finally:
                FastAttention.pad_v = None
        return run

    variants: list[tuple[str, Callable[[], None], bool]] = [
        ("reference fp32", module(ref.sam.image_encoder, False), False),
        ("reference bf16 autocast", module(ref.sam.image_encoder, True), False),
        ("fast bf16" + (" (autocast over fp32 weights; the product's path)" if cuda else " (CPU: fp32, as the product)"),
         product(fast), False)]
    if cuda and not quick:
        lowp = SamSegmenter(fast.sam, "sam", "fast", "0", device=str(dev), engine="fast", bf16_weights=True)
        variants.append(("fast bf16, bf16 weights copy (bf16_weights=True)", product(lowp), False))
    if cuda and backends:
        for backend in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION"):
            variants.append((f"fast bf16, SDPA forced to {backend}",
                             product(fast, lambda b=backend: _sdpa_backend(b)), False))  # type: ignore[misc]
        for backend in ("EFFICIENT_ATTENTION", "CUDNN_ATTENTION"):
            variants.append((f"fast bf16, v not padded ({backend})",
                             product(fast, lambda b=backend: _sdpa_backend(b), pad_v=False), False))  # type: ignore[misc]
    profiled = product(fast)  # the kernel profile: the product's path, compiled when measured
    for mode in compile_modes:
        seg = SamSegmenter(fast.sam, "sam", "fast", "0", device=str(dev), engine="fast", compile_mode=mode)
        variants.append((f"fast bf16 compiled ({mode})", product(seg), True))
        if mode == compile_modes[0]:
            profiled = product(seg)
        if cuda and not quick:
            seg_lp = SamSegmenter(fast.sam, "sam", "fast", "0", device=str(dev), engine="fast", compile_mode=mode,
                                  bf16_weights=True)
            variants.append((f"fast bf16 compiled ({mode}), bf16 weights copy", product(seg_lp), True))
    rows = []
    fast_ips = float("nan")
    for name, fn, comp in variants:
        t0 = time.perf_counter()
        try:
            dt = timed(fn, dev, iters, warmup=3 if cuda else 1)
        except Exception as exc:  # a backend that refuses these shapes: report it, keep going
            rows.append((f"{name}: failed ({type(exc).__name__}: {str(exc).splitlines()[0][:90]})",
                         float("nan"), float("nan")))
            continue
        ips = batch / dt
        if name.startswith("fast bf16 ("):
            fast_ips = ips
        warm = time.perf_counter() - t0 - dt * iters
        rows.append((name + (f" (warm-up {warm:.0f} s)" if comp else ""), ips, ips * flops / bound))
        if cuda:
            torch.cuda.empty_cache()
    if profile is not None:
        profile.write_text(kernel_profile(profiled, dev))
    return rows, flops, fast_ips


def kernel_profile(fn: Callable[[], None], dev: torch.device, steps: int = 3) -> str:
    """``torch.profiler`` table of the top kernels (self device time) over ``steps`` calls."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    sync(dev)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with profile(activities=acts) as prof:
        for _ in range(steps):
            fn()
        sync(dev)
    key = "self_cuda_time_total" if dev.type == "cuda" else "self_cpu_time_total"
    return str(prof.key_averages().table(sort_by=key, row_limit=25, max_name_column_width=70))


def end_to_end(arch_name: str, dev: torch.device, batch: int, n_per_modality: int, workers: int | None,
               types: list[str] | None, compile_mode: str | None = None) -> dict[str, float]:
    """evaluate_perturbed on a freshly built demo partition (CT, level 3, every registered
    perturbation type) with the fast engine; pure forward = ``score`` on the same regenerated
    images; encoder-only = the encoder on as many model-size inputs."""
    import yaml
    from safetensors.torch import save_file

    from medrobust_lib.config import load_suite
    from medrobust_lib.config.segmentation import PromptConfig
    from medrobust_lib.demo import build_demo
    from medrobust_lib.perturb.engine import regenerate
    from medrobust_lib.prompts import prompt_boxes
    from medrobust_lib.tracks.datasets import build_clean_index
    from medrobust_lib.tracks.feed import clean_samples
    from medrobust_lib.tracks.perturbed import build_perturbed, read_manifest
    from medrobust_lib.tracks.segmentation.evaluate import evaluate_clean, evaluate_perturbed
    from medrobust_lib.tracks.segmentation.model import load_model, model_config

    root = Path(tempfile.mkdtemp(prefix="gpu_seg_bench_"))
    build_demo(root / "demo", seed=0, n_per_modality=n_per_modality)
    arch = arch_for(arch_name, "sam")
    ckpt = root / "model.safetensors"
    save_file({k: v.contiguous() for k, v in build_sam(arch, seed=0).state_dict().items()}, str(ckpt))
    cfg = {"name": "bench", "seed": 0, "results_dir": str(root / "results"), "mart_path": str(root / "m.duckdb"),
           "workers": 1, "modalities": ["ct"],
           "demo": {"enabled": True, "root": str(root / "demo"), "n_per_modality": n_per_modality, "seed": 0},
           "perturbations": {"levels": [3], "split": "all", "calibration_subset": 2,
                             **({"include": types} if types else {})},
           "segmentation": {"split": "all", "feed_workers": workers,
                            "models": [{"id": "m", "arch": arch_name, "checkpoint": str(ckpt), "engine": "fast",
                                        "device": str(dev), "batch_size": batch, "compile": compile_mode}]}}
    (root / "suite.yaml").write_text(yaml.safe_dump(cfg))
    suite = load_suite(root / "suite.yaml")
    build_clean_index(suite, "ct")
    build_perturbed(suite, "ct", 3)
    model = load_model(suite, model_config(suite, "m"))
    evaluate_clean(suite, "m", "ct", model, reuse=False)
    evaluate_perturbed(suite, "m", "ct", 3, model, reuse=False)  # warm-up: feed pool spawned, caches filled
    t_e2e = float("inf")
    for _ in range(3):  # the fastest of three runs (shared machines)
        t0 = time.perf_counter()
        summ = evaluate_perturbed(suite, "m", "ct", 3, model, reuse=False)  # scored, never read back
        sync(dev)
        t_e2e = min(t_e2e, time.perf_counter() - t0)
    samples = clean_samples(suite, "ct", "all")
    items = []
    t0 = time.perf_counter()
    for rec in read_manifest(suite, "ct", 3).to_dict("records"):
        r = {str(k): v for k, v in rec.items()}
        if r["status"] != "ok":
            continue
        s = samples[(r["dataset"], r["sample_id"])]
        out = regenerate(r, s)
        items.append((out.image, prompt_boxes(s, PromptConfig(), mask=out.mask), out.mask))
    t_regen = time.perf_counter() - t0
    items = [it for it in items if len(it[1])]
    t_pure = timed(lambda: model.score(items, batch_size=batch), dev, iters=3, warmup=0)
    n = len(items)
    x = torch.rand(batch, 3, arch.image_size, arch.image_size, device=dev)

    def enc() -> None:
        with torch.no_grad():
            model.encode(x)

    t_enc = timed(enc, dev, iters=max(3, n // batch)) / batch * n
    return {"n": float(summ.n_rows), "e2e_ips": summ.n_rows / t_e2e, "pure_ips": n / t_pure,
            "enc_ips": n / t_enc, "regen_ips": n / t_regen, "ratio_e2e_pure": t_e2e / t_pure * n / summ.n_rows,
            "ratio_e2e_enc": (summ.n_rows / t_e2e) / (n / t_enc)}


def pgd_rate(arch_name: str, dev: torch.device, batch: int) -> float:
    arch = arch_for(arch_name, "sam")
    seg = SamSegmenter(build_sam(arch, seed=0), "sam", "m", "0", device=str(dev), engine="fast")
    g = torch.Generator().manual_seed(0)
    x = torch.rand(batch, 3, arch.image_size, arch.image_size, generator=g).to(dev)
    boxes = torch.tensor([[arch.image_size * 0.3, arch.image_size * 0.3, arch.image_size * 0.7,
                           arch.image_size * 0.7]], device=dev).repeat(batch, 1)
    y = (torch.rand(batch, 1, arch.image_size, arch.image_size, generator=g) > 0.5).float().to(dev)
    dt = timed(lambda: pgd(seg, x, boxes, y, 8 / 255, 10, generator=torch_generator_for(0, "bench")), dev, iters=1)
    return batch / dt


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=None, help="default 16 on CUDA, 2 on CPU")
    ap.add_argument("--iters", type=int, default=None, help="default 5 on CUDA, 2 on CPU")
    ap.add_argument("--archs", default=None, help="default vit_b on CUDA, tiny,vit_b on CPU")
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                    help="include the compiled rows (default: on CUDA only)")
    ap.add_argument("--compile-modes", default="default",
                    help="torch.compile modes measured, comma-separated (e.g. default,max-autotune-no-cudagraphs)")
    ap.add_argument("--profile", type=Path, default=None,
                    help="write a torch.profiler table of the fast encoder's top kernels to this file")
    ap.add_argument("--skip-e2e", action="store_true", help="encoder rows only")
    ap.add_argument("--quick", action="store_true", help="no bf16-weights-copy rows")
    ap.add_argument("--backends", action="store_true", help="also rows with each SDPA backend forced (CUDA)")
    ap.add_argument("--e2e-compile", default=None, help="torch.compile mode of the end-to-end model (default: eager)")
    ap.add_argument("--n-per-modality", type=int, default=6, help="demo images for the end-to-end partition")
    ap.add_argument("--workers", type=int, default=None, help="feed workers (default cores - 1)")
    ap.add_argument("--types", default=None, help="perturbation types of the end-to-end partition (default: all)")
    ap.add_argument("--full-cpu", action="store_true",
                    help="on the CPU also run end-to-end and PGD for ViT-B (minutes per image)")
    ap.add_argument("--models", default="sam",
                    help="sam (the --archs rows), litemedsam (the packaged LiteMedSAM), or both comma-separated")
    ap.add_argument("--lite-batches", default=None, help="LiteMedSAM batch sizes (default 1,8 on the CPU, 1,16,64 on CUDA)")
    ap.add_argument("--lite-threads", default=None,
                    help="CPU: torch.set_num_threads values for the LiteMedSAM encoder rows (default cores,1)")
    ap.add_argument("--lite-variants", default="default,channels_last",
                    help="LiteMedSAM encoder memory formats: default and/or channels_last")
    ap.add_argument("--lite-precisions", default="fp32,bf16", help="LiteMedSAM precisions: fp32 and/or bf16 (autocast)")
    ap.add_argument("--lite-e2e", action=argparse.BooleanOptionalAction, default=True,
                    help="LiteMedSAM end-to-end predict rows")
    ap.add_argument("--lite-pgd-steps", type=int, default=10, help="LiteMedSAM PGD steps (0: no PGD rows)")
    ap.add_argument("--lite-pgd-batch", type=int, default=None, help="LiteMedSAM PGD batch (default 1 on the CPU, 16 on CUDA)")
    args = ap.parse_args(argv)
    models = args.models.split(",")
    unknown = sorted(set(models) - {"sam", "litemedsam"})
    if unknown:
        ap.error(f"unknown --models {unknown}; valid: sam, litemedsam")
    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    batch = args.batch or (16 if cuda else 2)
    iters = args.iters or (5 if cuda else 2)
    archs = (args.archs or ("vit_b" if cuda else "tiny,vit_b")).split(",")
    compile_on = cuda if args.compile is None else args.compile
    name = torch.cuda.get_device_name(0) if cuda else f"CPU ({torch.get_num_threads()} threads)"
    bound = matmul_bound(dev, torch.bfloat16)
    fp32_bound = matmul_bound(dev, torch.float32)
    print(f"device: {name}; torch {torch.__version__}")
    print(f"measured matmul bound: bf16 {bound / 1e12:.3f} TFLOP/s, fp32 {fp32_bound / 1e12:.3f} TFLOP/s "
          "(shares below are of the bf16 bound)")
    for arch in (archs if "sam" in models else []):
        modes = args.compile_modes.split(",") if compile_on else []
        rows, flops, _ = encoder_rows(arch, dev, batch, iters, bound, modes, args.profile, args.backends, args.quick)
        size = arch_for(arch, "sam").image_size
        print(f"\n### {arch} at {size} px, batch {batch}: encoder {flops / 1e9:.1f} GFLOP/img")
        print("| encoder | img/s | share of bf16 bound |")
        print("|---|---|---|")
        for label, ips, share in rows:
            print(f"| {label} | {ips:.3g} | {share:.1%} |" if ips == ips else f"| {label} | - | - |")
        if not compile_on:
            print("| fast bf16 compiled | - | skipped (--compile) |")
        if args.skip_e2e:
            continue
        if not cuda and arch != "tiny" and not args.full_cpu:
            print("| evaluate_perturbed end to end, pure forward, PGD-10 | - | skipped on the CPU (--full-cpu) |")
            continue
        e = end_to_end(arch, dev, batch, args.n_per_modality, args.workers,
                       args.types.split(",") if args.types else None, args.e2e_compile)
        how = f"compiled {args.e2e_compile}" if args.e2e_compile else "eager"
        print(f"| evaluate_perturbed end to end (fast {how}, real regeneration, {int(e['n'])} rows) | {e['e2e_ips']:.2f} | "
              f"{e['ratio_e2e_enc']:.2f}x encoder-only img/s |")
        print(f"| pure forward (score on regenerated images) | {e['pure_ips']:.2f} | perturbed eval / pure forward "
              f"time = {e['ratio_e2e_pure']:.2f}x |")
        print(f"| regeneration alone, in one process (what the feed workers must keep up with) | {e['regen_ips']:.2f} | |")
        print(f"| PGD-10 (fast, batch {batch}) | {pgd_rate(arch, dev, batch):.3f} | |")
    if "litemedsam" in models:
        from bench.litemedsam_bench import litemedsam_table

        cores = torch.get_num_threads()
        lite_batches = [int(b) for b in (args.lite_batches or ("1,16,64" if cuda else "1,8")).split(",")]
        threads = [cores if t == "cores" else int(t) for t in (args.lite_threads or "cores,1").split(",")]
        print(f"(CPU threads: torch.get_num_threads() = {cores} at start)" if not cuda else "")
        lines, _, _ = litemedsam_table(dev, bound, batches=lite_batches, iters=iters,
                                       variants=args.lite_variants.split(","), threads=threads, e2e=args.lite_e2e,
                                       pgd_batch=args.lite_pgd_batch or (16 if cuda else 1),
                                       pgd_steps=args.lite_pgd_steps,
                                       pgd_precisions=tuple(args.lite_precisions.split(",")),
                                       precisions=tuple(args.lite_precisions.split(",")))
        print("\n".join(lines))
    print(f"\npeak memory: {peak_memory(dev)}")


if __name__ == "__main__":
    main()
