"""Perturbation benchmark (issue 2 figures). Run: make bench  (or .venv/bin/python bench/perturb_bench.py)

Table 1, per type over the demo images (test split, all 5 levels): milliseconds per 256x256 output
including calibration, mean SSIM evaluations per output, band hit rate (all outputs, and among
outputs whose band is reachable).
Table 2, against imagecorruptions (reference run in the same process, same 256x256 images): our
time per image over theirs for the types both have, apply-only at the level-3 default strength and
with per-image calibration. Ratios < 1 mean we are faster.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from medrobust_lib.config import Suite
from medrobust_lib.demo.build import ensure_demo
from medrobust_lib.perturb.calibrate import DEFAULT_BANDS, calibrate
from medrobust_lib.perturb.engine import ChunkSpec, run_chunk
from medrobust_lib.perturb.spec import get_perturbation
from medrobust_lib.seeding import rng_for
from medrobust_lib.tracks.datasets import build_clean_index, load_clean_samples
from medrobust_lib.tracks.perturbed import selected_types

# ours -> imagecorruptions name
PAIRS = {
    "gaussian_noise": "gaussian_noise", "salt_pepper_noise": "impulse_noise", "speckle_noise": "speckle_noise",
    "gaussian_blur": "gaussian_blur", "defocus_blur": "defocus_blur", "motion_blur": "motion_blur",
    "jpeg_compression": "jpeg_compression", "pixelate": "pixelate", "contrast": "contrast",
    "brightness": "brightness", "saturation": "saturate",
}


def per_type_table(suite: Suite, levels: list[int], max_per_dataset: int) -> pd.DataFrame:
    rows = []
    for modality in suite.modalities:
        build_clean_index(suite, modality)
        for ds, samples in load_clean_samples(suite, modality, split="test", max_samples=max_per_dataset).items():
            if not samples:
                continue
            for t in selected_types(suite, modality, samples[0].n_channels):
                for lv in levels:
                    ch = ChunkSpec(ds, modality, t, lv, DEFAULT_BANDS[lv], suite.seed, suite.perturbations.calibration_subset)
                    t0 = time.perf_counter()
                    out, stats = run_chunk(ch, samples)
                    dt = time.perf_counter() - t0
                    for r in out:
                        rows.append({"perturbation": t, "level": lv, "ms": 1000 * dt / len(out),
                                     "evals": r["n_ssim_evals"], "hit": r["band_reached"],
                                     "reachable": r["miss_reason"] != "unreachable",
                                     "calib_evals": stats["calibration_evals"] / len(out)})
    df = pd.DataFrame(rows)
    g = df.groupby("perturbation")
    table = pd.DataFrame({
        "n": g.size(), "ms_per_output": g["ms"].mean(), "ssim_evals": g["evals"].mean(),
        "warm_start_evals": g["calib_evals"].mean(), "hit_rate": g["hit"].mean(),
        "hit_rate_reachable": df[df["reachable"]].groupby("perturbation")["hit"].mean(),
        "unreachable": g["reachable"].apply(lambda r: int((~r).sum())),
    }).reset_index()
    return table


def _time(fn, reps: int) -> float:  # type: ignore[no-untyped-def]
    fn()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps


def vs_imagecorruptions(images: list[np.ndarray], reps: int) -> pd.DataFrame:
    try:
        from imagecorruptions import corrupt
    except ImportError:
        print("imagecorruptions is not installed: `pip install -e '.[bench]'` (make bench does)")
        return pd.DataFrame()
    rows = []
    for ours, theirs in PAIRS.items():
        spec = get_perturbation(ours)
        t_ours, t_cal, t_ref, note = [], [], [], ""
        for i, img in enumerate(images):
            u8 = np.round(img * 255).astype(np.uint8)
            t_ours.append(_time(lambda img=img, i=i, spec=spec, ours=ours: spec.apply(
                img, spec.levels[2], rng_for("bench", i, ours)), reps))
            t_cal.append(_time(lambda img=img, i=i, spec=spec, ours=ours: calibrate(
                spec, img, DEFAULT_BANDS[3], ("bench", i, ours), start=spec.levels[2]), max(1, reps // 4)))
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    t_ref.append(_time(lambda u8=u8, theirs=theirs: corrupt(u8, corruption_name=theirs, severity=3), reps))
            except Exception as exc:  # several imagecorruptions types crash on numpy 2 / new scikit-image
                note = f"reference crashed: {type(exc).__name__}"
        ref = statistics.median(t_ref) if t_ref else float("nan")
        rows.append({"ours": ours, "imagecorruptions": theirs, "ours_ms": 1000 * statistics.median(t_ours),
                     "ref_ms": 1000 * ref, "ratio_apply": statistics.median(t_ours) / ref,
                     "ours_calibrated_ms": 1000 * statistics.median(t_cal),
                     "ratio_calibrated": statistics.median(t_cal) / ref, "note": note})
    return pd.DataFrame(rows)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--suite-root", default="var/bench")
    ap.add_argument("--n-per-modality", type=int, default=24)
    ap.add_argument("--max-per-dataset", type=int, default=8)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    root = Path(args.suite_root)
    suite = Suite(results_dir=str(root / "results"), mart_path=str(root / "m.duckdb"),
                  demo={"root": "var/data/demo", "n_per_modality": args.n_per_modality})
    ensure_demo(suite)
    pd.set_option("display.width", 200)
    t = per_type_table(suite, [1, 2, 3, 4, 5], args.max_per_dataset)
    print("\n## Per type (demo images, test split, levels 1-5)\n")
    print(t.to_markdown(index=False, floatfmt=".3f"))
    print(f"\nall types: {t['ms_per_output'].mean():.2f} ms/output, {t['ssim_evals'].mean():.2f} SSIM evals/output, "
          f"hit rate {t['hit_rate'].mean():.3f}, reachable hit rate {t['hit_rate_reachable'].mean():.3f}, "
          f"types with reachable hit rate < 0.95: {list(t.loc[t['hit_rate_reachable'] < 0.95, 'perturbation'])}")
    imgs = [s.image for v in load_clean_samples(suite, "dermoscopy", split="test", max_samples=4).values() for s in v]
    v = vs_imagecorruptions(imgs, args.reps)
    if not v.empty:
        print("\n## Against imagecorruptions (256x256 RGB, same process; ratio < 1 = we are faster)\n")
        print(v.to_markdown(index=False, floatfmt=".3f"))
        print(f"\nmedian ratio apply-only: {v['ratio_apply'].median():.3f}  "
              f"(speed-up {1 / v['ratio_apply'].median():.1f}x); "
              f"median ratio with calibration: {v['ratio_calibrated'].median():.3f}")


if __name__ == "__main__":
    main()
