"""Dataset readers on mini datasets written at test time in the published layouts and formats."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import nibabel as nib
import numpy as np
import pytest
from PIL import Image

from medrobust_lib.data import readers_folder
from medrobust_lib.data.boxes import mask_to_boxes, rescale_boxes
from medrobust_lib.data.dataset import DatasetConfig, index_dataset, iter_dataset, load_sample
from medrobust_lib.data.formats import READERS
from medrobust_lib.data.imageio import intensity_to_native
from medrobust_lib.data.sample import QuarantineRecord, Sample, SampleError
from medrobust_lib.seeding import rng_for
from tests.data.test_imageio import ct_file, write_dicom

# --------------------------------------------------------------------------------------------------
# helpers


def rect_mask(hw: tuple[int, int], y0: int, x0: int, y1: int, x1: int) -> np.ndarray:
    m = np.zeros(hw, bool)
    m[y0:y1, x0:x1] = True
    return m


def image_u8(hw: tuple[int, int], key: str, channels: int = 3) -> np.ndarray:
    shape = hw if channels == 1 else (*hw, channels)
    return rng_for("test_readers", key).integers(30, 220, shape, dtype=np.uint8)


def save(path: Path, arr: np.ndarray, **kw: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(arr).save(path, **kw)
    return path


def save_mask(path: Path, mask: np.ndarray, **kw: Any) -> Path:
    return save(path, mask.astype(np.uint8) * 255, **kw)


def cfg(name: str, fmt: str, root: Path, modality: str, **kw: Any) -> DatasetConfig:
    return DatasetConfig(name=name, modality=modality, format=fmt, root=str(root), **kw)


def run(c: DatasetConfig) -> tuple[dict[str, Sample], dict[str, QuarantineRecord]]:
    good: dict[str, Sample] = {}
    bad: dict[str, QuarantineRecord] = {}
    for item in iter_dataset(c):
        if isinstance(item, Sample):
            good[item.sample_id] = item
        else:
            bad[item.sample_id] = item
    return good, bad


def assert_tight_boxes(s: Sample) -> None:
    assert s.mask is not None and s.boxes is not None
    assert s.boxes.dtype == np.float32 and s.boxes.shape[1] == 4
    np.testing.assert_array_equal(s.boxes, mask_to_boxes(s.mask))


# --------------------------------------------------------------------------------------------------
# config


def test_config_validation(tmp_path: Path) -> None:
    c = cfg("ct_demo", "dicom", tmp_path, "CT")
    assert c.modality == "ct" and c.size == 256
    with pytest.raises(ValueError, match="snake_case"):
        cfg("Bad-Name", "dicom", tmp_path, "ct")
    with pytest.raises(ValueError, match="valid: ct"):
        cfg("x", "dicom", tmp_path, "sonar")
    with pytest.raises(ValueError, match="valid: .*busi"):
        cfg("x", "jpegs", tmp_path, "ct")
    with pytest.raises(ValueError, match="valid keys"):
        cfg("x", "dicom", tmp_path, "ct", options={"windw_center": 40})
    with pytest.raises(ValueError, match="both"):
        cfg("x", "dicom", tmp_path, "ct", options={"window_center": 40})
    with pytest.raises(ValueError):
        cfg("x", "refuge", tmp_path, "fundus", options={"target": "macula"})


def test_registry_lists_readers() -> None:
    assert set(READERS.list(kind="preset")) == {"isic2016", "kvasir_seg", "busi", "lgg_mri", "refuge",
                                                "hyper_kvasir", "brain_tumor_kaggle", "glaucoma", "pannuke_npy"}
    assert {"folder", "dicom", "nifti", "npy_single"} <= set(READERS)
    for name in READERS.list(kind="preset"):
        r = READERS.get(name)
        assert r.citation and r.layout and r.description


# --------------------------------------------------------------------------------------------------
# presets


def test_isic2016(tmp_path: Path) -> None:
    hw = (30, 40)
    boxes = {"ISIC_0000000": (3, 4, 20, 25), "ISIC_0000001": (0, 0, 30, 40), "ISIC_0000002": (10, 12, 11, 13)}
    for sid, b in boxes.items():
        save(tmp_path / "ISBI2016_ISIC_Part1_Training_Data" / f"{sid}.jpg", image_u8(hw, sid), quality=95)
        save_mask(
            tmp_path / "ISBI2016_ISIC_Part1_Training_GroundTruth" / f"{sid}_Segmentation.png",
            rect_mask(hw, *b),
        )
    save(tmp_path / "ISBI2016_ISIC_Part1_Test_Data" / "ISIC_0000003.jpg", image_u8(hw, "t"))
    save_mask(
        tmp_path / "ISBI2016_ISIC_Part1_Test_GroundTruth" / "ISIC_0000003_Segmentation.png",
        rect_mask(hw, 5, 5, 9, 9),
    )
    good, bad = run(cfg("isic", "isic2016", tmp_path, "dermoscopy", size=None))
    assert not bad
    assert sorted(good) == ["ISIC_0000000", "ISIC_0000001", "ISIC_0000002", "ISIC_0000003"]
    s = good["ISIC_0000000"]
    assert s.image.shape == (30, 40, 3) and s.image.dtype == np.float32
    assert s.metadata["split"] == "train" and good["ISIC_0000003"].metadata["split"] == "test"
    y0, x0, y1, x1 = boxes["ISIC_0000000"]
    np.testing.assert_array_equal(s.boxes, [[x0, y0, x1, y1]])
    for smp in good.values():
        assert_tight_boxes(smp)
    only_train, _ = run(
        cfg("isic", "isic2016", tmp_path, "dermoscopy", size=None, options={"splits": ["train"]})
    )
    assert len(only_train) == 3


def test_kvasir_seg_jpeg_masks(tmp_path: Path) -> None:
    hw = (48, 64)
    rects = {"cju0qkwl35piu0993l0dewei2": (8, 10, 30, 40), "cju0qoxqj9q6s0835b43399p4": (20, 30, 44, 60)}
    for sid, r in rects.items():
        save(tmp_path / "Kvasir-SEG" / "images" / f"{sid}.jpg", image_u8(hw, sid), quality=90)
        save_mask(tmp_path / "Kvasir-SEG" / "masks" / f"{sid}.jpg", rect_mask(hw, *r), quality=75)
    good, bad = run(cfg("kvasir", "kvasir_seg", tmp_path, "endoscopy", size=None))  # root holds Kvasir-SEG/
    assert not bad and sorted(good) == sorted(rects)
    for sid, (y0, x0, y1, x1) in rects.items():
        s = good[sid]
        assert s.image.shape == (48, 64, 3)
        assert_tight_boxes(s)
        # JPEG ringing stays below the 127 threshold: the box is the drawn rectangle (+-1 px)
        assert s.mask is not None and s.boxes is not None
        np.testing.assert_allclose(s.boxes[0], [x0, y0, x1, y1], atol=1)
        assert abs(int(s.mask.sum()) - (y1 - y0) * (x1 - x0)) <= 2 * ((y1 - y0) + (x1 - x0))


def _busi(root: Path) -> Path:
    hw = (40, 36)
    base = root / "Dataset_BUSI_with_GT"
    gray = image_u8(hw, "b1", 1)
    save(base / "benign" / "benign (1).png", np.stack([gray] * 3, axis=2))  # stored RGB, really gray
    save_mask(base / "benign" / "benign (1)_mask.png", rect_mask(hw, 2, 3, 10, 12))
    save_mask(base / "benign" / "benign (1)_mask_1.png", rect_mask(hw, 20, 15, 30, 33))
    save(base / "benign" / "benign (10).png", np.stack([image_u8(hw, "b10", 1)] * 3, axis=2))
    m = rect_mask(hw, 5, 5, 15, 15).astype(np.uint8) * 255
    save(base / "benign" / "benign (10)_mask.png", np.stack([m] * 3, axis=2))  # RGB-stored mask
    save(base / "malignant" / "malignant (1).png", np.stack([image_u8(hw, "m1", 1)] * 3, axis=2))
    save_mask(base / "malignant" / "malignant (1)_mask.png", rect_mask(hw, 0, 0, 40, 4))
    save(base / "normal" / "normal (1).png", np.stack([image_u8(hw, "n1", 1)] * 3, axis=2))
    save_mask(base / "normal" / "normal (1)_mask.png", np.zeros(hw, bool))
    return base


def test_busi_union_gray_class_and_empty_masks(tmp_path: Path) -> None:
    _busi(tmp_path)
    good, bad = run(cfg("busi", "busi", tmp_path, "ultrasound", size=None))
    assert sorted(good) == ["benign (1)", "benign (10)", "malignant (1)"]
    assert {k: q.reason for k, q in bad.items()} == {"normal (1)": "empty_mask"}
    s = good["benign (1)"]
    assert s.image.shape == (40, 36) and s.n_channels == 1
    expected = (image_u8((40, 36), "b1", 1) / 255).astype(np.float32)
    np.testing.assert_allclose(s.image, expected, atol=1e-5)
    union = rect_mask((40, 36), 2, 3, 10, 12) | rect_mask((40, 36), 20, 15, 30, 33)
    np.testing.assert_array_equal(s.mask, union)
    np.testing.assert_array_equal(s.boxes, [[3, 2, 33, 30]])
    assert s.metadata["class"] == "benign" and len(s.metadata["mask_paths"]) == 2
    assert good["malignant (1)"].metadata["class"] == "malignant"
    for smp in good.values():
        assert_tight_boxes(smp)

    kept, bad2 = run(
        cfg("busi", "busi", tmp_path, "ultrasound", size=None, options={"allow_empty_mask": True})
    )
    assert not bad2 and kept["normal (1)"].boxes is not None and kept["normal (1)"].boxes.shape == (0, 4)
    pc, _ = run(cfg("busi", "busi", tmp_path, "ultrasound", size=None, per_component_boxes=True))
    np.testing.assert_array_equal(pc["benign (1)"].boxes, [[3, 2, 12, 10], [15, 20, 33, 30]])


def test_lgg_mri_channel(tmp_path: Path) -> None:
    hw = (32, 32)
    patient = "TCGA_CS_4941_19960909"
    d = tmp_path / "kaggle_3m" / patient
    imgs = {}
    for k, rect in [(1, None), (2, (4, 4, 12, 20)), (10, (10, 8, 31, 30))]:
        imgs[k] = image_u8(hw, f"lgg{k}")
        save(d / f"{patient}_{k}.tif", imgs[k])
        save_mask(d / f"{patient}_{k}_mask.tif", rect_mask(hw, *rect) if rect else np.zeros(hw, bool))
    (tmp_path / "kaggle_3m" / "data.csv").write_text("Patient,RNASeqCluster\n")
    good, bad = run(cfg("lgg", "lgg_mri", tmp_path, "mri", size=None))
    assert sorted(good) == [f"{patient}_10", f"{patient}_2"]
    assert bad[f"{patient}_1"].reason == "empty_mask"
    s = good[f"{patient}_2"]
    assert s.image.shape == hw
    np.testing.assert_array_equal(s.image, imgs[2][..., 1] / np.float32(255))  # FLAIR = channel 1
    assert (
        s.metadata["channel_name"] == "FLAIR"
        and s.metadata["patient"] == patient
        and s.metadata["slice"] == 2
    )
    np.testing.assert_array_equal(s.boxes, [[4, 4, 20, 12]])
    pre, _ = run(cfg("lgg", "lgg_mri", tmp_path / "kaggle_3m", "mri", size=None, options={"channel": 0}))
    np.testing.assert_array_equal(pre[f"{patient}_2"].image, imgs[2][..., 0] / np.float32(255))
    rgb, _ = run(cfg("lgg", "lgg_mri", tmp_path, "mri", size=None, options={"channel": None}))
    assert rgb[f"{patient}_2"].image.shape == (32, 32, 3)


def test_refuge_disc_and_cup(tmp_path: Path) -> None:
    hw = (40, 44)
    for sid, (cy, cx) in {"g0001": (20, 22), "n0001": (15, 25), "n0002": (25, 18)}.items():
        save(tmp_path / "Images" / f"{sid}.jpg", image_u8(hw, sid), quality=95)
        lab = np.full(hw, 255, np.uint8)
        lab[cy - 8 : cy + 8, cx - 9 : cx + 9] = 128  # rim
        lab[cy - 3 : cy + 3, cx - 4 : cx + 4] = 0  # cup
        save(tmp_path / "Masks" / f"{sid}.bmp", lab)
    disc, bad = run(cfg("refuge", "refuge", tmp_path, "fundus", size=None))
    cup, _ = run(cfg("refuge", "refuge", tmp_path, "fundus", size=None, options={"target": "cup"}))
    assert not bad and sorted(disc) == ["g0001", "n0001", "n0002"]
    s = disc["g0001"]
    assert s.image.shape == (40, 44, 3) and s.metadata["target"] == "disc"
    np.testing.assert_array_equal(s.boxes, [[22 - 9, 20 - 8, 22 + 9, 20 + 8]])
    np.testing.assert_array_equal(cup["g0001"].boxes, [[22 - 4, 20 - 3, 22 + 4, 20 + 3]])
    assert s.mask is not None and int(s.mask.sum()) == 16 * 18
    for smp in [*disc.values(), *cup.values()]:
        assert_tight_boxes(smp)


def test_refuge_split_folders(tmp_path: Path) -> None:
    hw = (20, 20)
    for split, sid in [("train", "g0001"), ("val", "V0001")]:
        save(tmp_path / split / "Images" / f"{sid}.jpg", image_u8(hw, sid))
        lab = np.full(hw, 255, np.uint8)
        lab[5:15, 5:15] = 128
        save(tmp_path / split / "Masks" / f"{sid}.bmp", lab)
    good, bad = run(cfg("refuge", "refuge", tmp_path, "fundus", size=None))
    assert not bad and {k: v.metadata["split"] for k, v in good.items()} == {"g0001": "train", "V0001": "val"}


# --------------------------------------------------------------------------------------------------
# folder, resizing, quarantine


def test_folder_with_suffix_recursive_and_label_maps(tmp_path: Path) -> None:
    hw = (20, 24)
    save(tmp_path / "imgs" / "a" / "x1.png", image_u8(hw, "x1", 1))
    save_mask(tmp_path / "imgs" / "a" / "x1_seg.png", rect_mask(hw, 1, 2, 5, 6))  # mask beside image
    save(tmp_path / "imgs" / "b" / "x2.png", image_u8(hw, "x2"))
    lab = np.zeros(hw, np.uint8)
    lab[3:9, 4:10] = 1  # a 0/1 label map
    save(tmp_path / "imgs" / "b" / "x2_seg.png", lab)
    c = cfg(
        "fold",
        "folder",
        tmp_path,
        "pathology",
        size=None,
        options={"image_dir": "imgs", "mask_dir": "imgs", "image_glob": "**/*.png", "mask_suffix": "_seg"},
    )
    good, bad = run(c)
    assert not bad and sorted(good) == ["a/x1", "b/x2"]
    assert good["a/x1"].image.ndim == 2 and good["b/x2"].image.ndim == 3
    np.testing.assert_array_equal(good["b/x2"].boxes, [[4, 3, 10, 9]])
    assert "label map" in good["b/x2"].metadata["mask_rule"]
    forced = cfg("fold", "folder", tmp_path, "pathology", size=None, options={**c.options, "grayscale": True})
    assert all(s.image.ndim == 2 for s in run(forced)[0].values())

    lab2 = np.zeros(hw, np.uint8)
    lab2[0:4, 0:4] = 2
    lab2[10:12, 10:20] = 5
    save(tmp_path / "multi" / "images" / "m.png", image_u8(hw, "m"))
    save(tmp_path / "multi" / "masks" / "m.png", lab2)
    only5, _ = run(cfg("multi", "folder", tmp_path / "multi", "ct", size=None, options={"mask_values": [5]}))
    np.testing.assert_array_equal(only5["m"].boxes, [[10, 10, 20, 12]])


def test_resize_rescales_boxes_consistently(tmp_path: Path) -> None:
    hw = (60, 90)
    rects = {"a": (6, 9, 30, 45), "b": (30, 0, 60, 90), "c": (12, 30, 48, 63)}
    for sid, r in rects.items():
        save(tmp_path / "images" / f"{sid}.png", image_u8(hw, sid))
        save_mask(tmp_path / "masks" / f"{sid}.png", rect_mask(hw, *r))
    full, _ = run(cfg("rs", "folder", tmp_path, "endoscopy", size=None))
    small, _ = run(cfg("rs", "folder", tmp_path, "endoscopy", size=32))
    for sid in rects:
        s = small[sid]
        assert s.image.shape == (32, 32, 3) and s.mask is not None and s.mask.shape == (32, 32)
        assert s.metadata["original_size"] == [60, 90] and s.metadata["resized"] is True
        assert_tight_boxes(s)
        full_boxes = full[sid].boxes
        assert full_boxes is not None and s.boxes is not None
        np.testing.assert_allclose(s.boxes, rescale_boxes(full_boxes, hw, (32, 32)), atol=1.0)
        assert float(s.image.min()) >= 0.0 and float(s.image.max()) <= 1.0
    same, _ = run(cfg("rs", "folder", tmp_path, "endoscopy", size=None))
    assert same["a"].metadata["resized"] is False


def test_corrupt_files_are_quarantined_and_good_ones_kept(tmp_path: Path) -> None:
    hw = (24, 24)
    for sid in ("good1", "good2", "good3"):
        save(tmp_path / "images" / f"{sid}.png", image_u8(hw, sid))
        save_mask(tmp_path / "masks" / f"{sid}.png", rect_mask(hw, 2, 2, 10, 10))
    (tmp_path / "images" / "zero.png").write_bytes(b"")
    save_mask(tmp_path / "masks" / "zero.png", rect_mask(hw, 2, 2, 10, 10))
    full = save(tmp_path / "full.png", image_u8(hw, "t")).read_bytes()
    (tmp_path / "images" / "trunc.png").write_bytes(full[: len(full) // 2])
    save_mask(tmp_path / "masks" / "trunc.png", rect_mask(hw, 2, 2, 10, 10))
    save(tmp_path / "images" / "mismatch.png", image_u8(hw, "mm"))
    save_mask(tmp_path / "masks" / "mismatch.png", rect_mask((20, 24), 2, 2, 10, 10))
    save(tmp_path / "images" / "empty.png", image_u8(hw, "e"))
    save_mask(tmp_path / "masks" / "empty.png", np.zeros(hw, bool))
    save(tmp_path / "images" / "nomask.png", image_u8(hw, "n"))
    save(tmp_path / "images" / "badmask.png", image_u8(hw, "bm"))
    (tmp_path / "masks" / "badmask.png").write_bytes(b"\x89PNG\r\n\x1a\nnope")

    c = cfg("bad", "folder", tmp_path, "dermoscopy", size=16)
    refs, idx_bad = index_dataset(c)
    assert [q.reason for q in idx_bad] == ["missing_mask"]
    good, bad = run(c)
    assert sorted(good) == ["good1", "good2", "good3"]
    assert {k: q.reason for k, q in bad.items()} == {
        "zero": "empty_file",
        "trunc": "truncated",
        "mismatch": "mask_size_mismatch",
        "empty": "empty_mask",
        "nomask": "missing_mask",
        "badmask": "unreadable_mask",
    }
    n_files = len(list((tmp_path / "images").glob("*.png")))
    assert len(good) + len(bad) == n_files == 9
    assert all(q.dataset == "bad" and q.path for q in bad.values())
    with pytest.raises(SampleError) as e:
        load_sample(c, next(r for r in refs if r.sample_id == "trunc"))
    assert e.value.reason == "truncated"


def test_decoder_exception_becomes_load_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hw = (10, 10)
    for sid in ("a", "b"):
        save(tmp_path / "images" / f"{sid}.png", image_u8(hw, sid))
        save_mask(tmp_path / "masks" / f"{sid}.png", rect_mask(hw, 1, 1, 5, 5))
    real = readers_folder.read_raw

    def flaky(path: Any) -> np.ndarray:
        if Path(path).name == "b.png" and Path(path).parent.name == "images":
            raise RuntimeError("codec exploded")
        return real(path)

    monkeypatch.setattr(readers_folder, "read_raw", flaky)
    good, bad = run(cfg("flaky", "folder", tmp_path, "xray"))
    assert list(good) == ["a"] and bad["b"].reason == "load_error" and "RuntimeError" in bad["b"].detail


def test_max_samples_and_sorting(tmp_path: Path) -> None:
    hw = (8, 8)
    for sid in ("d", "b", "a", "c"):
        save(tmp_path / "images" / f"{sid}.png", image_u8(hw, sid))
        if sid != "b":
            save_mask(tmp_path / "masks" / f"{sid}.png", rect_mask(hw, 1, 1, 4, 4))
    items = list(iter_dataset(cfg("ms", "folder", tmp_path, "xray", max_samples=3)))
    assert [i.sample_id for i in items] == ["a", "b", "c"]
    assert isinstance(items[1], QuarantineRecord) and items[1].reason == "missing_mask"


def test_duplicate_ids(tmp_path: Path) -> None:
    hw = (8, 8)
    save(tmp_path / "images" / "a.png", image_u8(hw, "a"))
    save(tmp_path / "images" / "a.jpg", image_u8(hw, "a"))
    save_mask(tmp_path / "masks" / "a.png", rect_mask(hw, 1, 1, 4, 4))
    refs, bad = index_dataset(cfg("dup", "folder", tmp_path, "xray", options={"image_glob": "*"}))
    assert [r.image_path.endswith("a.jpg") for r in refs] == [True]
    assert [q.reason for q in bad] == ["duplicate_id"]


# --------------------------------------------------------------------------------------------------
# DICOM


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_dicom_reader_hu_window_masks_and_bad_file(tmp_path: Path) -> None:
    hw = (16, 16)
    stored = np.full(hw, 1024, np.int16)  # HU 0 with the CT_small intercept of -1024
    stored[:4] = 1024 + 240  # HU 240 -> top of the window
    ct_file(tmp_path / "dcm" / "ct1.dcm", stored)
    write_dicom(tmp_path / "dcm" / "sub" / "us1.dcm", image_u8(hw, "us"), photometric="RGB", modality="US")
    write_dicom(
        tmp_path / "dcm" / "mr1.dcm", (np.arange(256, dtype=np.uint16) * 4).reshape(hw), modality="MR"
    )
    (tmp_path / "dcm" / "broken.dcm").write_bytes(b"\x00" * 132 + b"\xff" * 40)
    save_mask(tmp_path / "masks" / "ct1.png", rect_mask(hw, 4, 4, 12, 12))
    save_mask(tmp_path / "masks" / "sub" / "us1.png", rect_mask(hw, 0, 0, 3, 3))
    save_mask(tmp_path / "masks" / "mr1.png", rect_mask(hw, 8, 0, 16, 16))
    save_mask(tmp_path / "masks" / "broken.png", rect_mask(hw, 0, 0, 3, 3))
    c = cfg(
        "dcm",
        "dicom",
        tmp_path,
        "ct",
        size=None,
        options={"image_dir": "dcm", "mask_dir": "masks", "window_center": 40, "window_width": 400},
    )
    good, bad = run(c)
    assert sorted(good) == ["ct1", "mr1", "sub/us1"]
    assert bad["broken"].reason == "unreadable_dicom"
    ct = good["ct1"]
    assert ct.image.shape == hw and ct.image.dtype == np.float32
    assert ct.image[8, 8] == pytest.approx(0.4) and ct.image[0, 0] == pytest.approx(1.0)
    rec = ct.metadata["intensity"]
    assert rec["unit"] == "HU" and rec["center"] == 40 and rec["width"] == 400
    assert intensity_to_native(ct.image[8, 8], rec) == pytest.approx(0.0, abs=1e-3)
    np.testing.assert_array_equal(ct.boxes, [[4, 4, 12, 12]])
    assert good["sub/us1"].image.shape == hw  # RGB ultrasound -> luminance
    assert good["ct1"].metadata["dicom"]["modality"] == "CT"

    nomask = cfg("dcm2", "dicom", tmp_path / "dcm", "mri", size=8)
    g2, b2 = run(nomask)
    assert g2["mr1"].mask is None and g2["mr1"].boxes is None and g2["mr1"].image.shape == (8, 8)
    assert g2["mr1"].metadata["intensity"]["source"] == "percentile"
    assert len(g2) + len(b2) == 4


# --------------------------------------------------------------------------------------------------
# NIfTI


def _msd(root: Path) -> tuple[np.ndarray, np.ndarray]:
    rng = rng_for("test_readers", "msd")
    img = rng.normal(0, 100, (16, 12, 5)).astype(np.float32)
    lab = np.zeros((16, 12, 5), np.uint8)
    lab[2:6, 3:9, 1] = 1  # x 2..5, y 3..8 on slice 1
    lab[10:14, 0:2, 3] = 2  # label 2 on slice 3
    (root / "imagesTr").mkdir(parents=True)
    (root / "labelsTr").mkdir()
    nib.save(nib.Nifti1Image(img, np.eye(4)), root / "imagesTr" / "liver_0.nii.gz")
    nib.save(nib.Nifti1Image(lab, np.eye(4)), root / "labelsTr" / "liver_0.nii.gz")
    (root / "imagesTr" / "._liver_0.nii.gz").write_bytes(b"\x00\x05\x16\x07 AppleDouble")
    nib.save(nib.Nifti1Image(img[:4], np.eye(4)), root / "imagesTr" / "liver_1.nii.gz")  # no label
    nib.save(nib.Nifti1Image(img, np.eye(4)), root / "imagesTr" / "liver_2.nii.gz")
    nib.save(nib.Nifti1Image(lab[:, :6], np.eye(4)), root / "labelsTr" / "liver_2.nii.gz")  # wrong shape
    return img, lab


def test_nifti_slices_labels_orientation(tmp_path: Path) -> None:
    img, lab = _msd(tmp_path)
    good, bad = run(cfg("msd", "nifti", tmp_path, "ct", size=None))
    assert sorted(good) == ["liver_0_z001", "liver_0_z003"]
    assert {k: q.reason for k, q in bad.items()} == {
        "liver_1": "missing_mask",
        "liver_2": "mask_size_mismatch",
    }
    s = good["liver_0_z001"]
    assert s.image.shape == (12, 16)  # rows = stored y, cols = stored x
    np.testing.assert_array_equal(s.mask, lab[:, :, 1].T > 0)
    np.testing.assert_array_equal(s.boxes, [[2, 3, 6, 9]])  # x0=2, y0=3, x1=6, y1=9
    lo, hi = np.percentile(img, [0.5, 99.5])
    rec = s.metadata["intensity"]
    assert rec["source"] == "percentile" and rec["low"] == pytest.approx(lo, rel=1e-5)
    np.testing.assert_allclose(s.image, np.clip((img[:, :, 1].T - lo) / (hi - lo), 0, 1), atol=1e-5)
    assert s.metadata["nifti"]["slice"] == 1

    win, _ = run(
        cfg("msd", "nifti", tmp_path, "ct", size=None, options={"window_center": 0, "window_width": 200})
    )
    np.testing.assert_allclose(
        win["liver_0_z003"].image, np.clip((img[:, :, 3].T + 100) / 200, 0, 1), atol=1e-6
    )
    only2, _ = run(cfg("msd", "nifti", tmp_path, "ct", size=None, options={"label_values": [2]}))
    assert sorted(only2) == ["liver_0_z003"]
    every, _ = run(cfg("msd", "nifti", tmp_path, "ct", size=None, options={"all_slices": True}))
    assert sorted(k for k in every if k.startswith("liver_0")) == [f"liver_0_z{k:03d}" for k in range(5)]
    assert every["liver_0_z000"].boxes is not None and every["liver_0_z000"].boxes.shape == (0, 4)
    sag, sag_bad = run(cfg("msd", "nifti", tmp_path, "ct", size=None, options={"axis": 0}))
    # a sagittal slice is 5 x 12 pixels: under the 7 x 7 SSIM window, quarantined at read time
    assert "liver_0_x002" not in sag and sag_bad["liver_0_x002"].reason == "too_small"


def test_a_volume_read_again_keeps_its_window_and_its_pixels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A volume that left the two-volume cache is read again without a second percentile pass,
    with the same pixels; a rewritten file (a new stamp) gets its own window."""
    from medrobust_lib.data import readers_nifti

    img, _ = _msd(tmp_path)
    first, _ = run(cfg("msd", "nifti", tmp_path, "ct", size=None))
    calls: list[int] = []
    real = readers_nifti.percentile_window
    monkeypatch.setattr(readers_nifti, "percentile_window", lambda v, p: calls.append(1) or real(v, p))
    readers_nifti._CACHE.clear()
    again, _ = run(cfg("msd", "nifti", tmp_path, "ct", size=None))
    assert calls == [] and sorted(again) == sorted(first)
    for k in first:
        np.testing.assert_array_equal(again[k].image, first[k].image)
    nib.save(nib.Nifti1Image(img * 2 + 5, np.eye(4)), tmp_path / "imagesTr" / "liver_0.nii.gz")
    readers_nifti._CACHE.clear()
    changed, _ = run(cfg("msd", "nifti", tmp_path, "ct", size=None))
    assert len(calls) >= 1
    assert changed["liver_0_z001"].metadata["intensity"]["low"] == pytest.approx(
        float(np.percentile(img * 2 + 5, 0.5)), rel=1e-5)


def test_nifti_4d_channel(tmp_path: Path) -> None:
    vol = np.zeros((8, 8, 3, 2), np.float32)
    vol[..., 0] = 1.0
    vol[..., 1] = np.arange(8 * 8 * 3, dtype=np.float32).reshape(8, 8, 3)
    lab = np.zeros((8, 8, 3), np.uint8)
    lab[1:3, 1:3, 2] = 1
    (tmp_path / "imagesTr").mkdir()
    (tmp_path / "labelsTr").mkdir()
    nib.save(nib.Nifti1Image(vol, np.eye(4)), tmp_path / "imagesTr" / "BRATS_001.nii.gz")
    nib.save(nib.Nifti1Image(lab, np.eye(4)), tmp_path / "labelsTr" / "BRATS_001.nii.gz")
    good, _ = run(cfg("brats", "nifti", tmp_path, "mri", size=None, options={"channel": 1}))
    s = good["BRATS_001_z002"]
    assert s.image.shape == (8, 8) and float(s.image.max()) > 0.5


def test_mask_vanishing_on_resize_is_quarantined(tmp_path: Path) -> None:
    hw = (60, 90)
    save(tmp_path / "images" / "dot.png", image_u8(hw, "dot"))
    save_mask(tmp_path / "masks" / "dot.png", rect_mask(hw, 2, 2, 3, 3))  # one pixel, between samples
    good, bad = run(cfg("dot", "folder", tmp_path, "xray", size=16))
    assert not good and bad["dot"].reason == "mask_vanished_on_resize"
    kept, _ = run(cfg("dot", "folder", tmp_path, "xray", size=None))
    assert kept["dot"].boxes is not None
    np.testing.assert_array_equal(kept["dot"].boxes, [[2, 2, 3, 3]])
