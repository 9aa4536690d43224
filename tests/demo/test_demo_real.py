"""The demo's real dataset (issue 29, item 7): a byte copy of pydicom-data's overlay MR slice,
evaluation-only, outside the synthetic datasets and their records."""

from __future__ import annotations

import shutil
from pathlib import Path

from medrobust_lib.data.dataset import DatasetConfig, index_dataset, load_sample
from medrobust_lib.demo.manifest import DemoManifest
from medrobust_lib.demo.real import REAL_FILES, installed_file, real_paths
from medrobust_lib.tracks.datasets import clean_rows


def test_demo_copies_the_package_file_as_an_evaluation_only_dataset(demo_root: Path) -> None:
    man = DemoManifest.load(demo_root)
    spec = REAL_FILES[0]
    assert [c["name"] for c in man.real_datasets] == [spec.dataset]
    copied = real_paths(demo_root)[0]
    assert copied.read_bytes() == installed_file(spec).read_bytes()
    assert spec.dataset not in {s.dataset for s in man.samples()}  # no synthetic ground-truth record
    assert spec.dataset not in {c["name"] for c in man.dataset_configs()}
    cfg = DatasetConfig(**man.real_datasets[0])
    assert cfg.evaluation_only and cfg.modality == "mri" and cfg.size == 256
    refs, bad = index_dataset(cfg)
    assert not bad and len(refs) == 1
    s = load_sample(cfg, refs[0])
    assert s.image.shape == (256, 256) and s.mask is not None and 0 < s.mask.sum() < 0.01 * 256 * 256
    assert [r["split"] for r in clean_rows(cfg)] == ["test"]


def test_moved_demo_resolves_the_real_dataset(demo_root: Path, tmp_path: Path) -> None:
    moved = tmp_path / "moved"
    shutil.copytree(demo_root, moved)
    man = DemoManifest.load(moved)
    assert Path(man.real_datasets[0]["root"]) == moved.resolve() / REAL_FILES[0].folder


def test_suite_resolves_the_real_dataset_as_mri_evaluation_only(demo_root: Path, tmp_path: Path) -> None:
    import yaml

    from medrobust_lib.config import load_suite
    from medrobust_lib.tracks.datasets import datasets_for

    cfg = {"name": "real", "seed": 0, "results_dir": str(tmp_path / "r"), "mart_path": str(tmp_path / "m.duckdb"),
           "modalities": ["mri", "ct"], "demo": {"enabled": True, "root": str(demo_root), "n_per_modality": 4, "seed": 0}}
    (tmp_path / "suite.yaml").write_text(yaml.safe_dump(cfg))
    suite = load_suite(tmp_path / "suite.yaml")
    mri = datasets_for(suite, "mri")
    assert [(c.name, c.evaluation_only) for c in mri] == [("mri_demo", False), (REAL_FILES[0].dataset, True)]
    assert all(not c.evaluation_only for c in datasets_for(suite, "ct"))
