"""Committed demo weights: copied only when verified and trained from the same inputs; the demo's
training code still learns on a short schedule (what ``medrobust demo --retrain`` runs)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from medrobust_lib.config import load_suite
from medrobust_lib.demo import committed
from medrobust_lib.hashing import file_sha256
from medrobust_lib.tracks.finetune.vlm_adapter import box_text, examples_for, flipped
from tests.suite_helpers import write_suite

FP = {"kind": "segmentation", "train": {"max_steps": 10}, "suite_seed": 0}


def _model_folder(root: Path) -> Path:
    root.mkdir(parents=True)
    (root / "model.safetensors").write_bytes(b"\x00weights\x01" * 10)
    (root / "config.json").write_text(json.dumps({"val_dice": 0.8, "best_step": 7}))
    (root / "sub").mkdir()
    (root / "sub" / "adapter.json").write_text("{}")
    return root


def test_publish_then_install_copies_verified_files(tmp_path: Path) -> None:
    src = _model_folder(tmp_path / "trained")
    weights = tmp_path / "weights"
    pub = committed.publish(src, "m", FP, root=weights)
    man = committed.read_manifest(pub)
    assert set(man["files"]) == {"model.safetensors", "config.json", "sub/adapter.json"}
    assert man["files"]["config.json"] == file_sha256(src / "config.json")
    dest = tmp_path / "var" / "m"
    dest.mkdir(parents=True)
    (dest / "stale.bin").write_text("old")
    got = committed.install("m", dest, dict(FP), root=weights)
    assert got.used and got.meta["best_step"] == 7
    assert not (dest / "stale.bin").exists()  # replaced, not merged
    assert (dest / "model.safetensors").read_bytes() == (src / "model.safetensors").read_bytes()
    assert committed.verify(dest) == committed.folder_hashes(pub)


def test_other_inputs_retrain_or_absent_weights_are_not_used(tmp_path: Path) -> None:
    weights = tmp_path / "weights"
    committed.publish(_model_folder(tmp_path / "trained"), "m", FP, root=weights)
    other = {**FP, "train": {"max_steps": 11}}
    got = committed.install("m", tmp_path / "d1", other, root=weights)
    assert not got.used and "train" in got.reason and not (tmp_path / "d1").exists()
    got = committed.install("m", tmp_path / "d2", FP, retrain=True, root=weights)
    assert not got.used and "retrain" in got.reason
    got = committed.install("other", tmp_path / "d3", FP, root=weights)
    assert not got.used and "no committed weights" in got.reason


def test_a_changed_file_is_refused(tmp_path: Path) -> None:
    weights = tmp_path / "weights"
    pub = committed.publish(_model_folder(tmp_path / "trained"), "m", FP, root=weights)
    (pub / "model.safetensors").write_bytes(b"tampered")
    with pytest.raises(ValueError, match="model.safetensors"):
        committed.install("m", tmp_path / "dest", FP, root=weights)
    (pub / "extra.txt").write_text("x")
    with pytest.raises(ValueError, match="extra.txt"):
        committed.verify(pub)


@pytest.mark.parametrize("model_dir", sorted(p for p in committed.WEIGHTS_ROOT.glob("*") if p.is_dir())
                         or [pytest.param(None, marks=pytest.mark.skip(reason="no committed weights"))])
def test_committed_weights_match_their_sha256(model_dir: Path) -> None:
    committed.verify(model_dir)
    size = sum(p.stat().st_size for p in committed.WEIGHTS_ROOT.rglob("*") if p.is_file())
    assert size < 5 * 2**20


def test_box_answers_on_a_grid() -> None:
    box = np.array([[12.0, 20.0, 37.0, 41.0]])
    assert box_text(box, (100, 100)) == "[0.12, 0.20, 0.37, 0.41]"
    assert box_text(box, (100, 100), 0.05) == "[0.10, 0.20, 0.35, 0.40]"
    assert box_text(np.array([[0.0, 0.0, 100.0, 50.0]]), (50, 100), 0.05) == "[0.00, 0.00, 1.00, 1.00]"
    # a 4 % wide box whose corners round to the same grid value keeps one step of width
    assert box_text(np.array([[32.6, 10.0, 36.6, 30.0]]), (100, 100), 0.05) == "[0.35, 0.10, 0.40, 0.30]"
    assert box_text(np.array([[98.0, 10.0, 99.5, 30.0]]), (100, 100), 0.05) == "[0.95, 0.10, 1.00, 0.30]"


@pytest.mark.parametrize("flip", ["h", "v", "hv"])
def test_flipped_box_follows_the_image(flip: str) -> None:
    img = np.zeros((40, 60), np.float32)
    box = np.array([[5.0, 8.0, 20.0, 18.0]])  # XYXY, end exclusive
    img[8:18, 5:20] = 1.0
    out, fbox = flipped(img, box, flip)
    x0, y0, x1, y1 = (int(v) for v in fbox[0])
    assert out.shape == img.shape and out[y0:y1, x0:x1].min() == 1.0 and out.sum() == img.sum()


def test_grounding_flips_add_three_examples_per_box(demo_root: Path, tmp_path: Path) -> None:
    from medrobust_lib.tracks.datasets import build_clean_index, load_clean_samples
    from medrobust_lib.tracks.vlm.items import load_items

    suite = load_suite(write_suite(tmp_path, demo_root, modalities=["ct"], vlm={"split": "all"}))
    build_clean_index(suite, "ct")
    samples = {(s.dataset, s.sample_id): s for v in load_clean_samples(suite, "ct").values() for s in v}
    items = load_items(suite).items
    plain = examples_for(items, samples, ("grounding",))
    aug = examples_for(items, samples, ("grounding",), flips=True)
    assert len(plain) > 0 and len(aug) == 4 * len(plain)
    assert len({e.image_key for e in aug}) == 4 * len({e.image_key for e in plain})


def test_yes_no_examples_without_negations(demo_root: Path, tmp_path: Path) -> None:
    """``negations=False`` drops exactly the negated variants (polarity -1); every positive variant
    keeps its record's label."""
    from medrobust_lib.tracks.datasets import build_clean_index, load_clean_samples
    from medrobust_lib.tracks.vlm.items import load_items, prompt_for

    suite = load_suite(write_suite(tmp_path, demo_root, modalities=["ct"], vlm={"split": "all"}))
    build_clean_index(suite, "ct")
    samples = {(s.dataset, s.sample_id): s for v in load_clean_samples(suite, "ct").values() for s in v}
    items = [it for it in load_items(suite).items if it.task == "vqa_yesno" and (it.dataset, it.sample_id) in samples]
    every = examples_for(items, samples, ("vqa_yesno",))
    positive = examples_for(items, samples, ("vqa_yesno",), negations=False)
    n_neg = sum(1 for it in items for _, pol in it.variants if pol == -1)
    assert n_neg > 0 and len(every) - len(positive) == n_neg
    got = {(e.image_key, e.question): e.answer for e in positive}
    want = {(f"{it.dataset}/{it.sample_id}", prompt_for(it, k)): it.answer
            for it in items for k, (_, pol) in enumerate(it.variants) if pol == 1}
    assert got == want and len(got) == len(positive)


@pytest.mark.slow
def test_short_vlm_schedule_learns(demo_root: Path, tmp_path: Path) -> None:
    """The demo's tiny-LLaVA training (the code --retrain runs) on 2 modalities with every stage on
    (a 1-image-per-modality corpus, 10 tower steps, attribute naming, yes/no, 40 main steps) and the
    demo's tower options (wider and deeper than the language model, GIoU box loss, transposes,
    frozen after pretraining, float16 storage): the validation loss falls far below the uniform
    guess over the vocabulary, only the projector and the language model learned from text, and
    the saved weights are float16 that load as float32."""
    from medrobust_lib.demo.tiny_llava_train import train_base_vlm

    vlm = {"models": [{"id": "tiny-llava", "source": "trained", "box_scale": "0-1"}], "split": "all",
           "train": {"max_steps": 40, "eval_every": 20, "batch_size": 16, "time_budget_s": None,
                     "box_step": 0.05, "grounding_flips": True, "corpus_per_modality": 1, "tower_steps": 10,
                     "position_init_std": 1.0, "align_steps": 10, "yesno_steps": 10, "negations": False,
                     "vision_hidden": 96, "vision_layers": 3, "vision_heads": 4, "tower_box_loss": "l1_giou",
                     "tower_transposes": True, "tower_text_lr_scale": 0.0, "store_float16": True}}
    suite = load_suite(write_suite(tmp_path, demo_root, vlm=vlm))
    from medrobust_lib.tracks.datasets import build_clean_index

    for m in suite.modalities:
        build_clean_index(suite, m)
    tr = train_base_vlm(suite, "tiny-llava")
    vocab = json.loads((Path(tr.folder) / "config.json").read_text())["text_config"]["vocab_size"]
    assert tr.steps == 40 and tr.best_val_loss < 0.5 * math.log(vocab)
    meta = json.loads((Path(tr.folder) / "training.json").read_text())
    assert meta["corpus_samples"] > 0 and meta["tower"]["steps"] == 10 and meta["alignment"]["yesno"]["steps"] == 10
    import torch
    from safetensors import safe_open
    from transformers import AutoModelForImageTextToText

    loaded = AutoModelForImageTextToText.from_pretrained(tr.folder, local_files_only=True)
    tower = loaded.model.vision_tower
    assert tower.config.hidden_size == 96 and len(tower.encoder.layers) == 3
    assert meta["trainable_after_tower"] == meta["parameters"] - sum(p.numel() for p in tower.parameters())
    with safe_open(str(Path(tr.folder) / "model.safetensors"), framework="pt") as fh:
        assert {fh.get_tensor(k).dtype for k in fh.keys()} == {torch.float16}  # noqa: SIM118
    assert {p.dtype for p in loaded.parameters()} == {torch.float32}



def test_fast_and_full_demo_share_models_and_weights() -> None:
    """configs/demo.yaml (the fast default) and configs/demo_full.yaml differ only in the grid: same
    modalities and models in every track, the same training inputs (so the same committed weights),
    and the fast grid's levels are a subset of the full one's."""
    fast, full = load_suite("configs/demo.yaml"), load_suite("configs/demo_full.yaml")
    assert fast.modalities == full.modalities and len(fast.modalities) == 10
    assert [m.id for m in fast.segmentation.models] == [m.id for m in full.segmentation.models]
    assert [m.id for m in fast.vlm.models] == [m.id for m in full.vlm.models]
    assert [c.id for c in fast.taxonomy.configs] == [c.id for c in full.taxonomy.configs]
    assert fast.segmentation.finetune is not None and full.segmentation.finetune is not None
    # the fast demo fine-tunes the tiny SAM with all six strategies, the full one the real LiteMedSAM
    # with three of them (a CPU cannot fine-tune it six times in a demo)
    assert (fast.segmentation.finetune.base, full.segmentation.finetune.base) == ("tiny-sam", "litemedsam")
    assert {"decoder_only", "lora", "full"} <= set(full.segmentation.finetune.strategies) \
        <= set(fast.segmentation.finetune.strategies)
    assert set(fast.perturbations.levels) < set(full.perturbations.levels) == {1, 2, 3, 4, 5}
    assert committed.sam_fingerprint(fast, "tiny-sam") == committed.sam_fingerprint(full, "tiny-sam")
    assert committed.vlm_fingerprint(fast) == committed.vlm_fingerprint(full)
    assert committed.adapter_fingerprint(fast) == committed.adapter_fingerprint(full)
    for c in fast.taxonomy.configs:
        assert committed.taxonomy_fingerprint(fast, c.id) == committed.taxonomy_fingerprint(full, c.id)


def test_retrain_reaches_the_suite_through_the_resource() -> None:
    from medrobust_assets.resources import SuiteResource

    assert not SuiteResource(suite_path="configs/demo.yaml").load().demo.retrain
    assert SuiteResource(suite_path="configs/demo.yaml", retrain=True).load().demo.retrain


def test_demo_takes_suite_or_full_not_both() -> None:
    from typer.testing import CliRunner

    from medrobust_cli import app

    res = CliRunner().invoke(app, ["demo", "--full", "--suite", "configs/demo.yaml"])
    assert res.exit_code == 2 and "--full" in res.output
