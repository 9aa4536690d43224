"""``configs/reference_protocol.yaml`` as an overlay: merged over a suite, ``finetune?`` only where
the suite fine-tunes, ``protocol: reference`` fills per-model settings a model does not set."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from medrobust_lib.config import load_suite
from medrobust_lib.tracks.perturbed import selected_types

ROOT = Path(__file__).resolve().parents[2]


def _suite(tmp_path: Path, body: dict) -> Path:  # type: ignore[type-arg]
    shutil.copy(ROOT / "configs" / "reference_protocol.yaml", tmp_path / "reference_protocol.yaml")
    p = tmp_path / "suite.yaml"
    p.write_text(yaml.safe_dump({"overlays": ["reference_protocol.yaml"], **body}))
    return p


SEG = {"models": [
    {"id": "medsam", "family": "medsam", "checkpoint": "/w/medsam.pth"},
    {"id": "sammed", "family": "sam_med2d", "checkpoint": "/w/sammed.pth", "mask_selection": "best_iou"}]}
VLM = {"models": [{"id": "llava", "source": "/m/llava"}, {"id": "short", "source": "/m/x", "caption_max_new_tokens": 64}]}


def test_overlay_sets_the_reference_protocol(tmp_path: Path) -> None:
    s = load_suite(_suite(tmp_path, {"segmentation": {**SEG, "finetune": {"base": "medsam"}}, "vlm": VLM}))
    assert s.protocol == "reference"
    assert s.perturbations.levels == [1, 3, 5] and s.perturbations.calibration_mode == "reference"
    medsam, sammed = s.segmentation.models
    assert medsam.preprocess == "hf_processor"
    assert (sammed.color, sammed.resize, sammed.mask_selection) == ("rgb", "bilinear", "best_iou")  # explicit wins
    assert [m.caption_max_new_tokens for m in s.vlm.models] == [512, 64]
    ft = s.segmentation.finetune
    assert ft is not None and ft.base == "medsam" and ft.encoder_blocks == 2
    assert (ft.lora.r, ft.lora.alpha, ft.train.epochs, ft.train.lr, ft.train.encoder_lr_factor) == (16, 32, 20, 1e-5, 0.1)
    assert (s.vlm.finetune.r, s.vlm.finetune.alpha, s.vlm.finetune.epochs) == (128, 256, 20)
    assert s.vlm.finetune.lr_schedule == "linear"
    assert (s.splits.train, s.splits.val, s.splits.test) == (0.8, 0.0, 0.2)
    assert s.segmentation.split == "all" and ft.eval.split == "test"
    assert (ft.train.augmentation, ft.train.amp, ft.train.lr_schedule, ft.train.select) == (
        "reference", "fp16", "cosine", "last")
    assert ft.encoder_partial_adapters and ft.lora_plus_lr_ratio == 16
    assert ft.lora_for("lora", "sam_med2d")[0].target_regex == r".*\.(qkv|proj)"
    assert ft.lora_for("lora", "medsam")[0].target_regex == r".*\.(q_proj|v_proj)"
    assert ft.lora_for("lora_plus_encoder", "medsam")[1] is False  # no LoRA layer (the reference finds none)
    assert s.vlm.protocol.grounding_parse == "reference" and s.vlm.protocol.caption_raw_scores
    assert selected_types(s, "ultrasound", 1) == sorted(
        ["gaussian_noise", "speckle_noise", "gaussian_blur", "motion_blur", "acoustic_shadowing", "reverberation"])
    assert "haze" in selected_types(s, "angiography", 1)  # a modality the reference never had keeps every type


def test_finetune_section_only_where_the_suite_has_one(tmp_path: Path) -> None:
    s = load_suite(_suite(tmp_path, {"segmentation": SEG, "vlm": VLM}))
    assert s.segmentation.finetune is None


def test_default_suites_keep_the_corrected_protocol() -> None:
    s = load_suite(ROOT / "configs" / "example_real.yaml")
    assert s.protocol == "corrected" and s.perturbations.calibration_mode == "per_image"
    assert s.vlm.protocol.is_default()
    assert s.splits.is_default() and s.vlm.finetune.lr_schedule == "cosine"
    demo = load_suite(ROOT / "configs" / "demo.yaml")
    ft = demo.segmentation.finetune
    assert ft is not None and demo.splits.is_default() and ft.eval.split is None and not ft.lora_targets
    assert (ft.train.augmentation, ft.train.amp, ft.train.lr_schedule, ft.train.select) == (
        "project", "bf16", "cosine", "best_val")
    assert not ft.encoder_partial_adapters


def test_bad_overlays_are_refused(tmp_path: Path) -> None:
    p = tmp_path / "s.yaml"
    p.write_text("overlays: [missing.yaml]\n")
    with pytest.raises(FileNotFoundError, match="missing.yaml"):
        load_suite(p)
    (tmp_path / "o.yaml").write_text("overlays: [x.yaml]\n")
    p.write_text("overlays: [o.yaml]\n")
    with pytest.raises(ValueError, match="cannot name overlays"):
        load_suite(p)
    (tmp_path / "o.yaml").write_text("perturbations: {calibration_mode: sometimes}\n")
    with pytest.raises(ValueError, match="calibration_mode"):
        load_suite(p)


def test_every_type_of_the_overlay_subsets_applies_to_its_modality() -> None:
    from medrobust_lib.perturb.spec import get_perturbation

    over = yaml.safe_load((ROOT / "configs" / "reference_protocol.yaml").read_text())
    for modality, names in over["perturbations"]["types_by_modality"].items():
        for name in names:
            spec = get_perturbation(name)
            assert modality in spec.modalities, (modality, name)


def test_the_overlay_file_loads_as_a_suite_of_its_own() -> None:
    s = load_suite(ROOT / "configs" / "reference_protocol.yaml")
    assert s.protocol == "reference" and s.segmentation.finetune is None and not s.segmentation.models
