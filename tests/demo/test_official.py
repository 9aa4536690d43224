"""The official LiteMedSAM clean Dice shipped as package data (medrobust_lib/demo/official_real.json)
loads and is checked, and every real demo dataset has a description for the report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from medrobust_lib.demo.official import OFFICIAL_REAL_PATH, load_official_real
from medrobust_lib.demo.real import REAL_FILES, WHEEL_DATASETS, describe


def test_official_file_loads_and_is_checked(tmp_path: Path) -> None:
    shipped = load_official_real()  # whatever the package file holds: a source and well-formed entries
    assert shipped.source and OFFICIAL_REAL_PATH.name == "official_real.json"
    for name, entry in shipped.datasets.items():
        assert 0.0 <= entry.mean_dice <= 1.0 and entry.n >= 1, name
    bad = tmp_path / "bad.json"
    for body, match in (({"source": "x", "datasets": {"a": {"mean_dice": 1.5, "n": 3}}}, "mean_dice"),
                        ({"source": "x", "datasets": {"a": {"mean_dice": 0.5}}}, "'n'"),
                        ({"datasets": {}}, "expected")):
        bad.write_text(json.dumps(body))
        with pytest.raises(ValueError, match=match):
            load_official_real(bad)


def test_every_real_demo_dataset_is_described() -> None:
    for name in [s.dataset for s in REAL_FILES] + [w.dataset for w in WHEEL_DATASETS]:
        text = describe(name)
        assert text is not None and text.startswith(f"{name}: ") and "Licence: " in text and "Source (" in text
    assert "not drawn by an expert" in (describe("mni152_brain") or "")
    assert "CC BY-NC-SA 4.0" in (describe("lits117_tumour") or "")
    assert describe("ct_demo") is None


def test_the_shipped_official_dice_is_the_fixtures() -> None:
    """The package file holds exactly what tools/litemedsam_official_real.py measured with the official
    script (tests/models/fixtures/litemedsam_official_real.json), for every real dataset it covers."""
    fixture = json.loads((Path(__file__).parents[1] / "models" / "fixtures" / "litemedsam_official_real.json").read_text())
    shipped = load_official_real()
    assert set(shipped.datasets) == set(fixture["datasets"]) == {w.dataset for w in WHEEL_DATASETS}
    for name, row in fixture["datasets"].items():
        assert (shipped.datasets[name].mean_dice, shipped.datasets[name].n) == (row["mean_union_dice"], row["n_samples"])


def test_real_dataset_configs_carry_their_description_and_the_official_dice(tmp_path: Path) -> None:
    """What the report shows of a real dataset travels as data: the demo's dataset config (its
    ``description`` and ``reference_dice``) -> the clean index's ``dataset_info`` rows."""
    from medrobust_lib.data.dataset import DatasetConfig
    from medrobust_lib.tracks.datasets import info_rows

    shipped = load_official_real()
    for w in WHEEL_DATASETS:
        cfg = DatasetConfig(**w.config(tmp_path))
        assert cfg.description == describe(w.dataset) and cfg.evaluation_only and not cfg.synthetic_labels
        ref = cfg.reference_dice["litemedsam"]
        assert (ref.dice, ref.n) == (shipped.datasets[w.dataset].mean_dice, shipped.datasets[w.dataset].n)
        (row,) = info_rows(cfg)
        assert (row["reference_family"], row["reference_dice"], row["description"]) == \
            ("litemedsam", ref.dice, cfg.description)
