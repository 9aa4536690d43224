"""A small CT suite whose samples break after the clean index and manifest were built, shared by the
tests of the evaluations' ``error`` rows for samples that cannot be used now.

The copied demo's four CT images: the evaluation split is ``train`` (``ct_0001``, ``ct_0003``,
``ct_0004``), ``ct_0002`` is ``test``. After the clean index and the level-1 manifest (split
``all``) are built:

- :data:`QUARANTINED` (train) becomes unreadable and the clean index is rebuilt: quarantined there;
- :data:`MISSING` (train) is deleted without rebuilding the index: missing (with
  ``deleted=False`` its pixels change instead: ``changed_on_disk``, unreadable now; the VLM tracks
  test both, since their record readers quarantine every record of a deleted image as
  ``missing_image`` before the evaluation: :func:`missing_reason` is the reason either way);
- :data:`OTHER_SPLIT` (test) is deleted (changed) too: it belongs to another split, so no row at all;
- :data:`OK` (train) stays usable.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from medrobust_lib.config import Suite, load_suite
from medrobust_lib.data.splits import split_for
from medrobust_lib.demo import build_demo
from medrobust_lib.tracks.datasets import build_clean_index
from medrobust_lib.tracks.perturbed import build_perturbed
from tests.suite_helpers import write_suite

DATASET = "ct_demo"
SPLIT = "train"
OK, QUARANTINED, MISSING, OTHER_SPLIT = "ct_0001", "ct_0003", "ct_0004", "ct_0002"
LEVEL = 1


def image_path(demo: Path, sample_id: str) -> Path:
    """The DICOM file of a CT demo sample."""
    return demo / "ct_demo" / "dicom" / f"{sample_id}.dcm"


CHANGED_REASON = "quarantined:changed_on_disk: content differs from the clean index; re-materialize clean_samples"
"""The reason of a sample whose pixels changed after the clean index was built."""


def change_pixels(path: Path) -> None:
    """Rewrite a DICOM file with other pixel values (still readable, another content hash)."""
    import pydicom

    ds = pydicom.dcmread(path)
    ds.PixelData = (ds.pixel_array + 100).astype(ds.pixel_array.dtype).tobytes()
    ds.save_as(path)


def missing_reason(suite: Suite) -> str:
    """The ``error`` text of a VLM / taxonomy row of :data:`MISSING`'s records: ``changed_on_disk``
    when its pixels changed, ``missing: <image path>`` (the record reader's) when its file is gone."""
    path = image_path(Path(suite.demo.root), MISSING)
    return CHANGED_REASON if path.exists() else f"missing: {path}"


def broken_suite(root: Path, demo_root: Path, deleted: bool = True, **over: object) -> Suite:
    """A CT-only suite on a private copy of the demo, broken as the module docstring says."""
    assert [split_for(DATASET, s) for s in (OK, QUARANTINED, MISSING, OTHER_SPLIT)] == [SPLIT] * 3 + ["test"]
    demo = root / "demo"
    shutil.copytree(demo_root, demo)
    build_demo(demo, seed=0, n_per_modality=4)  # refreshes the absolute dataset roots of the copy
    suite = load_suite(write_suite(root, demo_root, modalities=["ct"],
                                   demo={"enabled": True, "root": str(demo), "n_per_modality": 4, "seed": 0},
                                   perturbations={"include": ["gaussian_noise"], "split": "all",
                                                  "calibration_subset": 2, "levels": [LEVEL]}, **over))
    build_clean_index(suite, "ct")
    build_perturbed(suite, "ct", LEVEL)
    image_path(demo, QUARANTINED).write_bytes(b"not a dicom file")
    build_clean_index(suite, "ct")
    for sid in (MISSING, OTHER_SPLIT):
        if deleted:
            image_path(demo, sid).unlink()
        else:
            change_pixels(image_path(demo, sid))
    return suite


def broken_seg_suite(root: Path, demo_root: Path) -> Suite:
    """:func:`broken_suite` with one segmentation model ``ref``: a tiny SAM with seeded random
    weights (reference engine), FGSM only, evaluated on :data:`SPLIT` without feed workers."""
    from safetensors.torch import save_file

    from medrobust_lib.models.sam import arch_for, build_sam

    ckpt = root / "tiny.safetensors"
    save_file({k: v.contiguous() for k, v in build_sam(arch_for("tiny", "sam"), seed=11).state_dict().items()},
              str(ckpt))
    seg = {"models": [{"id": "ref", "arch": "tiny", "checkpoint": str(ckpt), "engine": "reference"}],
           "split": SPLIT, "attacks": {"kinds": ["fgsm"]}, "feed_workers": 0}
    return broken_suite(root, demo_root, segmentation=seg)
