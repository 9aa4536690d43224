"""Segmentation pipeline benchmark (issue 3 figures). Needs `make demo` (or the demo suite's
perturbed manifests and the tiny-sam checkpoint) first. Run: .venv/bin/python -m bench.seg_bench

Prints: pipeline overhead = end-to-end evaluate_perturbed wall time / the model's own work on the
same regenerated images held in memory (``score``: batched forward, thresholding and IoU/Dice on
the model's device; goal <= 1.2); regeneration of those images in one process over the
pure forward (regenerated in-process, the overhead cannot fall below about 1 + that ratio); the
overhead of a second evaluation of the same partition in the same process, whose images come from
the regeneration cache (``medrobust_lib.perturb.regen_cache``; the demo evaluates every partition
with several models); images per second for clean, perturbed and PGD evaluation; clean-prediction
cache hits over a full run.

The evaluations write into a scratch copy of the suite's results (its clean index and perturbation
manifests, the checkpoints linked), so existing rows neither short-circuit the timed runs (resume)
nor get overwritten. ``--level`` defaults to the highest severity the suite perturbs.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from medrobust_lib.config import Suite, load_suite
from medrobust_lib.paths import suite_paths
from medrobust_lib.perturb import regen_cache
from medrobust_lib.perturb.engine import regenerate
from medrobust_lib.prompts import prompt_boxes
from medrobust_lib.tracks.feed import clean_samples, regenerate_stream, resolve_workers
from medrobust_lib.tracks.perturbed import read_manifest
from medrobust_lib.tracks.segmentation.evaluate import evaluate_attacks, evaluate_clean, evaluate_perturbed
from medrobust_lib.tracks.segmentation.model import load_model, model_config

REPEATS = 5


def scratch_suite(suite: Suite, scratch: Path) -> Suite:
    """``suite`` with its results under ``scratch``: the clean index and perturbation manifests
    copied, the checkpoints folder linked, every result table empty."""
    paths = suite_paths(suite)
    for table in ("clean_samples", "perturbation_manifest"):
        shutil.copytree(paths.results / table, scratch / "results" / table)
    (scratch / "checkpoints").symlink_to(paths.checkpoints.resolve(), target_is_directory=True)
    return suite.model_copy(update={"results_dir": str(scratch / "results")})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--suite", default="configs/demo.yaml")
    ap.add_argument("--model", default="tiny-sam")
    ap.add_argument("--modalities", default="ct,dermoscopy,mri")
    ap.add_argument("--level", type=int, default=None, help="severity (default: the suite's highest)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="seg_bench_") as tmp:
        run(scratch_suite(load_suite(args.suite), Path(tmp)), args.model, args.modalities.split(","), args.level)


def run(suite: Suite, model_id: str, modalities: list[str], level: int | None) -> None:
    lv = level if level is not None else max(suite.perturbations.levels)
    m = model_config(suite, model_id)
    model = load_model(suite, m)
    rows = []
    hits = misses = cache_hits = 0
    # start the feed's worker pool outside the timings (a process pays it once, not per partition)
    split = suite.segmentation.split
    known = clean_samples(suite, modalities[0], split)
    warm = [{str(k): v for k, v in rec.items()} for rec in read_manifest(suite, modalities[0], lv).to_dict("records")
            if rec["status"] == "ok" and (rec["dataset"], rec["sample_id"]) in known][:1]
    workers = resolve_workers(suite.segmentation.feed_workers, model.device.type)
    list(regenerate_stream(suite, modalities[0], split, warm, workers=workers))
    for modality in modalities:
        t0 = time.perf_counter()
        c = evaluate_clean(suite, m.id, modality, model, reuse=False)
        t_clean = time.perf_counter() - t0
        # each timing is the fastest of REPEATS (this machine's speed drifts between runs)
        t_pert = t_warm = float("inf")
        for _ in range(REPEATS):
            regen_cache.clear()  # a first model: every row is regenerated
            t0 = time.perf_counter()
            p = evaluate_perturbed(suite, m.id, modality, lv, model, reuse=False)
            t_pert = min(t_pert, time.perf_counter() - t0)
            # a later model on the same partition in the same process (the demo's strategies, VLMs
            # and taxonomy configurations): its rows come from the regeneration cache
            t0 = time.perf_counter()
            evaluate_perturbed(suite, m.id, modality, lv, model, reuse=False)
            t_warm = min(t_warm, time.perf_counter() - t0)
        cache_hits += regen_cache.stats()["hits"]
        hits, misses = hits + p.clean_cache_hits, misses + p.clean_cache_misses
        # pure batched forward on exactly the images the perturbed evaluation saw
        samples = clean_samples(suite, modality, split)  # the evaluation's own per-process cache
        items = []
        t0 = time.perf_counter()
        for rec in read_manifest(suite, modality, lv).to_dict("records"):
            s = samples.get((rec["dataset"], rec["sample_id"]))
            if s is None or rec["status"] != "ok" or s.mask is None:
                continue
            out = regenerate({str(k): v for k, v in rec.items()}, s)
            b = prompt_boxes(s, suite.segmentation.prompt, mask=out.mask)
            if len(b):
                items.append((out.image, b, out.mask))
        t_regen = time.perf_counter() - t0
        t_pure = float("inf")
        for _ in range(REPEATS):  # the model's own work: predict and score on the device, in-memory items
            t0 = time.perf_counter()
            model.score(items, batch_size=m.eval_batch_size)
            t_pure = min(t_pure, time.perf_counter() - t0)
        t0 = time.perf_counter()
        a = evaluate_attacks(suite, m.id, modality, lv, model, reuse=False)
        t_att = time.perf_counter() - t0
        hits, misses = hits + a.clean_cache_hits, misses + a.clean_cache_misses
        rows.append((modality, c.n_rows / t_clean, p.n_rows / t_pert, (a.n_rows / 2) / t_att, t_pert / t_pure,
                     len(items), t_regen / t_pure, t_warm / t_pure))
    print(f"level {lv}\n")
    print("| modality | clean img/s | perturbed img/s | attack img/s (FGSM+PGD) | overhead (e2e / pure forward) "
          "| overhead, regeneration cached (a later model) | regeneration in one process / pure forward "
          "| n perturbed |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]:.1f} | {r[2]:.1f} | {r[3]:.1f} | {r[4]:.2f} | {r[7]:.2f} | {r[6]:.2f} | {r[5]} |")
    print(f"\nfeed workers {workers} (0: regenerated in the model's process)")
    print(f"median overhead {np.median([r[4] for r in rows]):.2f}, {np.median([r[7] for r in rows]):.2f} with "
          f"regeneration cached ({cache_hits} regeneration cache hits); clean cache: {hits} hits, {misses} misses "
          f"({hits / max(1, hits + misses):.1%} hit rate)")


if __name__ == "__main__":
    main()
