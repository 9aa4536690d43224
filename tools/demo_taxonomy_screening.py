"""One-off: the confidence-screening figures of docs/taxonomy.md on the demo's clean images.

Runs the demo suite's taxonomy configurations (the committed known-answer weights, sha256-verified;
nothing is trained) on every modality's clean test images, writes ``taxonomy_results``,
``taxonomy_quadrant_stats`` and ``taxonomy_screening_stats`` under ``--work`` and prints the
screening per configuration pooled over the datasets (and per dataset with ``--per-dataset``).

    python -m tools.demo_taxonomy_screening --work /tmp/screening [--demo-root DIR]
        [--configs demo-shortcut,demo-image-reliant] [--modalities ct,mri]

``--demo-root``: an existing demo build of ``configs/demo.yaml`` (else one is built under --work).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import yaml

from medrobust_lib.config import load_suite

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--demo-root", type=Path, default=None)
    ap.add_argument("--per-dataset", action="store_true")
    ap.add_argument("--configs", default=None, help="comma-separated taxonomy configurations (default: all)")
    ap.add_argument("--modalities", default=None, help="comma-separated modalities to evaluate (default: the "
                    "suite's; the suite itself keeps them all, as the committed weights were trained on)")
    args = ap.parse_args(argv)

    from medrobust_lib.demo import build_demo
    from medrobust_lib.demo.committed import install_taxonomy
    from medrobust_lib.taxonomy.confidence_screening import screening_stats
    from medrobust_lib.tracks.datasets import build_clean_index
    from medrobust_lib.tracks.taxonomy import evaluate as tx
    from medrobust_lib.tracks.taxonomy.stats import (
        read_taxonomy_results,
        write_screening_stats,
        write_taxonomy_stats,
    )

    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    cfg = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
    demo_root = args.demo_root.resolve() if args.demo_root else work / "demo"
    if args.demo_root is None:
        build_demo(demo_root, seed=cfg["demo"].get("seed", 0), n_per_modality=cfg["demo"]["n_per_modality"])
    cfg.update(results_dir=str(work / "results"), mart_path=str(work / "marts.duckdb"))
    cfg["demo"]["root"] = str(demo_root)
    (work / "suite.yaml").write_text(yaml.safe_dump(cfg))
    suite = load_suite(work / "suite.yaml")
    t0 = time.perf_counter()
    for m in suite.modalities:
        build_clean_index(suite, m)
    configs = args.configs.split(",") if args.configs else [c.id for c in suite.taxonomy.configs]
    for c in configs:
        inst = install_taxonomy(suite, c)
        if not inst.used:
            raise SystemExit(f"{c}: the committed weights do not match this demo ({inst.reason})")
    modalities = args.modalities.split(",") if args.modalities else suite.modalities
    for c in configs:
        for m in modalities:
            tx.compute_baselines(suite, c, m)
            tx.evaluate(suite, c, m, 0)
        print(f"{c}: evaluated ({time.perf_counter() - t0:.0f} s)", flush=True)
    write_taxonomy_stats(suite.results_dir, suite.seed, suite.taxonomy.abstention_tau)
    per = write_screening_stats(suite.results_dir)
    df = read_taxonomy_results(suite.results_dir)
    pooled = screening_stats(df.assign(dataset="all datasets"))
    cols = ["config", "image_mode", "signal", "n", "n_dangerous", "n_ideal", "auroc", "threshold", "ideal_kept",
            "dangerous_pass", "mean_confidence_dangerous", "mean_confidence_other", "status"]
    with_image = pooled[pooled["perturbation"] == "clean"][cols]
    print(with_image.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    if args.per_dataset:
        print(per[per["perturbation"] == "clean"][["dataset", *cols]].to_string(index=False,
                                                                              float_format=lambda v: f"{v:.3f}"))
    print(f"done in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
