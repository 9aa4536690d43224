"""VLM track end to end on a small demo: tiny LLaVA training, LoRA adapter, clean and perturbed
rows with every outcome counted, the mart views and the stats table."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from medrobust_lib.config import Suite, load_suite
from medrobust_lib.config.vlm import vlm_model
from medrobust_lib.demo.tiny_llava_train import train_base_vlm
from medrobust_lib.store import results
from medrobust_lib.store.marts import build_mart, connect_readonly
from medrobust_lib.store.schema import VLM_COLUMN_NAMES as COLUMN_NAMES
from medrobust_lib.store.schema import VLM_TABLE
from medrobust_lib.tracks.datasets import build_clean_index, load_clean_samples
from medrobust_lib.tracks.finetune.vlm_adapter import finetune_adapter
from medrobust_lib.tracks.perturbed import build_perturbed, read_manifest
from medrobust_lib.tracks.vlm.evaluate import _move_box, evaluate_clean, evaluate_perturbed
from medrobust_lib.tracks.vlm.items import load_items, records_config
from medrobust_lib.tracks.vlm.model import Runner, trained_box_scale
from medrobust_lib.tracks.vlm.stats import write_vlm_stats
from tests.suite_helpers import write_suite

PER_IMAGE = 3 + 2 + 1 + 1  # MC, yes/no, caption, grounding records per demo image


@pytest.fixture(scope="module")
def vlm_suite(tmp_path_factory: pytest.TempPathFactory, demo_root: Path) -> Suite:
    root = tmp_path_factory.mktemp("vlm")
    # the MC records plus one whose image is not in any dataset
    mc = json.loads((demo_root / "records" / "omnimedvqa.json").read_text())
    mc.append({**mc[0], "question_id": "orphan", "sample_id": "no_such_image"})
    (root / "mc.json").write_text(json.dumps(mc))
    vlm = {"models": [{"id": "tiny-llava", "source": "trained", "box_scale": "0-1", "batch_size": 16},
                      {"id": "tiny-llava-lora", "base": "tiny-llava", "adapter": "finetuned", "box_scale": "0-1"}],
           "records": {"omnimedvqa": str(root / "mc.json")}, "split": "test",  # the adapter saw train and val
           "train": {"max_steps": 20, "eval_every": 10, "time_budget_s": 60, "batch_size": 16},
           "finetune": {"max_steps": 6, "eval_every": 3, "batch_size": 8, "time_budget_s": 60}}
    suite = load_suite(write_suite(root, demo_root, modalities=["ct", "dermoscopy"], vlm=vlm,
                                   perturbations={"include": ["gaussian_noise", "rotation"], "split": "test",
                                                  "calibration_subset": 2, "levels": [1, 2, 3, 4, 5]}))
    for m in suite.modalities:
        build_clean_index(suite, m)
    build_perturbed(suite, "ct", 5)
    return suite


def _rows(s: Suite) -> pd.DataFrame:
    return results.read_table(s.results_dir, VLM_TABLE)


def test_records_default_to_the_demo_and_keep_overrides(vlm_suite: Suite, demo_root: Path) -> None:
    rc = records_config(vlm_suite)
    assert rc.omnimedvqa is not None and rc.omnimedvqa.endswith("mc.json")
    assert rc.yesno == str(demo_root / "records" / "yesno_paraphrases.jsonl")
    tasks = {it.task for it in load_items(vlm_suite).items}
    assert tasks == {"vqa_mc", "vqa_yesno", "caption", "grounding"}


def test_missing_model_is_a_clear_error(vlm_suite: Suite) -> None:
    with pytest.raises(FileNotFoundError, match="tiny-llava/base_checkpoint"):
        Runner(vlm_suite, vlm_model(vlm_suite, "tiny-llava"))


def test_track_end_to_end(vlm_suite: Suite) -> None:
    s = vlm_suite
    tr = train_base_vlm(s, "tiny-llava")
    assert (Path(tr.folder) / "config.json").is_file() and tr.steps <= 20
    assert 0.0 <= tr.heldout["yesno_accuracy"] <= 1.0 and 0.0 <= tr.heldout["mc_accuracy"] <= 1.0

    runner = Runner(s, vlm_model(s, "tiny-llava"))
    clean = evaluate_clean(s, "tiny-llava", "ct", runner)
    n_img = sum(len(v) for v in load_clean_samples(s, "ct", split="test").values())
    df = _rows(s)
    assert list(df.columns[: len(COLUMN_NAMES) - 2]) != []  # readable
    cl = df[(df["model"] == "tiny-llava") & (df["perturbation"] == "clean")]
    orphan = cl[cl["record_id"] == "orphan"]
    assert len(orphan) == 1 and orphan["outcome"].iloc[0] == "excluded:image_not_indexed"
    assert clean.n_rows == len(cl) == PER_IMAGE * n_img + 1
    scored = cl[cl["outcome"] != "excluded:image_not_indexed"]
    assert set(scored["outcome"]) <= {"ok", "unparseable", "refused", "error"}
    assert scored[(scored["task"] != "caption") & (scored["outcome"] != "error")]["correct"].notna().all()
    assert scored[scored["task"] == "vqa_yesno"]["source"].eq("logprobs").all()
    assert scored[scored["task"] == "caption"]["cider_d"].ge(0).all()

    pert = evaluate_perturbed(s, "tiny-llava", "ct", 5, runner)
    man = read_manifest(s, "ct", 5)
    assert pert.n_rows == PER_IMAGE * len(man)
    df = _rows(s)
    pr = df[(df["model"] == "tiny-llava") & (df["perturbation"] != "clean")]
    assert set(pr["perturbation"]) == {"gaussian_noise", "rotation"} and set(pr["level"]) == {5}
    # every (record, type) appears once: nothing duplicated on a re-run
    evaluate_perturbed(s, "tiny-llava", "ct", 5, runner)
    again = _rows(s)
    assert len(again) == len(df)
    assert not again.duplicated(["model", "task", "record_id", "prompt_id", "perturbation", "level"]).any()


def test_spatial_perturbations_move_the_grounding_box(vlm_suite: Suite) -> None:
    s = vlm_suite
    man = read_manifest(s, "ct", 5)
    samples = {x.sample_id: x for v in load_clean_samples(s, "ct").values() for x in v}
    box = np.array([[40.0, 60.0, 90.0, 120.0]], np.float32)
    for row in man.to_dict("records"):
        smp = samples[row["sample_id"]]
        moved = _move_box(row, smp, box)
        if row["perturbation"] == "gaussian_noise":
            assert moved is box
        else:
            assert moved is None or not np.allclose(moved, box)


def test_failed_batches_are_counted_errors(vlm_suite: Suite, tmp_path: Path) -> None:
    if not (Path(vlm_suite.results_dir).parent / "checkpoints" / "tiny-llava" / "config.json").is_file():
        train_base_vlm(vlm_suite, "tiny-llava")
    # every dermoscopy image (the demo's test split may hold none of them): the base model alone, no adapter
    s = vlm_suite.model_copy(update={"vlm": vlm_suite.vlm.model_copy(update={
        "split": "all", "models": [vlm_model(vlm_suite, "tiny-llava")]})})
    runner = Runner(s, vlm_model(s, "tiny-llava"))

    def boom(*a: object, **k: object) -> list[str]:
        raise RuntimeError("device lost")

    runner.hf.generate = runner.hf.generate_capped = boom
    runner.hf.score = boom
    out = evaluate_clean(s, "tiny-llava", "dermoscopy", runner)
    df = _rows(s)
    d = df[(df["model"] == "tiny-llava") & (df["modality"] == "dermoscopy")]
    assert out.n_rows == len(d) > 0 and set(d["outcome"]) == {"error"}
    assert d["correct"].isna().all() and d["prediction"].isna().all()  # not answers: nothing is scored
    assert d["error"].str.contains("device lost").all()


def test_lora_variant_and_mart(vlm_suite: Suite) -> None:
    s = vlm_suite
    if not (Path(s.results_dir).parent / "checkpoints" / "tiny-llava" / "config.json").is_file():
        train_base_vlm(s, "tiny-llava")
    ad = finetune_adapter(s, "tiny-llava-lora")
    assert (Path(ad.folder) / "adapter_model.safetensors").is_file() and ad.task == "grounding"
    assert all("vision_tower" not in m for m in ad.target_modules)
    assert ad.box_scale == "0-1" and trained_box_scale(ad.folder) == "0-1"  # taught in the declared scale
    assert Runner(s, vlm_model(s, "tiny-llava-lora")).box_scale == "0-1"
    evaluate_clean(s, "tiny-llava-lora", "ct")
    evaluate_perturbed(s, "tiny-llava-lora", "ct", 5)
    evaluate_clean(s, "tiny-llava", "ct")
    evaluate_perturbed(s, "tiny-llava", "ct", 5)
    df = _rows(s)
    lora = df[df["model"] == "tiny-llava-lora"]
    assert lora["adapter"].notna().all() and lora["adapter"].nunique() == 1
    stats = write_vlm_stats(s.results_dir, s.seed)
    assert set(stats["task"]) >= {"vqa_mc", "vqa_yesno", "grounding", "caption"}
    build_mart(s.results_dir, s.mart_path)
    con = connect_readonly(s.mart_path)
    try:
        by = con.execute("select * from vlm_by_level where model = 'tiny-llava' and task = 'vqa_yesno'").df()
        drops = con.execute("select * from vlm_task_drops where model = 'tiny-llava-lora' and task = 'grounding'").df()
    finally:
        con.close()
    assert set(by["level"]) == {0, 5} and (by["n_scored"] + by["n_excluded"] == by["n"]).all()
    cols = list(drops.sort_values("ord")["column_name"])
    assert cols[0] == "Clean" and cols[-2:] == ["Avg", "ΔTP"]
