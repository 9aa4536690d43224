"""Issue 44, finding 9: a registration killed before its aliases were set is finished by the next run.

Before, a process killed inside ``set_registered_model_alias`` left version 1 with no alias; every
rerun found the version by its checksum, returned it as registered, and never set ``candidate`` /
``champion``, so ``models:/<name>@candidate`` never resolved."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from medrobust_lib.store import model_registry
from medrobust_lib.tracks.finetune.strategy_runs import register_version

NAME = "medrobust-seg-tiny-sam-lora"


def _checkpoint(tmp_path: Path, tag: str) -> Path:
    folder = tmp_path / f"ckpt-{tag}"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"weights " + tag.encode())
    (folder / "config.json").write_text("{}")
    return folder


def _client(mlruns: Path) -> Any:
    from mlflow import MlflowClient

    uri = model_registry.init_store(mlruns)
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def test_aliases_deleted_after_registration_are_set_again_by_the_rerun(tmp_path: Path) -> None:
    mlruns = tmp_path / "mlruns"
    folder = _checkpoint(tmp_path, "a")
    assert register_version(folder, NAME, {"strategy": "lora"}, mlruns_dir=mlruns) == (1, True)
    client = _client(mlruns)
    for alias in ("candidate", "champion"):  # the state a kill inside set_registered_model_alias leaves
        client.delete_registered_model_alias(NAME, alias)
    assert model_registry.snapshot(mlruns_dir=mlruns)[NAME]["aliases"] == {}

    assert register_version(folder, NAME, {"strategy": "lora"}, mlruns_dir=mlruns) == (1, False)
    assert model_registry.snapshot(mlruns_dir=mlruns)[NAME] == {"versions": [1],
                                                              "aliases": {"candidate": 1, "champion": 1}}
    assert model_registry.resolve_version(f"models:/{NAME}@candidate", mlruns) == (NAME, 1)


def test_a_kill_inside_set_registered_model_alias_is_finished_by_the_rerun(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow import MlflowClient

    mlruns = tmp_path / "mlruns"
    first = _checkpoint(tmp_path, "a")
    second = _checkpoint(tmp_path, "b")
    assert register_version(first, NAME, {"strategy": "lora"}, mlruns_dir=mlruns) == (1, True)

    real = MlflowClient.set_registered_model_alias

    def killed(self: Any, name: str, alias: str, version: str) -> None:
        raise KeyboardInterrupt  # SIGINT / SIGKILL inside the call: the alias is never written

    monkeypatch.setattr(MlflowClient, "set_registered_model_alias", killed)
    with pytest.raises(KeyboardInterrupt):
        register_version(second, NAME, {"strategy": "lora"}, mlruns_dir=mlruns)
    monkeypatch.setattr(MlflowClient, "set_registered_model_alias", real)
    snap = model_registry.snapshot(mlruns_dir=mlruns)[NAME]
    assert snap == {"versions": [1, 2], "aliases": {"candidate": 1, "champion": 1}}  # v2 lost its alias

    assert register_version(second, NAME, {"strategy": "lora"}, mlruns_dir=mlruns) == (2, False)
    assert model_registry.snapshot(mlruns_dir=mlruns)[NAME]["aliases"] == {"candidate": 2, "champion": 1}
    # a further rerun of either checkpoint changes nothing (idempotent; v1 is older than the candidate)
    assert register_version(first, NAME, {"strategy": "lora"}, mlruns_dir=mlruns) == (1, False)
    assert register_version(second, NAME, {"strategy": "lora"}, mlruns_dir=mlruns) == (2, False)
    assert model_registry.snapshot(mlruns_dir=mlruns)[NAME]["aliases"] == {"candidate": 2, "champion": 1}


def test_a_candidate_moved_back_by_hand_is_left_alone(tmp_path: Path) -> None:
    """Once a version's aliases were set, a rerun does not undo a deliberate move of ``candidate``."""
    mlruns = tmp_path / "mlruns"
    a, b = _checkpoint(tmp_path, "a"), _checkpoint(tmp_path, "b")
    register_version(a, NAME, {"strategy": "lora"}, mlruns_dir=mlruns)
    register_version(b, NAME, {"strategy": "lora"}, mlruns_dir=mlruns)
    model_registry.set_alias(NAME, "candidate", 1, mlruns)  # rolled back by hand
    assert register_version(b, NAME, {"strategy": "lora"}, mlruns_dir=mlruns) == (2, False)
    assert model_registry.snapshot(mlruns_dir=mlruns)[NAME]["aliases"] == {"candidate": 1, "champion": 1}
