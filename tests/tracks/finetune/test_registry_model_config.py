"""A registered version is evaluated with the settings of the suite model it derives from (the
fine-tuning base's caps, levels, precision), so its rows pair sample by sample with the
strategies' rows in the gate; a version of a family the suite does not hold gets the defaults."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from medrobust_lib.config import load_suite
from medrobust_lib.store.model_registry import register_checkpoint
from medrobust_lib.tracks.finetune.strategy_runs import registry_model_config, strategy_model_config
from medrobust_lib.tracks.segmentation.model import model_config

ROOT = Path(__file__).resolve().parents[3]


def _register(tmp_path: Path, name: str, meta: dict[str, str]) -> str:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"weights of " + name.encode())
    (folder / "config.json").write_text(json.dumps(meta))
    version = register_checkpoint(folder, name, tags={"strategy": meta["strategy"]}).version
    return f"models:/{name}/{version}"


def test_a_version_takes_the_base_models_caps_and_a_foreign_family_the_defaults(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEDROBUST_MLRUNS", str(tmp_path / "mlruns"))
    suite = load_suite(ROOT / "configs" / "demo.yaml")
    base = model_config(suite, "tiny-sam")
    assert base.max_perturbed_per_dataset == 3  # the demo's cap this test is about

    m = registry_model_config(suite, _register(tmp_path, "medrobust-seg-tiny-sam-lora",
                                               {"family": "sam", "arch": "tiny", "strategy": "lora"}))
    assert (m.id, m.strategy, m.family, m.arch) == ("medrobust-seg-tiny-sam-lora-v1", "lora", "sam", "tiny")
    assert Path(str(m.checkpoint)).name == "model.safetensors"
    for key in ("max_perturbed_per_modality", "max_perturbed_per_dataset", "levels", "attacks", "device", "batch_size",
                "precision", "engine"):
        assert getattr(m, key) == getattr(base, key), key

    lite = model_config(suite, "litemedsam")
    m = registry_model_config(suite, _register(tmp_path, "my-lite", {"family": "litemedsam", "arch": "tinyvit",
                                                                     "strategy": "full"}))
    assert m.max_perturbed_per_dataset == lite.max_perturbed_per_dataset == 1 and m.precision == lite.precision

    m = registry_model_config(suite, _register(tmp_path, "my-medsam", {"family": "medsam", "arch": "vit_b",
                                                                       "strategy": "full"}))
    assert m.max_perturbed_per_dataset is None and m.levels is None and m.attacks


def test_the_finetune_eval_cap_applies_to_strategies_and_versions(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``finetune.eval.max_perturbed_per_modality`` caps every fine-tune's and registry version's
    perturbed and attacked images (the full demo's LiteMedSAM fine-tunes) and leaves the base model
    alone; without it the base's cap holds."""
    monkeypatch.setenv("MEDROBUST_MLRUNS", str(tmp_path / "mlruns"))
    plain = load_suite(ROOT / "configs" / "demo.yaml")
    ft = plain.segmentation.finetune
    assert ft is not None and ft.eval.max_perturbed_per_modality is None
    assert strategy_model_config(plain, "lora").max_perturbed_per_dataset == 3  # tiny-sam's own cap

    capped = plain.model_copy(deep=True)
    assert capped.segmentation.finetune is not None
    capped.segmentation.finetune.eval.max_perturbed_per_modality = 2
    m = strategy_model_config(capped, "lora")
    assert (m.id, m.max_perturbed_per_modality) == ("tiny-sam-lora", 2)
    assert model_config(capped, "tiny-sam").max_perturbed_per_dataset == 3
    for uri in (_register(tmp_path, "medrobust-seg-tiny-sam-lora", {"family": "sam", "arch": "tiny", "strategy": "lora"}),
                _register(tmp_path, "my-lite", {"family": "litemedsam", "arch": "tinyvit", "strategy": "full"})):
        assert registry_model_config(capped, uri).max_perturbed_per_modality == 2
