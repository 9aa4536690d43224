"""The taxonomy's real data end to end: PSF-Med-style yes/no files over a MIMIC-CXR-JPG-like nested
layout (``files/p10/p10000032/s50414267/<uuid>.jpg``) and PadChest-like numbered folders, read as
two yes/no datasets of one suite. Every record joins its image in the clean index (the folder
reader keys by the path below its image folder, never by the file stem), and the headline
correlation has one point per (configuration, dataset)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pandas as pd
import pytest
import yaml

from medrobust_lib.config import Suite, load_suite
from medrobust_lib.report.screening_table import taxonomy_screening
from medrobust_lib.store import results
from medrobust_lib.store.marts import build_mart, connect_readonly
from medrobust_lib.store.schema import TAXONOMY_TABLE
from medrobust_lib.taxonomy.aggregates import HEADLINE, flip_dangerous_correlation
from medrobust_lib.taxonomy.confidence_screening import SIGNALS
from medrobust_lib.tracks.datasets import CLEAN_TABLE, build_clean_index
from medrobust_lib.tracks.taxonomy import evaluate as tx
from medrobust_lib.tracks.taxonomy.stats import write_screening_stats
from medrobust_lib.tracks.vlm.items import YESNO_SUFFIX, load_items

MIMIC = [("10000032", "50414267"), ("10000032", "53189527"), ("10000764", "57375967"), ("11000011", "51029426")]
PADCHEST = [("0", 3), ("1", 2), ("12", 2)]  # numbered folder, images in it
PAD_QUESTIONS = (("Is there a nodule?", "no"), ("Is there scoliosis?", "yes"), ("Is there an effusion?", "no"))
"""Three questions per PadChest image (two per MIMIC image): the datasets' answer mixes differ."""
CONFIGS = ("reliant", "wording")


def _image(rng: np.random.Generator, shape: tuple[int, int] = (48, 40)) -> np.ndarray:
    return (rng.random(shape) * 255).astype(np.uint8)


def _layouts(root: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """MIMIC-CXR-JPG and PadChest trees with two PSF-Med-style question rows per image."""
    rng = np.random.default_rng(0)
    mimic_rows: list[dict[str, Any]] = []
    for k, (subject, study) in enumerate(MIMIC):
        dicom = str(uuid.UUID(int=k + 1))
        path = root / "mimic-cxr-jpg" / "files" / f"p{subject[:2]}" / f"p{subject}" / f"s{study}" / f"{dicom}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        assert cv2.imwrite(str(path), _image(rng))
        for q, (question, answer) in enumerate((("Is there cardiomegaly?", "yes"), ("Is there a pneumothorax?", "no"))):
            mimic_rows.append({"question_id": f"m{k}_{q}", "subject_id": int(subject), "study_id": int(study),
                               "dicom_id": dicom, "original_question": question, "answer": answer,
                               "paraphrases": [question.replace("Is there", "Do you see"),
                                               question.replace("Is there", "Can you identify")],
                               "is_yesno": True})
    pad_rows: list[dict[str, Any]] = []
    n = 0
    for folder, count in PADCHEST:
        for _ in range(count):
            name = f"216840111366964012283393834152009{n:03d}_0{n}-{n:03d}.png"
            path = root / "padchest" / folder / name
            path.parent.mkdir(parents=True, exist_ok=True)
            assert cv2.imwrite(str(path), _image(rng))
            for q, (question, answer) in enumerate(PAD_QUESTIONS):
                pad_rows.append({"question_id": f"pc{n}_{q}", "ImageID": name, "original_question": question,
                                 "answer": answer, "paraphrases": [question.replace("Is there", "Do you see")],
                                 "is_yesno": True})
            n += 1
    return mimic_rows, pad_rows


@pytest.fixture(scope="module")
def real_suite(tmp_path_factory: pytest.TempPathFactory) -> Suite:
    root = tmp_path_factory.mktemp("real")
    mimic_rows, pad_rows = _layouts(root)
    (root / "mimic_questions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in mimic_rows))
    (root / "padchest_questions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in pad_rows))
    folder = {"mask_dir": None}
    cfg = {
        "name": "real", "seed": 0, "results_dir": str(root / "results"), "mart_path": str(root / "marts.duckdb"),
        "modalities": ["xray"],
        "datasets": [
            {"name": "mimic", "modality": "xray", "format": "folder", "root": str(root / "mimic-cxr-jpg"), "size": 32,
             "options": {**folder, "image_dir": ".", "image_glob": "files/**/*.jpg"}},
            {"name": "padchest", "modality": "xray", "format": "folder", "root": str(root / "padchest"), "size": 32,
             "options": {**folder, "image_dir": ".", "image_glob": "**/*.png"}},
        ],
        "vlm": {"models": [{"id": "stand-in", "source": str(root / "no_weights")}],
                "records": {"yesno": [
                    {"path": str(root / "mimic_questions.jsonl"), "dataset": "mimic",
                     "image_root": str(root / "mimic-cxr-jpg")},
                    {"path": str(root / "padchest_questions.jsonl"), "dataset": "padchest",
                     "image_root": str(root / "padchest")}]}},
        "taxonomy": {"configs": [{"id": c, "model": "stand-in"} for c in CONFIGS], "min_paraphrases": 2,
                     "image_modes": ["none"], "split": "all"},
    }
    (root / "suite.yaml").write_text(yaml.safe_dump(cfg))
    suite = load_suite(root / "suite.yaml")
    build_clean_index(suite, "xray")
    return suite


def test_every_nested_and_numbered_record_joins_its_indexed_image(real_suite: Suite) -> None:
    clean = results.read_table(real_suite.results_dir, CLEAN_TABLE)
    ok = set(zip(clean.loc[clean["status"] == "ok", "dataset"], clean.loc[clean["status"] == "ok", "sample_id"],
                 strict=True))
    assert len(ok) == len(MIMIC) + sum(c for _, c in PADCHEST)
    # the folder reader's keys are paths below the image folder, not file stems
    assert any(sid.startswith("files/p10/p10000032/s50414267/") for d, sid in ok if d == "mimic")
    assert any(sid.startswith("12/") for d, sid in ok if d == "padchest")
    loaded = load_items(real_suite)
    assert loaded.quarantine == {} and loaded.dropped == []
    items = [it for it in loaded.items if it.task == "vqa_yesno"]
    assert len(items) == 2 * len(MIMIC) + len(PAD_QUESTIONS) * sum(c for _, c in PADCHEST) == loaded.n_total
    assert {(it.dataset, it.sample_id) for it in items} == ok  # every record indexed, every image asked about
    assert {it.dataset for it in items if it.record_id.startswith("m")} == {"mimic"}


def test_a_plain_yesno_path_still_reads_one_file(real_suite: Suite, tmp_path: Path) -> None:
    data = yaml.safe_load(Path(real_suite.results_dir).parent.joinpath("suite.yaml").read_text())
    data["vlm"]["records"] = {"yesno": data["vlm"]["records"]["yesno"][1]["path"],
                              "image_root": data["vlm"]["records"]["yesno"][1]["image_root"]}
    (tmp_path / "one.yaml").write_text(yaml.safe_dump(data))
    items = load_items(load_suite(tmp_path / "one.yaml")).items
    assert {it.dataset for it in items} == {"padchest"} and len(items) == len(PAD_QUESTIONS) * sum(c for _, c in PADCHEST)


class _Runner:
    checkpoint = "stand-in"
    adapter = None
    n_vision_calls = 0
    hf = None


def _lp(label: str) -> dict[str, float]:
    return {"yes": -0.1, "no": -2.4} if label == "yes" else {"yes": -2.4, "no": -0.1}


def _scorer(suite: Suite) -> type:
    """Stand-ins: ``reliant`` answers every wording of a record with its truth while it sees the
    image and "no" without it; ``wording`` answers by the length of the wording alone, so it flips
    between paraphrases of some records and ignores the image."""
    truth = {text + YESNO_SUFFIX: it.answer for it in load_items(suite).items if it.task == "vqa_yesno"
             for text, _ in tx.variants_of(it, 2)}

    class Fake:
        def __init__(self, s: Suite, entry: tx.TaxonomyConfigEntry) -> None:
            self.entry, self.runner = entry, _Runner()

        @property
        def vision_calls(self) -> int:
            return 0

        def variants(self, image: np.ndarray | None, prompts: Sequence[str]) -> tuple[list[Any], str]:
            if self.entry.id == "wording":
                return [_lp("yes" if len(p) % 3 == 0 else "no") for p in prompts], "logprobs"
            return [_lp(truth[p] if image is not None else "no") for p in prompts], "logprobs"

    return Fake


def test_two_yesno_datasets_give_the_headline_two_points_per_configuration(
        real_suite: Suite, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tx, "_Scorer", _scorer(real_suite))
    for c in CONFIGS:
        tx.compute_baselines(real_suite, c, "xray")
        out = tx.evaluate(real_suite, c, "xray", 0)
        assert out.outcomes == {"ok": out.n_rows}
    df = results.read_table(real_suite.results_dir, TAXONOMY_TABLE)
    assert set(df["dataset"]) == {"mimic", "padchest"}
    corr = flip_dangerous_correlation(df, real_suite.seed)
    head = corr[corr["scope"] == HEADLINE]
    assert len(head) == 1 and int(head["n_points"].iloc[0]) == 2 * len(CONFIGS)
    assert int(head["n_configs"].iloc[0]) == len(CONFIGS)
    assert pd.notna(head["r"].iloc[0])  # the points differ: a defined correlation

    # confidence screening: a table, a view and a report table with one row per (config, dataset, signal)
    screening = write_screening_stats(real_suite.results_dir)
    assert len(screening) == 2 * len(CONFIGS) * len(SIGNALS)
    build_mart(real_suite.results_dir, real_suite.mart_path)
    con = connect_readonly(real_suite.mart_path)
    try:
        view = con.execute("select config, dataset, signal, status, auroc from taxonomy_screening").df()
        table = taxonomy_screening(con, None)
    finally:
        con.close()
    assert len(view) == len(screening) and set(view["dataset"]) == {"mimic", "padchest"}
    assert not isinstance(table, str) and len(table.data) == len(screening)
