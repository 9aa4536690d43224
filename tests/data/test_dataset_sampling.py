"""Thinning a dataset: ``sample`` (a seeded draw of n ids, independent of the listing order) and
NIfTI ``slice_start`` / ``slice_step`` (every k-th slice index with foreground)."""

from __future__ import annotations

from pathlib import Path

import cv2
import nibabel as nib
import numpy as np

from medrobust_lib.config.datasets import DatasetConfig
from medrobust_lib.data.dataset import index_dataset
from medrobust_lib.seeding import stable_fraction


def _folder(root: Path, n: int) -> Path:
    (root / "images").mkdir(parents=True)
    (root / "masks").mkdir()
    for i in range(n):
        img = np.full((16, 16), 30 + i, np.uint8)
        mask = np.zeros((16, 16), np.uint8)
        mask[4:10, 4:10] = 255
        cv2.imwrite(str(root / "images" / f"id{i:02d}.png"), img)
        cv2.imwrite(str(root / "masks" / f"id{i:02d}.png"), mask)
    return root


def _cfg(root: Path, **kw: object) -> DatasetConfig:
    return DatasetConfig(name="d", modality="ct", format="folder", root=str(root), size=None, **kw)  # type: ignore[arg-type]


def test_sample_is_a_seeded_draw_that_does_not_depend_on_the_listing(tmp_path: Path) -> None:
    root = _folder(tmp_path / "f", 12)
    ids = [f"id{i:02d}" for i in range(12)]
    want = sorted(sorted(ids, key=lambda i: (stable_fraction(7, "d", i, "sample"), i))[:4])
    refs, bad = index_dataset(_cfg(root, sample={"n": 4, "seed": 7}))
    assert [r.sample_id for r in refs] == want and not bad
    assert want != ids[:4]  # not the first four
    other, _ = index_dataset(_cfg(root, sample={"n": 4, "seed": 8}))
    assert [r.sample_id for r in other] != want  # another seed, another draw
    capped, _ = index_dataset(_cfg(root, sample={"n": 4, "seed": 7}, max_samples=2))
    assert [r.sample_id for r in capped] == want[:2]


def test_nifti_slice_step_keeps_every_kth_slice_with_foreground(tmp_path: Path) -> None:
    vol = np.random.default_rng(0).random((8, 8, 20)).astype(np.float32)
    lab = np.zeros((8, 8, 20), np.uint8)
    lab[2:6, 2:6, 3:17] = 1  # foreground on slices 3..16
    for sub, arr in (("imagesTr", vol), ("labelsTr", lab)):
        (tmp_path / sub).mkdir()
        nib.save(nib.Nifti1Image(arr, np.eye(4)), str(tmp_path / sub / "case.nii.gz"))
    cfg = DatasetConfig(name="v", modality="ct", format="nifti", root=str(tmp_path), size=None,
                        options={"slice_start": 1, "slice_step": 4})
    refs, _ = index_dataset(cfg)
    assert [r.sample_id for r in refs] == ["case_z005", "case_z009", "case_z013"]  # 1 and 17: no foreground
