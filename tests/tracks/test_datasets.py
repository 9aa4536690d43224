"""Evaluation samples: the usable samples of a split, and why each other sample of the split cannot
be used now (quarantined in the clean index, missing, unreadable since the index was built)."""

from __future__ import annotations

from pathlib import Path

from medrobust_lib.tracks.datasets import load_eval_samples
from tests.tracks.unusable_helpers import (
    CHANGED_REASON,
    DATASET,
    MISSING,
    OK,
    OTHER_SPLIT,
    QUARANTINED,
    SPLIT,
    broken_suite,
    image_path,
)


def test_eval_samples_say_why_samples_of_the_split_cannot_be_used(tmp_path: Path, demo_root: Path) -> None:
    suite = broken_suite(tmp_path, demo_root)
    ev = load_eval_samples(suite, "ct", SPLIT)
    assert list(ev.samples) == [(DATASET, OK)]
    assert ev.quarantined == {(DATASET, QUARANTINED): "quarantined:unreadable_dicom"}
    assert ev.unusable == {(DATASET, MISSING): f"missing: {image_path(tmp_path / 'demo', MISSING)}"}
    assert ev.reason((DATASET, OK)) is None
    assert ev.reason((DATASET, OTHER_SPLIT)) is None  # another split: a legitimate skip, gone or not
    assert ev.reason((DATASET, QUARANTINED)) == "quarantined:unreadable_dicom"
    assert ev.reason((DATASET, MISSING)) == ev.unusable[(DATASET, MISSING)]
    assert ev.reasons_for([(DATASET, s) for s in (OK, QUARANTINED, MISSING, OTHER_SPLIT)]) == {
        (DATASET, QUARANTINED): "quarantined:unreadable_dicom", (DATASET, MISSING): ev.unusable[(DATASET, MISSING)]}
    # every split: the deleted test sample is missing too
    assert (DATASET, OTHER_SPLIT) in load_eval_samples(suite, "ct", "all").unusable


def test_a_sample_unreadable_since_the_index_is_recorded_not_raised(tmp_path: Path, demo_root: Path) -> None:
    suite = broken_suite(tmp_path, demo_root, deleted=False)  # changed on disk, the index lists it as ok
    ev = load_eval_samples(suite, "ct", SPLIT)
    assert ev.unusable == {(DATASET, MISSING): CHANGED_REASON}
    assert ev.reason((DATASET, OTHER_SPLIT)) is None
    image_path(tmp_path / "demo", OK).write_bytes(b"garbage")
    ev = load_eval_samples(suite, "ct", SPLIT)
    assert ev.samples == {}
    assert ev.unusable[(DATASET, OK)].startswith("quarantined:unreadable_dicom")


def test_a_key_unknown_to_the_clean_index_is_missing_unless_of_another_split(tmp_path: Path, demo_root: Path) -> None:
    suite = broken_suite(tmp_path, demo_root)
    ev = load_eval_samples(suite, "ct", "all")
    assert ev.reason(("gone", "x")) == "missing: gone/x is not a sample of the clean index"


def test_demo_datasets_say_whether_their_labels_are_synthetic(tmp_path: Path, demo_root: Path) -> None:
    """The demo's generated datasets come out with synthetic labels (its manifest entries do not carry
    the flag, as no manifest written before it did), its real datasets and a suite's own without; the
    clean index records the flag on every row."""
    import json

    from medrobust_lib.config import load_suite
    from medrobust_lib.store import results
    from medrobust_lib.tracks.datasets import build_clean_index, resolve_datasets
    from medrobust_lib.tracks.datasets import clean_rows as index_rows
    from tests.suite_helpers import write_suite

    manifest = json.loads((demo_root / "demo_manifest.json").read_text())
    assert all("synthetic_labels" not in c for c in manifest["datasets"] + manifest.get("real_datasets", []))
    own = {"name": "own_mri", "modality": "mri", "format": "nifti", "root": str(demo_root / "mri_demo")}
    suite = load_suite(write_suite(tmp_path, demo_root, modalities=["mri"], datasets=[own]))
    flags = {c.name: c.synthetic_labels for c in resolve_datasets(suite)}
    assert flags == {"mri_demo": True, "mri_overlay_real": False, "own_mri": False}
    real = next(c for c in resolve_datasets(suite) if c.name == "mri_overlay_real")
    assert {r["synthetic_labels"] for r in index_rows(real)} == {False}
    build_clean_index(suite, "mri")
    index = results.read_partition(suite.results_dir, "clean_samples", {"modality": "mri"})
    assert index.groupby("dataset")["synthetic_labels"].agg(lambda v: set(v.astype(bool))).to_dict() == {
        "mri_demo": {True}, "mri_overlay_real": {False}, "own_mri": {False}}
