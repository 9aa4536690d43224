"""The shipped suite YAMLs (every ``configs/*.yaml``) validate and keep the rules a copied config must
not break: an adapter is never evaluated on the split it was trained or selected on, and its
grounding answers are read in the scale it was taught."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from medrobust_lib.config import Suite, load_suite
from medrobust_lib.config.vlm import ADAPTER_SEEN_SPLITS, ApiSettings, adapter_box_scale
from medrobust_lib.data.dataset import DatasetConfig
from medrobust_lib.tracks.finetune.vlm_adapter import box_text
from medrobust_lib.tracks.vlm.model import TRAINING_META, declared_box_scale
from medrobust_lib.vlm_tasks.scoring import score_grounding

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted(p.name for p in (ROOT / "configs").glob("*.yaml") if p.name != "reference_protocol.yaml")
"""The shipped suites; ``reference_protocol.yaml`` is an overlay (tests/reference_protocol/test_overlay.py)."""


def test_every_shipped_config_is_checked() -> None:
    assert {"demo.yaml", "demo_full.yaml", "example_real.yaml"} <= set(SHIPPED)


@pytest.mark.parametrize("name", SHIPPED)
def test_suites_validate(name: str) -> None:
    suite = load_suite(ROOT / "configs" / name)
    seg = suite.segmentation
    assert seg.models and len({m.id for m in seg.models}) == len(seg.models)
    assert all(isinstance(d, DatasetConfig) for d in suite.datasets)  # typed when the suite loads
    vlm = suite.vlm
    assert vlm.models and len({m.id for m in vlm.models}) == len(vlm.models)
    ids = {m.id for m in vlm.models}
    for m in vlm.models:
        assert m.base is None or m.base in ids
        if m.kind == "api":
            assert isinstance(m.api, ApiSettings) and m.api.api_key_env  # typed when the suite loads
    # a key is only ever named by its environment variable, never a setting itself
    assert {f for f in ApiSettings.model_fields if "key" in f.lower()} == {"api_key_env"}


def test_unknown_fields_are_rejected(tmp_path: Path) -> None:
    p = tmp_path / "bad.yaml"
    p.write_text("perturbations: {levls: [1]}\n")
    with pytest.raises(ValueError, match="levls"):
        load_suite(p)


def _adapted(suite: Suite) -> list[str]:
    return [m.id for m in suite.vlm.models if m.adapter == "finetuned"]


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_adapters_are_held_out_and_read_in_their_taught_scale(name: str) -> None:
    suite = load_suite(ROOT / "configs" / name)
    vc = suite.vlm
    for mid in _adapted(suite):
        m = next(x for x in vc.models if x.id == mid)
        assert vc.split not in ADAPTER_SEEN_SPLITS, (name, mid, vc.split)
        # a box taught to the adapter, answered back verbatim, is read as the same box
        hw = (240, 320)
        gt = np.array([[32.0, 48.0, 160.0, 192.0]])
        taught = box_text(gt, hw, scale=adapter_box_scale(suite, m))
        row = score_grounding(taught, gt[0].tolist(), hw, declared_box_scale(suite, m, None))
        assert row["outcome"] == "ok" and row["iou"] > 0.99, (name, mid, taught, row)
    for c in suite.taxonomy.configs:
        if c.model in _adapted(suite) or c.demo_training == "consistency_lora":
            assert suite.taxonomy.split not in ADAPTER_SEEN_SPLITS, (name, c.id)


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "s.yaml"
    p.write_text(text)
    return p


ADAPTER_SUITE = """
demo: {{enabled: true}}
vlm:
  models:
    - {{id: base-vlm, source: trained, box_scale: "0-1000"}}
    - {{id: base-vlm-lora, base: base-vlm, adapter: finetuned}}
  split: {split}
"""


@pytest.mark.parametrize("split", ["train", "val", "all"])
def test_an_adapter_on_its_training_split_is_refused_in_one_line(tmp_path: Path, split: str) -> None:
    with pytest.raises(ValueError) as err:
        load_suite(_write(tmp_path, ADAPTER_SUITE.format(split=split)))
    msg = str(err.value)
    assert "\n" not in msg and "'base-vlm-lora'" in msg and f"vlm.split {split!r}" in msg


def test_an_adapter_on_test_inherits_its_base_scale(tmp_path: Path) -> None:
    suite = load_suite(_write(tmp_path, ADAPTER_SUITE.format(split="test")))
    m = suite.vlm.models[1]
    assert adapter_box_scale(suite, m) == "0-1000" and declared_box_scale(suite, m, None) == "0-1000"
    assert box_text(np.array([[10.0, 20.0, 30.0, 40.0]]), (100, 100), scale="0-1000") == "[100, 200, 300, 400]"
    assert box_text(np.array([[10.0, 20.0, 30.0, 40.0]]), (100, 100)) == "[0.10, 0.20, 0.30, 0.40]"


def test_the_scale_an_adapter_was_taught_wins_over_the_config(tmp_path: Path) -> None:
    """An adapter folder records the scale it was taught in; a config edited afterwards cannot make
    the evaluation read its boxes in another scale."""
    suite = load_suite(_write(tmp_path, ADAPTER_SUITE.format(split="test")))
    m = suite.vlm.models[1]
    folder = tmp_path / "adapter"
    folder.mkdir()
    (folder / TRAINING_META).write_text('{"box_scale": "0-1"}')
    assert declared_box_scale(suite, m, str(folder)) == "0-1"
    assert declared_box_scale(suite, suite.vlm.models[0], str(folder)) == "0-1000"  # not an adapter model


def test_a_pixel_scale_adapter_is_refused(tmp_path: Path) -> None:
    text = ADAPTER_SUITE.format(split="test").replace('"0-1000"', "pixels")
    with pytest.raises(ValueError, match="base-vlm-lora.*not pixels"):
        load_suite(_write(tmp_path, text))


def test_a_consistency_lora_on_its_training_split_is_refused(tmp_path: Path) -> None:
    text = """
demo: {enabled: true}
taxonomy:
  configs:
    - {id: reliant, demo_training: image_reliant}
    - {id: lora, demo_training: consistency_lora, base: reliant}
  split: all
"""
    with pytest.raises(ValueError, match="taxonomy config 'lora'.*taxonomy.split 'all'"):
        load_suite(_write(tmp_path, text))


@pytest.mark.parametrize(("body", "message"), [
    ("datasets: [{name: ct_liver, modality: ct, format: dicom, root: /x, options: {window_centre: 40}}]",
     "datasets.0: invalid options for reader 'dicom': options.window_centre: unknown key (valid keys: "),
    ("datasets: [{name: a, modality: ct, format: folder, root: /x, sise: 3}]", "datasets.0.sise: unknown key"),
    ("datasets: [{name: a, modality: ct, format: fodler, root: /x}]", "datasets.0: unknown format 'fodler'"),
    ("vlm: {models: [{id: g, kind: api, api: {model: m, conurrency: 3}}]}", "vlm.models.0.api.conurrency: unknown key"),
    ("vlm: {models: [{id: g, kind: api, api: {model: m, max_retries: -1}}]}",
     "vlm.models.0.api.max_retries: Input should be greater than or equal to 0"),
    ("vlm: {models: [{id: g, kind: api, api: {model: m, base_url: 'http://api.example.org/v1'}}]}",
     "would travel in clear text"),
    ("vlm: {models: [{id: g, kind: api}]}", "vlm.models.0: VLM 'g' (kind: api) needs 'api'"),
    ("vlm: {models: [{id: h, source: /w, api: {model: m}}]}", "'api' settings are for endpoint models"),
    ("segmentation: {models: [{id: a, checkpoint: /w}], finetune: {base: a, gate: {alpha: 1.5}}}",
     "segmentation.finetune.gate.alpha: Input should be less than 1"),
    ("segmentation: {models: [{id: a, checkpoint: /w}], finetune: {base: a, train: {max_steps: 0}}}",
     "max_steps must be >= 1, got 0"),
])
def test_datasets_and_api_are_checked_when_the_suite_loads(tmp_path: Path, body: str, message: str) -> None:
    """``datasets[]`` (with each reader's options) and ``vlm.models[].api`` are typed: a bad key or value
    is refused by load_suite with the key's location, not at run time."""
    p = tmp_path / "s.yaml"
    p.write_text(f"name: t\ndemo: {{enabled: false}}\n{body}\n")
    with pytest.raises(ValueError) as err:
        load_suite(p)
    assert message in str(err.value)
