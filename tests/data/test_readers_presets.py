"""The reference datasets' presets (Hyper-Kvasir, Kaggle brain tumour, SMDG glaucoma, PanNuke
arrays, per-image npy) on small files written in the published layouts.

Layouts confirmed from public copies: Hyper-Kvasir ``segmented-images/{images,masks}/<id>.jpg`` +
``bounding-boxes.json`` keyed by stem with ``bbox: [{xmin, ymin, xmax, ymax}]`` (dataset-ninja's
converter); the Kaggle brain tumour set as ``images/*.png`` + ``masks/*.png`` (3,064 pairs); SMDG
``full-fundus/``, ``optic-disc/``, ``optic-cup/`` (the SMDG README); PanNuke ``images.npy``,
``masks.npy`` (6 channels, 5 = background), ``types.npy`` per part; MedSAM's per-slice
``imgs/<name>.npy`` (H, W, 3) float in [0, 1] + ``gts/<name>.npy`` (H, W) uint8 label maps.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from medrobust_lib.data.dataset import index_dataset
from medrobust_lib.data.readers_npy import open_npy
from tests.data.test_readers import cfg, image_u8, rect_mask, run, save, save_mask

# --------------------------------------------------------------------------------------------------
# hyper_kvasir


def _hyper_kvasir(root: Path) -> Path:
    seg = root / "hyper-kvasir" / "segmented-images"
    for sid, (y0, x0, y1, x1) in {"0a1b": (10, 20, 20, 40), "0c2d": (5, 5, 25, 15)}.items():
        save(seg / "images" / f"{sid}.jpg", image_u8((40, 60), sid), quality=95)
        save_mask(seg / "masks" / f"{sid}.jpg", rect_mask((40, 60), y0, x0, y1, x1), quality=100)
    save(seg / "images" / "0e3f.jpg", image_u8((40, 60), "0e3f"))  # no mask
    boxes = {
        "0a1b": {"height": 40, "width": 60, "bbox": [{"label": "polyp", "xmin": 20, "ymin": 10, "xmax": 39, "ymax": 19}]},
        "0c2d": {"height": 40, "width": 60, "bbox": [{"label": "polyp", "xmin": 5, "ymin": 5, "xmax": 14, "ymax": 24},
                                                     {"label": "polyp", "xmin": 1, "ymin": 1, "xmax": 3, "ymax": 3}]},
    }
    (seg / "bounding-boxes.json").write_text(json.dumps(boxes))
    return seg


def test_hyper_kvasir_layout_boxes_and_published_boxes(tmp_path: Path) -> None:
    seg = _hyper_kvasir(tmp_path)
    good, bad = run(cfg("hk", "hyper_kvasir", tmp_path, "endoscopy", size=None))  # root: parent of the archive folder
    assert sorted(good) == ["0a1b", "0c2d"] and bad["0e3f"].reason == "missing_mask"
    s = good["0a1b"]
    assert s.image.shape == (40, 60, 3) and s.mask is not None and int(s.mask.sum()) == 10 * 20
    np.testing.assert_array_equal(s.boxes, [[20, 10, 40, 20]])
    assert s.metadata["published_boxes_xyxy"] == [[20.0, 10.0, 39.0, 19.0]]
    assert good["0c2d"].metadata["n_published_boxes"] == 2
    (seg / "bounding-boxes.json").unlink()
    with pytest.raises(FileNotFoundError, match="bounding-boxes.json"):
        index_dataset(cfg("hk", "hyper_kvasir", seg, "endoscopy"))


# --------------------------------------------------------------------------------------------------
# brain_tumor_kaggle


def test_brain_tumor_kaggle(tmp_path: Path) -> None:
    root = tmp_path / "brain-tumor-segmentation"
    save(root / "images" / "1.png", image_u8((48, 48), "bt1", channels=3))  # stored RGB, read as gray
    save_mask(root / "masks" / "1.png", rect_mask((48, 48), 4, 6, 20, 30))
    save(root / "images" / "2.png", image_u8((48, 48), "bt2", channels=1))
    save_mask(root / "masks" / "2.png", np.zeros((48, 48), bool))
    good, bad = run(cfg("bt", "brain_tumor_kaggle", tmp_path, "mri", size=24))
    assert list(good) == ["1"] and bad["2"].reason == "empty_mask"
    s = good["1"]
    assert s.image.shape == (24, 24) and s.metadata["intensity"]["color"] == "bt601_luminance"
    np.testing.assert_array_equal(s.boxes, [[3, 2, 15, 10]])  # (6, 4, 30, 20) halved
    (root / "masks" / "1.png").unlink()
    (root / "masks" / "2.png").unlink()
    (root / "masks").rmdir()
    with pytest.raises(FileNotFoundError, match="masks folder"):
        index_dataset(cfg("bt", "brain_tumor_kaggle", root, "mri"))


# --------------------------------------------------------------------------------------------------
# glaucoma


def _smdg(root: Path) -> None:
    for sid in ("REFUGE1-TRAIN-1", "G1020-7"):
        save(root / "full-fundus" / "full-fundus" / f"{sid}.png", image_u8((50, 50), sid))
    save_mask(root / "optic-disc" / "optic-disc" / "REFUGE1-TRAIN-1.png", rect_mask((50, 50), 10, 12, 40, 38))
    save_mask(root / "optic-cup" / "optic-cup" / "REFUGE1-TRAIN-1.png", rect_mask((50, 50), 20, 20, 30, 28))


def test_glaucoma_disc_and_cup_as_two_datasets(tmp_path: Path) -> None:
    _smdg(tmp_path)
    disc, bad = run(cfg("disc", "glaucoma", tmp_path, "fundus", size=None))
    assert list(disc) == ["REFUGE1-TRAIN-1"] and bad == {}  # G1020-7 has no disc mask: not a sample
    np.testing.assert_array_equal(disc["REFUGE1-TRAIN-1"].boxes, [[12, 10, 38, 40]])
    assert disc["REFUGE1-TRAIN-1"].metadata["source_dataset"] == "REFUGE1-TRAIN"
    cup, _ = run(cfg("cup", "glaucoma", tmp_path, "fundus", size=None, options={"target": "cup"}))
    np.testing.assert_array_equal(cup["REFUGE1-TRAIN-1"].boxes, [[20, 20, 28, 30]])
    assert cup["REFUGE1-TRAIN-1"].metadata["target"] == "cup"
    _, bad = run(cfg("disc", "glaucoma", tmp_path, "fundus", options={"missing_target": "quarantine"}))
    assert bad["G1020-7"].reason == "missing_mask"


def test_glaucoma_missing_mask_set_names_it(tmp_path: Path) -> None:
    save(tmp_path / "full-fundus" / "a.png", image_u8((20, 20), "a"))  # not nested: also accepted
    save_mask(tmp_path / "optic-disc" / "a.png", rect_mask((20, 20), 2, 2, 9, 9))
    good, _ = run(cfg("disc", "glaucoma", tmp_path, "fundus", size=None))
    assert list(good) == ["a"]
    with pytest.raises(FileNotFoundError, match="optic-cup"):
        index_dataset(cfg("cup", "glaucoma", tmp_path, "fundus", options={"target": "cup"}))


# --------------------------------------------------------------------------------------------------
# pannuke_npy


def _pannuke(root: Path) -> tuple[np.ndarray, np.ndarray]:
    part = root / "Part 1"
    (part / "Images").mkdir(parents=True)
    (part / "Masks").mkdir(parents=True)
    images = np.stack([image_u8((32, 32), f"pn{i}").astype(np.float64) for i in range(3)])  # float64 0..255
    masks = np.zeros((3, 32, 32, 6), np.float64)
    masks[0, 2:6, 3:9, 0] = 17  # two neoplastic nuclei (instance ids 17, 18)
    masks[0, 20:24, 20:30, 0] = 18
    masks[0, 10:15, 10:12, 2] = 4  # one connective nucleus
    masks[2, 0:3, 0:3, 4] = 1  # one epithelial nucleus
    masks[..., 5] = (masks[..., :5].sum(axis=3) == 0).astype(np.float64)  # background channel
    np.save(part / "Images" / "images.npy", images)
    np.save(part / "Images" / "types.npy", np.array(["Breast", "Colon", "Lung"]))
    np.save(part / "Masks" / "masks.npy", masks)
    return images, masks


def test_pannuke_per_channel_boxes_merged_and_resize(tmp_path: Path) -> None:
    images, _ = _pannuke(tmp_path)
    good, bad = run(cfg("pannuke", "pannuke_npy", tmp_path, "pathology", size=None))
    assert sorted(good) == ["part1_00000", "part1_00002"] and bad["part1_00001"].reason == "empty_mask"
    s = good["part1_00000"]
    np.testing.assert_allclose(s.image, images[0] / 255.0, atol=1e-6)
    np.testing.assert_array_equal(s.boxes, [[3, 2, 30, 24], [10, 10, 12, 15]])  # neoplastic, connective
    assert s.metadata["classes_present"] == ["neoplastic", "connective"] and s.metadata["tissue"] == "Breast"
    assert s.metadata["n_nuclei"]["neoplastic"] == 2 and s.metadata["n_nuclei"]["dead"] == 0
    assert s.mask is not None and int(s.mask.sum()) == 4 * 6 + 4 * 10 + 5 * 2
    merged, _ = run(cfg("pannuke", "pannuke_npy", tmp_path, "pathology", size=None, options={"boxes": "merged"}))
    np.testing.assert_array_equal(merged["part1_00000"].boxes, [[3, 2, 30, 24]])
    big, _ = run(cfg("pannuke", "pannuke_npy", tmp_path, "pathology", size=64))
    np.testing.assert_array_equal(big["part1_00000"].boxes, [[6, 4, 60, 48], [20, 20, 24, 30]])
    only_epi, bad = run(cfg("pannuke", "pannuke_npy", tmp_path, "pathology", size=None, options={"channels": [4]}))
    assert list(only_epi) == ["part1_00002"] and bad["part1_00000"].reason == "empty_mask"


def test_pannuke_memory_maps_and_names_a_missing_array(tmp_path: Path) -> None:
    _pannuke(tmp_path)
    assert isinstance(open_npy(tmp_path / "Part 1" / "Masks" / "masks.npy"), np.memmap)
    (tmp_path / "Part 1" / "Masks" / "masks.npy").unlink()
    with pytest.raises(FileNotFoundError, match=r"masks\.npy"):
        index_dataset(cfg("pannuke", "pannuke_npy", tmp_path, "pathology"))
    np.save(tmp_path / "Part 1" / "Masks" / "masks.npy", np.zeros((2, 32, 32, 6)))  # wrong N
    with pytest.raises(ValueError, match="does not match"):
        index_dataset(cfg("pannuke", "pannuke_npy", tmp_path, "pathology"))


# --------------------------------------------------------------------------------------------------
# npy_single


def test_npy_single_medsam_slices(tmp_path: Path) -> None:
    root = tmp_path / "npy" / "CT_Abd"
    (root / "imgs").mkdir(parents=True)
    (root / "gts").mkdir(parents=True)
    img = image_u8((32, 32), "flare", channels=1).astype(np.float64) / 255.0
    lab = np.zeros((32, 32), np.uint8)
    lab[4:10, 5:12] = 1  # liver
    lab[20:30, 22:26] = 3  # spleen
    np.save(root / "imgs" / "CT_Abd_FLARE22_Tr_0001-000.npy", np.repeat(img[..., None], 3, axis=2))
    np.save(root / "gts" / "CT_Abd_FLARE22_Tr_0001-000.npy", lab)
    np.save(root / "imgs" / "CT_Abd_FLARE22_Tr_0001-001.npy", img * 300.0)  # out of [0, 1]
    np.save(root / "gts" / "CT_Abd_FLARE22_Tr_0001-001.npy", lab)
    np.save(root / "imgs" / "CT_Abd_FLARE22_Tr_0001-002.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    np.save(root / "gts" / "CT_Abd_FLARE22_Tr_0001-002.npy", lab)
    np.save(root / "imgs" / "CT_Abd_FLARE22_Tr_0001-003.npy", img)  # no gts file
    good, bad = run(cfg("flare", "npy_single", root, "ct", size=None))
    s = good["CT_Abd_FLARE22_Tr_0001-000"]
    assert s.image.shape == (32, 32, 3) and s.metadata["labels_present"] == [1, 3]
    np.testing.assert_allclose(s.image[..., 0], img, atol=1e-6)
    np.testing.assert_array_equal(s.boxes, [[5, 4, 26, 30]])
    assert bad["CT_Abd_FLARE22_Tr_0001-001"].reason == "unreadable_image"
    assert "float_scale" in bad["CT_Abd_FLARE22_Tr_0001-001"].detail
    assert bad["CT_Abd_FLARE22_Tr_0001-002"].reason == "unreadable_image"  # pickles refused
    assert bad["CT_Abd_FLARE22_Tr_0001-003"].reason == "missing_mask"
    spleen, _ = run(cfg("flare", "npy_single", root, "ct", size=None, options={"label_values": [3]}))
    np.testing.assert_array_equal(spleen["CT_Abd_FLARE22_Tr_0001-000"].boxes, [[22, 20, 26, 30]])
    scaled, _ = run(cfg("flare", "npy_single", root, "ct", size=None, options={"float_scale": 300.0}))
    assert "CT_Abd_FLARE22_Tr_0001-001" in scaled
    with pytest.raises(FileNotFoundError, match="masks"):
        index_dataset(cfg("flare", "npy_single", root, "ct", options={"mask_dir": "masks"}))


def test_docs_dataset_examples_validate() -> None:
    """docs/own-data.md's example suite entries for these presets are valid DatasetConfigs."""
    import yaml

    from medrobust_lib.data.dataset import DatasetConfig

    text = (Path(__file__).resolve().parents[2] / "docs" / "own-data.md").read_text()
    start = text.index("- {name: hyper_kvasir")
    block = text[start:text.index("```", start)]
    entries = yaml.safe_load(block)
    assert {e["format"] for e in entries} == {"hyper_kvasir", "brain_tumor_kaggle", "glaucoma", "pannuke_npy",
                                              "npy_single"}
    for e in entries:
        DatasetConfig(**e)


def test_hyper_kvasir_root_may_be_any_wrapper_level(tmp_path: Path) -> None:
    seg = _hyper_kvasir(tmp_path)
    for root in (tmp_path, seg.parent, seg):
        refs, bad = index_dataset(cfg("hk", "hyper_kvasir", root, "endoscopy"))
        assert [r.sample_id for r in refs] == ["0a1b", "0c2d"] and len(bad) == 1
    kaggle = tmp_path / "kaggle" / "1"
    kaggle.mkdir(parents=True)
    seg.rename(kaggle / "segmented-images")  # Kaggle's copy: <version>/segmented-images/
    refs, _ = index_dataset(cfg("hk", "hyper_kvasir", kaggle, "endoscopy"))
    assert len(refs) == 2


def test_pannuke_pickled_types_are_noted_not_fatal(tmp_path: Path) -> None:
    _pannuke(tmp_path)
    np.save(tmp_path / "Part 1" / "Images" / "types.npy", np.array(["Breast", 1, None], dtype=object), allow_pickle=True)
    refs, _ = index_dataset(cfg("pannuke", "pannuke_npy", tmp_path, "pathology"))
    assert len(refs) == 3 and refs[0].extra["tissue"] is None and "pickles are refused" in refs[0].extra["tissue_note"]
    with pytest.raises(ValueError, match="channels"):
        cfg("pannuke", "pannuke_npy", tmp_path, "pathology", options={"channels": [6]})


def test_pannuke_original_fold_layout(tmp_path: Path) -> None:
    """PanNuke's own release: fold_1/images/images.npy + fold_1/masks/masks.npy (lower case)."""
    _pannuke(tmp_path)
    fold = tmp_path / "pannuke" / "fold_1"
    fold.mkdir(parents=True)
    (tmp_path / "Part 1" / "Images").rename(fold / "images")
    (tmp_path / "Part 1" / "Masks").rename(fold / "masks")
    refs, _ = index_dataset(cfg("pannuke", "pannuke_npy", tmp_path / "pannuke", "pathology"))
    assert [r.sample_id for r in refs] == ["fold1_00000", "fold1_00001", "fold1_00002"]
    good, _ = run(cfg("pannuke", "pannuke_npy", fold, "pathology", size=None))
    assert sorted(good) == ["fold1_00000", "fold1_00002"]
