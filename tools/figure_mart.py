"""A small synthetic mart shaped like the demo's, for looking at the report's figures and tables
without running the demo: ``python -m tools.figure_mart OUT_DIR [--report]``.

Segmentation: ``tiny-sam`` at levels 1-5 on 14 corruption types (4 families) and FGSM/PGD, over
two datasets, one of which (``demo_us``) has a clean IoU near 0 (a floor effect), plus the
strategy model ``tiny-sam-lora`` evaluated at levels 2 and 4 only. Taxonomy: 3 configurations x
8 datasets x (clean + 2 types x 5 levels) x 3 image modes. VLM: one model x 2 tasks x 14 types.
The rows are seeded (``numpy.random.default_rng(0)``) and built with the library's own statistics
and the mart's real view SQL; with ``--report`` the paper report is written to ``OUT_DIR/report``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd

from medrobust_lib.store.marts import MART_TABLES, MART_VIEWS
from medrobust_lib.store.schema import TAXONOMY_CORRELATION_STATS_COLUMNS, TAXONOMY_QUADRANT_STATS_COLUMNS
from medrobust_lib.taxonomy.aggregates import flip_dangerous_correlation, quadrant_stats
from medrobust_lib.tracks.segmentation.stats import segmentation_stats

FAMILIES = {"noise": ["gaussian_noise", "shot_noise", "speckle_noise", "impulse_noise"],
            "blur": ["gaussian_blur", "motion_blur", "defocus_blur"],
            "digital": ["jpeg_compression", "pixelate", "contrast", "brightness"],
            "mri": ["bias_field", "kspace_spike", "ghosting"]}
TYPES = [t for ts in FAMILIES.values() for t in ts]
DATASETS = {"demo_ct": ("ct", 0.72), "demo_us": ("ultrasound", 0.02)}


def seg_rows(rng: np.random.Generator) -> pd.DataFrame:
    rows = []
    for model, strategy, levels in (("tiny-sam", "pretrained", (1, 2, 3, 4, 5)), ("tiny-sam-lora", "lora", (2, 4))):
        for ds, (modality, clean0) in DATASETS.items():
            for s in range(8):
                ciou = float(np.clip(clean0 + 0.03 * rng.standard_normal(), 0, 1))
                cdice = 2 * ciou / (1 + ciou)
                base: dict[str, object] = {"model": model, "checkpoint": f"ck-{model}", "strategy": strategy, "dataset": ds,
                        "modality": modality, "sample_id": f"{ds}_{s}", "prompt": "box", "error": None,
                        "empty_gt_policy": "both_empty_1_else_0", "clean_iou": ciou,
                        "clean_dice": cdice}
                rows.append({**base, "condition": "clean", "perturbation": "clean", "level": 0, "iou": ciou,
                             "dice": cdice, "iou_drop": 0.0, "dice_drop": 0.0, "status": "ok"})
                conds = [("perturbation", t) for t in TYPES] + [("fgsm", "fgsm"), ("pgd", "pgd")]
                for k, (cond, ptype) in enumerate(conds):
                    for level in levels:
                        scale = 0.02 + 0.01 * (k % 5) if cond == "perturbation" else 0.06
                        iou = float(np.clip(ciou - scale * level * ciou / 0.7 - 0.01 * rng.random(), 0, 1))
                        dice = 2 * iou / (1 + iou)
                        rows.append({**base, "condition": cond, "perturbation": ptype, "level": level,
                                     "ssim": 0.94 - 0.1 * level + 0.01 * rng.random() if cond == "perturbation"
                                     else None,
                                     "epsilon": level * 2 / 255 if cond != "perturbation" else None,
                                     "iou": iou, "dice": dice, "iou_drop": ciou - iou,
                                     "dice_drop": cdice - dice, "status": "ok"})
    return pd.DataFrame(rows)


def taxonomy_rows(rng: np.random.Generator) -> pd.DataFrame:
    rows = []
    for ci, cfg in enumerate(("demo-image-reliant", "demo-shortcut", "demo-consistency-lora")):
        for d in range(8):
            ds = f"demo_{['ct', 'mri', 'xray', 'fundus', 'oct', 'pathology', 'dermoscopy', 'endoscopy'][d]}"
            for mode in ("none", "blank", "noise"):
                conds = [("clean", 0)] + [(t, lv) for t in ("gaussian_noise", "gaussian_blur") for lv in range(1, 6)]
                for pert, level in conds:
                    for s in range(10):
                        disagreement = float(rng.choice([0.0, 0.2, 0.4], p=[0.5 - 0.1 * ci + 0.02 * level, 0.3,
                                                                           0.2 + 0.1 * ci - 0.02 * level]))
                        consistent = disagreement == 0.0
                        reliant = bool(rng.random() < 0.7 - 0.25 * ci)
                        quad = {(True, True): "Ideal", (False, True): "Fragile", (True, False): "Dangerous",
                                (False, False): "Worst"}[(consistent, reliant)]
                        answer = "yes" if s % 2 == 0 else "no"
                        correct = bool(rng.random() < 0.6)
                        pred = answer if correct else ("no" if answer == "yes" else "yes")
                        removed = pred if not reliant else ("no" if pred == "yes" else "yes")
                        rows.append({"config": cfg, "dataset": ds, "sample_id": f"{ds}_{s}", "record_id": f"r{s}",
                                     "perturbation": pert, "level": level, "image_mode": mode, "quadrant": quad,
                                     "answer": answer, "pred_original": pred, "pred_removed": removed,
                                     "correct_original": float(correct), "entropy_original": float(rng.random()),
                                     "flip_rate": float(not consistent), "pairwise_disagreement": disagreement,
                                     "consistent": consistent, "image_reliant": reliant, "outcome": "ok"})
    return pd.DataFrame(rows)


def vlm_rows() -> pd.DataFrame:
    rows = []
    for task, metric, clean in (("vqa_mc", "accuracy", 0.62), ("grounding", "acc@0.5", 0.0)):
        per = {t: max(clean - 0.01 * (i % 7), 0.0) for i, t in enumerate(TYPES)}
        avg = float(np.mean(list(per.values())))
        chance = 0.25 if task == "vqa_mc" else None
        cols = [("Clean", clean), *per.items(), ("Avg", avg), ("ΔTP", clean - avg)]
        for ord_, (name, value) in enumerate(cols):
            drop = value if name == "ΔTP" else clean - value
            rows.append({"model": "tiny-llava", "checkpoint": "ck", "adapter": None, "task": task,
                         "column_name": name, "metric": metric, "value": value, "drop": drop,
                         "rel_drop": drop / clean if clean else None, "n_unparseable": 0, "n_error": 0,
                         "ord": ord_, "chance": chance,
                         "floor_effect": clean <= (chance if chance is not None else 0.0)})
    return pd.DataFrame(rows)


def strategy_rows() -> pd.DataFrame:
    rows = []
    for kind in ("corruption", "attack"):
        for rank, strat in enumerate(("lora", "full", "decoder_only", "decoder_prompt", "encoder_partial",
                                      "adapter"), start=1):
            d = 0.01 * rank + (0.02 if kind == "attack" else 0.0)
            rows.append({"model": "tiny-sam", "strategy": strat, "kind": kind, "n_samples": 16, "n_conditions": 32,
                         "mean_iou_drop": d, "iou_drop_ci_low": d - 0.005, "iou_drop_ci_high": d + 0.005,
                         "mean_dice_drop": d / 2, "dice_drop_ci_low": d / 2 - 0.002, "dice_drop_ci_high": d / 2 + 0.002,
                         "clean_iou": 0.6, "clean_dice": 0.75, "n_trainable": 1000 * rank, "rank": rank,
                         "iou_rel_drop": d / 0.6, "dice_rel_drop": d / 2 / 0.75})
    return pd.DataFrame(rows)


def _create(con: duckdb.DuckDBPyConnection, name: str, cols: list[tuple[str, str]], df: pd.DataFrame) -> None:
    con.execute(f"create table {name} ({', '.join(f'{c} {t}' for c, t in cols)})")
    frame = df.reindex(columns=[c for c, _ in cols])  # noqa: F841 - read by DuckDB's replacement scan
    con.execute(f"insert into {name} select * from frame")


def _declared(name: str) -> list[tuple[str, str]]:
    return list(next(t.columns for t in MART_TABLES if t.name == name))


def make_mart(path: Path) -> Path:
    rng = np.random.default_rng(0)
    seg, tax = seg_rows(rng), taxonomy_rows(rng)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    con = duckdb.connect(str(path))
    try:
        _create(con, "segmentation_results", _declared("segmentation_results"), seg)
        _create(con, "segmentation_stats", _declared("segmentation_stats"), segmentation_stats(seg, seed=0))
        manifest = pd.DataFrame([{"perturbation": t, "family": f} for f, ts in FAMILIES.items() for t in ts])
        _create(con, "perturbation_manifest", _declared("perturbation_manifest"), manifest)
        _create(con, "clean_samples", _declared("clean_samples"), pd.DataFrame())  # the real-label views read it
        for view in [v for v in MART_VIEWS if v.startswith("segmentation_")]:
            con.execute(f"create view {view} as {MART_VIEWS[view]}")
        vlm = vlm_rows()  # noqa: F841 - read by DuckDB's replacement scan
        con.execute("create table vlm_task_drops as select * from vlm")
        _create(con, "taxonomy_results", _declared("taxonomy_results"), tax)
        _create(con, "taxonomy_quadrant_stats", list(TAXONOMY_QUADRANT_STATS_COLUMNS), quadrant_stats(tax, 0, 200))
        _create(con, "taxonomy_correlation_stats", list(TAXONOMY_CORRELATION_STATS_COLUMNS),
                flip_dangerous_correlation(tax, seed=0, n_boot=500))
        for view in ("taxonomy_quadrants", "taxonomy_correlation"):
            con.execute(f"create view {view} as {MART_VIEWS[view]}")
        strat = strategy_rows()
        _create(con, "strategy_ranking_stats", [(c, "DOUBLE" if "drop" in c or "clean" in c else
                                                 ("VARCHAR" if c in ("model", "strategy", "kind") else "BIGINT"))
                                                for c in strat.columns], strat)
        con.execute("create view strategy_ranking as select * from strategy_ranking_stats order by model, kind, rank")
    finally:
        con.close()
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--report", action="store_true", help="also write the paper report to OUT/report")
    a = ap.parse_args()
    mart = make_mart(a.out / "marts.duckdb")
    print(mart)
    if a.report:
        from medrobust_lib.report.paper import build_report

        rep = build_report(mart, a.out / "report", log_mlflow=False)
        print(rep.html, f"{len(rep.figures)} figures", rep.skipped or "")


if __name__ == "__main__":
    main()
