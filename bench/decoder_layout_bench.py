"""LiteMedSAM's exported mask decoder in two layouts, timed in one process (issue 47).

``reference``: segment-anything's own attention modules in every two-way block (the graph that
``EXPORTER_VERSION`` 3 exported); ``tokens``: the per-prompt projections of the image tokens
applied to the prompt tokens after the first block (the default,
:mod:`medrobust_lib.models.sam_decode_export`). Both are exported from the packaged release
(``torch.onnx.export``, opset 17, as :mod:`medrobust_lib.models.onnx_engine` exports) into a
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
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from medrobust_lib.models.litemedsam import DECODER_GRAPH, IMAGE_SIZE, load_litemedsam
from medrobust_lib.models.onnx_engine import OPSET, ExportedGraph
from medrobust_lib.models.sam_decode_export import DecodeLowForExport

LAYOUTS = {"reference": False, "tokens": True}
"""Layout name -> ``DecodeLowForExport(projections_on_tokens=...)``."""
BOXES = np.array([[40.0, 52.0, 200.0, 180.0], [0.0, 0.0, 255.0, 255.0], [97.0, 12.0, 130.0, 33.0],
                  [3.0, 150.0, 12.0, 161.0], [120.0, 130.0, 160.0, 170.0], [10.0, 10.0, 60.0, 90.0],
                  [200.0, 20.0, 250.0, 60.0], [60.0, 200.0, 140.0, 250.0]], np.float32)
"""Model-grid XYXY boxes (256 px); the first ``--prompts`` are used."""


def export(layout: str, folder: Path) -> tuple[Path, np.ndarray]:
    """The packaged release's decoder in ``layout`` as ``<folder>/<layout>.onnx`` (traced with 2
    prompts, the prompt axis dynamic), and a real embedding (1, 256, 64, 64) float32 of a smooth
    random image to run it on."""
    seg = load_litemedsam(runtime="pytorch")
    g = torch.Generator().manual_seed(3)
    x = torch.nn.functional.interpolate(torch.rand(1, 3, 16, 16, generator=g), size=IMAGE_SIZE, mode="bilinear")
    module = DecodeLowForExport(seg, projections_on_tokens=LAYOUTS[layout]).eval()
    path = folder / f"{layout}.onnx"
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation and tracer warnings
        emb = seg.sam.image_encoder(x)
        torch.onnx.export(module, (emb, torch.from_numpy(BOXES[:2])), str(path), opset_version=OPSET, dynamo=False,
                          do_constant_folding=True, input_names=list(DECODER_GRAPH.inputs), output_names=list(DECODER_GRAPH.outputs),
                          dynamic_axes={k: dict(v) for k, v in DECODER_GRAPH.dynamic_axes.items()})
    return path, emb.numpy()


def runner(runtime: str, path: Path, threads: int) -> Callable[[dict[str, np.ndarray]], np.ndarray]:
    """A call of the graph at ``path`` as the product runs it (:class:`ExportedGraph`: ``onnxruntime``
    or ``openvino``, fp32, ``threads`` threads, ONNX Runtime without busy waiting) -> the logits."""
    graph = ExportedGraph(path, DECODER_GRAPH, runtime, threads)
    return lambda feeds: graph(*(feeds[name] for name in DECODER_GRAPH.inputs))[0]


def compare(runtimes: list[str], rounds: int, prompts: int) -> list[str]:
    """Markdown lines: per runtime and layout, ms per prompt, x the first runtime's reference
    layout and x the same runtime's reference layout (paired medians: every graph of every runtime
    is timed once per round), and the largest logit difference from the same runtime's reference."""
    if not 1 <= prompts <= len(BOXES):
        raise ValueError(f"--prompts must be 1-{len(BOXES)}, got {prompts}")
    if rounds < 1:
        raise ValueError(f"--rounds must be >= 1, got {rounds}")
    threads = max(1, torch.get_num_threads())
    base = (runtimes[0], "reference")
    lines = [f"\n### LiteMedSAM decoder layouts ({threads} threads, {prompts} prompts a call, "
             f"kernels {torch.backends.cpu.get_cpu_capability()})",
             f"| runtime | layout | ms/prompt | x {base[0]} reference | x same runtime's reference | "
             "max abs logit diff vs same runtime's reference |", "|---|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        graphs = {name: export(name, Path(tmp)) for name in LAYOUTS}
        feeds = dict(zip(DECODER_GRAPH.inputs, (graphs["reference"][1], BOXES[:prompts]), strict=True))
        calls = {(rt, name): runner(rt, path, threads) for rt in runtimes for name, (path, _) in graphs.items()}
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
            own = (rt, "reference")
            diff = float(np.abs(outs[(rt, name)] - outs[own]).max())
            lines.append(f"| {rt} | {name} | {1e3 * float(np.median(times[(rt, name)])):.2f} | "
                         f"{ratio(base, (rt, name)):.2f} | {ratio(own, (rt, name)):.2f} | {diff:.2g} |")
    return lines


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="LiteMedSAM's exported decoder: segment-anything's attention vs the "
                                             "per-prompt projections on the prompt tokens")
    ap.add_argument("--rounds", type=int, default=13)
    ap.add_argument("--prompts", type=int, default=4, help="box prompts per call (the product: 4)")
    ap.add_argument("--runtimes", default="onnxruntime,openvino")
    args = ap.parse_args(argv)
    runtimes = args.runtimes.split(",")
    unknown = sorted(set(runtimes) - {"onnxruntime", "openvino"})
    if unknown or args.rounds < 1 or not 1 <= args.prompts <= len(BOXES):
        ap.error(f"--runtimes: onnxruntime and/or openvino (got {', '.join(unknown)})" if unknown else
                 f"--rounds must be >= 1 and --prompts 1-{len(BOXES)}")
    print("\n".join(compare(runtimes, args.rounds, args.prompts)))


if __name__ == "__main__":
    main()
