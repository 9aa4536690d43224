"""LiteMedSAM rows of ``bench/gpu_seg_bench.py`` (issue 29, item 6): ``--models litemedsam``.

The packaged LiteMedSAM release (``load_litemedsam()``: TinyViT encoder, 256 px input) measured
on whatever device the bench runs on:

* encoder FLOP per image (``torch.utils.flop_counter``);
* encoder-only img/s and share of the measured bf16 matmul bound, fp32 and bf16 autocast
  (CPU autocast on a CPU), for each batch size; on the CPU also with the encoder and its input
  in ``channels_last`` and with ``torch.set_num_threads`` variants (the rows of one run share the
  process and the machine's load, so their ratios are what to read on a shared machine);
* end to end: ``LiteMedSamSegmenter.predict`` on 256 x 256 images with one box each, i.e. the
  official preprocessing on the host (uint8, cv2 INTER_AREA, min-max, pad), encoder, decoder,
  crop, bilinear upsampling to the input size and the sigmoid;
* PGD-10 img/s: :func:`medrobust_lib.attacks.linf.pgd` on the segmenter's differentiable
  ``forward_logits`` (the CPU or the CUDA path of the attack code; LiteMedSAM has only the
  reference engine), fp32 and under bf16 autocast.

Every row is timed as the fastest of ``iters`` calls after one warm-up call.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import numpy as np
import torch

from bench.timing import timed
from medrobust_lib.attacks.linf import pgd, torch_generator_for
from medrobust_lib.config.runtimes import EXPORTED_RUNTIMES
from medrobust_lib.models.litemedsam import IMAGE_SIZE, LiteMedSamSegmenter, exact_inputs, load_litemedsam
from medrobust_lib.models.precision import native_bf16


def encoder_flops(seg: LiteMedSamSegmenter) -> int:
    """FLOP of the image encoder on one (1, 3, 256, 256) input, counted by
    ``torch.utils.flop_counter.FlopCounterMode`` (matmuls, convolutions, SDPA; a multiply-add = 2)."""
    from torch.utils.flop_counter import FlopCounterMode

    enc = seg.sam.image_encoder
    x = torch.zeros(1, 3, IMAGE_SIZE, IMAGE_SIZE, device=seg.device)
    with torch.no_grad(), FlopCounterMode(display=False) as fc:
        enc(x)
    return int(fc.get_total_flops())


def model_flops(seg: LiteMedSamSegmenter) -> int:
    """FLOP of the whole differentiable forward (``forward_logits``: encoder, prompt encoder, mask
    decoder, upsampling) on one 256 x 256 image with one box, counted as :func:`encoder_flops`."""
    from torch.utils.flop_counter import FlopCounterMode

    x = torch.zeros(1, 3, IMAGE_SIZE, IMAGE_SIZE, device=seg.device)
    box = torch.tensor([[64.0, 64.0, 192.0, 192.0]], device=seg.device)
    # with autograd on: FlopCounterMode's module tracker hooks the outputs' gradient functions, and
    # the decoder's outputs under no_grad have none (torch 2.14 raises); the count is the forward's
    with FlopCounterMode(display=False) as fc:
        seg.forward_logits(x, box)
    return int(fc.get_total_flops())


@dataclass(frozen=True)
class Row:
    """One measured row: ``ips`` images per second, ``share`` of the bf16 matmul bound
    (encoder FLOP x img/s / bound; NaN where not meaningful)."""

    label: str
    ips: float
    share: float


def _with_precision(seg: LiteMedSamSegmenter, precision: str) -> LiteMedSamSegmenter:
    """The same model (shared modules) with another autocast: ``fp32`` or ``bf16``."""
    out = copy.copy(seg)
    out.autocast_dtype = torch.bfloat16 if precision == "bf16" else None
    return out


def _channels_last(seg: LiteMedSamSegmenter) -> LiteMedSamSegmenter:
    """A copy whose encoder weights are in ``channels_last`` (4-D tensors only)."""
    out = copy.copy(seg)
    out.sam = copy.deepcopy(seg.sam).to(memory_format=torch.channels_last)
    return out


def demo_items(n: int, size: int = IMAGE_SIZE, seed: int = 0) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """``n`` gray float32 (size, size) images in [0, 1] (noise over a brighter disk) and one pixel
    XYXY box (1, 4) around each disk."""
    g = np.random.default_rng(seed)
    yy, xx = np.mgrid[:size, :size]
    images, boxes = [], []
    for _ in range(n):
        cx, cy, r = g.uniform(0.35, 0.65) * size, g.uniform(0.35, 0.65) * size, g.uniform(0.1, 0.2) * size
        disk = (xx - cx) ** 2 + (yy - cy) ** 2 < r * r
        img = np.clip(0.3 + 0.4 * disk + g.normal(0, 0.05, (size, size)), 0, 1).astype(np.float32)
        images.append(img)
        boxes.append(np.array([[cx - r, cy - r, cx + r, cy + r]], np.float32))
    return images, boxes


def encoder_rows(seg: LiteMedSamSegmenter, dev: torch.device, batches: list[int], iters: int, bound: float,
                 flops: int, variants: list[str], threads: list[int],
                 precisions: tuple[str, ...] = ("fp32", "bf16")) -> list[Row]:
    """Encoder-only img/s. ``variants``: ``default`` and/or ``channels_last``; ``threads``: the
    ``torch.set_num_threads`` values measured (CPU only; restored afterwards)."""
    rows: list[Row] = []
    cpu = dev.type == "cpu"
    before = torch.get_num_threads()
    models = {"default": seg}
    if "channels_last" in variants:
        models["channels_last"] = _channels_last(seg)
    try:
        for nthreads in (threads if cpu else [before]):
            torch.set_num_threads(nthreads)
            for b in batches:
                x = torch.rand(b, 3, IMAGE_SIZE, IMAGE_SIZE, generator=torch.Generator().manual_seed(b)).to(dev)
                for variant in variants:
                    base = models[variant]
                    xin = x.contiguous(memory_format=torch.channels_last) if variant == "channels_last" else x
                    for precision in precisions:
                        m = _with_precision(base, precision)

                        def run(m: LiteMedSamSegmenter = m, xin: torch.Tensor = xin) -> None:
                            with torch.no_grad():
                                m.encode(xin)

                        ips = b / timed(run, dev, iters)
                        how = "CPU bf16 autocast" if (cpu and precision == "bf16") else (
                            "bf16 autocast" if precision == "bf16" else "fp32")
                        label = f"encoder, {how}, batch {b}, {variant}" + (f", {nthreads} threads" if cpu else "")
                        rows.append(Row(label, ips, ips * flops / bound))
    finally:
        torch.set_num_threads(before)
    return rows


def end_to_end_rows(seg: LiteMedSamSegmenter, dev: torch.device, batches: list[int], iters: int, bound: float,
                    flops: int, precisions: tuple[str, ...] = ("fp32", "bf16")) -> list[Row]:
    """``predict`` img/s (official preprocessing, encoder, decoder, postprocessing); the share
    uses the encoder's FLOP (the header gives the whole forward's)."""
    rows = []
    for b in batches:
        images, boxes = demo_items(b)
        for precision in precisions:
            m = _with_precision(seg, precision)

            def run(m: LiteMedSamSegmenter = m, images: list[np.ndarray] = images, boxes: list[np.ndarray] = boxes,
                    b: int = b) -> None:
                m.predict(images, boxes, batch_size=b)

            ips = b / timed(run, dev, iters)
            how = ("CPU bf16 autocast" if dev.type == "cpu" else "bf16 autocast") if precision == "bf16" else "fp32"
            rows.append(Row(f"end to end (predict: official pre/postprocessing), {how}, batch {b}", ips,
                            ips * flops / bound))
    return rows


def pgd_rows(seg: LiteMedSamSegmenter, dev: torch.device, batch: int, steps: int, precisions: list[str]) -> list[Row]:
    """PGD-``steps`` img/s (epsilon 8/255, random start from a CPU generator), one timed call."""
    images, boxes = demo_items(batch, seed=1)
    x = torch.from_numpy(np.stack(images))[:, None].repeat(1, 3, 1, 1).to(dev)
    bx = torch.from_numpy(np.concatenate(boxes)).to(dev)
    y = torch.zeros(batch, 1, IMAGE_SIZE, IMAGE_SIZE, device=dev)
    for i, b in enumerate(bx.round().long().tolist()):
        y[i, 0, b[1]:b[3], b[0]:b[2]] = 1.0
    rows = []
    for precision in precisions:
        m = _with_precision(seg, precision)

        def run(m: LiteMedSamSegmenter = m) -> None:
            pgd(m, x, bx, y, 8 / 255, steps, generator=torch_generator_for(0, "bench", "litemedsam"))

        ips = batch / timed(run, dev, iters=1, warmup=0)
        how = ("CPU bf16 autocast" if dev.type == "cpu" else "bf16 autocast") if precision == "bf16" else "fp32"
        rows.append(Row(f"PGD-{steps} (attacks.linf.pgd on forward_logits), {how}, batch {batch}", ips, float("nan")))
    return rows


def litemedsam_table(dev: torch.device, bound: float, *, batches: list[int], iters: int, variants: list[str],
                     threads: list[int], e2e: bool = True, pgd_batch: int = 1, pgd_steps: int = 10,
                     pgd_precisions: tuple[str, ...] = ("fp32", "bf16"), precisions: tuple[str, ...] = ("fp32", "bf16"),
                     count_model: bool = True) -> tuple[list[str], list[Row], int]:
    """The LiteMedSAM section: markdown lines, the rows and the encoder FLOP per image."""
    seg = load_litemedsam(device=str(dev))
    flops = encoder_flops(seg)
    total = model_flops(seg) if count_model else None
    rows = encoder_rows(seg, dev, batches, iters, bound, flops, variants, threads, precisions)
    if e2e:
        rows += end_to_end_rows(seg, dev, batches, iters, bound, flops, precisions)
    if pgd_steps > 0:
        rows += pgd_rows(seg, dev, pgd_batch, pgd_steps, list(pgd_precisions))
    whole = "" if total is None else f", whole forward (one box) {total / 1e9:.1f} GFLOP/img"
    lines = [f"\n### LiteMedSAM (packaged release, TinyViT) at {IMAGE_SIZE} px: encoder {flops / 1e9:.1f} GFLOP/img"
             + whole,
             "| LiteMedSAM | img/s | share of bf16 bound |", "|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.label} | {r.ips:.3g} | {'-' if r.share != r.share else f'{r.share:.1%}'} |")
    return lines, rows, flops


# ---- runtimes (issue 47): PyTorch fp32, bf16 autocast, ONNX Runtime, OpenVINO, the split ----------

RUNTIME_ENGINES: tuple[str, ...] = ("pytorch-fp32", "pytorch-bf16", "onnxruntime", "openvino", "openvino+onnxruntime")
"""The engines :func:`runtime_comparison` measures (``pytorch-bf16`` only where the CPU computes bf16
natively: emulated bf16 is about 10x slower, :mod:`medrobust_lib.models.precision`)."""


@dataclass(frozen=True)
class RuntimeRow:
    """One engine at one batch: median seconds per image over the rounds (``sec_per_img``), the
    median over rounds of PyTorch fp32's time / this engine's time in the same round (``ratio``:
    a paired ratio, robust to load that changes between rounds), and against PyTorch fp32 on the
    same items the largest absolute logit difference and the share of mask pixels that differ."""

    engine: str
    batch: int
    what: str
    sec_per_img: float
    ratio: float
    max_abs_diff: float
    mask_diff: float


def runtime_models(cache_dir: str | None, engines: tuple[str, ...] = RUNTIME_ENGINES
                   ) -> tuple[dict[str, LiteMedSamSegmenter], dict[str, float]]:
    """The packaged release through each available engine, and per exported runtime the seconds of
    its first preparation (export and check into ``cache_dir`` when not cached there, else loading)."""
    from medrobust_lib.models.precision import native_bf16

    models: dict[str, LiteMedSamSegmenter] = {"pytorch-fp32": load_litemedsam(runtime="pytorch")}
    prepare: dict[str, float] = {}
    if "pytorch-bf16" in engines and native_bf16("cpu"):
        models["pytorch-bf16"] = load_litemedsam(runtime="pytorch", precision="bf16")
    for rt in EXPORTED_RUNTIMES:
        if rt not in engines:
            continue
        m = load_litemedsam(runtime=rt, cache_dir=cache_dir)
        t0 = time.perf_counter()
        ok = m.engine_ready()
        prepare[rt] = time.perf_counter() - t0
        if ok:
            models[rt] = m
    return models, prepare


def runtime_comparison(models: dict[str, LiteMedSamSegmenter], batches: list[int], rounds: int, size: int = IMAGE_SIZE,
                       encoder_only: bool = True, many_prompts: int = 0) -> list[RuntimeRow]:
    """End-to-end ``predict`` (official pre/postprocessing, one box per image) and encoder-only
    seconds per image of every engine in ``models`` at each batch size, and with ``many_prompts``
    one image with that many boxes (the decoder's share: the demo's DSB nuclei image has 125).
    Interleaved: each round times every engine once (the order rotating between rounds) after one
    untimed warm-up call each, so that the engines share the machine's load; ``rounds`` rounds."""
    cases: list[tuple[str, int, list[np.ndarray], list[np.ndarray]]] = []
    for b in batches:
        images, boxes = demo_items(b, size=size)
        cases.append(("end to end (predict)", b, images, boxes))
        if encoder_only:
            cases.append(("encoder only", b, images, boxes))
    if many_prompts:
        images, _ = demo_items(1, size=size, seed=5)
        g = np.random.default_rng(5)
        xy = g.uniform(0, 0.85 * size, (many_prompts, 2))  # small boxes all over, like nuclei
        wh = g.uniform(0.02 * size, 0.15 * size, (many_prompts, 2))
        cases.append((f"end to end, {many_prompts} box prompts on one image", 1, images,
                      [np.floor(np.concatenate([xy, xy + wh], axis=1)).astype(np.float32)]))
    rows: list[RuntimeRow] = []
    base = "pytorch-fp32"
    names = list(models)
    for what, b, images, boxes in cases:
        x = torch.from_numpy(np.stack([exact_inputs([im])[0].numpy() for im in images]))
        for m in models.values():
            m.clear_embedding_cache()
            _run_once(m, what, x, images, boxes)  # warm-up (first-call allocations, oneDNN primitives)
        times: dict[str, list[float]] = {n: [] for n in names}
        for r in range(rounds):
            order = names[r % len(names):] + names[: r % len(names)]
            for n in order:
                models[n].clear_embedding_cache()  # every call encodes, as a new image would
                t0 = time.perf_counter()
                _run_once(models[n], what, x, images, boxes)
                times[n].append((time.perf_counter() - t0) / b)
        ref = models[base].predict_logits(images, boxes, batch_size=b)
        for n in names:
            got = models[n].predict_logits(images, boxes, batch_size=b)
            diff = max(float(np.abs(g - e).max()) for g, e in zip(got, ref, strict=True))
            flips = float(np.mean([((g > 0) != (e > 0)).mean() for g, e in zip(got, ref, strict=True)]))
            paired = [tb / tn for tb, tn in zip(times[base], times[n], strict=True)]
            rows.append(RuntimeRow(n, b, what, float(np.median(times[n])), float(np.median(paired)), diff, flips))
    return rows


def _run_once(m: LiteMedSamSegmenter, what: str, x: torch.Tensor, images: list[np.ndarray],
              boxes: list[np.ndarray]) -> None:
    """One call (the caller empties the embedding cache first: the rounds repeat the same inputs)."""
    with torch.no_grad():
        if what == "encoder only":
            m.encode(x)
        else:
            m.predict(images, boxes, batch_size=len(images))


def runtime_table(rows: list[RuntimeRow], prepare: dict[str, float]) -> list[str]:
    """Markdown lines: one row per (what, batch, engine)."""
    import platform

    flags = sorted({f for f in ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")
                    if f in cpu_flags()})
    # what the libraries see through cpuid (tools/avx2_only hides features that /proc/cpuinfo lists)
    seen = f"kernels {torch.backends.cpu.get_cpu_capability()}, native bf16 {native_bf16('cpu')}"
    lines = [f"\n### LiteMedSAM runtimes on the CPU ({torch.get_num_threads()} threads, {platform.processor() or 'cpu'}; "
             f"flags: {', '.join(flags) or 'unknown'}; {seen})",
             "| what | batch | engine | ms/img | img/s | x PyTorch fp32 (paired median) | max abs logit diff | "
             "mask pixels differing |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.what} | {r.batch} | {r.engine} | {r.sec_per_img * 1e3:.0f} | {1 / r.sec_per_img:.2f} | "
                     f"{r.ratio:.2f} | {r.max_abs_diff:.2g} | {r.mask_diff:.4%} |")
    for rt, sec in prepare.items():
        lines.append(f"\n{rt}: first preparation {sec:.1f} s (export + check when the cache was empty, else loading; "
                     "a graph this process loaded for an engine above is shared, not loaded again)")
    return lines


def cpu_flags() -> set[str]:
    """The flags /proc/cpuinfo lists for the first CPU (empty where there is no such file); what the
    kernel reports, not what ``tools/avx2_only`` lets libraries see."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def main(argv: list[str] | None = None) -> None:
    """``.venv/bin/python -m bench.litemedsam_bench [--batches 1,8] [--rounds 5] [--many-prompts 125]
    [--cache-dir DIR]``:
    the runtime table (:func:`runtime_comparison`). The demo evaluates LiteMedSAM at batch 1 (its
    ``batch_size``, also the family default); 8 is the other families' default batch."""
    import argparse
    import tempfile

    ap = argparse.ArgumentParser(description="LiteMedSAM: PyTorch fp32 / bf16 autocast / ONNX Runtime / OpenVINO / "
                                             "OpenVINO encoder + ONNX Runtime decoder")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--engines", default=",".join(RUNTIME_ENGINES))
    ap.add_argument("--cache-dir", default=None, help="export cache (default: a fresh temporary folder, so the "
                                                      "export time is measured too)")
    ap.add_argument("--no-encoder-only", action="store_true")
    ap.add_argument("--many-prompts", type=int, default=0, help="also one image with this many box prompts")
    ap.add_argument("--threads", type=int, default=None, help="threads of every engine (default: torch's, the cores)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)  # the exported runtimes take torch's count when they load
    with tempfile.TemporaryDirectory() as tmp:
        models, prepare = runtime_models(args.cache_dir or tmp, tuple(args.engines.split(",")))
        rows = runtime_comparison(models, [int(b) for b in args.batches.split(",")], args.rounds,
                                  encoder_only=not args.no_encoder_only, many_prompts=args.many_prompts)
    print("\n".join(runtime_table(rows, prepare)))


if __name__ == "__main__":
    main()
