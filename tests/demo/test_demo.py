"""Tests of the offline demo generator (medrobust_lib.demo)."""

from __future__ import annotations

import csv
import hashlib
import json
import re
from collections import Counter
from pathlib import Path

import cv2
import nibabel as nib
import numpy as np
import pydicom
import pytest
from PIL import Image

from medrobust_lib.data.boxes import mask_to_box
from medrobust_lib.data.splits import split_for
from medrobust_lib.demo import LAYOUTS, SIZE, DemoManifest, DemoSample, build_demo
from medrobust_lib.demo import generators as gens
from medrobust_lib.demo.build import STAMP_NAME
from medrobust_lib.demo.geometry import Placement, plan_placements
from medrobust_lib.seeding import rng_for
from medrobust_lib.types import ALL_MODALITIES

N = 4
GRAY = {"ct", "mri", "ultrasound", "xray", "oct", "angiography"}
RGB = {"fundus", "pathology", "dermoscopy", "endoscopy"}


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> DemoManifest:
    return build_demo(tmp_path_factory.mktemp("demo_a"), seed=0, n_per_modality=N)


@pytest.fixture(scope="module")
def demo_again(tmp_path_factory: pytest.TempPathFactory) -> DemoManifest:
    return build_demo(tmp_path_factory.mktemp("demo_b"), seed=0, n_per_modality=N)


@pytest.fixture(scope="module")
def demo_seed1(tmp_path_factory: pytest.TempPathFactory) -> DemoManifest:
    return build_demo(tmp_path_factory.mktemp("demo_c"), seed=1, n_per_modality=N)


def _file_hashes(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _read_image(root: Path, s: DemoSample) -> np.ndarray:
    """The stored image array of a sample, read with the codec libraries directly."""
    path = root / s.image_path
    if path.suffix == ".dcm":
        return np.asarray(pydicom.dcmread(path).pixel_array)
    if path.name.endswith(".nii.gz"):
        vol = np.asarray(nib.load(path).dataobj)  # type: ignore[attr-defined]
        return np.asarray(vol[:, :, s.slice_index].T)
    arr = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    assert arr is not None, path
    return arr


def _read_mask(root: Path, s: DemoSample) -> np.ndarray:
    """The stored mask of a sample as bool, decoded by each layout's published rule."""
    path = root / s.mask_path
    if path.name.endswith(".nii.gz"):
        lab = np.asarray(nib.load(path).dataobj)  # type: ignore[attr-defined]
        return np.asarray(lab[:, :, s.slice_index].T > 0)
    raw = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    assert raw is not None, path
    if raw.ndim == 3:
        raw = raw.max(axis=2)
    if path.suffix == ".bmp":  # REFUGE: 0 cup, 128 rim, 255 background
        return np.asarray(raw < 192)
    return np.asarray(raw > 127)


# ---------------------------------------------------------------- build and layouts


def test_every_modality_written_with_n_images(demo: DemoManifest) -> None:
    assert [d.modality for d in demo.datasets] == list(ALL_MODALITIES)
    for d in demo.datasets:
        assert d.name == f"{d.modality}_demo"
        assert d.format == LAYOUTS[d.modality].format
        assert Path(d.root).is_dir()
        assert len(d.samples) == N
        assert len({s.sample_id for s in d.samples}) == N
        cfg = d.config()
        assert set(cfg) == {"name", "modality", "format", "root", "options"}


def test_image_sizes_and_channels(demo: DemoManifest) -> None:
    for s in demo.samples():
        img = _read_image(demo.root, s)
        assert img.shape[:2] == (SIZE, SIZE), s.image_path
        if s.modality in GRAY:
            if img.ndim == 3:  # BUSI stores grayscale as RGB with equal channels
                assert s.modality == "ultrasound"
                assert (img[..., 0] == img[..., 1]).all() and (img[..., 1] == img[..., 2]).all()
            else:
                assert img.ndim == 2
        else:
            assert s.modality in RGB
            assert img.ndim == 3 and img.shape[2] == 3
            assert not (img[..., 0] == img[..., 2]).all()
    assert _read_image(demo.root, demo.dataset("xray").samples[0]).dtype == np.uint16


def test_ct_dicom_header(demo: DemoManifest) -> None:
    s = demo.dataset("ct").samples[0]
    ds = pydicom.dcmread(demo.root / s.image_path)
    assert ds.Modality == "CT"
    assert (ds.Rows, ds.Columns) == (SIZE, SIZE)
    assert float(ds.RescaleIntercept) == -1024 and float(ds.RescaleSlope) == 1
    assert float(ds.WindowCenter) == 40 and float(ds.WindowWidth) == 400
    assert ds.pixel_array.dtype == np.int16
    assert str(ds.SOPInstanceUID).startswith("2.25.")
    assert not ds.get("StudyDate") and not ds.get("StudyTime") and "ContentTime" not in ds


def test_masks_nonempty_and_boxes_tight(demo: DemoManifest) -> None:
    for s in demo.samples():
        mask = _read_mask(demo.root, s)
        assert mask.shape == (SIZE, SIZE)
        assert mask.any(), s.mask_path
        assert int(mask.sum()) == s.area
        box = mask_to_box(mask)
        assert box is not None and tuple(float(v) for v in box) == s.box
        n_components, _ = cv2.connectedComponents(mask.astype(np.uint8), connectivity=8)
        assert n_components == 2, s.mask_path  # background + exactly one lesion


def test_kvasir_jpeg_masks_agree_across_decoders(demo: DemoManifest) -> None:
    for s in demo.dataset("endoscopy").samples:
        path = demo.root / s.mask_path
        with Image.open(path) as im:
            pil = np.asarray(im.convert("L")) > 127
        assert (pil == _read_mask(demo.root, s)).all()


def test_mri_volumes_have_n_foreground_slices(demo: DemoManifest) -> None:
    d = demo.dataset("mri")
    total = 0
    for p in sorted((Path(d.root) / "labelsTr").glob("*.nii.gz")):
        lab = np.asarray(nib.load(p).dataobj)  # type: ignore[attr-defined]
        fg = np.asarray(lab.reshape(-1, lab.shape[2]).any(axis=0), dtype=bool)
        assert not fg[0] and not fg[-1]  # lesion-free slices at both ends
        total += int(fg.sum())
        img = np.asarray(nib.load(Path(d.root) / "imagesTr" / p.name).dataobj)  # type: ignore[attr-defined]
        assert img.shape == lab.shape and img.dtype == np.int16
    assert total == N
    assert all(re.fullmatch(r"mri_\d{3}_z\d{3}", s.sample_id) for s in d.samples)


def test_positions_cover_both_halves(demo: DemoManifest) -> None:
    for d in demo.datasets:
        if d.modality == "mri":  # 2 lesion slices per case: a case shares one position
            continue
        assert {s.horizontal for s in d.samples} == {"left", "right"}, d.name
        assert {s.vertical for s in d.samples} == {"upper", "lower"}, d.name
        assert {s.size for s in d.samples} == {"small", "large"}, d.name


def test_placement_plan_is_balanced() -> None:
    plan = plan_placements(rng_for(0, "t"), 16)
    assert Counter((p.right, p.lower) for p in plan[:4]) == Counter(
        {(a, b): 1 for a in (0, 1) for b in (0, 1)}
    )
    assert Counter((p.right, p.lower, p.large) for p in plan[:8]).most_common(1)[0][1] == 1


@pytest.mark.parametrize("modality", [m for m in ALL_MODALITIES if m != "mri"])
def test_lesion_changes_image_inside_mask(modality: str) -> None:
    for i, pl in enumerate(
        [Placement(False, False, False), Placement(True, True, True), Placement(True, False, False)]
    ):
        rng = rng_for(5, "test", modality, i)
        g = (
            gens.gen_ultrasound(rng, pl, i % 2 == 1)
            if modality == "ultrasound"
            else gens.GENERATORS[modality](rng, pl)
        )
        assert g.image.shape == g.background.shape and g.image.dtype == g.background.dtype
        diff = np.abs(g.image.astype(np.float64) - g.background.astype(np.float64))
        if diff.ndim == 3:
            diff = diff.mean(axis=2)
        assert g.mask.any()
        assert diff[g.mask].mean() > 5 * max(diff[~g.mask].mean(), 1e-9), modality
        if modality != "ultrasound":  # ultrasound adds posterior enhancement/shadowing below
            assert diff[~g.mask].max() == 0, modality


def test_mri_lesion_changes_image_inside_mask() -> None:
    case = gens.gen_mri_case(rng_for(5, "test", "mri"), Placement(True, False, True), 2)
    for z in case.foreground_slices:
        m = case.labels[z] > 0
        diff = np.abs(case.volume[z].astype(np.float64) - case.background[z])
        assert diff[m].mean() > 0 and diff[~m].max() == 0
    assert case.foreground_slices == [1, 2]


# ---------------------------------------------------------------- determinism and caching


def test_same_seed_gives_identical_bytes(demo: DemoManifest, demo_again: DemoManifest) -> None:
    a, b = _file_hashes(demo.root), _file_hashes(demo_again.root)
    assert a.keys() == b.keys()
    # the manifest names its own absolute root; every other file is identical across folders
    assert {k: v for k, v in a.items() if k != "demo_manifest.json"} == {
        k: v for k, v in b.items() if k != "demo_manifest.json"
    }
    text_a = (demo.root / "demo_manifest.json").read_text().replace(str(demo.root), "<root>")
    text_b = (demo_again.root / "demo_manifest.json").read_text().replace(str(demo_again.root), "<root>")
    assert text_a == text_b


def test_forced_rebuild_in_place_is_byte_identical(tmp_path: Path) -> None:
    build_demo(tmp_path, seed=2, n_per_modality=1)
    before = _file_hashes(tmp_path)
    build_demo(tmp_path, seed=2, n_per_modality=1, force=True)
    assert _file_hashes(tmp_path) == before


def test_different_seed_differs(demo: DemoManifest, demo_seed1: DemoManifest) -> None:
    a, b = _file_hashes(demo.root), _file_hashes(demo_seed1.root)
    images_a = {k: v for k, v in a.items() if "/masks/" not in k and k.endswith((".png", ".jpg", ".dcm"))}
    common = [k for k in images_a if k in b]
    assert sum(images_a[k] != b[k] for k in common) >= 0.9 * len(common)
    assert a["records/omnimedvqa.json"] != b["records/omnimedvqa.json"]


def test_rebuild_with_same_seed_is_skipped(tmp_path: Path) -> None:
    first = build_demo(tmp_path, seed=3, n_per_modality=1)
    dcm = tmp_path / first.dataset("ct").samples[0].image_path
    mtime = dcm.stat().st_mtime_ns
    again = build_demo(tmp_path, seed=3, n_per_modality=1)
    assert dcm.stat().st_mtime_ns == mtime  # skipped: nothing rewritten (no timing asserted)
    assert again.to_json_dict() == first.to_json_dict()
    assert json.loads((tmp_path / STAMP_NAME).read_text())["seed"] == 3
    other = build_demo(tmp_path, seed=4, n_per_modality=1)  # stale stamp -> rebuilt
    assert other.seed == 4
    assert sum(1 for _ in (tmp_path / "xray_demo" / "images").iterdir()) == 1


def test_invalid_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="n_per_modality"):
        build_demo(tmp_path, n_per_modality=0)
    with pytest.raises(ValueError, match="seed"):
        build_demo(tmp_path, seed=1.5)  # type: ignore[arg-type]


def test_manifest_json_round_trip(demo: DemoManifest) -> None:
    from medrobust_lib.data.dataset import DatasetConfig

    loaded = DemoManifest.load(demo.root)
    assert loaded.to_json_dict() == demo.to_json_dict()
    assert loaded.dataset_configs() == demo.dataset_configs()
    data = json.loads((demo.root / "demo_manifest.json").read_text())
    assert data["datasets"] == demo.dataset_configs()
    for entry in data["datasets"]:  # each entry is exactly a DatasetConfig
        assert Path(DatasetConfig(**entry).root).is_dir()


def test_moved_demo_folder_is_reused_and_reresolved(tmp_path: Path) -> None:
    build_demo(tmp_path / "a", seed=0, n_per_modality=1)
    (tmp_path / "a").rename(tmp_path / "b")
    man = build_demo(tmp_path / "b", seed=0, n_per_modality=1)
    assert all(Path(d.root).parent == (tmp_path / "b").resolve() for d in man.datasets)
    data = json.loads((tmp_path / "b" / "demo_manifest.json").read_text())
    assert all(Path(d["root"]).parent == (tmp_path / "b").resolve() for d in data["datasets"])


# ---------------------------------------------------------------- records


def test_omnimedvqa_records(demo: DemoManifest) -> None:
    recs = json.loads(demo.records["omnimedvqa"].read_text())
    assert len(recs) == 3 * 10 * N
    keys = {"question_id", "dataset", "question_type", "modality_type", "question", "gt_answer", "image_path"}
    truth = {(s.dataset, s.sample_id): s for s in demo.samples()}
    letters: Counter[str] = Counter()
    for r in recs:
        assert keys | {f"option_{c}" for c in "ABCD"} <= set(r)
        opts = [r[f"option_{c}"] for c in "ABCD"]
        assert len(set(opts)) == 4 and r["gt_answer"] in opts
        letters["ABCD"[opts.index(r["gt_answer"])]] += 1
        assert (demo.root / r["image_path"]).is_file()
        s = truth[(r["dataset"], r["sample_id"])]
        if r["question_type"] == "Lesion Location":
            assert r["gt_answer"].lower() == s.quadrant
    assert {r["question_type"] for r in recs} == {
        "Modality Recognition",
        "Anatomy Identification",
        "Lesion Location",
    }
    assert len(letters) == 4


def test_yesno_records(demo: DemoManifest) -> None:
    lines = demo.records["yesno_paraphrases"].read_text().splitlines()
    recs = [json.loads(x) for x in lines]
    assert len(recs) == 2 * 10 * N
    answers = Counter(r["answer"] for r in recs)
    assert answers["yes"] == answers["no"] == len(recs) // 2
    truth = {(s.dataset, s.sample_id): s for s in demo.samples()}
    for r in recs:
        assert {
            "id",
            "image_path",
            "dataset",
            "modality",
            "question",
            "answer",
            "paraphrases",
            "finding",
        } <= set(r)
        assert (demo.root / r["image_path"]).is_file()
        assert len(r["paraphrases"]) >= 5
        assert any(p["polarity"] == -1 for p in r["paraphrases"])
        assert all(p["polarity"] in (1, -1) and p["text"].endswith("?") for p in r["paraphrases"])
        q = r["question"].lower()
        assert " yes" not in q and " no " not in q
        s = truth[(r["dataset"], r["sample_id"])]
        f = r["finding"]
        if f.startswith("modality "):
            expected = f == f"modality {s.modality}"
        elif " half" in f:
            expected = s.horizontal in f or s.vertical in f
        else:
            expected = s.size in f if f.startswith(("small", "large")) else s.brightness in f
        assert r["answer"] == ("yes" if expected else "no"), (r["question"], s)
    kinds = Counter(r["finding"].startswith("modality ") for r in recs)
    assert kinds[True] == kinds[False] == len(recs) // 2  # one image-level question and one finding per image


def test_yesno_question_wording_is_not_an_answer_cue(demo: DemoManifest) -> None:
    recs = [json.loads(x) for x in demo.records["yesno_paraphrases"].read_text().splitlines()]

    def template(q: str) -> str:
        return re.sub(
            r"\b(left|right|upper|lower|small|large|less|more|brighter|darker|hyper\w+|hypo\w+)\b", "_", q
        )

    by_answer = {a: Counter(template(r["question"]) for r in recs if r["answer"] == a) for a in ("yes", "no")}
    assert set(by_answer["yes"]) & set(by_answer["no"])


def test_roco_captions_and_images(demo: DemoManifest) -> None:
    with demo.records["roco_captions"].open(newline="") as f:
        caps = list(csv.DictReader(f))
    with demo.records["roco_images"].open(newline="") as f:
        imgs = list(csv.DictReader(f))
    assert list(caps[0]) == ["ID", "Caption"]
    assert len(caps) == 10 * N and len({c["ID"] for c in caps}) == len(caps)
    assert all(re.fullmatch(r"ROCOv2_2023_(train|valid|test)_\d{6}", c["ID"]) for c in caps)
    assert [c["ID"] for c in caps] == [i["ID"] for i in imgs]
    assert all((demo.root / i["image_path"]).is_file() for i in imgs)
    assert all(c["Caption"].strip().endswith(".") for c in caps)
    assert len({c["Caption"] for c in caps}) > 0.8 * len(caps)


def test_grounding_records_match_masks(demo: DemoManifest) -> None:
    recs = json.loads(demo.records["mecovqa_grounding"].read_text())
    assert len(recs) == 10 * N
    truth = {(s.dataset, s.sample_id): s for s in demo.samples()}
    for r in recs:
        s = truth[(r["dataset"], r["sample_id"])]
        human, gpt = r["conversations"]
        assert human["from"] == "human" and human["value"].startswith("<image>\n")
        assert gpt["from"] == "gpt"
        assert tuple(r["bbox"]) == s.box == tuple(float(v) for v in mask_to_box(_read_mask(demo.root, s)))  # type: ignore[union-attr]
        h, w = r["image_size"]
        norm = json.loads(gpt["value"])
        assert np.allclose(norm, np.array(r["bbox"]) / [w, h, w, h], atol=5e-4)
        assert (demo.root / r["image"]).is_file()
    assert "Please output the bounding box of the lesion in this image." in {
        r["conversations"][0]["value"].split("\n", 1)[1] for r in recs
    }


def test_splits_csv(demo: DemoManifest) -> None:
    with demo.records["splits"].open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 10 * N
    for r in rows:
        assert (
            r["split"]
            == split_for(r["dataset"], r["sample_id"])
            == demo.splits[(r["dataset"], r["sample_id"])]
        )


# ---------------------------------------------------------------- through the dataset readers


def test_demo_reads_through_dataset_readers(demo: DemoManifest) -> None:
    from medrobust_lib.data.dataset import DatasetConfig, index_dataset, iter_dataset
    from medrobust_lib.data.sample import Sample

    for d in demo.datasets:
        cfg = DatasetConfig(**d.config())
        refs, bad = index_dataset(cfg)
        assert bad == [], d.name
        assert [r.sample_id for r in refs] == [s.sample_id for s in d.samples]
        truth = {s.sample_id: s for s in d.samples}
        for item in iter_dataset(cfg):
            assert isinstance(item, Sample), item
            s = truth[item.sample_id]
            assert item.image.shape == ((SIZE, SIZE) if d.modality in GRAY else (SIZE, SIZE, 3)), d.name
            assert item.mask is not None and (item.mask == _read_mask(demo.root, s)).all()
            assert item.boxes is not None and tuple(float(v) for v in item.boxes[0]) == s.box


@pytest.mark.slow
def test_full_build_has_every_sample(tmp_path: Path) -> None:
    """The demo's own size (24 per modality) builds every sample (no timing asserted: the build's
    time is in the demo's stage line)."""
    man = build_demo(tmp_path, seed=0, n_per_modality=24)
    assert sum(len(d.samples) for d in man.datasets) == 240
