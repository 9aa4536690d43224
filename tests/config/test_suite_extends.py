"""``extends:`` in a suite file (medrobust_lib.config.suite.read_suite_file): the file is merged over
the suite it names (mappings key by key, lists replace), and configs/demo_full.yaml is written that
way over configs/demo.yaml."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from medrobust_lib.config import load_suite

ROOT = Path(__file__).resolve().parents[2]


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


BASE = """name: base
seed: 3
perturbations: {levels: [2, 4], calibration_subset: 6, exclude: [haze]}
segmentation:
  models:
    - {id: a, checkpoint: /w/a.pth}
    - {id: b, checkpoint: /w/b.pth}
  attacks: {kinds: [fgsm], max_samples: 10}
"""


def test_the_child_is_merged_over_its_base_mappings_by_key_lists_replaced(tmp_path: Path) -> None:
    _write(tmp_path / "base.yaml", BASE)
    child = _write(tmp_path / "child.yaml", """extends: base.yaml
perturbations: {levels: [1, 2, 3]}
segmentation:
  models: [{id: c, checkpoint: /w/c.pth}]
  attacks: {max_samples: null}
""")
    s = load_suite(child)
    assert s.name == "base" and s.seed == 3  # untouched keys come from the base
    assert s.perturbations.levels == [1, 2, 3]  # a list replaces
    assert s.perturbations.calibration_subset == 6 and s.perturbations.exclude == ["haze"]  # siblings kept
    assert [m.id for m in s.segmentation.models] == ["c"]  # a list of sections replaces too
    assert s.segmentation.attacks.kinds == ["fgsm"] and s.segmentation.attacks.max_samples is None


def test_extends_chains_and_conditional_keys_apply_only_where_the_base_has_them(tmp_path: Path) -> None:
    _write(tmp_path / "base.yaml", BASE)
    _write(tmp_path / "mid.yaml", "extends: base.yaml\nseed: 4\n")
    leaf = _write(tmp_path / "sub" / "leaf.yaml", """extends: ../mid.yaml
name: leaf
segmentation:
  finetune?: {base: a}      # the base has no finetune section: nothing to apply to
  attacks?: {max_samples: 2}
""")
    s = load_suite(leaf)
    assert (s.name, s.seed) == ("leaf", 4)
    assert s.segmentation.finetune is None and s.segmentation.attacks.max_samples == 2


def test_a_base_overlay_is_found_from_the_base_folder(tmp_path: Path) -> None:
    _write(tmp_path / "common" / "over.yaml", "perturbations: {calibration_subset: 9}\n")
    _write(tmp_path / "common" / "base.yaml", BASE + "overlays: [over.yaml]\n")
    child = _write(tmp_path / "mine" / "child.yaml", "extends: ../common/base.yaml\nseed: 7\n")
    s = load_suite(child)
    assert s.perturbations.calibration_subset == 9 and s.seed == 7


@pytest.mark.parametrize(("files", "match"), [
    ({"a.yaml": "extends: missing.yaml\n"}, "suite file not found"),
    ({"a.yaml": "extends: b.yaml\n", "b.yaml": "extends: a.yaml\n"}, "comes back to"),
    ({"a.yaml": "extends: [b.yaml]\n"}, "names one suite file"),
    ({"a.yaml": "extends: b.yaml\nperturbations: {levls: [1]}\n", "b.yaml": BASE}, "perturbations.levls: unknown key"),
    ({"a.yaml": BASE + "overlays: [o.yaml]\n", "o.yaml": "extends: a.yaml\n"}, "cannot name overlays or extends"),
])
def test_bad_extends_is_refused_naming_the_file(tmp_path: Path, files: dict[str, str], match: str) -> None:
    for name, text in files.items():
        _write(tmp_path / name, text)
    with pytest.raises((ValueError, FileNotFoundError), match=match):
        load_suite(tmp_path / "a.yaml")


def _without(d: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in d.items() if k not in keys}


def test_demo_full_is_demo_with_the_full_grid() -> None:
    """configs/demo_full.yaml extends configs/demo.yaml: the loaded suite is demo.yaml's except the
    levels (1-5 for the perturbations, the VLMs, LiteMedSAM and the taxonomy), LiteMedSAM on every
    image with attacks, tiny-sam on every image, the fine-tuned base (LiteMedSAM, three strategies,
    every type, FGSM and PGD on 3 test images per modality); every model's training equals demo.yaml's (the committed weights)."""
    assert "extends: demo.yaml" in (ROOT / "configs" / "demo_full.yaml").read_text()
    fast = load_suite(ROOT / "configs" / "demo.yaml").model_dump()
    full = load_suite(ROOT / "configs" / "demo_full.yaml").model_dump()
    changed = ("perturbations", "segmentation", "vlm", "taxonomy")
    assert _without(full, *changed) == _without(fast, *changed)

    assert full["perturbations"]["levels"] == [1, 2, 3, 4, 5] and fast["perturbations"]["levels"] == [2, 4]
    assert _without(full["perturbations"], "levels") == _without(fast["perturbations"], "levels")

    seg, fseg = full["segmentation"], fast["segmentation"]
    assert _without(seg, "models", "finetune") == _without(fseg, "models", "finetune")
    # tiny-sam as in the fast demo, on every test image (the fast demo: the first 3 of each dataset)
    assert seg["models"][0] == {**fseg["models"][0], "max_perturbed_per_dataset": None}
    assert fseg["models"][0]["max_perturbed_per_dataset"] == 3
    lite = seg["models"][1]
    assert (lite["id"], lite["levels"], lite["max_perturbed_per_dataset"], lite["attacks"]) == \
        ("litemedsam", None, None, True)
    # batch 1 in both; the full demo's hours are attack and fine-tuning gradients (PyTorch), so it takes
    # bf16 autocast where the CPU has it (precision auto); the fast demo has no LiteMedSAM gradients and
    # runs the defaults, fp32 through the exported graphs (runtime auto), the official masks on every CPU
    assert (lite["precision"], lite["batch_size"]) == ("auto", 1)
    fast_lite = load_suite(ROOT / "configs" / "demo.yaml").segmentation.models[1]
    assert (fseg["models"][1]["precision"], fast_lite.runtime) == ("fp32", "auto")
    assert lite == {**fseg["models"][1], "levels": None, "max_perturbed_per_dataset": None, "attacks": True,
                    "precision": "auto"}
    ft, fft = seg["finetune"], fseg["finetune"]
    assert (ft["base"], ft["strategies"], ft["encoder_blocks"]) == ("litemedsam", ["decoder_only", "lora", "full"], 2)
    assert (ft["train"]["max_steps"], ft["train"]["lr"], ft["train"]["batch_size"]) == (40, 1e-4, 4)
    assert ft["eval"] == {**fft["eval"], "attack_kinds": None, "perturbations": None,
                          "max_perturbed_per_modality": 3} and ft["gate"] == fft["gate"]
    assert fft["eval"]["max_perturbed_per_modality"] is None  # the fast demo: tiny-sam's own cap (3)
    assert fft["eval"]["perturbations"] is not None and len(fft["eval"]["perturbations"]) == 39

    vlm, fvlm = full["vlm"], fast["vlm"]
    assert vlm["train"] == fvlm["train"]
    assert vlm["models"] == [{**m, "levels": None} for m in fvlm["models"]]
    assert vlm["finetune"] == fvlm["finetune"]  # one adapter for both demos (its committed weights)
    assert [m["levels"] for m in fvlm["models"]] == [[4], []]  # the fast demo: the adapter on clean images
    assert _without(vlm, "models", "finetune") == _without(fvlm, "models", "finetune")

    assert full["taxonomy"] == {**fast["taxonomy"], "levels": None}
