"""Segmentation pipeline benchmark (issue 3 figures). Needs `make demo` (or the demo suite's
perturbed manifests and the tiny-sam checkpoint) first. Run: .venv/bin/python bench/seg_bench.py

Prints: pipeline overhead = end-to-end evaluate_perturbed wall time / pure batched model forward
on the same regenerated images (goal <= 1.2); images per second for clean, perturbed and PGD
evaluation; clean-prediction cache hits over a full run.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from medrobust_lib.config import load_suite
from medrobust_lib.perturb.engine import regenerate
from medrobust_lib.prompts import prompt_boxes
from medrobust_lib.tracks.datasets import load_clean_samples
from medrobust_lib.tracks.perturbed import read_manifest
from medrobust_lib.tracks.segmentation.evaluate import (
    evaluate_attacks,
    evaluate_clean,
    evaluate_perturbed,
    load_model,
    model_config,
    seg_config,
)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--suite", default="configs/demo.yaml")
    ap.add_argument("--model", default="tiny-sam")
    ap.add_argument("--modalities", default="ct,dermoscopy,mri")
    args = ap.parse_args()
    suite = load_suite(args.suite)
    m = model_config(suite, args.model)
    model = load_model(suite, m)
    rows = []
    hits = misses = 0
    for modality in args.modalities.split(","):
        t0 = time.perf_counter()
        c = evaluate_clean(suite, m.id, modality, model)
        t_clean = time.perf_counter() - t0
        t0 = time.perf_counter()
        p = evaluate_perturbed(suite, m.id, modality, 3, model)
        t_pert = time.perf_counter() - t0
        hits, misses = hits + p.clean_cache_hits, misses + p.clean_cache_misses
        # pure batched forward on exactly the images the perturbed evaluation saw
        samples = {(s.dataset, s.sample_id): s for v in load_clean_samples(suite, modality, split=seg_config(suite).split).values() for s in v}
        imgs, boxes = [], []
        for r in read_manifest(suite, modality, 3).to_dict("records"):
            s = samples.get((r["dataset"], r["sample_id"]))
            if s is None or r["status"] != "ok":
                continue
            out = regenerate(r, s)
            imgs.append(out.image)
            boxes.append(prompt_boxes(s, seg_config(suite).prompt, mask=out.mask))
        t0 = time.perf_counter()
        model.predict(imgs, boxes, batch_size=m.batch_size)
        t_pure = time.perf_counter() - t0
        t0 = time.perf_counter()
        a = evaluate_attacks(suite, m.id, modality, 3, model)
        t_att = time.perf_counter() - t0
        hits, misses = hits + a.clean_cache_hits, misses + a.clean_cache_misses
        rows.append((modality, c.n_rows / t_clean, p.n_rows / t_pert, (a.n_rows / 2) / t_att, t_pert / t_pure,
                     len(imgs)))
    print("| modality | clean img/s | perturbed img/s | attack img/s (FGSM+PGD L3) | overhead (e2e / pure forward) | n perturbed |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]:.1f} | {r[2]:.1f} | {r[3]:.1f} | {r[4]:.2f} | {r[5]} |")
    print(f"\nmedian overhead {np.median([r[4] for r in rows]):.2f}; clean cache: {hits} hits, {misses} misses "
          f"({hits / max(1, hits + misses):.1%} hit rate)")


if __name__ == "__main__":
    main()
