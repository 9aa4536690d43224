"""LiteMedSAM's exported mask decoder in two layouts, timed in one process (issue 47).

``reference``: segment-anything's own attention modules in every two-way block (the graph that
``EXPORTER_VERSION`` 3 exported); ``tokens``: five per-prompt projections of the image tokens
applied to the prompt tokens (the default,
:mod:`medrobust_lib.models.sam_decode_export`). Both are exported from the packaged release
(:func:`medrobust_lib.models.onnx_engine.export_graph`, as the product exports) into a
temporary folder and run by each requested runtime on one real image embedding with ``--prompts``
boxes per call (the product calls 4 at a time). Rounds are interleaved (each round times every
graph of every runtime once, the order rotating), after one untimed warm-up call each; the table
gives the median milliseconds per prompt, the ratios to the first runtime's ``reference`` and to
the same runtime's (medians of the rounds' paired ratios) and the largest logit difference between
the layouts.

    .venv/bin/python -m bench.decoder_layout_bench [--rounds 13] [--prompts 4] [--runtimes onnxruntime,openvino]
    tools/avx2_only/run.sh .venv/bin/python -m bench.decoder_layout_bench
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import torch

from medrobust_lib.config.runtimes import EXPORT_RUNTIMES
from medrobust_lib.models.litemedsam import DECODER_GRAPH, IMAGE_SIZE, LiteMedSamSegmenter, load_litemedsam
from medrobust_lib.models.onnx_engine import ExportedGraph, export_graph
from medrobust_lib.models.sam_decode_export import DecodeLowForExport

LAYOUTS = {"reference": False, "tokens": True}
"""Layout name -> ``DecodeLowForExport(projections_on_tokens=...)``."""
BOXES = np.array([[40.0, 52.0, 200.0, 180.0], [0.0, 0.0, 255.0, 255.0], [97.0, 12.0, 130.0, 33.0],
                  [3.0, 150.0, 12.0, 161.0], [120.0, 130.0, 160.0, 170.0], [10.0, 10.0, 60.0, 90.0],
                  [200.0, 20.0, 250.0, 60.0], [60.0, 200.0, 140.0, 250.0]], np.float32)
"""Model-grid XYXY boxes (256 px); the first ``--prompts`` are used."""


def export(seg: LiteMedSamSegmenter, layout: str, emb: torch.Tensor, folder: Path) -> Path:
    """The decoder of ``seg`` in ``layout`` written as ``<folder>/<layout>.onnx`` the way the
    product writes it (:func:`~medrobust_lib.models.onnx_engine.export_graph`, traced with 2 prompts
    on ``emb``, the prompt axis dynamic)."""
    module = DecodeLowForExport(seg, projections_on_tokens=LAYOUTS[layout]).eval()
    path = folder / f"{layout}.onnx"
    export_graph(module, (emb, torch.from_numpy(BOXES[:2])), DECODER_GRAPH, path)
    return path


def embedding(seg: LiteMedSamSegmenter) -> torch.Tensor:
    """A real embedding (1, 256, 64, 64) float32: the encoder's output for a smooth random image."""
    g = torch.Generator().manual_seed(3)
    x = torch.nn.functional.interpolate(torch.rand(1, 3, 16, 16, generator=g), size=IMAGE_SIZE, mode="bilinear")
    with torch.no_grad():
        return seg.sam.image_encoder(x)


def runner(runtime: str, path: Path, threads: int) -> Callable[[dict[str, np.ndarray]], np.ndarray]:
    """A call of the graph at ``path`` as the product runs it (:class:`ExportedGraph`: ``onnxruntime``
    or ``openvino``, fp32, ``threads`` threads, ONNX Runtime without busy waiting) -> the logits."""
    graph = ExportedGraph(path, DECODER_GRAPH, runtime, threads)
    return lambda feeds: graph(*(feeds[name] for name in DECODER_GRAPH.inputs))[0]


def check_arguments(runtimes: list[str], rounds: int, prompts: int) -> None:
    """ValueError naming the first bad argument: a runtime that runs no exported graph, fewer than
    one round, or a prompt count outside 1-len(BOXES)."""
    unknown = sorted(set(runtimes) - set(EXPORT_RUNTIMES))
    if unknown:
        raise ValueError(f"--runtimes: {', '.join(unknown)} runs no exported graph; valid: {', '.join(EXPORT_RUNTIMES)}")
    if rounds < 1:
        raise ValueError(f"--rounds must be >= 1, got {rounds}")
    if not 1 <= prompts <= len(BOXES):
        raise ValueError(f"--prompts must be 1-{len(BOXES)}, got {prompts}")


def compare(runtimes: list[str], rounds: int, prompts: int) -> list[str]:
    """Markdown lines: per runtime and layout, ms per prompt, x the first runtime's reference
    layout and x the same runtime's reference layout (paired medians: every graph of every runtime
    is timed once per round), the largest logit difference from PyTorch's ``decode_low`` (the
    product's export check allows 1e-4 + 1e-5 x the largest logit) and the graph's node count."""
    check_arguments(runtimes, rounds, prompts)
    threads = max(1, torch.get_num_threads())
    base = (runtimes[0], "reference")
    lines = [f"\n### LiteMedSAM decoder layouts ({threads} threads, {prompts} prompts a call, "
             f"kernels {torch.backends.cpu.get_cpu_capability()})",
             f"| runtime | layout | ms/prompt | x {base[0]} reference | x same runtime's reference | "
             "max abs logit diff vs PyTorch | max abs PyTorch logit | graph nodes |", "|---|---|---|---|---|---|---|---|"]
    seg = load_litemedsam(runtime="pytorch")
    emb = embedding(seg)
    boxes = torch.from_numpy(BOXES[:prompts])
    with torch.no_grad():
        ref = seg.decode_low(emb.expand(prompts, -1, -1, -1), boxes).numpy()
    with tempfile.TemporaryDirectory() as tmp:
        graphs = {name: export(seg, name, emb, Path(tmp)) for name in LAYOUTS}
        nodes = {name: len(onnx.load(str(path)).graph.node) for name, path in graphs.items()}
        feeds = dict(zip(DECODER_GRAPH.inputs, (emb.numpy(), BOXES[:prompts]), strict=True))
        calls = {(rt, name): runner(rt, path, threads) for rt in runtimes for name, path in graphs.items()}
        outs = {key: call(feeds) for key, call in calls.items()}  # the warm-up calls
        times: dict[tuple[str, str], list[float]] = {key: [] for key in calls}
        keys = list(calls)
        for r in range(rounds):
            for key in keys[r % len(keys):] + keys[: r % len(keys)]:
                t0 = time.perf_counter()
                calls[key](feeds)
                times[key].append((time.perf_counter() - t0) / prompts)

        def ratio(ref: tuple[str, str], key: tuple[str, str]) -> float:
            return float(np.median([a / b for a, b in zip(times[ref], times[key], strict=True)]))

        for rt, name in keys:
            diff = float(np.abs(outs[(rt, name)] - ref).max())
            lines.append(f"| {rt} | {name} | {1e3 * float(np.median(times[(rt, name)])):.2f} | "
                         f"{ratio(base, (rt, name)):.2f} | {ratio((rt, 'reference'), (rt, name)):.2f} | {diff:.2g} | "
                         f"{float(np.abs(ref).max()):.3g} | {nodes[name]} |")
    return lines


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="LiteMedSAM's exported decoder: segment-anything's attention vs the "
                                             "per-prompt projections on the prompt tokens")
    ap.add_argument("--rounds", type=int, default=13)
    ap.add_argument("--prompts", type=int, default=4, help="box prompts per call (the product: 4)")
    ap.add_argument("--runtimes", default="onnxruntime,openvino")
    args = ap.parse_args(argv)
    runtimes = args.runtimes.split(",")
    try:
        check_arguments(runtimes, args.rounds, args.prompts)
    except ValueError as exc:
        ap.error(str(exc))
    print("\n".join(compare(runtimes, args.rounds, args.prompts)))


if __name__ == "__main__":
    main()
