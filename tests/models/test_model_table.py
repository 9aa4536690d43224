"""The model table: every family / kind the config accepts has an entry, entries resolve
lazily to classes, and the models built from real tiny models satisfy the protocols of
``models/base.py`` (the registry is the test matrix)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from medrobust_lib import model_table
from medrobust_lib.config import Suite
from medrobust_lib.config.segmentation import SegModelConfig
from medrobust_lib.config.vlm import VLMModelConfig, vlm_model
from medrobust_lib.model_table import ModelEntry
from medrobust_lib.models import base, factory
from medrobust_lib.models.factory import VLMInputs, build_segmenter, build_vlm, load_model_class

SEG_FAMILIES: tuple[str, ...] = get_args(SegModelConfig.model_fields["family"].annotation)
VLM_KINDS: tuple[str, ...] = get_args(VLMModelConfig.model_fields["kind"].annotation)
API = {"model": "tiny-remote", "base_url": "http://127.0.0.1:9/v1", "api_key_env": None}


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_the_config_literals_are_exactly_the_registered_names() -> None:
    """A new Literal value without a registry line (or a line no config can name) fails here."""
    assert SEG_FAMILIES and VLM_KINDS
    assert sorted(SEG_FAMILIES) == model_table.list_models("segmentation")
    assert sorted(VLM_KINDS) == model_table.list_models("vlm")
    assert model_table.list_models() == sorted(SEG_FAMILIES + VLM_KINDS)


@pytest.mark.parametrize("name", model_table.list_models())
def test_every_entry_resolves_to_a_class_with_from_config(name: str) -> None:
    entry = model_table.model_entry(name)
    cls = load_model_class(name, entry.task)
    assert f"{cls.__module__}:{cls.__qualname__}" == entry.class_path
    assert callable(getattr(cls, "from_config", None))
    assert hasattr(base, entry.protocol)


def test_unknown_names_list_the_known_ones() -> None:
    with pytest.raises(KeyError, match=r"unknown model 'nope'; known: api, hf, litemedsam, llava_rad, medsam, sam, sam_med2d"):
        load_model_class("nope")
    with pytest.raises(KeyError, match=r"unknown segmentation model 'hf'; known: litemedsam, medsam, sam, sam_med2d"):
        load_model_class("hf", "segmentation")  # a VLM kind is no segmentation family
    with pytest.raises(KeyError, match=r"unknown vlm model 'sam'; known: api, hf, llava_rad"):
        model_table.model_entry("sam", "vlm")


def test_the_entries_carry_what_callers_dispatch_on() -> None:
    """Callers read these fields instead of comparing names (see the next test)."""
    assert model_table.list_models("vlm", is_endpoint=True) == ["api"]
    assert model_table.list_models("vlm", local_weights=True) == ["hf", "llava_rad"]
    assert model_table.list_models("vlm", lora_finetunable=True) == ["hf"]
    assert model_table.list_models("segmentation", packaged=True) == ["litemedsam"]
    assert model_table.list_models("segmentation", exact_preprocess=True) == ["litemedsam", "medsam"]
    assert model_table.list_models("segmentation", demo_trainable=False) == ["litemedsam"]
    assert model_table.list_models("vlm", demo_trainable=False) == ["llava_rad"]
    assert model_table.model_entry("litemedsam").archs == ("tinyvit",) and model_table.model_entry("sam").archs == ()


def _name_branches(path: Path, names: set[str]) -> list[str]:
    """``x.kind == "hf"``-like comparisons (also ``!=``, ``in (...)``) of a ``kind`` / ``family``
    with a model name, in one source file."""
    import ast

    def is_subject(n: ast.AST) -> bool:
        return (isinstance(n, ast.Attribute) and n.attr in ("kind", "family")) or \
            (isinstance(n, ast.Name) and n.id in ("kind", "family"))

    def literals(n: ast.AST) -> set[str]:
        if isinstance(n, ast.Constant) and isinstance(n.value, str):
            return {n.value}
        if isinstance(n, ast.Tuple | ast.List | ast.Set):
            return {e.value for e in n.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
        return set()

    hits = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(is_subject(n) for n in sides) and any(literals(n) & names for n in sides):
                hits.append(f"{path.name}:{node.lineno}")
    return hits


def test_no_module_branches_on_a_model_name() -> None:
    """Outside the model table and the model classes themselves (a class serving several
    families, like SamSegmenter, may tell them apart), nothing compares a kind or family with a
    name: the old ``kind == "hf"`` branches in seven modules are fields of the entry now."""
    root = Path(__file__).resolve().parents[2]
    names = set(model_table.list_models())
    own = {model_table.model_entry(n).class_path.split(":")[0] for n in names}
    files = [*sorted((root / "medrobust_lib").rglob("*.py")), *sorted((root / "medrobust_assets").rglob("*.py")),
             root / "medrobust_cli.py"]
    hits = [h for f in files
            if ".".join(f.relative_to(root).with_suffix("").parts) not in own and f.name != "model_table.py"
            for h in _name_branches(f, names)]
    assert hits == []


def test_entries_are_validated_and_unique() -> None:
    with pytest.raises(ValueError, match="already registered"):
        model_table.register(model_table.model_entry("sam"))
    with pytest.raises(ValueError, match="class_path must be"):
        ModelEntry("x", "vlm", "medrobust_lib.models.hf_vlm.HFVisionLanguageModel", "VisionLanguageModel", True, "")
    with pytest.raises(ValueError, match="unknown protocol"):
        ModelEntry("x", "vlm", "m:C", "Model", True, "")


def test_a_missing_class_is_an_import_error(monkeypatch: pytest.MonkeyPatch) -> None:
    entry = ModelEntry("ghost", "vlm", "medrobust_lib.models.base:Ghost", "VisionLanguageModel", True, "")
    monkeypatch.setitem(model_table.MODELS._entries, "ghost", entry)
    with pytest.raises(ImportError, match="has no class 'Ghost'"):
        load_model_class("ghost")


def test_importing_the_table_imports_no_model_class() -> None:
    code = ("import sys, medrobust_lib.models.factory, medrobust_lib.model_table as r; r.list_models(); "
            "r.model_entry('hf'); "
            "heavy = [m for m in ('torch', 'transformers', 'segment_anything', 'httpx', "
            "'medrobust_lib.models.sam', 'medrobust_lib.models.hf_vlm', 'medrobust_lib.models.api_vlm') "
            "if m in sys.modules]; print(heavy); sys.exit(1 if heavy else 0)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize("family", SEG_FAMILIES)
def test_segmenters_built_from_tiny_checkpoints_satisfy_the_protocol(family: str, tmp_path: Path) -> None:
    from medrobust_lib.models.sam import SamSegmenter, arch_for, build_sam

    if family == "litemedsam":  # one architecture: LiteMedSAM's own (random weights here)
        from medrobust_lib.models.litemedsam import build_litemedsam

        sam, arch = build_litemedsam(seed=0), "tinyvit"
    else:
        sam, arch = build_sam(arch_for("tiny", family), seed=0), "tiny"  # type: ignore[arg-type]
    path = tmp_path / "model.safetensors"
    save_file({k: v.detach().clone().contiguous() for k, v in sam.state_dict().items()}, str(path))
    # LiteMedSAM in PyTorch: the protocol is the point here; exporting random weights for the
    # default runtime (auto) would take about 9 s (the exported runtimes: test_litemedsam_runtime.py)
    extra = {"runtime": "pytorch"} if family == "litemedsam" else {}
    m = SegModelConfig(id=f"tiny-{family}", family=family, arch=arch, checkpoint=str(path), **extra)  # type: ignore[arg-type]
    seg = build_segmenter(m, path)
    assert isinstance(seg, SamSegmenter) and isinstance(seg, base.SegmentationModel)
    assert seg.family == family and seg.model_id == m.id and len(seg.checkpoint_hash) > 0
    img = np.full((64, 64), 0.5, np.float32)
    probs = seg.predict([img], [np.array([[8, 8, 40, 40]], np.float32)])
    assert probs[0].shape == (1, 64, 64) and probs[0].dtype == np.float32


def test_segmentation_load_model_goes_through_the_registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from medrobust_lib.models.sam import arch_for, build_sam
    from medrobust_lib.tracks.segmentation.model import load_model

    path = tmp_path / "model.safetensors"
    sam = build_sam(arch_for("tiny", "medsam"), seed=0)
    save_file({k: v.detach().clone().contiguous() for k, v in sam.state_dict().items()}, str(path))
    suite = Suite.model_validate({"name": "t", "results_dir": str(tmp_path / "results"), "segmentation": {
        "models": [{"id": "m", "family": "medsam", "arch": "tiny", "checkpoint": str(path)}]}})
    calls: list[str] = []
    real = factory.load_model_class

    def spy(name: str, task: Any = None) -> type[Any]:
        calls.append(name)
        return real(name, task)

    monkeypatch.setattr(factory, "load_model_class", spy)
    seg = load_model(suite, suite.segmentation.models[0], fresh=True)
    assert calls == ["medsam"] and isinstance(seg, base.SegmentationModel) and seg.family == "medsam"


@pytest.fixture(scope="module")
def tiny_llava(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from medrobust_lib.models.tiny_vlm import build_tiny_llava, build_tokenizer, save_tiny

    model, proc = build_tiny_llava(build_tokenizer(["is there a lesion ?", "yes", "no"]), seed=1)
    return save_tiny(model, proc, tmp_path_factory.mktemp("tiny_llava"))


def test_hf_model_is_a_local_vision_language_model(tiny_llava: Path) -> None:
    vlm = build_vlm(VLMModelConfig(id="tiny", source=str(tiny_llava)), VLMInputs(source=str(tiny_llava)))
    assert isinstance(vlm, base.VisionLanguageModel) and not isinstance(vlm, base.VisionLanguageEndpoint)
    assert vlm.model_id == "tiny"
    scores = vlm.score([np.full((32, 32), 0.5, np.float32)], ["is there a lesion ?"], ["yes", "no"])
    assert set(scores[0]) == {"yes", "no"} and all(v <= 0 for v in scores[0].values())
    with pytest.raises(ValueError, match="names no source"):
        build_vlm(VLMModelConfig(id="tiny"), VLMInputs())


def test_api_model_is_an_endpoint(tmp_path: Path) -> None:
    cache = tmp_path / "cache" / "remote.sqlite"
    vlm = build_vlm(VLMModelConfig(id="remote", kind="api", api=API), VLMInputs(cache_path=str(cache), seed=7))
    try:
        assert isinstance(vlm, base.VisionLanguageEndpoint) and vlm.model_id == "tiny-remote"
        assert vlm.config.seed == 7 and vlm.config.cache_path == str(cache) and cache.parent.is_dir()
    finally:
        vlm.close()
    own = build_vlm(VLMModelConfig(id="remote", kind="api", api={**API, "seed": 1, "cache_path": None}),
                    VLMInputs(cache_path=str(cache), seed=7))
    try:
        assert own.config.seed == 1 and own.config.cache_path is None  # the model's own settings win
    finally:
        own.close()


def test_the_runner_builds_through_the_registry(tiny_llava: Path, tmp_path: Path) -> None:
    from medrobust_lib.tracks.vlm.model import Runner

    suite = Suite.model_validate({"name": "t", "seed": 5, "results_dir": str(tmp_path / "results"), "vlm": {
        "models": [{"id": "tiny", "source": str(tiny_llava)}, {"id": "remote", "kind": "api", "api": API}]}})
    remote = Runner(suite, vlm_model(suite, "remote"))
    try:
        assert remote.hf is None and isinstance(remote.api, base.VisionLanguageEndpoint)
        assert remote.checkpoint == "api:tiny-remote" and remote.adapter is None
        assert remote.api.config.cache_path == str(tmp_path / "cache" / "remote.sqlite")
        assert remote.api.config.seed == 5
    finally:
        remote.close()
    local = Runner(suite, vlm_model(suite, "tiny"))
    assert local.api is None and isinstance(local.hf, base.VisionLanguageModel)
    assert len(local.checkpoint) == 16 and local.adapter is None


def test_runners_share_a_local_model_until_its_weights_or_config_change(tiny_llava: Path, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Partitions in one process share the loaded model (one load, not one per partition); each
    runner counts only its own vision-encoder calls; new weight files or another configuration
    load afresh; models are kept within a byte budget, the oldest released first."""
    from medrobust_lib.tracks.vlm import model as runner_mod
    from medrobust_lib.tracks.vlm.model import Runner

    runner_mod._LOCAL.clear()  # what earlier tests loaded is not this test's
    folder = tmp_path / "weights"
    shutil.copytree(tiny_llava, folder)
    suite = Suite.model_validate({"name": "t", "results_dir": str(tmp_path / "results"), "vlm": {
        "models": [{"id": "a", "source": str(folder)}, {"id": "b", "source": str(folder), "batch_size": 4}]}})
    first = Runner(suite, vlm_model(suite, "a"))
    first.yes_no([np.full((32, 32), 0.5, np.float32)] * 2, ["is there a lesion ?"] * 2)
    second = Runner(suite, vlm_model(suite, "a"))
    assert second.hf is first.hf and len(runner_mod._LOCAL) == 1
    assert first.n_vision_calls == 2 and second.n_vision_calls == 0
    second.yes_no([np.full((32, 32), 0.5, np.float32)], ["is there a lesion ?"])
    assert second.n_vision_calls == 1 and first.n_vision_calls == 3  # the model's counter is shared
    other = Runner(suite, vlm_model(suite, "b"))
    assert other.hf is not first.hf and len(runner_mod._LOCAL) == 2  # tiny models: both kept
    assert Runner(suite, vlm_model(suite, "a")).hf is first.hf
    weights = folder / "model.safetensors"
    st = weights.stat()
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # the weights were rewritten
    fresh = Runner(suite, vlm_model(suite, "b"))
    assert fresh.hf is not other.hf
    # a budget below two models keeps only the newest: the older one is released before a load
    monkeypatch.setattr(runner_mod, "LOCAL_MODEL_BUDGET", int(2.5 * weights.stat().st_size))
    again = Runner(suite, vlm_model(suite, "a"))
    assert again.hf is not first.hf and runner_mod._LOCAL.values()[-1] is again.hf
    assert len(runner_mod._LOCAL) == 1
