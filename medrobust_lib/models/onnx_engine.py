"""Exported inference on the CPU: a PyTorch module exported once to ONNX and run through ONNX
Runtime or OpenVINO (issue 47). Used by LiteMedSAM (:mod:`medrobust_lib.models.litemedsam`) for
its no-grad inference; gradients (attacks, fine-tuning) and CUDA stay in PyTorch.

**Export.** ``torch.onnx.export`` with its TorchScript exporter (``dynamo=False``) at opset
:data:`OPSET` (the dynamo exporter of torch 2.14 writes opset 18 and up only), in fp32, under
``torch.no_grad()``. The graph's inputs and outputs are named by a :class:`GraphSpec`; an axis is
dynamic only where the spec says so (a traced ``len(x)`` freezes a batch axis: LiteMedSAM's TinyViT
is exported at batch 1 and run one image at a time).

**Cache.** One folder per exported graph under the cache folder (a suite's
``<suite root>/cache/exports``, :func:`medrobust_lib.paths.suite_paths`; without a suite
:func:`default_cache_dir`): ``<graph>-<runtime>-<key>/`` holding ``model.onnx`` and
``manifest.json``. The key is the SHA-256 of the canonical JSON :func:`export_key` document: the
source checkpoint's SHA-256, the graph name, the runtime, :data:`EXPORTER_VERSION` (bumped when the
export code changes), the opset, the versions of torch, onnx and the runtime package, and the
caller's settings (the packages the module's code comes from, the mask selection): a change to any
of them exports again into a new folder. A folder is written atomically: exported, loaded and
checked in a temporary folder beside it, then renamed into place; a concurrent writer that got
there first wins and its folder is used.

**Checks, never a wrong number.** Before a new export is kept, the runtime's outputs on the
caller's check inputs must equal PyTorch's within :func:`agrees` (1e-4 + 1e-5 x the largest
magnitude, the official-fixture tolerance); otherwise nothing is kept. A cached folder is used only
when its manifest names the same key and ``model.onnx`` has the SHA-256 the manifest recorded, and
the runtime loads it; a broken folder is moved aside (``<name>.broken-<time>``, so that the next
load exports again) and :class:`ExportError` says why. The caller falls back to PyTorch with one
warning line (:mod:`medrobust_lib.models.litemedsam`).

**Runtimes.** ``onnxruntime`` (CPU execution provider, all graph optimisations, intra-op threads =
``torch.get_num_threads()``, no spin-waiting: the cores are shared with the perturbation feed) and
``openvino`` (CPU plugin, ``INFERENCE_PRECISION_HINT f32``: on a CPU with AMX or AVX512-BF16 the
plugin otherwise runs in bf16 by default, latency hint, the same thread count), or the two split by
graph (:data:`SPLIT_RUNTIME`: the image encoder on OpenVINO, the decoder on ONNX Runtime). ``auto``
takes the first installed of :data:`AUTO_PREFERENCE` (the choice and the measurements:
docs/performance.md).
Loaded graphs are kept per process by key (:data:`_GRAPHS`), so the models of one process share
them, even when their suites keep their exports in different folders.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import torch

from medrobust_lib.config.runtimes import (  # noqa: F401 (SPLIT_RUNTIME, graph_runtimes: re-exported)
    EXPORT_RUNTIMES,
    EXPORTED_RUNTIMES,
    RUNTIMES,
    SPLIT_RUNTIME,
    graph_runtimes,
    runtime_packages,
)
from medrobust_lib.hashing import canonical_json, digest, file_sha256
from medrobust_lib.lru import LRU

logger = logging.getLogger(__name__)

AUTO_PREFERENCE: tuple[str, ...] = (SPLIT_RUNTIME, "onnxruntime", "openvino")
"""What ``auto`` takes on the CPU in fp32: the first whose packages are installed (make setup
installs both). OpenVINO's encoder was 2-25 % faster than ONNX Runtime's on the three CPUs measured,
and ONNX Runtime's decoder 3-10 % faster than OpenVINO's on the two where both were measured
(docs/performance.md, seventh session)."""
OPSET = 17
EXPORTER_VERSION = 4
"""Bumped whenever the export code (wrappers, names, axes, checks) changes: every cached graph is
then exported again (2: LiteMedSAM's decoder exported channels last,
:mod:`medrobust_lib.models.sam_decode_export`; 3: the decoder takes one image's embedding for all
its prompts; 4: the per-prompt attention projections applied to the prompt tokens)."""
CACHE_ENV = "MEDROBUST_EXPORT_CACHE"
"""Overrides :func:`default_cache_dir` (for a model built without a suite)."""
MODEL_FILE = "model.onnx"
MANIFEST_FILE = "manifest.json"
ATOL = 1e-4
RTOL = 1e-5


Inputs = tuple[torch.Tensor, ...]
"""The positional inputs of a module to export."""


class ExportError(RuntimeError):
    """An exported graph that cannot be made, loaded or trusted (the message says why, one line)."""


@dataclass(frozen=True)
class GraphSpec:
    """One exported graph: ``name`` (e.g. ``image_encoder``), its input and output names in order,
    and its dynamic axes (``{input or output name: {axis: label}}``; the rest is fixed at the
    example's shape)."""

    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    dynamic_axes: Mapping[str, Mapping[int, str]] = field(default_factory=dict)


def default_cache_dir() -> Path:
    """``$MEDROBUST_EXPORT_CACHE``, else ``$XDG_CACHE_HOME/medrobust/exports`` (``~/.cache/...``):
    where a model built without a suite (a notebook, a bench) keeps its exports. A suite's runs use
    ``<suite root>/cache/exports``."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(base).expanduser() / "medrobust" / "exports"


def runtime_installed(runtime: str) -> bool:
    """Whether the packages of an exported ``runtime`` setting (``onnxruntime``, ``openvino`` or
    both) and the ``onnx`` package that the exporter needs are importable (looked up, not imported)."""
    return all(importlib.util.find_spec(name) is not None for name in runtime_packages(runtime))


def resolve_runtime(runtime: str, device: str, precision: str) -> str:
    """The runtime that will run inference: ``pytorch`` or one of :data:`EXPORTED_RUNTIMES`
    (``onnxruntime``, ``openvino``, ``openvino+onnxruntime``).

    ``auto``: the first installed of :data:`AUTO_PREFERENCE` on the CPU in fp32, else ``pytorch``
    (``precision`` is the resolved arithmetic, ``fp32`` or ``bf16``: the exported graphs are fp32,
    so bf16 autocast stays with PyTorch). An explicit runtime is returned as given (one that turns
    out not to load falls back at run time, with a warning).

    Raises:
        ValueError: an unknown runtime, or an exported runtime asked for on a CUDA device or in bf16.
    """
    if runtime not in RUNTIMES:
        raise ValueError(f"unknown runtime {runtime!r}; valid: {', '.join(RUNTIMES)}")
    cpu = torch.device(device).type == "cpu"
    if runtime == "auto":
        if not cpu or precision != "fp32":
            return "pytorch"
        return next((rt for rt in AUTO_PREFERENCE if runtime_installed(rt)), "pytorch")
    if runtime in EXPORTED_RUNTIMES and not cpu:
        raise ValueError(f"runtime {runtime!r} runs on the CPU; device {device!r} runs PyTorch (runtime: pytorch or auto)")
    if runtime in EXPORTED_RUNTIMES and precision != "fp32":
        raise ValueError(f"runtime {runtime!r} runs the exported graph in fp32; precision {precision!r} needs "
                         "runtime: pytorch (or auto)")
    return runtime


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def export_key(source_sha256: str, graph: str, runtime: str, settings: Mapping[str, Any]) -> dict[str, Any]:
    """The document whose SHA-256 names a cached export (module docstring): everything that changes
    the exported file or how it is run."""
    return {"source_sha256": source_sha256, "graph": graph, "runtime": runtime, "exporter": EXPORTER_VERSION,
            "opset": OPSET, "torch": torch.__version__, "onnx": _version("onnx"), runtime: _version(runtime),
            "settings": dict(settings)}


def key_digest(doc: Mapping[str, Any]) -> str:
    """First 24 hex digits of :func:`medrobust_lib.hashing.digest` of ``doc`` (the project's one
    canonical JSON form)."""
    return digest(dict(doc))[:24]


def export_folder(cache_dir: Path, doc: Mapping[str, Any]) -> Path:
    """``<cache_dir>/<graph>-<runtime>-<key>``."""
    return Path(cache_dir) / f"{doc['graph']}-{doc['runtime']}-{key_digest(doc)}"


def agrees(got: np.ndarray, ref: np.ndarray) -> tuple[bool, float]:
    """Whether ``got`` equals ``ref`` within ``ATOL + RTOL * max|ref|`` everywhere (and has its
    shape, all finite), and the largest absolute difference."""
    if got.shape != ref.shape or not np.isfinite(got).all():
        return False, float("inf")
    diff = float(np.max(np.abs(got.astype(np.float64) - ref.astype(np.float64)))) if got.size else 0.0
    ok = diff <= ATOL + RTOL * float(np.max(np.abs(ref))) if ref.size else True
    return ok, diff


class ExportedGraph:
    """A loaded graph: ``graph(*arrays)`` -> its outputs (float32 numpy arrays, owned by the
    caller), inputs in :attr:`GraphSpec.inputs` order."""

    def __init__(self, path: Path, spec: GraphSpec, runtime: str, threads: int) -> None:
        self.path = path
        self.spec = spec
        self.runtime = runtime
        self.threads = threads
        self._run: Callable[[Sequence[np.ndarray]], list[np.ndarray]]
        if runtime == "onnxruntime":
            self._run = _onnxruntime_runner(path, spec, threads)
        elif runtime == "openvino":
            self._run = _openvino_runner(path, threads)
        else:
            raise ValueError(f"runtime {runtime!r} runs no exported graph; valid: {', '.join(EXPORT_RUNTIMES)}")

    def __call__(self, *arrays: np.ndarray) -> list[np.ndarray]:
        return self._run([np.ascontiguousarray(a, dtype=np.float32) for a in arrays])


def import_onnxruntime() -> Any:
    """The ``onnxruntime`` module with its telemetry off (the only place this project imports it).

    ONNX Runtime's Linux wheels carry Microsoft's 1DS telemetry (the pinned 1.32.0 does): importing
    it creates its environment, which writes a persistent device id and an offline event store under
    ``~/.cache/Microsoft/DeveloperTools/.onnxruntime`` and starts an uploader. Nothing may reach the
    internet at run time, so ``ORT_DISABLE_TELEMETRY=1`` (ONNX Runtime's own full opt-out, read once
    when that environment is created) is set first unless the caller's environment sets it. A process
    that imported ``onnxruntime`` before this call has already started its telemetry."""
    os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
    import onnxruntime

    return onnxruntime


def _onnxruntime_runner(path: Path, spec: GraphSpec, threads: int) -> Callable[[Sequence[np.ndarray]], list[np.ndarray]]:
    ort = import_onnxruntime()

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")  # shared cores: no busy waiting
    so.log_severity_level = 3
    session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    names = list(spec.inputs)

    def run(arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        return [np.asarray(o) for o in session.run(None, dict(zip(names, arrays, strict=True)))]

    return run


def import_openvino() -> Any:
    """The ``openvino`` module, imported without its telemetry (the only place this project imports it).

    ``import openvino`` imports ``openvino.tools.ovc``, which starts ``openvino_telemetry``: with no
    consent file under ``~/intel`` it counts every import in ``~/intel/stats`` and sends an event to
    Google Analytics from a background thread. Nothing may reach the internet at run time, so the
    telemetry package is hidden before the first import (``sys.modules["openvino_telemetry"] =
    None``: ovc then takes its own no-op stub). A process that imported ``openvino`` before this
    call has already started its telemetry; this cannot undo that."""
    sys.modules.setdefault("openvino_telemetry", None)  # type: ignore[arg-type]
    import openvino

    return openvino


def _openvino_runner(path: Path, threads: int) -> Callable[[Sequence[np.ndarray]], list[np.ndarray]]:
    ov = import_openvino()
    core = ov.Core()
    compiled = core.compile_model(core.read_model(str(path)), "CPU", {
        "INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": threads})
    request = compiled.create_infer_request()
    outputs = list(compiled.outputs)

    def run(arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        result = request.infer(list(arrays))
        return [np.array(result[o], dtype=np.float32, copy=True) for o in outputs]  # the request reuses its buffers

    return run


_GRAPHS: LRU[tuple[str, str, int], ExportedGraph] = LRU(max_items=8, name="models.exported_graphs")
"""Loaded graphs by (key digest, runtime, threads): the models of one process share them, whichever
cache folder they name (the key says what the graph is; a suite's folder is where it is kept)."""


def _one_line(exc: BaseException) -> str:
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return text[:300]


def _move_aside(folder: Path) -> Path | None:
    """Rename a broken cache folder to ``<name>.broken-<time>`` (kept for inspection); None if it
    could not be moved (another process did, or the folder is read-only)."""
    target = folder.with_name(f"{folder.name}.broken-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}")
    try:
        folder.rename(target)
        return target
    except OSError:
        return None


def _load_cached(folder: Path, doc: Mapping[str, Any], spec: GraphSpec, runtime: str, threads: int) -> ExportedGraph:
    """The graph of an existing cache folder, checked (module docstring); ExportError when broken
    (the folder is then moved aside)."""
    try:
        manifest = json.loads((folder / MANIFEST_FILE).read_text(encoding="utf-8"))
        if manifest.get("key") != json.loads(canonical_json(doc)):  # the key as the manifest stored it
            raise ValueError("its manifest names another key")
        sha = file_sha256(folder / MODEL_FILE)
        if sha != manifest.get("sha256"):
            raise ValueError(f"{MODEL_FILE} has SHA-256 {sha[:16]}..., the manifest recorded "
                             f"{str(manifest.get('sha256'))[:16]}...")
        return ExportedGraph(folder / MODEL_FILE, spec, runtime, threads)
    except Exception as exc:  # any fault of a cached file means: do not use it
        moved = _move_aside(folder)
        where = f"moved aside to {moved.name}; the next load exports again" if moved else "left in place"
        raise ExportError(f"cached export {folder} is broken ({_one_line(exc)}); {where}") from None


def _fsync(path: Path) -> None:
    with path.open("rb") as fh:
        os.fsync(fh.fileno())


@contextlib.contextmanager
def _eval_mode(module: torch.nn.Module) -> Iterator[None]:
    """``module`` and every submodule in eval mode inside, each back in its own mode after.

    ``torch.onnx.export`` switches a module to eval and back to *the top module's* flag, which
    ``train(flag)`` applies to every child: a wrapper built for the export (``training`` True, as
    every new module) would leave the wrapped model in training mode, and a TinyViT encoder in
    training mode normalises with batch statistics and overwrites its BatchNorm running stats."""
    modes = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        yield
    finally:
        for m, training in modes:
            m.training = training


def export_graph(module: torch.nn.Module, example: Inputs, spec: GraphSpec, path: Path) -> None:
    """``module`` traced on ``example`` and written to ``path`` as ONNX the way every cached graph
    is (TorchScript exporter, :data:`OPSET`, constant folding, ``spec``'s names and dynamic axes)."""
    with warnings.catch_warnings(), torch.no_grad():
        # the TorchScript exporter warns about its deprecation, traced shapes and constant folding
        warnings.simplefilter("ignore")
        torch.onnx.export(module, example, str(path), opset_version=OPSET, dynamo=False, do_constant_folding=True,
                          input_names=list(spec.inputs), output_names=list(spec.outputs),
                          dynamic_axes={k: dict(v) for k, v in spec.dynamic_axes.items()} or None)


def load_or_export(module: torch.nn.Module, inputs: Callable[[], tuple[Inputs, Sequence[Inputs]]], spec: GraphSpec, *,
                   source_sha256: str, runtime: str, cache_dir: Path | None,
                   settings: Mapping[str, Any], reference: torch.nn.Module | None = None) -> ExportedGraph:
    """The graph of ``module`` (in eval mode, fp32, CPU; its weights those of the checkpoint with
    SHA-256 ``source_sha256``) run by ``runtime``: from the cache when a good export is there, else
    exported now and kept. ``inputs()`` (called only to export) gives the example the export traces
    and the input tuples on which the runtime is checked against ``reference`` (default ``module``
    itself; a module exported in another layout names the PyTorch path it stands for). ``cache_dir``:
    None for :func:`default_cache_dir`.

    Raises:
        ExportError: the runtime or the exporter is not installed, the export fails, disagrees with
            PyTorch, or the cached folder is broken (moved aside); the message is one line.
    """
    if runtime not in EXPORT_RUNTIMES:
        raise ValueError(f"runtime {runtime!r} runs no exported graph; valid: {', '.join(EXPORT_RUNTIMES)}")
    missing = [name for name in (runtime, "onnx") if importlib.util.find_spec(name) is None]
    if missing:
        raise ExportError(f"{' and '.join(missing)} not installed (make setup installs them)")
    threads = max(1, torch.get_num_threads())
    doc = export_key(source_sha256, spec.name, runtime, settings)
    folder = export_folder(cache_dir or default_cache_dir(), doc)
    held_key = (key_digest(doc), runtime, threads)
    held = _GRAPHS.get(held_key)
    if held is not None:
        return held
    if folder.is_dir():  # only ever renamed into place complete: anything wrong with it means broken
        graph = _load_cached(folder, doc, spec, runtime, threads)
    else:
        graph = _export_into(folder, module, inputs, spec, doc, runtime, threads,
                             module if reference is None else reference)
    _GRAPHS.put(held_key, graph)
    return graph


def _export_into(folder: Path, module: torch.nn.Module, inputs: Callable[[], tuple[Inputs, Sequence[Inputs]]],
                 spec: GraphSpec, doc: Mapping[str, Any], runtime: str, threads: int,
                 reference: torch.nn.Module) -> ExportedGraph:
    """Export, check against ``reference`` and atomically place a new cache folder (module docstring)."""
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.tmp-", dir=folder.parent))
        tmp.chmod(0o755)  # mkdtemp's 0700 would hide the cache from the other users of a shared folder
    except OSError as exc:
        raise ExportError(f"cannot write the export cache {folder.parent} ({_one_line(exc)})") from None
    try:
        t0 = time.perf_counter()
        with _eval_mode(module):  # the inputs too: LiteMedSAM's decoder example runs its encoder
            example, checks = inputs()
            export_graph(module, example, spec, tmp / MODEL_FILE)
        graph = ExportedGraph(tmp / MODEL_FILE, spec, runtime, threads)
        worst = 0.0
        for xs in checks:
            with torch.no_grad(), _eval_mode(reference):
                ref = reference(*xs)
            refs = [r.detach().float().cpu().numpy() for r in (ref if isinstance(ref, tuple | list) else (ref,))]
            got = graph(*(x.detach().float().cpu().numpy() for x in xs))
            for g, r in zip(got, refs, strict=True):
                ok, diff = agrees(g, r)
                worst = max(worst, diff)
                if not ok:
                    raise ExportError(f"the exported {spec.name} disagrees with PyTorch (max abs difference {diff:.3g}, "
                                      f"shape {g.shape} vs {r.shape}); not kept")
        manifest = {"key": doc, "sha256": file_sha256(tmp / MODEL_FILE), "max_abs_diff": worst,
                    "tolerance": f"{ATOL:g} + {RTOL:g} * max|ref|", "export_seconds": round(time.perf_counter() - t0, 3),
                    "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        (tmp / MANIFEST_FILE).write_text(json.dumps(manifest, sort_keys=True, indent=1, default=str), encoding="utf-8")
        for name in (MODEL_FILE, MANIFEST_FILE):
            _fsync(tmp / name)
        try:
            os.replace(tmp, folder)
        except OSError:
            if not (folder / MANIFEST_FILE).is_file():  # not a concurrent writer's finished folder
                raise
            shutil.rmtree(tmp, ignore_errors=True)
            return _load_cached(folder, doc, spec, runtime, threads)
        graph.path = folder / MODEL_FILE  # the runtime read the whole file when it loaded: the rename is safe
        return graph
    except ExportError:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    except Exception as exc:  # the exporter or the runtime failed: no export, PyTorch runs
        shutil.rmtree(tmp, ignore_errors=True)
        raise ExportError(f"exporting {spec.name} for {runtime} failed ({_one_line(exc)})") from None
