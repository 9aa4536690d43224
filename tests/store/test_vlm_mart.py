"""The VLM mart (vlm_results, vlm_by_level, vlm_task_drops, vlm_stats) on synthetic result rows
written through the results store, with known answers."""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Sequence
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pandas as pd
import pytest

from medrobust_lib.metrics.caption import bleu
from medrobust_lib.metrics.stats import mcnemar
from medrobust_lib.store import results
from medrobust_lib.store.marts import build_mart, connect_readonly
from medrobust_lib.store.schema import VLM_COLUMN_NAMES as COLUMN_NAMES
from medrobust_lib.store.schema import VLM_TABLE
from medrobust_lib.tracks.vlm.stats import vlm_stats, vlm_task_drops_wide, write_vlm_stats
from medrobust_lib.vlm_tasks.scoring import score_captions

MODEL = "m1"
N_MC = 12
# vqa_mc correctness per (perturbation, level); None = not scored. Clean: 7 ok right, 1 ok wrong,
# 1 unparseable, 1 refused (both wrong), 1 error (infrastructure: outside the denominator), 1 excluded
# -> accuracy 7/10, n_error 1, n_excluded 1.
Cell = tuple[str, float | None]


def _cells(*groups: tuple[str, float | None, int]) -> list[Cell]:
    """(outcome, correct, repeat) groups -> one (outcome, correct) per sample s0, s1, ..."""
    return [(o, c) for o, c, k in groups for _ in range(k)]


MC_CLEAN = _cells(("ok", 1.0, 7), ("ok", 0.0, 1), ("unparseable", 0.0, 1), ("refused", 0.0, 1), ("error", None, 1),
                  ("excluded:image_not_indexed", None, 1))
MC_PERTURBED: dict[tuple[str, int], list[Cell]] = {
    ("blur", 1): _cells(("ok", 1.0, 6), ("ok", 0.0, 1), ("unparseable", 0.0, 1), ("ok", 1.0, 1), ("ok", 0.0, 1),
                        ("ok", 1.0, 2)),
    ("blur", 2): _cells(("ok", 1.0, 3), ("ok", 0.0, 4), ("unparseable", 0.0, 2), ("ok", 0.0, 1), ("ok", 1.0, 1),
                        ("ok", 0.0, 1)),
    ("noise", 1): _cells(("excluded:perturbation_error", None, 1), ("ok", 0.0, 9), ("ok", 1.0, 2)),
}
REFS: dict[str, list[str]] = {
    "c0": ["a chest x-ray showing a small left pleural effusion", "small left effusion on chest radiograph"],
    "c1": ["axial ct of the abdomen with a liver lesion"],
    "c2": ["brain mri t2-weighted image with a bright lesion", "t2 mri of the brain"],
    "c3": ["ultrasound of the kidney", "renal ultrasound showing hydronephrosis"],
}
CAP_CLEAN = {"c0": "chest x-ray with a left pleural effusion", "c1": "ct of the abdomen showing a liver lesion",
             "c2": "mri of the brain", "c3": ""}
CAP_NOISE = {"c0": "a chest x-ray showing a left effusion", "c1": "a ct image", "c2": "brain mri with lesion on t2-weighted image",
             "c3": "kidney"}


def _row(task: str, sample: str, perturbation: str, level: int, **fields: Any) -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(COLUMN_NAMES)
    row.update(model=MODEL, checkpoint="base", adapter=None, task=task, dataset="ds", modality="ct",
               sample_id=sample, record_id=f"r-{sample}", prompt_id=0, image_mode="image",
               perturbation=perturbation, level=level, ssim=1.0 if level == 0 else 1.0 - 0.05 * level)
    row.update(fields)
    return row


def _mc_rows(perturbation: str, level: int, cells: list[Cell]) -> list[dict[str, Any]]:
    return [_row("vqa_mc", f"s{i}", perturbation, level, outcome=o, correct=c, parsed="A" if o == "ok" else None)
            for i, (o, c) in enumerate(cells)]


def _caption_rows(perturbation: str, level: int, hyps: dict[str, str]) -> list[dict[str, Any]]:
    scored = score_captions(hyps, REFS)
    rows = [_row("caption", sid, perturbation, level, **fields) for sid, fields in scored.items()]
    rows.append(_row("caption", "c9", perturbation, level, outcome="excluded:image_not_indexed"))
    return rows


def _grounding_rows(perturbation: str, level: int, ious: list[float]) -> list[dict[str, Any]]:
    return [_row("grounding", f"g{i}", perturbation, level, outcome="ok" if iou > 0 else "unparseable", iou=iou,
                 correct=float(iou >= 0.5), acc_75=float(iou >= 0.75)) for i, iou in enumerate(ious)]


def all_rows() -> list[dict[str, Any]]:
    rows = _mc_rows("clean", 0, MC_CLEAN)
    for (p, lv), cells in MC_PERTURBED.items():
        rows += _mc_rows(p, lv, cells)
    rows += _caption_rows("clean", 0, CAP_CLEAN) + _caption_rows("noise", 1, CAP_NOISE)
    rows += _grounding_rows("clean", 0, [0.9, 0.6, 0.3, 0.0]) + _grounding_rows("blur", 1, [0.8, 0.4, 0.0, 0.55])
    # an image-removal baseline row: outside every view and outside the pairing
    rows.append(_row("vqa_mc", "s0", "clean", 0, image_mode="none", outcome="ok", correct=0.0, prompt_id=0))
    return rows


def write_results(res: Path, rows: list[dict[str, Any]]) -> None:
    df = pd.DataFrame(rows, columns=list(COLUMN_NAMES))
    for level in sorted({int(r["level"]) for r in rows}):
        part = {"model": MODEL, "run": "clean" if level == 0 else "perturbation", "modality": "ct", "level": level}
        results.write_chunk(results.chunk_path(res, VLM_TABLE, part, "ds"), df[df["level"] == level], "fp")


MAX_ERROR_SHARE = 0.1
"""The clean partition has 1 error in 20 attempted rows (5 %): complete under this limit."""


@pytest.fixture()
def mart(tmp_path: Path) -> Iterator[tuple[Path, duckdb.DuckDBPyConnection]]:
    res = tmp_path / "results"
    write_results(res, all_rows())
    write_vlm_stats(res, seed=7, max_error_share=MAX_ERROR_SHARE, min_n=2)  # CIs on these few pairs
    counts = build_mart(res, tmp_path / "m.duckdb", max_error_share=MAX_ERROR_SHARE)
    assert counts["vlm_results"] == len(all_rows())
    con = connect_readonly(tmp_path / "m.duckdb")
    try:
        yield res, con
    finally:
        con.close()


def _one(con: duckdb.DuckDBPyConnection, sql: str) -> dict[str, Any]:
    df = con.execute(sql).df()
    assert len(df) == 1, df
    return dict(df.iloc[0])


def _acc(cells: list[Cell]) -> float:
    vals = [c for _, c in cells if c is not None]
    return sum(vals) / len(vals)


def test_by_level_counts_failures_wrong_and_excluded_outside(mart: tuple[Path, duckdb.DuckDBPyConnection]) -> None:
    _, con = mart
    r = _one(con, "select * from vlm_by_level where task = 'vqa_mc' and perturbation = 'clean'")
    assert (r["n"], r["n_scored"], r["n_unparseable"], r["n_refused"], r["n_error"], r["n_excluded"]) == (
        12, 10, 1, 1, 1, 1)
    assert r["accuracy"] == pytest.approx(7 / 10, abs=1e-12)
    assert pd.isna(r["cider_d"]) and pd.isna(r["bleu_4"]) and pd.isna(r["mean_iou"])
    g = _one(con, "select * from vlm_by_level where task = 'grounding' and perturbation = 'clean'")
    assert g["accuracy"] == g["acc_50"] == pytest.approx(0.5)
    assert g["acc_75"] == pytest.approx(0.25) and g["mean_iou"] == pytest.approx(0.45)
    assert g["n_unparseable"] == 1
    b = _one(con, "select * from vlm_by_level where task = 'vqa_mc' and perturbation = 'blur' and level = 2")
    assert b["mean_ssim"] == pytest.approx(0.9) and b["n_unparseable"] == 2


@pytest.mark.parametrize(("perturbation", "level", "hyps"), [("clean", 0, CAP_CLEAN), ("noise", 1, CAP_NOISE)])
def test_corpus_bleu_in_sql_equals_python(mart: tuple[Path, duckdb.DuckDBPyConnection], perturbation: str,
                                          level: int, hyps: dict[str, str]) -> None:
    _, con = mart
    r = _one(con, f"select * from vlm_by_level where task = 'caption' and perturbation = '{perturbation}' "
                  f"and level = {level}")
    refs: dict[Hashable, Sequence[str]] = {k: v for k, v in REFS.items()}
    hyp_map: dict[Hashable, str] = {k: v for k, v in hyps.items()}
    expected = bleu(refs, hyp_map)["bleu_4"].corpus
    assert abs(r["bleu_4"] - expected) < 1e-9
    scored = score_captions(hyps, REFS)
    assert r["cider_d"] == pytest.approx(np.mean([s["cider_d"] for s in scored.values()]), abs=1e-12)
    assert r["rouge_l"] == pytest.approx(np.mean([s["rouge_l"] for s in scored.values()]), abs=1e-12)
    assert pd.isna(r["accuracy"]) and r["n_excluded"] == 1 and r["n_scored"] == 4


def test_task_drops_clean_types_avg_delta(mart: tuple[Path, duckdb.DuckDBPyConnection]) -> None:
    _, con = mart
    long = con.execute("select * from vlm_task_drops where task = 'vqa_mc' order by ord").df()
    assert list(long["column_name"]) == ["Clean", "blur", "noise", "Avg", "ΔTP"]
    assert list(long["ord"]) == [0, 1, 2, 3, 4] and set(long["metric"]) == {"accuracy"}
    v = dict(zip(long["column_name"], long["value"], strict=True))
    blur = (_acc(MC_PERTURBED[("blur", 1)]) + _acc(MC_PERTURBED[("blur", 2)])) / 2
    noise = _acc(MC_PERTURBED[("noise", 1)])
    assert v["Clean"] == pytest.approx(7 / 10) and v["blur"] == pytest.approx(blur)
    assert v["noise"] == pytest.approx(noise) and v["Avg"] == pytest.approx((blur + noise) / 2)
    assert v["ΔTP"] == pytest.approx(v["Clean"] - v["Avg"], abs=1e-12)
    nu = dict(zip(long["column_name"], long["n_unparseable"], strict=True))
    assert (nu["Clean"], nu["blur"], nu["noise"], nu["Avg"], nu["ΔTP"]) == (1, 3, 0, 3, 4)
    ne = dict(zip(long["column_name"], long["n_error"], strict=True))
    assert (ne["Clean"], ne["blur"], ne["noise"], ne["Avg"], ne["ΔTP"]) == (1, 0, 0, 0, 1)
    # absolute and relative drops: Clean - value and (Clean - value) / Clean; the ΔTP row holds ΔTP itself
    d = dict(zip(long["column_name"], long["drop"], strict=True))
    rel = dict(zip(long["column_name"], long["rel_drop"], strict=True))
    assert d["Clean"] == 0.0 and d["blur"] == pytest.approx(7 / 10 - blur, abs=1e-12)
    assert d["Avg"] == pytest.approx(d["ΔTP"], abs=1e-12) == pytest.approx(v["ΔTP"], abs=1e-12)
    assert rel["noise"] == pytest.approx((7 / 10 - noise) / (7 / 10), abs=1e-12)
    assert rel["ΔTP"] == pytest.approx(v["ΔTP"] / (7 / 10), abs=1e-12)
    metrics = dict(con.execute("select distinct task, metric from vlm_task_drops").fetchall())
    assert metrics == {"vqa_mc": "accuracy", "caption": "cider_d", "grounding": "acc_50"}
    wide = vlm_task_drops_wide(con)
    row = wide[wide["task"] == "vqa_mc"].iloc[0]
    assert list(wide.columns) == ["model", "checkpoint", "adapter", "task", "metric", "Clean", "blur", "noise",
                                  "Avg", "ΔTP", "rel_drop", "n_unparseable", "n_error", "n_truncated"]
    assert row["ΔTP"] == pytest.approx(v["ΔTP"]) and row["n_unparseable"] == 4 and row["n_error"] == 1
    assert row["rel_drop"] == pytest.approx(rel["ΔTP"])
    assert pd.isna(wide[wide["task"] == "caption"].iloc[0]["blur"])


def _mc_pairs(key: tuple[str, int]) -> tuple[np.ndarray, np.ndarray, int, int]:
    """(clean correct, perturbed correct) of the pairs, then the unpaired: excluded, error."""
    clean, pert = [], []
    excluded = errors = 0
    for (oc, c), (op, p) in zip(MC_CLEAN, MC_PERTURBED[key], strict=True):
        if "error" in (oc, op):
            errors += 1
            continue
        if c is None or p is None:
            excluded += 1
            continue
        clean.append(c == 1.0)
        pert.append(p == 1.0)
    return np.array(clean), np.array(pert), excluded, errors


def test_stats_mcnemar_known_answer_and_bh(mart: tuple[Path, duckdb.DuckDBPyConnection]) -> None:
    res, con = mart
    stats = con.execute("select * from vlm_stats order by task, perturbation, level").df()
    assert len(stats) == 5  # blur 1, blur 2, noise 1 (mc); noise 1 (caption); blur 1 (grounding)
    mc = stats[stats["task"] == "vqa_mc"]
    for key in MC_PERTURBED:
        r = mc[(mc["perturbation"] == key[0]) & (mc["level"] == key[1])].iloc[0]
        c, p, excluded, errors = _mc_pairs(key)
        assert (r["n_pairs"], r["n_excluded"], r["n_unmatched"], r["n_error"]) == (len(c), excluded, 0, errors)
        assert errors == 1  # the clean error row is never paired
        assert r["test"] == "mcnemar" and r["metric"] == "accuracy"
        assert r["p_value"] == pytest.approx(mcnemar(c, p)[1], abs=1e-12)
        assert r["clean_value"] == pytest.approx(c.mean()) and r["perturbed_value"] == pytest.approx(p.mean())
        assert r["drop"] == pytest.approx(c.mean() - p.mean(), abs=1e-12)
        assert r["drop_ci_low"] <= r["drop"] <= r["drop_ci_high"]
        assert r["clean_ci_low"] <= r["clean_value"] <= r["clean_ci_high"]
    # noise: 6 pairs right -> wrong, none wrong -> right (the clean error row's pair is out):
    # exact two-sided binomial 2 / 2**6
    assert mc[mc["perturbation"] == "noise"].iloc[0]["p_value"] == pytest.approx(0.03125, abs=1e-12)
    # blur 2: 4 right -> wrong, 0 back: 2 / 2**4; blur 1: one discordant pair each way: 1.0
    # BH within (model, checkpoint, adapter, task): p 0.03125, 0.125, 1.0 -> q 0.09375, 0.1875, 1.0
    assert sorted(mc["q_value"]) == pytest.approx([0.09375, 0.1875, 1.0])
    # BH within (model, checkpoint, adapter, task): q >= p and q monotone in p
    o = mc.sort_values("p_value")
    assert np.all(o["q_value"].to_numpy() >= o["p_value"].to_numpy() - 1e-15)
    assert np.all(np.diff(o["q_value"].to_numpy()) >= -1e-15)
    cap = stats[stats["task"] == "caption"].iloc[0]
    assert (cap["test"], cap["metric"], cap["n_pairs"], cap["n_excluded"]) == ("wilcoxon", "cider_d", 4, 1)
    assert 0.0 <= cap["p_value"] <= 1.0
    gr = stats[stats["task"] == "grounding"].iloc[0]
    # clean hits 1,1,0,0 vs blur 1,0,0,1: one discordant each way
    assert (gr["metric"], gr["n_pairs"]) == ("acc_50", 4) and gr["p_value"] == pytest.approx(1.0)
    assert gr["q_value"] == pytest.approx(1.0)
    assert set(stats["model"]) == {MODEL} and stats["level"].dtype.kind == "i"


def test_stats_deterministic_and_stale_models_removed(tmp_path: Path) -> None:
    res = tmp_path / "results"
    write_results(res, all_rows())
    stale = results.chunk_path(res, "vlm_stats", {"model": "gone"}, "stats")
    results.write_chunk(stale, [{"task": "vqa_mc"}], "old")
    a = write_vlm_stats(res, seed=3, max_error_share=MAX_ERROR_SHARE, min_n=2)
    assert not stale.parent.exists() and (res / "vlm_stats" / f"model={MODEL}" / "stats.parquet").is_file()
    df = results.read_table(res, VLM_TABLE)
    df["level"] = df["level"].astype(int)
    b = vlm_stats(df, seed=3, min_n=2)
    pd.testing.assert_frame_equal(a.reset_index(drop=True), b.reset_index(drop=True))
    c = vlm_stats(df, seed=4, min_n=2)
    ci = ["drop_ci_low", "drop_ci_high", "clean_ci_low", "clean_ci_high"]
    assert not np.allclose(a[ci].to_numpy(dtype=float), c[ci].to_numpy(dtype=float), equal_nan=True)
    pd.testing.assert_frame_equal(a.drop(columns=[*ci, "perturbed_ci_low", "perturbed_ci_high"]),
                                  c.drop(columns=[*ci, "perturbed_ci_low", "perturbed_ci_high"]))


def test_stats_degenerate_cases() -> None:
    same = [_row("vqa_yesno", f"y{i}", p, lv, outcome="ok", correct=1.0) for i in range(3)
            for p, lv in (("clean", 0), ("blur", 1))]
    only_excluded = [_row("vqa_yesno", "z", "clean", 0, outcome="ok", correct=1.0),
                     _row("vqa_yesno", "z", "noise", 1, outcome="excluded:perturbation_error")]
    unmatched = [_row("vqa_yesno", "w", "blur", 1, outcome="error", correct=None)]
    out = vlm_stats(pd.DataFrame(same + only_excluded + unmatched), seed=0, min_n=2)
    assert list(out["perturbation"]) == ["blur"]  # noise has no pairs: skipped
    r = out.iloc[0]
    assert (r["n_pairs"], r["n_unmatched"], r["p_value"], r["q_value"], r["drop"]) == (3, 1, 1.0, 1.0, 0.0)
    assert vlm_stats(pd.DataFrame(), seed=0).empty
    dup = pd.DataFrame([_row("vqa_yesno", "y0", "clean", 0, outcome="ok", correct=1.0)] * 2)
    with pytest.raises(ValueError, match="pairing key"):
        vlm_stats(dup)


def test_empty_mart_has_vlm_views(tmp_path: Path) -> None:
    counts = build_mart(tmp_path / "results", tmp_path / "m.duckdb")
    assert counts["vlm_results"] == 0 and counts["vlm_stats"] == 0
    con = connect_readonly(tmp_path / "m.duckdb")
    try:
        assert con.execute("select count(*) from vlm_by_level").fetchall() == [(0,)]
        assert vlm_task_drops_wide(con).empty
    finally:
        con.close()


def test_partition_over_the_error_limit_is_incomplete_and_left_out(tmp_path: Path) -> None:
    """Default limit 0.02: the clean partition (1 error in 20 attempted rows) is marked incomplete,
    listed by incomplete_partitions and left out of vlm_by_level, vlm_task_drops and vlm_stats; the
    perturbed partitions (no errors) stay."""
    res = tmp_path / "results"
    write_results(res, all_rows())
    stats = write_vlm_stats(res, seed=0)
    assert stats.empty  # every pair needs the clean partition
    build_mart(res, tmp_path / "m.duckdb")
    con = connect_readonly(tmp_path / "m.duckdb")
    try:
        pc = con.execute("select * from partition_completeness where source_table = 'vlm_results' "
                         "order by level").df()
        assert list(pc["level"]) == [0, 1, 2] and list(pc["complete"]) == [False, True, True]
        clean = pc.iloc[0]
        # 22 rows: 12 mc + 5 caption + 4 grounding + 1 image-removal row; 2 excluded; 1 error
        assert (clean["n"], clean["n_excluded"], clean["n_attempted"], clean["n_error"]) == (22, 2, 20, 1)
        assert clean["error_share"] == pytest.approx(0.05) and clean["max_error_share"] == pytest.approx(0.02)
        assert con.execute("select model, modality, level from incomplete_partitions").fetchall() == [(MODEL, "ct", 0)]
        levels = {r[0] for r in con.execute("select distinct level from vlm_by_level").fetchall()}
        assert levels == {1, 2}
        assert con.execute("select count(*) from vlm_task_drops where column_name = 'Clean'").fetchall() == [(0,)]
    finally:
        con.close()
