"""One-off: what bf16 autocast does to LiteMedSAM's drops, against fp32 on the same rows.

After a finished demo (``make demo``), re-evaluates the suite's LiteMedSAM model in fp32 on exactly
the partitions the demo evaluated (clean, and every perturbed (modality, level) partition it has
rows for) into a scratch copy of the results folder, and compares the rows with the demo's
(bf16) rows: per-image IoU, drop and mask-level agreement, and the ranking of the corruption types
by mean IoU drop. Prints a table; nothing in the suite's own folders changes.

    .venv/bin/python tools/litemedsam_precision_check.py [--suite configs/demo.yaml] [--model litemedsam]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default=str(ROOT / "configs/demo.yaml"))
    ap.add_argument("--model", default="litemedsam")
    args = ap.parse_args()

    import pandas as pd
    from scipy.stats import spearmanr

    from medrobust_lib.config import load_suite
    from medrobust_lib.store import results
    from medrobust_lib.tracks.segmentation.evaluate import RESULTS_TABLE, evaluate_clean, evaluate_perturbed

    suite = load_suite(args.suite)
    rows = results.read_table(suite.results_dir, RESULTS_TABLE)
    mine = rows[rows["model"] == args.model]
    if mine.empty:
        raise SystemExit(f"no {args.model} rows in {suite.results_dir}: run the demo first")
    scratch = Path(tempfile.mkdtemp(prefix="precision-"))
    shutil.copytree(suite.results_dir, scratch / "results")
    fp32_id = f"{args.model}-fp32"
    models = [m.model_copy(update={"id": fp32_id, "precision": "fp32"}) if m.id == args.model else m
              for m in suite.segmentation.models]
    seg = suite.segmentation.model_copy(update={"models": models})
    s32 = suite.model_copy(update={"results_dir": str(scratch / "results"), "segmentation": seg})
    for modality in sorted(mine["modality"].unique()):
        evaluate_clean(s32, fp32_id, modality)
        for level in sorted(mine.loc[(mine["modality"] == modality) & (mine["condition"] == "perturbation"), "level"]
                            .unique()):
            evaluate_perturbed(s32, fp32_id, modality, int(level))
    other = results.read_table(s32.results_dir, RESULTS_TABLE)
    other = other[other["model"] == fp32_id]
    key = ["dataset", "sample_id", "condition", "perturbation", "level"]
    both = mine.merge(other, on=key, suffixes=("_bf16", "_fp32"))
    both = both[(both["status_bf16"] == "ok") & (both["status_fp32"] == "ok")]
    pert = both[both["condition"] == "perturbation"]
    clean = both[both["condition"] == "clean"]
    print(f"rows compared: {len(both)} ({len(clean)} clean, {len(pert)} perturbed)")
    for name, df in (("clean", clean), ("perturbed", pert)):
        d = (df["iou_bf16"] - df["iou_fp32"]).abs()
        print(f"{name}: mean IoU bf16 {df['iou_bf16'].mean():.4f} fp32 {df['iou_fp32'].mean():.4f}; "
              f"|IoU diff| mean {d.mean():.4f}, median {d.median():.4f}, max {d.max():.4f}")
    dd = (pert["iou_drop_bf16"] - pert["iou_drop_fp32"]).abs()
    print(f"IoU drop: mean bf16 {pert['iou_drop_bf16'].mean():.4f} fp32 {pert['iou_drop_fp32'].mean():.4f}; "
          f"|diff| mean {dd.mean():.4f}, max {dd.max():.4f}")
    by_type = pert.groupby("perturbation")[["iou_drop_bf16", "iou_drop_fp32"]].mean()
    rho = spearmanr(by_type["iou_drop_bf16"], by_type["iou_drop_fp32"]).statistic
    top_b = list(by_type["iou_drop_bf16"].sort_values(ascending=False).index[:3])
    top_f = list(by_type["iou_drop_fp32"].sort_values(ascending=False).index[:3])
    print(f"types: {len(by_type)}; Spearman rho of the type ranking by mean IoU drop: {rho:.3f}")
    print(f"worst three, bf16: {top_b}; fp32: {top_f}")
    with pd.option_context("display.width", 160, "display.max_rows", 100):
        print(by_type.sort_values("iou_drop_fp32", ascending=False).round(4).to_string())
    shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
