"""The names of what runs a segmentation model's no-grad inference (``segmentation.models[].runtime``)
and the packages each needs: plain strings, no import of torch or a runtime, so that the suite's
validation and ``medrobust validate`` can check them without loading either
(:mod:`medrobust_lib.models.onnx_engine` runs them)."""

from __future__ import annotations

EXPORT_RUNTIMES: tuple[str, ...] = ("onnxruntime", "openvino")
"""The runtimes that run an exported ONNX graph (one graph: ``onnx_engine.load_or_export``)."""
SPLIT_RUNTIME = "openvino+onnxruntime"
"""A model's image encoder through OpenVINO and the rest (prompt encoder + mask decoder) through ONNX
Runtime: each graph on the runtime that ran it fastest on every CPU measured (docs/performance.md)."""
EXPORTED_RUNTIMES: tuple[str, ...] = (*EXPORT_RUNTIMES, SPLIT_RUNTIME)
"""The ``runtime`` settings under which a model's inference runs exported graphs
(:func:`graph_runtimes` says which runtime runs which graph)."""
RUNTIMES: tuple[str, ...] = ("auto", "pytorch", *EXPORTED_RUNTIMES)
"""What runs a model's no-grad inference (``segmentation.models[].runtime``)."""


def graph_runtimes(runtime: str) -> tuple[str, str]:
    """(the image encoder's runtime, the decoder's) under an exported ``runtime`` setting
    (:data:`EXPORTED_RUNTIMES`): ``onnxruntime`` -> both ONNX Runtime, ``openvino+onnxruntime`` ->
    (``openvino``, ``onnxruntime``).

    Raises:
        ValueError: a setting that runs no exported graph."""
    if runtime not in EXPORTED_RUNTIMES:
        raise ValueError(f"runtime {runtime!r} runs no exported graph; valid: {', '.join(EXPORTED_RUNTIMES)}")
    encoder, _, decoder = runtime.partition("+")
    return encoder, decoder or encoder


def runtime_packages(runtime: str) -> tuple[str, ...]:
    """The packages an exported ``runtime`` setting imports: its runtimes, each once, and ``onnx``
    (the exporter)."""
    return (*dict.fromkeys(graph_runtimes(runtime)), "onnx")
