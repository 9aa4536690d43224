"""SSIM evaluations per calibrated output in the demo's manifest (issue 47, item 5).

Run: .venv/bin/python -m bench.calibration_evals_bench [--work DIR] [--workers N] [--save-rows F] [--compare-rows F]
[--modalities M ...] [--include T ...] [--exclude T ...]

Builds the demo's data (``configs/demo.yaml``: its modalities, ``n_per_modality``, real labelled
datasets) into a temporary folder (or ``--work``), indexes it, and runs the perturbed stage exactly
as the demo does (:func:`medrobust_lib.tracks.perturbed.build_perturbed` for every modality and
every level of the suite, the suite's workers), without the models. Then, from the manifest chunks:

* SSIM evaluations per calibrated output: the rows' ``n_ssim_evals`` summed over the ``ok`` rows,
  divided by their number (the figure the issue names); and the same with the warm starts'
  evaluations (the calibration subset's searches, a fixed cost per chunk) added;
* the same over the outputs outside the calibration subsets (a subset image starts from its own
  subset search, so it costs about one evaluation; with 1 to 16 images per chunk the demo's subsets
  of 4 hold half the outputs, at 1,000 images per dataset almost none: this is the figure at scale);
* the in-band share among reachable outputs (``miss_reason != 'unreachable'``), and over all;
* wall time of the perturbed stage (the demo build and indexing excluded).

``--save-rows`` writes the per-output rows (dataset, sample, type, level, strength, SSIM, hash);
``--compare-rows`` checks the current rows against such a file: an output whose strength did not
change must have the same bytes (hash), and every changed output is reported with its band flag.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from medrobust_lib.config import load_suite
from medrobust_lib.demo.build import ensure_demo
from medrobust_lib.perturb.engine import NOT_APPLICABLE, calibration_subset
from medrobust_lib.tracks import perturbed as perturbed_track
from medrobust_lib.tracks.datasets import build_clean_index

ROOT = Path(__file__).resolve().parent.parent


def demo_suite(work: Path, workers: int | None, config: Path, modalities: list[str] | None = None,
               include: list[str] | None = None, real_labels: bool = True, exclude: list[str] | None = None) -> Path:
    """The demo suite with its results, mart and demo data under ``work`` (``modalities`` /
    ``include``: a smaller grid, for the smoke test; ``real_labels``: the real labelled datasets)."""
    cfg = yaml.safe_load(config.read_text())
    if modalities:
        cfg["modalities"] = modalities
    if include:
        cfg.setdefault("perturbations", {})["include"] = include
    if exclude:
        cfg.setdefault("perturbations", {})["exclude"] = exclude
    cfg["demo"]["real_labels"] = real_labels
    cfg["results_dir"] = str(work / "results")
    cfg["mart_path"] = str(work / "marts.duckdb")
    cfg["demo"]["root"] = str(work / "demo")
    if workers is not None:
        cfg["workers"] = workers
    path = work / "suite.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def run(work: Path, workers: int | None, config: Path, **grid: Any) -> tuple[pd.DataFrame, dict[str, Any]]:
    suite = load_suite(demo_suite(work, workers, config, **grid))
    ensure_demo(suite)
    for m in suite.modalities:
        build_clean_index(suite, m)
    shutil.rmtree(Path(suite.results_dir) / perturbed_track.MANIFEST_TABLE, ignore_errors=True)  # no reuse
    evals = 0
    t0 = time.perf_counter()
    for m in suite.modalities:
        for lv in suite.perturbations.levels:
            s = perturbed_track.build_perturbed(suite, m, lv)
            evals += s.calibration_evals
    wall = time.perf_counter() - t0
    df = perturbed_track.read_manifest(suite)
    df["in_subset"] = in_calibration_subset(df, suite.seed, suite.perturbations.calibration_subset)
    return df, {"wall_s": wall, "warm_start_evals": evals, "workers": suite.workers}


def in_calibration_subset(df: pd.DataFrame, seed: int, k: int) -> pd.Series:
    """Whether each row's sample is in its chunk's calibration subset (the engine's
    :func:`~medrobust_lib.perturb.engine.calibration_subset` over the chunk's applicable samples)."""
    flags = pd.Series(False, index=df.index)
    applicable = df[df["status"] != NOT_APPLICABLE]
    for _, g in applicable.groupby(["dataset", "perturbation", "level"]):
        # the engine's own choice: it reads only each sample's dataset and sample_id
        chosen = calibration_subset(list(g.itertuples()), seed, k)  # type: ignore[arg-type]
        flags[[r.Index for r in chosen]] = True
    return flags


def figures(df: pd.DataFrame, warm_evals: int) -> dict[str, float]:
    ok = df[df["status"] == "ok"]
    reachable = ok[ok["miss_reason"] != "unreachable"]
    n = len(ok)
    outside = ok[~ok["in_subset"]] if "in_subset" in ok.columns else ok.iloc[:0]
    return {
        "outputs": n,
        "evals_per_output": float(ok["n_ssim_evals"].sum() / n),
        "evals_per_output_with_warm_starts": float((ok["n_ssim_evals"].sum() + warm_evals) / n),
        "outputs_outside_subsets": len(outside),
        "evals_per_output_outside_subsets": float(outside["n_ssim_evals"].mean()) if len(outside) else float("nan"),
        "first_eval_in_band": float(((ok["n_ssim_evals"] == 1) & ok["band_reached"]).mean()),
        "in_band_reachable": float(reachable["band_reached"].mean()),
        "reachable_misses": int((~reachable["band_reached"]).sum()),
        "in_band_all": float(ok["band_reached"].mean()),
    }


def compare(before: pd.DataFrame, after: pd.DataFrame) -> dict[str, int]:
    key = ["dataset", "sample_id", "perturbation", "level"]
    m = before.merge(after, on=key, suffixes=("_b", "_a"))
    same = m["strength_b"] == m["strength_a"]
    return {
        "outputs compared": len(m),
        "same strength": int(same.sum()),
        "same strength, same bytes": int((same & (m["sha256_b"] == m["sha256_a"])).sum()),
        "same strength, different bytes": int((same & (m["sha256_b"] != m["sha256_a"])).sum()),
        "strength changed": int((~same).sum()),
        "strength changed, in band now": int((~same & m["band_reached_a"]).sum()),
        "strength changed, in band before": int((~same & m["band_reached_b"]).sum()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=None, help="folder for the demo data and results (default: a temp dir)")
    ap.add_argument("--config", type=Path, default=ROOT / "configs" / "demo.yaml")
    ap.add_argument("--workers", type=int, default=None, help="worker processes (default: the suite's)")
    ap.add_argument("--save-rows", type=Path, default=None)
    ap.add_argument("--compare-rows", type=Path, default=None)
    ap.add_argument("--modalities", nargs="*", default=None, help="only these modalities (default: the suite's)")
    ap.add_argument("--include", nargs="*", default=None, help="only these perturbation types / globs")
    ap.add_argument("--exclude", nargs="*", default=None, help="without these types / globs (e.g. a type added "
                    "since the rows compared against were saved)")
    ap.add_argument("--no-real-labels", action="store_true", help="without the real labelled datasets")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="calib-bench-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        df, info = run(work, args.workers, args.config, modalities=args.modalities, include=args.include,
                       real_labels=not args.no_real_labels, exclude=args.exclude)
    ok = df[df["status"] == "ok"]
    fig = figures(df, info["warm_start_evals"])
    print(f"perturbed stage, {info['workers']} worker(s): wall {info['wall_s']:.1f} s")
    for k, v in fig.items():
        print(f"  {k}: {v:.4f}" if isinstance(v, float) else f"  {k}: {v}")
    by_level = ok.groupby(["level", "in_subset"])["n_ssim_evals"].mean()
    print("evals per output by level (outside / inside the subsets):",
          ", ".join(f"L{lv} {by_level.get((lv, False), float('nan')):.3f} / {by_level.get((lv, True), float('nan')):.3f}"
                    for lv in sorted(ok["level"].unique())))
    by_type = ok.groupby("perturbation")["n_ssim_evals"].mean().sort_values(ascending=False)
    print("dearest types (evals per output):", ", ".join(f"{t} {v:.2f}" for t, v in by_type.head(8).items()))
    cols = ["dataset", "sample_id", "perturbation", "level", "strength", "ssim", "sha256", "band_reached",
            "n_ssim_evals", "in_subset"]
    if args.save_rows:
        ok[cols].to_parquet(args.save_rows)
        print(f"rows written to {args.save_rows}")
    if args.compare_rows:
        for k, v in compare(pd.read_parquet(args.compare_rows), ok[cols]).items():
            print(f"  {k}: {v}")


if __name__ == "__main__":
    main()
