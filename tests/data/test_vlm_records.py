"""Tests of the VLM record readers (medrobust_lib.data.vlm_records).

Fixture files are written at test time in the published layouts (OmniMedVQA QA JSON, ROCOv2
``ID,Caption`` CSV and parquet, MeCoVQA-G LLaVA conversations, PSF-Med-like JSONL/CSV), each with
malformed entries and missing images; the demo's record files must read with zero quarantine.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from medrobust_lib.data.vlm_records import (
    ReadResult,
    RecordSource,
    YesNoRecord,
    canonical_modality,
    read_binary_paraphrases,
    read_mecovqa_grounding,
    read_omnimedvqa,
    read_roco,
)
from medrobust_lib.demo import DemoManifest, build_demo


def _png(path: Path, h: int = 20, w: int = 30) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.zeros((h, w), np.uint8)).save(path)
    return path


def _check_counts(res: ReadResult[Any]) -> None:
    assert len(res.records) + len(res.quarantine) == res.n_total


def _reasons(res: ReadResult[Any]) -> dict[str, str]:
    return {q.record_id: q.reason for q in res.quarantine}


def _sources(res: ReadResult[Any]) -> dict[str, RecordSource | None]:
    return {q.record_id: q.source for q in res.quarantine}


def _csv(path: Path, header: list[str], rows: list[list[Any]]) -> Path:
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    return path


# ---------------------------------------------------------------- OmniMedVQA


def _mcq(qid: str, img: str, gt: str, **options: Any) -> dict[str, Any]:
    e: dict[str, Any] = {
        "question_id": qid,
        "dataset": "ACRIMA",
        "question_type": "Disease Diagnosis",
        "modality_type": "Fundus Photography",
        "question": "What is the diagnosis?",
        "gt_answer": gt,
        "image_path": img,
    }
    e.update({f"option_{k}": v for k, v in options.items()})
    return e


def test_omnimedvqa_fixture(tmp_path: Path) -> None:
    _png(tmp_path / "Images/ACRIMA/a.png")
    img = "Images/ACRIMA/a.png"
    entries = [
        _mcq("q0", img, "Glaucoma", A="Normal", B="Cataract", C="Glaucoma", D="AMD"),
        _mcq("q1", img, "Normal", A="Glaucoma", B="Normal"),  # only A-B
        _mcq("q2", img, "Cataract", A="Cataract", B="Normal", C=None, D=float("nan")),  # NaN dropped
        _mcq("q3", img, "glaucoma ", A="Normal", B="Glaucoma"),  # normalised match
        _mcq("q4", img, "Myopia", A="Normal", B="Glaucoma"),
        _mcq("q5", "Images/ACRIMA/missing.png", "Normal", A="Normal", B="Glaucoma"),
        {k: v for k, v in _mcq("q6", img, "Normal", A="Normal", B="X").items() if k != "question"},
        _mcq("q0", img, "Normal", A="Normal", B="X"),  # duplicate id
        _mcq("q7", img, "Normal", A="Normal"),
        "not an object",
    ]
    qa = tmp_path / "QA_information" / "ACRIMA.json"
    qa.parent.mkdir()
    qa.write_text(json.dumps(entries), encoding="utf-8")  # NaN written as the JSON literal NaN
    res = read_omnimedvqa(qa, tmp_path)
    _check_counts(res)
    assert res.n_total == 10
    by_id = {r.record_id: r for r in res.records}
    assert sorted(by_id) == ["q0", "q1", "q2", "q3"]
    assert by_id["q0"].answer_letter == "C" and by_id["q0"].answer_text == "Glaucoma"
    assert list(by_id["q1"].options) == ["A", "B"] and by_id["q1"].answer_letter == "B"
    assert by_id["q2"].options == {"A": "Cataract", "B": "Normal"}
    assert by_id["q3"].answer_letter == "B"
    assert by_id["q0"].modality == "fundus" and by_id["q0"].image_path == tmp_path / img
    assert _reasons(res) == {
        "q4": "answer_not_in_options",
        "q5": "missing_image",
        "q6": "missing_field",
        "q0": "duplicate_id",
        "q7": "too_few_options",
        "#9": "bad_json",
    }
    # a quarantined entry still names its image (so an evaluation can write its row), unless it
    # is a repeated id or names none
    src = _sources(res)
    assert src["q5"] == RecordSource("ACRIMA", "fundus", tmp_path / "Images/ACRIMA/missing.png")
    assert src["q4"] == src["q6"] == src["q7"] == RecordSource("ACRIMA", "fundus", tmp_path / img)
    assert src["q0"] is None and src["#9"] is None
    # a folder of QA files reads the same
    folder = read_omnimedvqa(qa.parent, tmp_path)
    assert [r.record_id for r in folder.records] == [r.record_id for r in res.records]


def test_omnimedvqa_rejects_non_list(tmp_path: Path) -> None:
    p = tmp_path / "qa.json"
    p.write_text("{}", encoding="utf-8")
    with pytest.raises(ValueError, match="JSON list"):
        read_omnimedvqa(p, tmp_path)


def test_canonical_modality() -> None:
    assert canonical_modality("CT(Computed Tomography)") == "ct"
    assert canonical_modality("OCT (Optical Coherence Tomography") == "oct"
    assert canonical_modality("MR (Mag-netic Resonance Imaging)") == "mri"
    assert canonical_modality("X-Ray Angiography") == "angiography"
    assert canonical_modality("X-Ray") == "xray"
    assert canonical_modality("Microscopy Images") == "pathology"
    assert canonical_modality("") == "unknown"


# ---------------------------------------------------------------- ROCOv2


def test_roco_csv_fixture(tmp_path: Path) -> None:
    images = tmp_path / "images"
    _png(images / "ROCOv2_2023_train_000001.jpg")
    _png(images / "test" / "ROCOv2_2023_test_000001.jpg")  # split subfolder layout
    _png(images / "ROCOv2_2023_train_000004.jpg")
    caps = _csv(
        tmp_path / "train_captions.csv",
        ["ID", "Caption"],
        [
            ["ROCOv2_2023_train_000001", "CT of the chest."],
            ["ROCOv2_2023_test_000001", "MRI of the head, arrow marks the lesion."],
            ["ROCOv2_2023_train_000001", "Axial CT image."],  # second reference
            ["ROCOv2_2023_train_000002", "No image for this one."],
            ["", "row without an ID"],
            ["ROCOv2_2023_train_000004", ""],
        ],
    )
    res = read_roco(caps, images)
    _check_counts(res)
    assert res.n_total == 5
    by_id = {r.record_id: r for r in res.records}
    assert by_id["ROCOv2_2023_train_000001"].references == ("CT of the chest.", "Axial CT image.")
    assert by_id["ROCOv2_2023_train_000001"].split == "train"
    assert by_id["ROCOv2_2023_test_000001"].image_path == images / "test" / "ROCOv2_2023_test_000001.jpg"
    assert by_id["ROCOv2_2023_test_000001"].dataset == "rocov2"
    assert _reasons(res) == {
        "ROCOv2_2023_train_000002": "missing_image",
        "row:5": "missing_field",
        "ROCOv2_2023_train_000004": "empty_caption",
    }
    src = _sources(res)
    assert src["ROCOv2_2023_train_000002"] == RecordSource("rocov2", "unknown",
                                                           images / "ROCOv2_2023_train_000002.jpg")
    assert src["ROCOv2_2023_train_000004"] == RecordSource("rocov2", "unknown",
                                                           images / "ROCOv2_2023_train_000004.jpg")
    assert src["row:5"] is None


def test_roco_parquet_and_mapping(tmp_path: Path) -> None:
    _png(tmp_path / "a" / "x.png")
    df = pd.DataFrame(
        {
            "image_id": ["r1", "r2", "r1", "r3"],
            "caption": ["first", "second", "first again", "third"],
            "image_path": ["a/x.png", "a/x.png", "a/x.png", "a/gone.png"],
        }
    )
    pq = tmp_path / "test.parquet"
    df.to_parquet(pq)
    res = read_roco(pq, tmp_path)
    _check_counts(res)
    assert [r.record_id for r in res.records] == ["r1", "r2"]
    assert res.records[0].references == ("first", "first again")
    assert _reasons(res) == {"r3": "missing_image"}
    assert _sources(res) == {"r3": RecordSource("rocov2", "unknown", tmp_path / "a" / "gone.png")}

    mapping = _csv(
        tmp_path / "map.csv",
        ["ID", "image_path", "dataset", "sample_id", "slice_index"],
        [["r1", "a/x.png", "ct_demo", "s1", "2"], ["r2", "a/x.png", "ct_demo", "s2", ""]],
    )
    res2 = read_roco(pq, tmp_path, images_csv=mapping)
    _check_counts(res2)
    assert res2.records[0].dataset == "ct_demo" and res2.records[0].slice_index == 2
    assert res2.records[1].slice_index is None
    assert _reasons(res2) == {"r3": "missing_image"}  # not in the mapping
    assert _sources(res2) == {"r3": None}
    gone = _csv(tmp_path / "map_gone.csv", ["ID", "image_path", "dataset", "sample_id", "slice_index"],
                [["r1", "a/x.png", "ct_demo", "s1", "2"], ["r2", "a/gone.png", "ct_demo", "s2", "3"]])
    res3 = read_roco(pq, tmp_path, images_csv=gone)
    assert _reasons(res3) == {"r2": "missing_image", "r3": "missing_image"}
    assert _sources(res3) == {"r2": RecordSource("ct_demo", "unknown", tmp_path / "a" / "gone.png", "s2", 3),
                              "r3": None}


# ---------------------------------------------------------------- MeCoVQA-G


def _conv(rid: str, image: str, answer: str | None, **extra: Any) -> dict[str, Any]:
    conv = [{"from": "human", "value": "<image>\nPlease output the bounding box of the tumor."}]
    if answer is not None:
        conv.append({"from": "gpt", "value": answer})
    return {"id": rid, "image": image, "conversations": conv, **extra}


def test_mecovqa_grounding_fixture(tmp_path: Path) -> None:
    _png(tmp_path / "img" / "a.png", h=20, w=30)
    mask = np.zeros((20, 30), np.uint8)
    mask[5:9, 10:17] = 255
    (tmp_path / "mask").mkdir()
    Image.fromarray(mask).save(tmp_path / "mask" / "a.png")
    Image.fromarray(np.zeros((20, 30), np.uint8)).save(tmp_path / "mask" / "empty.png")
    img = "img/a.png"
    entries = [
        _conv("g0", img, "[0.1, 0.1, 0.2, 0.2]", bbox=[3, 4, 12, 10], image_size=[20, 30]),
        _conv("g1", img, "The tumor is at [0.100, 0.250, 0.500, 0.750].", image_size=[20, 30]),
        _conv("g2", img, "[3, 4, 12, 10]"),  # pixels, size from the PNG header
        _conv("g3", img, "It is <SEG>.", mask="mask/a.png"),
        _conv("g4", img, "[0.1, 0.2, 0.3, 0.4]"),  # normalised, no image_size
        _conv("g5", img, "There is a tumor."),
        _conv("g6", "img/missing.png", "[3, 4, 12, 10]"),
        _conv("g7", img, "[3, 4, 40, 10]"),  # beyond the 30-px width
        {"id": "g8", "image": img},
        _conv("g9", img, "It is <SEG>.", mask="mask/gone.png"),
        _conv("g10", img, "It is <SEG>.", mask="mask/empty.png"),
    ]
    p = tmp_path / "MeCoVQA-G_test.json"
    p.write_text(json.dumps(entries), encoding="utf-8")
    res = read_mecovqa_grounding(p, tmp_path)
    _check_counts(res)
    by_id = {r.record_id: r for r in res.records}
    assert sorted(by_id) == ["g0", "g1", "g2", "g3"]
    assert by_id["g0"].box_xyxy == (3, 4, 12, 10) and by_id["g0"].box_source == "bbox"
    assert by_id["g0"].question == "Please output the bounding box of the tumor."
    assert by_id["g1"].box_xyxy == (3, 5, 15, 15) and by_id["g1"].box_source == "answer"
    assert by_id["g2"].box_xyxy == (3, 4, 12, 10) and by_id["g2"].image_hw == (20, 30)
    assert by_id["g3"].box_xyxy == (10, 5, 17, 9) and by_id["g3"].box_source == "mask"
    assert by_id["g3"].image_hw == (20, 30)
    assert _reasons(res) == {
        "g4": "no_box",
        "g5": "no_box",
        "g6": "missing_image",
        "g7": "invalid_box",
        "g8": "missing_field",
        "g9": "missing_mask",
        "g10": "empty_mask",
    }
    src = _sources(res)
    assert src["g6"] == RecordSource("mecovqa_g", "unknown", tmp_path / "img" / "missing.png")
    assert src["g8"] == src["g9"] == RecordSource("mecovqa_g", "unknown", tmp_path / img)


# ---------------------------------------------------------------- binary paraphrases


def _yn(rid: str, img: str, answer: Any, paras: list[tuple[str, Any]]) -> dict[str, Any]:
    return {
        "id": rid,
        "image_path": img,
        "dataset": "mimic",
        "modality": "xray",
        "question": "Is there a pleural effusion?",
        "answer": answer,
        "paraphrases": [{"text": t, "polarity": p} for t, p in paras],
        "finding": "effusion",
    }


def test_binary_paraphrases_jsonl_fixture(tmp_path: Path) -> None:
    _png(tmp_path / "a.png")
    lines = [
        json.dumps(_yn("y0", "a.png", "Yes", [("Is fluid present?", 1), ("Is effusion absent?", -1)])),
        json.dumps(_yn("y1", "a.png", "no", [])),
        "{not json",
        "",
        json.dumps(_yn("y2", "a.png", "maybe", [])),
        json.dumps(_yn("y3", "a.png", "yes", [("Is fluid present?", 2)])),
        json.dumps(_yn("y4", "gone.png", "yes", [])),
        json.dumps({k: v for k, v in _yn("y5", "a.png", "yes", []).items() if k != "question"}),
        json.dumps(_yn("y6", "a.png", "yes", [("", 1)])),
    ]
    p = tmp_path / "psf.jsonl"
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    res = read_binary_paraphrases(p, tmp_path)
    _check_counts(res)
    assert res.n_total == 8  # the blank line is not an entry
    y0 = res.records[0]
    assert isinstance(y0, YesNoRecord) and y0.answer == "yes" and y0.modality == "xray"
    assert y0.variants == (
        ("Is there a pleural effusion?", 1),
        ("Is fluid present?", 1),
        ("Is effusion absent?", -1),
    )
    assert [y0.expected(p) for _, p in y0.variants] == ["yes", "yes", "no"]
    assert res.records[1].expected(-1) == "yes" and len(res.records[1].variants) == 1
    with pytest.raises(ValueError, match="polarity"):
        y0.expected(0)
    assert _reasons(res) == {
        "line:3": "bad_json",
        "y2": "bad_answer",
        "y3": "bad_polarity",
        "y4": "missing_image",
        "y5": "missing_field",
        "y6": "bad_paraphrase",
    }
    src = _sources(res)
    assert src["y4"] == RecordSource("mimic", "xray", tmp_path / "gone.png")
    assert src["y2"] == src["y5"] == RecordSource("mimic", "xray", tmp_path / "a.png")
    assert src["line:3"] is None


def test_binary_paraphrases_csv_fixture(tmp_path: Path) -> None:
    _png(tmp_path / "a.png")
    q = "Is there a pneumothorax?"
    p = _csv(
        tmp_path / "psf.csv",
        ["id", "image_path", "question", "answer", "paraphrase", "polarity"],
        [
            ["c0", "a.png", q, "no", "Is a pneumothorax visible?", "1"],
            ["c0", "a.png", q, "no", "Is the lung free of pneumothorax?", "-1"],
            ["c1", "a.png", q, "yes", "", ""],
            ["c2", "a.png", q, "yes", "Any pneumothorax?", "1"],
            ["c2", "a.png", q, "no", "Is there no pneumothorax?", "-1"],
            ["", "a.png", q, "yes", "x", "1"],
            ["c3", "a.png", q, "yes", "Any pneumothorax?", "one"],
        ],
    )
    res = read_binary_paraphrases(p, tmp_path)
    _check_counts(res)
    assert res.n_total == 5
    c0 = res.records[0]
    assert c0.variants == (
        (q, 1),
        ("Is a pneumothorax visible?", 1),
        ("Is the lung free of pneumothorax?", -1),
    )
    assert c0.expected(-1) == "yes"
    assert res.records[1].variants == ((q, 1),)
    assert _reasons(res) == {"c2": "inconsistent_rows", "row:6": "missing_field", "c3": "bad_polarity"}
    assert _sources(res) == {"c2": RecordSource("unknown", "unknown", tmp_path / "a.png"), "row:6": None,
                             "c3": RecordSource("unknown", "unknown", tmp_path / "a.png")}


# ---------------------------------------------------------------- demo equivalents


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> DemoManifest:
    return build_demo(tmp_path_factory.mktemp("vlm_demo"), seed=0, n_per_modality=4)


def _n_samples(demo: DemoManifest) -> int:
    return sum(1 for _ in demo.samples())


def test_demo_omnimedvqa(demo: DemoManifest) -> None:
    res = read_omnimedvqa(demo.records["omnimedvqa"], demo.root)
    assert res.quarantine == [] and res.n_total == 3 * _n_samples(demo)
    modality: dict[tuple[str, str | None], str] = {
        (s.dataset, s.sample_id): s.modality for s in demo.samples()
    }
    for r in res.records:
        assert r.modality == modality[(r.dataset, r.sample_id)]
        assert len(r.options) == 4


def test_demo_roco(demo: DemoManifest) -> None:
    res = read_roco(demo.records["roco_captions"], demo.root, images_csv=demo.records["roco_images"])
    assert res.quarantine == [] and res.n_total == _n_samples(demo)
    assert all(len(r.references) == 1 and r.split in ("train", "valid", "test") for r in res.records)


def test_demo_grounding(demo: DemoManifest, tmp_path: Path) -> None:
    path = demo.records["mecovqa_grounding"]
    res = read_mecovqa_grounding(path, demo.root)
    assert res.quarantine == [] and res.n_total == _n_samples(demo)
    boxes: dict[tuple[str, str | None], tuple[int, ...]] = {
        (s.dataset, s.sample_id): tuple(int(v) for v in s.box) for s in demo.samples()
    }
    assert all(r.box_xyxy == boxes[(r.dataset, r.sample_id)] for r in res.records)
    assert not any("<image>" in r.question for r in res.records)
    # without "bbox", the normalised answer text gives the same pixel boxes
    stripped = [{k: v for k, v in e.items() if k != "bbox"} for e in json.loads(path.read_text())]
    p2 = tmp_path / "no_bbox.json"
    p2.write_text(json.dumps(stripped), encoding="utf-8")
    res2 = read_mecovqa_grounding(p2, demo.root)
    assert res2.quarantine == []
    assert [r.box_xyxy for r in res2.records] == [r.box_xyxy for r in res.records]
    assert {r.box_source for r in res2.records} == {"answer"}


def test_demo_binary_paraphrases(demo: DemoManifest) -> None:
    res = read_binary_paraphrases(demo.records["yesno_paraphrases"], demo.root)
    assert res.quarantine == [] and res.n_total == 2 * _n_samples(demo)
    assert sum(r.answer == "yes" for r in res.records) == res.n_total // 2
    for r in res.records:
        assert r.variants[0] == (r.question, 1) and len(r.variants) > 1
        assert {r.expected(p) for _, p in r.variants} <= {"yes", "no"}
