"""The released VLM record files: MeCoVQA-G as MedPLIB reads it, and PSF-Med's question files.

MeCoVQA-G (confirmed from MedPLIB's ``datasets/LazySupervisedDataset.py`` and public evaluation
scripts over ``MeCoVQA_Grounding_test.json``): a JSON list of ``{"id", "image",
"conversations"}``; the gpt turn is ``<SEG><mask>masks/<name>.png</mask>``, paths relative to
``SAMed2Dv1``; mask pixel >= 1 is foreground; ids are SA-Med2D names
(``ct_00--AMOS2022--amos_0001--x_0020``).

PSF-Med (the card of ``saillab/psf-med``: subsets mimic / padchest / vindr, split test, fields
``is_yesno`` and ``is_yesno_claude``, phenomena such as ``lexical_substitution`` and
``negation_pattern``, MIMIC images at ``files/p<2>/p<subject>/s<study>/<dicom>.jpg``). The gated
files' other column names could not be inspected; the fixtures use the accepted spellings of
:data:`~medrobust_lib.data.vlm_records.PSF_MED_FIELDS`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from PIL import Image

from medrobust_lib.data.vlm_records import (
    RecordSource,
    looks_like_psf_med,
    read_binary_paraphrases,
    read_mecovqa_grounding,
    read_psf_med,
    samed2d_name_parts,
)
from tests.data.test_vlm_records import _check_counts, _csv, _png, _reasons, _sources

# ---------------------------------------------------------------- MeCoVQA-G


def _medplib(sid: str, mask_rel: str, question: str = "Please segment the liver in this image.") -> dict[str, Any]:
    return {
        "id": sid,
        "image": f"images/{sid}.png",
        "conversations": [
            {"from": "human", "value": f"<image>\n{question}"},
            {"from": "gpt", "value": f"It is <SEG>.<mask>{mask_rel}</mask>"},
        ],
        "answer_type": "open",
    }


def test_mecovqa_grounding_released_layout(tmp_path: Path) -> None:
    sam = tmp_path / "SAMed2Dv1"
    ct, xr = "ct_00--AMOS2022--amos_0001--x_0020", "x_ray--Chest_Image_Pneum--1.2.276.0.7230010--2d_none"
    for sid in (ct, xr):
        _png(sam / "images" / f"{sid}.png", h=24, w=32)
    m = np.zeros((24, 32), np.uint8)
    m[3:11, 6:20] = 1  # SA-Med2D masks store 0/1 (MedPLIB: value >= 1 is foreground)
    (sam / "masks").mkdir()
    Image.fromarray(m).save(sam / "masks" / f"{ct}_liver_000.png")
    Image.fromarray(m * 255).save(sam / "masks" / f"{xr}_pneumothorax_000.png")
    entries = [
        _medplib(ct, f"masks/{ct}_liver_000.png"),
        _medplib(xr, f"masks/{xr}_pneumothorax_000.png", "Where is the pneumothorax?"),
        _medplib(ct, f"masks/{ct}_gone.png") | {"id": "dup-mask-missing"},
        {k: v for k, v in _medplib(ct, f"masks/{ct}_liver_000.png").items() if k != "id"},  # no id
    ]
    p = tmp_path / "MeCoVQA_Grounding_test.json"
    p.write_text(json.dumps(entries), encoding="utf-8")
    res = read_mecovqa_grounding(p, sam)
    _check_counts(res)
    by_id = {r.record_id: r for r in res.records}
    assert sorted(by_id) == ["#3", ct, xr]
    r = by_id[ct]
    assert r.box_xyxy == (6, 3, 20, 11) and r.box_source == "mask" and r.image_hw == (24, 32)
    assert (r.modality, r.dataset) == ("ct", "AMOS2022")
    assert r.question == "Please segment the liver in this image." and r.answer == "It is ."
    assert (by_id[xr].modality, by_id[xr].dataset) == ("xray", "Chest_Image_Pneum")
    assert by_id["#3"].dataset == "AMOS2022"  # from the image name when there is no id
    assert _reasons(res) == {"dup-mask-missing": "missing_mask"}


def test_samed2d_name_parts() -> None:
    assert samed2d_name_parts("ct_00--AbdomenCT1K--Case_00220--x_0359") == ("ct", "AbdomenCT1K")
    assert samed2d_name_parts("fundus_photography--REFUGE--g0001--2d_none.png") == ("fundus_photography", "REFUGE")
    assert samed2d_name_parts("ultrasound_00--ultrasound_nerve_segmentation--19_3--2d_none") == (
        "ultrasound", "ultrasound_nerve_segmentation")
    assert samed2d_name_parts("plain_name") == (None, None)


# ---------------------------------------------------------------- PSF-Med


def _mimic_image(root: Path, subject: str, study: str, dicom: str) -> None:
    _png(root / "files" / f"p{subject[:2]}" / f"p{subject}" / f"s{study}" / f"{dicom}.jpg")


def test_psf_med_mimic_grouped_parquet(tmp_path: Path) -> None:
    images = tmp_path / "mimic-cxr-jpg"
    _mimic_image(images, "10000032", "50414267", "02aa804e-bde0afdd")
    base = {"subject_id": "10000032", "study_id": "50414267", "dicom_id": "02aa804e-bde0afdd"}
    rows = [
        {"question_id": "m1", "question": "Is there a pleural effusion?", "answer": "No",
         "paraphrases": [{"paraphrase": "Can a pleural effusion be seen?", "phenomenon": "syntactic_restructuring"},
                         {"paraphrase": "Is pleural fluid present?", "phenomenon": "lexical_substitution"}],
         "is_yesno": True, "is_yesno_claude": True, **base},
        {"question_id": "m2", "question": "Is the heart enlarged?", "answer": "Yes.",
         "paraphrases": [], "is_yesno": True, "is_yesno_claude": True, **base},
        {"question_id": "m3", "question": "What abnormality is seen?", "answer": "effusion",
         "paraphrases": [], "is_yesno": False, "is_yesno_claude": False, **base},
        {"question_id": "m4", "question": "Is there a pneumothorax?", "answer": "maybe",
         "paraphrases": [], "is_yesno": True, "is_yesno_claude": True, **base},
        {"question_id": "m5", "question": "Is there edema?", "answer": "yes", "paraphrases": [],
         "is_yesno": True, "is_yesno_claude": True, "subject_id": "10000099", "study_id": "5", "dicom_id": "x"},
    ]
    p = tmp_path / "psf_med_mimic_test.parquet"
    pd.DataFrame(rows).to_parquet(p)
    assert looks_like_psf_med(p)
    res = read_binary_paraphrases(p, tmp_path)  # the suite's yes/no reader dispatches to read_psf_med
    _check_counts(res)
    by_id = {r.record_id: r for r in res.records}
    assert sorted(by_id) == ["m1", "m2"]
    m1 = by_id["m1"]
    assert m1.dataset == "mimic" and m1.modality == "xray" and m1.answer == "no"
    assert m1.variants == (("Is there a pleural effusion?", 1), ("Can a pleural effusion be seen?", 1),
                           ("Is pleural fluid present?", 1))
    assert m1.finding == "syntactic_restructuring;lexical_substitution"
    assert m1.image_path == images / "files" / "p10" / "p10000032" / "s50414267" / "02aa804e-bde0afdd.jpg"
    assert by_id["m2"].answer == "yes" and by_id["m2"].variants == (("Is the heart enlarged?", 1),)
    assert _reasons(res) == {"m3": "not_yesno", "m4": "bad_answer", "m5": "missing_image"}
    # a record whose image is gone still names it; a question that is not yes/no names none
    assert _sources(res) == {
        "m3": None,
        "m4": RecordSource("mimic", "xray", m1.image_path),
        "m5": RecordSource("mimic", "xray", tmp_path / "files" / "p10" / "p10000099" / "s5" / "x.jpg"),
    }
    kept = read_psf_med(p, tmp_path, yesno_only=False)
    assert _reasons(kept)["m3"] == "bad_answer"


def test_psf_med_padchest_pair_rows_csv(tmp_path: Path) -> None:
    images = tmp_path / "padchest"
    _png(images / "12" / "216840111366964012989926673512011101154705259_00-141-160.png")
    _png(images / "3" / "other.png")
    img = "216840111366964012989926673512011101154705259_00-141-160.png"
    header = ["question_id", "ImageID", "original_question", "paraphrase", "phenomenon", "answer", "is_yesno"]
    rows = [
        ["p1", img, "Is there cardiomegaly?", "Is the heart enlarged?", "lexical_substitution", "yes", "True"],
        ["p1", img, "Is there cardiomegaly?", "Is there no cardiomegaly absent?", "negation_pattern", "yes", "True"],
        ["p2", "missing.png", "Is there a nodule?", "Can a nodule be seen?", "syntactic_restructuring", "no", "True"],
        ["p3", img, "Is there scoliosis?", "Is scoliosis present?", "lexical_substitution", "no", "True"],
        ["p3", img, "Is there kyphosis?", "Is kyphosis present?", "lexical_substitution", "no", "True"],
    ]
    p = _csv(tmp_path / "padchest_flip_bank.csv", header, rows)
    assert looks_like_psf_med(p)
    res = read_binary_paraphrases(p, tmp_path / "padchest")
    _check_counts(res)
    assert res.n_total == 3
    (p1,) = res.records
    assert p1.dataset == "padchest" and p1.answer == "yes"
    assert p1.image_path == images / "12" / img  # found by name in PadChest's numbered folders
    assert [t for t, _ in p1.variants] == ["Is there cardiomegaly?", "Is the heart enlarged?",
                                           "Is there no cardiomegaly absent?"]
    assert all(pol == 1 for _, pol in p1.variants)  # meaning-preserving: no polarity flips
    assert _reasons(res) == {"p2": "missing_image", "p3": "inconsistent_rows"}
    assert _sources(res) == {"p2": RecordSource("padchest", "xray", images / "missing.png"),
                             "p3": RecordSource("padchest", "xray", images / "12" / img)}


def test_psf_med_json_list_field_override_and_our_schema_untouched(tmp_path: Path) -> None:
    _png(tmp_path / "a.png")
    rows = [{"qid_custom": "v1", "q": "Is there a fracture?", "answer": False, "image": "a.png",
             "paraphrases": ["Is a fracture visible?", "Can a fracture be identified?"]}]
    p = tmp_path / "vindr_psf.json"
    p.write_text(json.dumps(rows), encoding="utf-8")
    res = read_psf_med(p, tmp_path, fields={"id": ["qid_custom"], "question": ["q"]})
    (r,) = res.records
    assert r.record_id == "v1" and r.dataset == "vindr" and len(r.variants) == 3 and r.answer == "no"
    ours = tmp_path / "ours.jsonl"
    ours.write_text(json.dumps({"id": "o1", "image_path": "a.png", "question": "Is there a mass?", "answer": "no",
                                "paraphrases": [{"text": "Is there no mass?", "polarity": -1}]}) + "\n")
    assert not looks_like_psf_med(ours)
    (o,) = read_binary_paraphrases(ours, tmp_path).records
    assert o.variants[1] == ("Is there no mass?", -1)
