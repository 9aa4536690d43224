"""The reference overlay's fine-tuning strategies train exactly the tensors the reference trains.

Fixture ``finetune_strategies_reference.json`` (``tools/reference_protocol_fixtures.py``, section
``finetune_strategies``): the reference's own ``setup_finetune`` and ``build_optimizer``
(``Segmentation/finetune_utils.py``) run with ``jobgpu_with_finetune.sh``'s settings on

* SAM-Med2D's ViT-B (medrobust's build of it: the published segment-anything module names), where
  the names of the trainable tensors, their sizes and learning rates must be ours exactly; and on
* a Hugging Face ``SamModel`` of MedSAM's ViT-B configuration, whose names differ from
  segment-anything's: there the LoRA-wrapped modules (the decoder's names are the same in both),
  the trainable sizes per component and encoder block, and the learning rates per component and
  LoRA matrix must be ours.

Ours: ``configs/reference_protocol.yaml`` merged over a suite fine-tuning a base of that family,
the strategy built as the fine-tuning track builds it (``strategy_config`` / ``train_config``).
"""

from __future__ import annotations

import copy
import json
import re
import shutil
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import yaml

from medrobust_lib.config import load_suite
from medrobust_lib.config.segmentation import FinetuneConfig
from medrobust_lib.models.sam import SamSegmenter, arch_for, build_sam
from medrobust_lib.tracks.finetune.strategy_runs import strategy_config, train_config
from medrobust_lib.training.strategies import apply_strategy
from medrobust_lib.training.train import param_groups

ROOT = Path(__file__).resolve().parents[2]
DATA = json.loads((Path(__file__).parent / "fixtures" / "finetune_strategies_reference.json").read_text())
OURS = {"adapter_only": "adapter"}
"""The reference's strategy names that are spelled differently here."""
HF_ONLY = "shared_image_embedding.positional_embedding"
"""MedSAM in Hugging Face's SamModel: the prompt encoder's random Fourier matrix (256 numbers) is a
parameter shared with the model's ``shared_image_embedding``, so the reference trains it with the
prompt encoder; segment-anything keeps it as a buffer (``pe_layer.positional_encoding_gaussian_matrix``),
never trained."""


def _finetune(tmp_path: Path, family: str) -> FinetuneConfig:
    shutil.copy(ROOT / "configs" / "reference_protocol.yaml", tmp_path / "reference_protocol.yaml")
    suite = {"overlays": ["reference_protocol.yaml"], "segmentation": {
        "models": [{"id": "base", "family": family, "arch": "vit_b", "checkpoint": "/w/base.pth"}],
        "finetune": {"base": "base"}}}
    (tmp_path / "suite.yaml").write_text(yaml.safe_dump(suite))
    ft = load_suite(tmp_path / "suite.yaml").segmentation.finetune
    assert ft is not None
    return ft


def _ref_name(name: str) -> str:
    """A reference parameter name in peft's spelling: its ``LoRAPlusLinear`` holds the matrices as
    bare parameters (``X.lora_A``), peft as ``X.lora_A.default.weight``."""
    return re.sub(r"\.lora_([AB])$", r".lora_\1.default.weight", name)


def _ours(base: Any, family: str, ft: FinetuneConfig, strategy: str) -> tuple[dict[str, tuple[int, float]], list[str]]:
    """Name -> (size, learning rate) of every tensor our strategy trains, and the LoRA targets."""
    seg = SamSegmenter(copy.deepcopy(base), family, "vit_b", "0")  # type: ignore[arg-type]
    report = apply_strategy(seg, strategy_config(ft, strategy, family), seed=0)
    named = [(n, p) for n, p in seg.sam.named_parameters() if report.is_trainable(n)]
    lr = {id(p): g["lr"] for g in param_groups(named, train_config(ft, strategy, 0)) for p in g["params"]}
    return {n: (p.numel(), lr[id(p)]) for n, p in named}, list(report.targets)


@pytest.fixture(scope="module")
def sammed2d() -> Any:
    return build_sam(arch_for("vit_b", "sam_med2d"), seed=0)


@pytest.fixture(scope="module")
def medsam() -> Any:
    return build_sam(arch_for("vit_b", "medsam"), seed=0)


@pytest.mark.parametrize("strategy", list(DATA["sammed2d"]["strategies"]))
def test_sam_med2d_trains_the_reference_tensors(strategy: str, sammed2d: Any, tmp_path: Path) -> None:
    ref = DATA["sammed2d"]["strategies"][strategy]
    ours, targets = _ours(sammed2d, "sam_med2d", _finetune(tmp_path, "sam_med2d"), OURS.get(strategy, strategy))
    theirs = {_ref_name(n): (size, lr) for n, size, lr in ref["params"]}
    assert sorted(ours) == sorted(theirs)  # the names of the trainable tensors
    assert {n: size for n, (size, _) in ours.items()} == {n: size for n, (size, _) in theirs.items()}
    assert {n: lr for n, (_, lr) in ours.items()} == pytest.approx({n: lr for n, (_, lr) in theirs.items()}, rel=1e-12)
    assert sum(size for size, _ in ours.values()) == ref["n_trainable"]
    assert targets == ref["wrapped"]


def test_the_headline_strategies_are_the_reference_ones() -> None:
    """What issue 46 found wrong: SAM-Med2D's LoRA adapts the encoder (every block's qkv / proj and,
    through peft's suffix match, the patch embedding), and encoder_partial trains every adapter."""
    rows = DATA["sammed2d"]["strategies"]
    assert len(rows["lora"]["wrapped"]) == 1 + 2 * 12 and rows["lora"]["wrapped"][0] == "image_encoder.patch_embed.proj"
    assert all(n.startswith("image_encoder.") for n in rows["lora"]["wrapped"])
    adapters = {n for n, _, _ in rows["encoder_partial"]["params"] if ".Adapter." in n}
    assert {int(n.split(".")[2]) for n in adapters} == set(range(12))


def _by_component(params: dict[str, tuple[int, float]]) -> tuple[dict[tuple[str, str], int], dict[tuple[str, str], set[float]]]:
    """Sizes and learning rates summed / collected per (component or encoder block, kind), the
    Hugging Face names read as segment-anything's (``vision_encoder.layers.i`` -> ``image_encoder.blocks.i``)."""
    sizes: dict[tuple[str, str], int] = defaultdict(int)
    lrs: dict[tuple[str, str], set[float]] = defaultdict(set)
    for name, (size, lr) in params.items():
        name = re.sub(r"^vision_encoder\.layers\.", "image_encoder.blocks.", name)
        name = name.replace("vision_encoder.", "image_encoder.")
        m = re.match(r"image_encoder\.blocks\.\d+", name)
        where = m.group(0) if m else name.split(".")[0]
        kind = next((k for k in ("lora_A", "lora_B") if f".{k}" in name), "base")
        sizes[where, kind] += size
        lrs[where, kind].add(round(lr, 15))
    return dict(sizes), dict(lrs)


@pytest.mark.parametrize("strategy", list(DATA["medsam"]["strategies"]))
def test_medsam_trains_the_reference_tensors(strategy: str, medsam: Any, tmp_path: Path) -> None:
    ref = DATA["medsam"]["strategies"][strategy]
    ours, targets = _ours(medsam, "medsam", _finetune(tmp_path, "medsam"), OURS.get(strategy, strategy))
    theirs = {_ref_name(n): (size, lr) for n, size, lr in ref["params"] if n != HF_ONLY}
    hf_only = [(size, lr) for n, size, lr in ref["params"] if n == HF_ONLY]
    assert hf_only == ([] if strategy in ("decoder_only", "lora") else [(256, hf_only[0][1])])
    assert _by_component(ours) == _by_component(theirs)
    assert targets == ref["wrapped"]  # the mask decoder's modules: the same names in both


def test_medsam_lora_plus_encoder_is_decoder_prompt_in_the_reference() -> None:
    """The reference's MedSAM ``lora_plus_encoder`` looks for ``q_proj`` / ``v_proj`` in a vision
    encoder that names its attention ``qkv`` / ``proj``: no LoRA layer, the decoder and prompt encoder
    in full, i.e. ``decoder_prompt`` (the overlay reproduces it with ``lora_targets: null``)."""
    rows = DATA["medsam"]["strategies"]
    assert rows["lora_plus_encoder"]["wrapped"] == []
    assert rows["lora_plus_encoder"]["params"] == rows["decoder_prompt"]["params"]
