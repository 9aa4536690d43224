"""The segmentation checkpoint registry against a real SQLite MLflow store in a temp folder."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from medrobust_lib.store import model_registry

NAME = model_registry.seg_model_name("tiny", "lora")


def _checkpoint(folder: Path, value: float) -> Path:
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    save_file({"w": torch.full((2, 2), value)}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({"family": "sam", "arch": "tiny", "value": value}))
    return folder


def _value(weights: Path) -> float:
    from safetensors.torch import load_file

    return float(load_file(str(weights))["w"][0, 0])


@dataclass(frozen=True)
class Store:
    mlruns: Path
    v1: model_registry.RegisteredVersion
    v2: model_registry.RegisteredVersion


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    root = tmp_path_factory.mktemp("registry")
    mlruns = root / "mlruns"
    tags = {"strategy": "lora", "dataset": "demo", "base_checkpoint_sha256": "ab" * 32, "api_key": "sk-secret"}
    v1 = model_registry.register_checkpoint(_checkpoint(root / "c1", 1.0), NAME, tags={**tags, "val_dice": "0.5"},
                                      mlruns_dir=mlruns)
    v2 = model_registry.register_checkpoint(_checkpoint(root / "c2", 2.0), NAME, tags={**tags, "val_dice": "0.7"},
                                      mlruns_dir=mlruns)
    return Store(mlruns, v1, v2)


def test_seg_model_name() -> None:
    assert model_registry.seg_model_name("sam-vitb", "full") == "medrobust-seg-sam-vitb-full"


def test_mlruns_dir_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(model_registry.MLRUNS_ENV, raising=False)
    assert model_registry.mlruns_dir() == Path("mlruns")
    monkeypatch.setenv(model_registry.MLRUNS_ENV, str(tmp_path / "x"))
    assert model_registry.mlruns_dir() == tmp_path / "x"


def test_versions_and_candidate_alias(store: Store) -> None:
    assert (store.v1.version, store.v2.version) == (1, 2)
    assert store.v2.uri == f"models:/{NAME}/2" and store.v1.run_id != store.v2.run_id
    assert store.v2.source.endswith("/checkpoint")
    assert model_registry.get_alias_version(NAME, "candidate", store.mlruns) == 2
    assert model_registry.get_alias_version(NAME, "champion", store.mlruns) is None
    assert model_registry.get_alias_version("medrobust-seg-nope-x", "candidate", store.mlruns) is None
    rows = model_registry.list_versions(NAME, store.mlruns)
    assert [r["version"] for r in rows] == [1, 2]
    assert rows[0]["aliases"] == [] and rows[1]["aliases"] == ["candidate"]
    assert rows[1]["run_id"] == store.v2.run_id and rows[1]["creation_timestamp"] > 0


def test_tags_recorded_without_secrets(store: Store) -> None:
    rows = {r["version"]: r for r in model_registry.list_versions(NAME, store.mlruns)}
    for v, dice in ((1, "0.5"), (2, "0.7")):
        t = rows[v]["tags"]
        assert t["strategy"] == "lora" and t["dataset"] == "demo" and t["val_dice"] == dice
        assert t["base_checkpoint_sha256"] == "ab" * 32
        assert "api_key" not in t


def test_resolve_by_version_alias_latest(store: Store) -> None:
    p1 = model_registry.resolve_model_uri(f"models:/{NAME}/1", store.mlruns)
    p2 = model_registry.resolve_model_uri(f"models:/{NAME}/2", store.mlruns)
    assert p1.name == p2.name == "model.safetensors" and p1 != p2
    assert p1.is_relative_to(store.mlruns.resolve() / "artifacts")
    assert (_value(p1), _value(p2)) == (1.0, 2.0)
    assert json.loads((p2.parent / "config.json").read_text())["value"] == 2.0
    assert model_registry.resolve_model_uri(f"models:/{NAME}@candidate", store.mlruns) == p2
    assert model_registry.resolve_model_uri(f"models:/{NAME}/latest", store.mlruns) == p2


def test_set_alias_moves(store: Store, tmp_path: Path) -> None:
    name = model_registry.seg_model_name("tiny", "alias")
    model_registry.register_checkpoint(_checkpoint(tmp_path / "a", 3.0), name, tags={}, mlruns_dir=store.mlruns,
                                 alias=None)
    model_registry.register_checkpoint(_checkpoint(tmp_path / "b", 4.0), name, tags={}, mlruns_dir=store.mlruns,
                                 alias="champion")
    assert model_registry.get_alias_version(name, "candidate", store.mlruns) is None
    assert model_registry.get_alias_version(name, "champion", store.mlruns) == 2
    model_registry.set_alias(name, "champion", 1, store.mlruns)
    assert model_registry.get_alias_version(name, "champion", store.mlruns) == 1
    assert _value(model_registry.resolve_model_uri(f"models:/{name}@champion", store.mlruns)) == 3.0
    with pytest.raises(model_registry.RegistryError, match="no version 7"):
        model_registry.set_alias(name, "champion", 7, store.mlruns)


def test_clear_errors(store: Store, tmp_path: Path) -> None:
    with pytest.raises(model_registry.RegistryError, match="unknown registered model 'medrobust-seg-nope-x'"):
        model_registry.resolve_model_uri("models:/medrobust-seg-nope-x/1", store.mlruns)
    with pytest.raises(model_registry.RegistryError, match=r"no version 9; versions: \[1, 2\]"):
        model_registry.resolve_model_uri(f"models:/{NAME}/9", store.mlruns)
    with pytest.raises(model_registry.RegistryError, match=r"no alias 'champion'; aliases: \['candidate'\]"):
        model_registry.resolve_model_uri(f"models:/{NAME}@champion", store.mlruns)
    with pytest.raises(ValueError, match="not a registry URI"):
        model_registry.resolve_model_uri("models:/", store.mlruns)
    with pytest.raises(ValueError, match="stages are not supported"):
        model_registry.resolve_model_uri(f"models:/{NAME}/Production", store.mlruns)
    with pytest.raises(FileNotFoundError, match="no model.safetensors"):
        model_registry.register_checkpoint(tmp_path, NAME, tags={}, mlruns_dir=store.mlruns)
    with pytest.raises(model_registry.RegistryError):
        model_registry.list_versions("medrobust-seg-nope-x", store.mlruns)


def test_missing_file_is_clear(store: Store, tmp_path: Path) -> None:
    name = model_registry.seg_model_name("tiny", "gone")
    rv = model_registry.register_checkpoint(_checkpoint(tmp_path / "g", 5.0), name, tags={}, mlruns_dir=store.mlruns)
    model_registry.resolve_model_uri(rv.uri, store.mlruns).unlink()
    with pytest.raises(FileNotFoundError, match="version 1"):
        model_registry.resolve_model_uri(rv.uri, store.mlruns)


def test_runs_source_is_copied_to_cache_and_remote_refused(store: Store, tmp_path: Path) -> None:
    name = model_registry.seg_model_name("tiny", "runs")
    rv = model_registry.register_checkpoint(_checkpoint(tmp_path / "r", 6.0), name, tags={}, mlruns_dir=store.mlruns)
    client = model_registry._client(store.mlruns)
    client.create_model_version(name, source=f"runs:/{rv.run_id}/checkpoint", run_id=rv.run_id)
    client.create_model_version(name, source="s3://bucket/model", run_id=rv.run_id)
    got = model_registry.resolve_model_uri(f"models:/{name}/2", store.mlruns)
    assert got == store.mlruns.resolve() / ".cache" / name / "2" / "model.safetensors" and _value(got) == 6.0
    assert model_registry.resolve_model_uri(f"models:/{name}/2", store.mlruns) == got  # cached
    with pytest.raises(ValueError, match="outside the local store"):
        model_registry.resolve_model_uri(f"models:/{name}/3", store.mlruns)


def test_suite_checkpoint_resolves_through_registry(store: Store, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from medrobust_lib.config import load_suite
    from medrobust_lib.tracks.segmentation.model import model_config, resolve_checkpoint

    suite_yaml = tmp_path / "suite.yaml"
    suite_yaml.write_text(
        f"name: reg\nresults_dir: {tmp_path / 'var' / 'results'}\nmodalities: [xray]\n"
        f"segmentation:\n  models:\n    - id: tiny\n      checkpoint: 'models:/{NAME}@candidate'\n"
        "      strategy: lora\n")
    suite = load_suite(suite_yaml)
    monkeypatch.setenv(model_registry.MLRUNS_ENV, str(store.mlruns))
    got = resolve_checkpoint(suite, model_config(suite, "tiny"))
    assert got == model_registry.resolve_model_uri(f"models:/{NAME}/2", store.mlruns) and _value(got) == 2.0
