"""The exported-graph cache and runtimes (:mod:`medrobust_lib.models.onnx_engine`) on a small
module: export once, load from the cache, keys that change with everything the export follows
from, atomic folders, broken exports refused (never used), and the runtime choice."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from medrobust_lib.models import onnx_engine as oe

SPEC = oe.GraphSpec("tiny", ("x",), ("y",), {"x": {0: "n"}, "y": {0: "n"}})
SHA = "ab" * 32


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.lin = torch.nn.Linear(8, 2)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(torch.nn.functional.gelu(self.conv(x)).mean(dim=(2, 3)))


def _inputs() -> tuple[tuple[torch.Tensor, ...], list[tuple[torch.Tensor, ...]]]:
    x = torch.rand(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    return (x,), [(x,), (x[:1],)]


def _never() -> tuple[tuple[torch.Tensor, ...], list[tuple[torch.Tensor, ...]]]:
    raise AssertionError("exported again although a good export is cached")


@pytest.fixture(autouse=True)
def _fresh_process_cache() -> Iterator[None]:
    """Each test sees only its own cache folder (the per-process graphs are keyed by content)."""
    oe._GRAPHS.clear()
    yield
    oe._GRAPHS.clear()


def _load(tmp: Path, module: torch.nn.Module | None = None, runtime: str = "onnxruntime", inputs=_inputs,
          sha: str = SHA) -> oe.ExportedGraph:
    return oe.load_or_export(module or Tiny().eval(), inputs, SPEC, source_sha256=sha, runtime=runtime,
                             cache_dir=tmp, settings={"what": "tiny"})


def _folders(tmp: Path) -> list[str]:
    return sorted(p.name for p in tmp.iterdir())


@pytest.mark.parametrize("runtime", ["onnxruntime", "openvino"])
def test_exported_once_then_loaded_from_the_cache(tmp_path: Path, runtime: str) -> None:
    module = Tiny().eval()
    x = torch.rand(5, 3, 16, 16, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = module(x).numpy()
    graph = _load(tmp_path, module, runtime)
    np.testing.assert_allclose(graph(x.numpy())[0], ref, atol=1e-5)  # a dynamic batch axis
    [name] = _folders(tmp_path)  # one folder, no temporary left behind
    assert name.startswith(f"tiny-{runtime}-")
    manifest = json.loads((tmp_path / name / oe.MANIFEST_FILE).read_text())
    assert manifest["key"]["source_sha256"] == SHA and manifest["key"]["opset"] == oe.OPSET == 17
    assert manifest["max_abs_diff"] < 1e-5
    oe._GRAPHS.clear()  # a new process: read from disk, not exported again
    np.testing.assert_allclose(_load(tmp_path, module, runtime, inputs=_never)(x.numpy())[0], ref, atol=1e-5)
    assert _folders(tmp_path) == [name]


class _Wrapper(torch.nn.Module):
    """A module built for the export around a model (new modules start in training mode)."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)


def test_the_export_leaves_every_module_in_its_own_mode(tmp_path: Path) -> None:
    """torch.onnx.export restores only the top module's flag (to every child): a wrapper in
    training mode around a model in eval mode must not leave the model training, whose BatchNorm
    would then normalise with batch statistics and overwrite its running stats."""
    inner = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Dropout(0.5)).eval()
    inner[2].train()  # a child in another mode than its parent keeps it too
    with torch.no_grad():
        inner[1].running_mean.uniform_(-1.0, 1.0, generator=torch.Generator().manual_seed(4))
    before = {k: v.clone() for k, v in inner.state_dict().items()}
    wrapper = _Wrapper(inner)
    assert wrapper.training

    def inputs() -> tuple[tuple[torch.Tensor, ...], list[tuple[torch.Tensor, ...]]]:
        x = torch.rand(2, 3, 8, 8, generator=torch.Generator().manual_seed(5))
        return (x,), [(x,)]  # checked in eval mode: the Dropout (training) would disagree otherwise

    _load(tmp_path, wrapper, inputs=inputs)
    assert wrapper.training and not inner.training and not inner[1].training and inner[2].training
    for k, v in inner.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_the_key_changes_with_the_checkpoint_the_exporter_and_the_versions(monkeypatch: pytest.MonkeyPatch) -> None:
    def folder(**kw: object) -> str:
        doc = oe.export_key(str(kw.get("sha", SHA)), "tiny", str(kw.get("runtime", "onnxruntime")),
                            {"what": kw.get("what", "tiny")})
        return oe.export_folder(Path("/c"), doc).name

    base = folder()
    assert folder(sha="cd" * 32) != base
    assert folder(runtime="openvino") != base and folder(what="other") != base
    monkeypatch.setattr(oe, "EXPORTER_VERSION", oe.EXPORTER_VERSION + 1)
    assert folder() != base
    monkeypatch.undo()
    monkeypatch.setattr(oe.torch, "__version__", "9.9.9")
    assert folder() != base
    monkeypatch.undo()
    real = oe._version
    monkeypatch.setattr(oe, "_version", lambda dist: "0.0" if dist == "onnx" else real(dist))
    assert folder() != base
    monkeypatch.undo()
    assert folder() == base


def test_a_new_exporter_version_exports_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _load(tmp_path)
    monkeypatch.setattr(oe, "EXPORTER_VERSION", oe.EXPORTER_VERSION + 1)
    _load(tmp_path)
    assert len(_folders(tmp_path)) == 2


@pytest.mark.parametrize("damage", ["truncated", "bytes", "manifest", "no_manifest", "other_key"])
def test_a_broken_cached_export_is_refused_and_moved_aside(tmp_path: Path, damage: str) -> None:
    _load(tmp_path)
    [name] = _folders(tmp_path)
    folder = tmp_path / name
    model, manifest = folder / oe.MODEL_FILE, folder / oe.MANIFEST_FILE
    if damage == "truncated":
        model.write_bytes(model.read_bytes()[:100])
    elif damage == "bytes":
        data = bytearray(model.read_bytes())
        data[-20:-10] = b"\x00" * 10  # inside the weights: the runtime would load it and be wrong
        model.write_bytes(bytes(data))
    elif damage == "manifest":
        manifest.write_text("{not json")
    elif damage == "no_manifest":
        manifest.unlink()
    else:
        doc = json.loads(manifest.read_text())
        doc["key"]["source_sha256"] = "0" * 64
        manifest.write_text(json.dumps(doc))
    oe._GRAPHS.clear()
    with pytest.raises(oe.ExportError, match="is broken") as info:
        _load(tmp_path, inputs=_never)
    assert "\n" not in str(info.value)
    assert not folder.exists() and any(".broken-" in n for n in _folders(tmp_path))
    _load(tmp_path)  # the next load exports again
    assert folder.is_dir()


def test_an_export_that_disagrees_with_pytorch_is_not_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(oe, "agrees", lambda got, ref: (False, 0.5))
    with pytest.raises(oe.ExportError, match=r"disagrees with PyTorch \(max abs difference 0.5"):
        _load(tmp_path)
    assert _folders(tmp_path) == []  # nothing kept, no temporary folder left


def test_the_runtime_is_checked_against_the_reference_module(tmp_path: Path) -> None:
    """A module exported in another layout is checked against the PyTorch path it stands for: the
    same function passes, another one is refused and nothing is kept."""
    class Scaled(Tiny):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return super().forward(x) * 1.01

    same = oe.load_or_export(Tiny().eval(), _inputs, SPEC, source_sha256=SHA, runtime="onnxruntime", cache_dir=tmp_path,
                             settings={"what": "tiny"}, reference=Tiny().eval())
    x = _inputs()[0][0]
    with torch.no_grad():
        np.testing.assert_allclose(same(x.numpy())[0], Tiny()(x).numpy(), atol=1e-5)
    oe._GRAPHS.clear()
    with pytest.raises(oe.ExportError, match="disagrees with PyTorch"):
        oe.load_or_export(Tiny().eval(), _inputs, SPEC, source_sha256="cd" * 32, runtime="onnxruntime",
                          cache_dir=tmp_path, settings={"what": "tiny"}, reference=Scaled().eval())
    assert len(_folders(tmp_path)) == 1  # only the first export


def test_an_exporter_failure_is_an_export_error(tmp_path: Path) -> None:
    class Bad(Tiny):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise RuntimeError("cannot trace\nthis")

    with pytest.raises(oe.ExportError, match="exporting tiny for onnxruntime failed") as info:
        _load(tmp_path, Bad())
    assert "\n" not in str(info.value) and _folders(tmp_path) == []


def test_a_missing_runtime_is_an_export_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = oe.importlib.util.find_spec
    monkeypatch.setattr(oe.importlib.util, "find_spec", lambda name, *a: None if name == "openvino" else real(name, *a))
    with pytest.raises(oe.ExportError, match="openvino not installed"):
        _load(tmp_path, runtime="openvino")
    assert not oe.runtime_installed("openvino") and oe.runtime_installed("onnxruntime")


def test_the_runtime_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    # auto: the encoder through OpenVINO and the decoder through ONNX Runtime where both are installed
    assert oe.resolve_runtime("auto", "cpu", "fp32") == oe.SPLIT_RUNTIME == "openvino+onnxruntime"
    assert oe.graph_runtimes(oe.SPLIT_RUNTIME) == ("openvino", "onnxruntime")
    assert oe.graph_runtimes("onnxruntime") == ("onnxruntime", "onnxruntime")
    assert oe.graph_runtimes("openvino") == ("openvino", "openvino")
    with pytest.raises(ValueError, match="runs no exported graph"):
        oe.graph_runtimes("pytorch")
    assert oe.resolve_runtime(oe.SPLIT_RUNTIME, "cpu", "fp32") == oe.SPLIT_RUNTIME
    assert oe.resolve_runtime("auto", "cpu", "bf16") == "pytorch"  # the graphs are fp32: autocast stays in torch
    assert oe.resolve_runtime("auto", "cuda:1", "fp32") == "pytorch"
    assert oe.resolve_runtime("pytorch", "cpu", "fp32") == "pytorch"
    assert oe.resolve_runtime("openvino", "cpu", "fp32") == "openvino"
    with pytest.raises(ValueError, match="unknown runtime 'tensorrt'; valid: auto, pytorch, onnxruntime, openvino, "
                                         "openvino\\+onnxruntime$"):
        oe.resolve_runtime("tensorrt", "cpu", "fp32")
    with pytest.raises(ValueError, match="runs on the CPU"):
        oe.resolve_runtime("onnxruntime", "cuda", "fp32")
    with pytest.raises(ValueError, match="runs the exported graph in fp32"):
        oe.resolve_runtime("openvino", "cpu", "bf16")
    with pytest.raises(ValueError, match="runs on the CPU"):
        oe.resolve_runtime(oe.SPLIT_RUNTIME, "cuda", "fp32")
    # one runtime installed: auto takes it; none: PyTorch
    real = oe.importlib.util.find_spec
    for gone, left in (("openvino", "onnxruntime"), ("onnxruntime", "openvino")):
        monkeypatch.setattr(oe.importlib.util, "find_spec", lambda name, *a, gone=gone: None if name == gone
                            else real(name, *a))
        assert not oe.runtime_installed(oe.SPLIT_RUNTIME) and oe.runtime_installed(left)
        assert oe.resolve_runtime("auto", "cpu", "fp32") == left
    monkeypatch.setattr(oe, "runtime_installed", lambda runtime: False)
    assert oe.resolve_runtime("auto", "cpu", "fp32") == "pytorch"


def test_the_default_cache_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(oe.CACHE_ENV, str(tmp_path / "x"))
    assert oe.default_cache_dir() == tmp_path / "x"
    monkeypatch.delenv(oe.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert oe.default_cache_dir() == tmp_path / "xdg" / "medrobust" / "exports"


def test_the_suite_key_names_every_runtime() -> None:
    """``segmentation.models[].runtime``'s allowed values are the runtime names the engine knows, and
    each exported setting names the packages it imports."""
    from typing import get_args

    from medrobust_lib.config.runtimes import runtime_packages
    from medrobust_lib.config.segmentation import SegModelConfig

    assert get_args(SegModelConfig.model_fields["runtime"].annotation) == oe.RUNTIMES
    assert runtime_packages(oe.SPLIT_RUNTIME) == ("openvino", "onnxruntime", "onnx")
    assert runtime_packages("onnxruntime") == ("onnxruntime", "onnx")


_RELU = ("import numpy as np, onnx; from onnx import helper, TensorProto; "
         "g = helper.make_graph([helper.make_node('Relu', ['x'], ['y'])], 'g', "
         "[helper.make_tensor_value_info('x', TensorProto.FLOAT, [1])], [helper.make_tensor_value_info('y', TensorProto.FLOAT, [1])]); "
         "model = helper.make_model(g, opset_imports=[helper.make_opsetid('', 17)]).SerializeToString(); ")


@pytest.mark.parametrize("runtime", ["openvino", "onnxruntime"])
def test_the_runtimes_are_imported_without_their_telemetry(runtime: str, tmp_path: Path) -> None:
    """A plain import starts the runtime's telemetry: OpenVINO's writes ``~/intel/stats`` and would send
    an event to Google Analytics, ONNX Runtime's writes a device id and an event store under
    ``~/.cache/Microsoft`` for its uploader (the proxy below keeps any request on this machine).
    Through ``import_<runtime>`` nothing is written under the home folder and the runtime still works."""
    import os
    import subprocess
    import sys

    ours = {"openvino": "ov = oe.import_openvino(); assert ov.Core().available_devices; "
                        "assert sys.modules['openvino_telemetry'] is None",
            "onnxruntime": "ort = oe.import_onnxruntime(); "
                           "s = ort.InferenceSession(model, providers=['CPUExecutionProvider']); "
                           "assert s.run(None, {'x': np.array([-1.0], np.float32)})[0].tolist() == [0.0]"}[runtime]
    marks = {"openvino": "intel/stats", "onnxruntime": ".cache/Microsoft/DeveloperTools/.onnxruntime"}[runtime]
    for name, code in (("plain", f"import {runtime}"),
                       ("ours", f"import sys; {_RELU}from medrobust_lib.models import onnx_engine as oe; {ours}")):
        home = tmp_path / name
        home.mkdir()
        env = {**os.environ, "HOME": str(home), "https_proxy": "http://127.0.0.1:9", "http_proxy": "http://127.0.0.1:9"}
        for quiet in ("CI", "GITHUB_ACTIONS", "GITLAB_CI", "CIRCLECI", "TF_BUILD", "JENKINS_URL", "ORT_DISABLE_TELEMETRY"):
            env.pop(quiet, None)  # both stay quiet on CI services: the control must not
        subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120, cwd=Path(__file__).parents[2])
    assert (tmp_path / "plain" / marks).exists()
    assert list((tmp_path / "ours").iterdir()) == []


def test_the_runtimes_are_imported_only_through_their_helpers() -> None:
    import re

    root = Path(__file__).parents[2]
    for runtime in ("openvino", "onnxruntime"):
        found = [str(p.relative_to(root)) for d in ("medrobust_lib", "medrobust_assets", "bench", "tools", "tests")
                 for p in (root / d).rglob("*.py")
                 if re.search(rf"^\s*(import {runtime}\b|from {runtime}\b)", p.read_text(encoding="utf-8"), re.M)]
        assert found == ["medrobust_lib/models/onnx_engine.py"], (runtime, found)
