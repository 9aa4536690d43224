"""Perturbation benchmark (issues 2 and 34). Run: make bench  (or .venv/bin/python -m bench.perturb_bench)

Table 1, per type over the demo images (test split, all 5 levels), through the engine
(:func:`medrobust_lib.perturb.engine.run_chunk`): milliseconds per 256x256 output including
calibration, mean SSIM evaluations per output, the warm start's evaluations per output, band hit
rate (all outputs, and among outputs whose band is reachable).
Table 2, against imagecorruptions (reference run in the same process, same 256x256 images): our
time per image over theirs for the types both have, apply-only at the level-3 default strength and
with per-image calibration (warm start fitted on the same images, as the engine does). Ratios < 1
mean we are faster. Skipped with a message when imagecorruptions is not importable.
Table 3, at ``--large-size`` px (demo images upsampled): milliseconds per calibrated output at
level 3 for every type, one process, the warm start excluded (amortised at scale).

Every time is the process's CPU time (``time.process_time``, all its threads), not wall time, so
the figures are per core and hold up on a loaded machine; tables 1 and 3 say "ms" for CPU ms.

``--save-rows`` writes the per-output rows of table 1 (strength, SSIM, hash); ``--compare-rows``
compares the current rows with such a file: outputs with the same strength must have the same
hash, and every output whose strength changed must still be verified in its band.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import cv2
import numpy as np
import pandas as pd

from medrobust_lib.config import Suite
from medrobust_lib.data.sample import Sample
from medrobust_lib.demo.build import ensure_demo
from medrobust_lib.perturb import calibrate as cal
from medrobust_lib.perturb.calibrate import DEFAULT_BANDS, calibrate
from medrobust_lib.perturb.engine import ChunkSpec, run_chunk
from medrobust_lib.perturb.spec import get_perturbation, list_perturbations
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


def _warm_start(spec, images: Sequence[np.ndarray], keys: Sequence[tuple[object, ...]], level: int):  # type: ignore[no-untyped-def]
    """The engine's warm start for these images: a fitted model where the library has one
    (``warm_start``), else the dataset-level median strength (``dataset_strength``)."""
    band = DEFAULT_BANDS[level]
    pairs = list(zip(images, keys, strict=True))
    if hasattr(cal, "warm_start"):
        return cal.warm_start(spec, pairs, band, start=spec.levels[level - 1])
    return cal.dataset_strength(spec, pairs, band, start=spec.levels[level - 1])[0]


def _calibrate_with(spec, image, level: int, key, warm, **kw):  # type: ignore[no-untyped-def]
    if hasattr(cal, "warm_start"):
        return calibrate(spec, image, DEFAULT_BANDS[level], key, warm=warm, **kw)
    return calibrate(spec, image, DEFAULT_BANDS[level], key, start=warm, **kw)


def load_suite_samples(suite: Suite, max_per_dataset: int) -> dict[str, dict[str, list[Sample]]]:
    """modality -> dataset -> test samples (the clean index is built first)."""
    out: dict[str, dict[str, list[Sample]]] = {}
    for modality in suite.modalities:
        build_clean_index(suite, modality)
        out[modality] = load_clean_samples(suite, modality, split="test", max_samples=max_per_dataset)
    return out


def per_type_table(suite: Suite, by_modality: dict[str, dict[str, list[Sample]]], levels: list[int],
                   ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per-type table, per-output rows)."""
    rows = []
    for modality, by_ds in by_modality.items():
        for ds, samples in by_ds.items():
            if not samples:
                continue
            for t in selected_types(suite, modality, samples[0].n_channels):
                for lv in levels:
                    ch = ChunkSpec(ds, modality, t, lv, DEFAULT_BANDS[lv], suite.seed, suite.perturbations.calibration_subset)
                    t0 = time.process_time()
                    out, stats = run_chunk(ch, samples)
                    dt = time.process_time() - t0
                    for r in out:
                        if r["status"] != "ok":
                            continue
                        rows.append({"dataset": ds, "sample_id": r["sample_id"], "perturbation": t, "level": lv,
                                     "ms": 1000 * dt / len(out), "evals": r["n_ssim_evals"],
                                     "strength": r["strength"], "ssim": r["ssim"], "sha256": r["sha256"],
                                     "band_low": r["band_low"], "band_high": r["band_high"],
                                     "hit": bool(r["band_reached"]), "reachable": r["miss_reason"] != "unreachable",
                                     "calib_evals": stats["calibration_evals"] / len(out)})
    df = pd.DataFrame(rows)
    g = df.groupby("perturbation")
    table = pd.DataFrame({
        "n": g.size(), "ms_per_output": g["ms"].mean(), "ssim_evals": g["evals"].mean(),
        "warm_start_evals": g["calib_evals"].mean(), "hit_rate": g["hit"].mean(),
        "hit_rate_reachable": df[df["reachable"]].groupby("perturbation")["hit"].mean(),
        "unreachable": g["reachable"].apply(lambda r: int((~r).sum())),
    }).reset_index()
    return table, df


def compare_rows(before: pd.DataFrame, after: pd.DataFrame) -> dict[str, int]:
    """Same strength -> same hash; changed strength -> in band. Returns the counts; raises
    nothing (the caller prints and judges)."""
    key = ["dataset", "sample_id", "perturbation", "level"]
    m = before.merge(after, on=key, suffixes=("_before", "_after"))
    same = m["strength_before"] == m["strength_after"]
    in_band = (m["ssim_after"] >= m["band_low_after"]) & (m["ssim_after"] <= m["band_high_after"])
    return {
        "outputs compared": len(m),
        "same strength": int(same.sum()),
        "same strength, same bytes": int((same & (m["sha256_before"] == m["sha256_after"])).sum()),
        "same strength, different bytes": int((same & (m["sha256_before"] != m["sha256_after"])).sum()),
        "strength changed": int((~same).sum()),
        "strength changed, in band now": int((~same & in_band).sum()),
        "strength changed, in band before": int((~same & m["hit_before"]).sum()),
        "strength changed, flagged in band but outside": int((~same & m["hit_after"] & ~in_band).sum()),
        "in band before": int(m["hit_before"].sum()),
        "in band now": int(m["hit_after"].sum()),
    }


def _time(fn, reps: int) -> float:  # type: ignore[no-untyped-def]
    fn()
    t0 = time.process_time()
    for _ in range(reps):
        fn()
    return (time.process_time() - t0) / reps


def vs_imagecorruptions(images: list[np.ndarray], reps: int) -> pd.DataFrame:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from imagecorruptions import corrupt
    except ImportError as exc:
        print(f"\nimagecorruptions is not importable ({exc}): the comparison is skipped. "
              "`pip install -e '.[bench]'` (make bench does) or put a copy on PYTHONPATH.")
        return pd.DataFrame()
    rows = []
    for ours, theirs in PAIRS.items():
        spec = get_perturbation(ours)
        keys = [("bench", i, ours) for i in range(len(images))]
        warm = _warm_start(spec, images, keys, 3)
        t_ours, t_cal, t_ref, evals, note = [], [], [], [], ""
        for i, img in enumerate(images):
            u8 = np.round(img * 255).astype(np.uint8)
            t_ours.append(_time(lambda img=img, i=i, spec=spec, ours=ours: spec.apply(
                img, spec.levels[2], rng_for("bench", i, ours)), reps))
            evals.append(_calibrate_with(spec, img, 3, keys[i], warm).n_ssim_evals)
            t_cal.append(_time(lambda img=img, key=keys[i], spec=spec, warm=warm: _calibrate_with(
                spec, img, 3, key, warm), max(1, reps // 4)))
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    t_ref.append(_time(lambda u8=u8, theirs=theirs: corrupt(u8, corruption_name=theirs, severity=3), reps))
            except Exception as exc:  # several imagecorruptions types crash on numpy 2 / new scikit-image
                note = f"reference crashed: {type(exc).__name__}"
        ref = statistics.median(t_ref) if t_ref else float("nan")
        rows.append({"ours": ours, "imagecorruptions": theirs, "ours_ms": 1000 * statistics.median(t_ours),
                     "ref_ms": 1000 * ref, "ratio_apply": statistics.median(t_ours) / ref,
                     "ours_calibrated_ms": 1000 * statistics.median(t_cal), "ssim_evals": float(np.mean(evals)),
                     "ratio_calibrated": statistics.median(t_cal) / ref, "note": note})
    return pd.DataFrame(rows)


def _upsample(s: Sample, size: int) -> Sample:
    img = np.clip(cv2.resize(s.image, (size, size), interpolation=cv2.INTER_CUBIC), 0, 1).astype(np.float32)
    mask = None if s.mask is None else cv2.resize(s.mask.astype(np.uint8), (size, size),
                                                  interpolation=cv2.INTER_NEAREST).astype(bool)
    return replace(s, image=img, mask=mask, boxes=None)


def large_table(by_modality: dict[str, dict[str, list[Sample]]], size: int, n_images: int,
                types: list[str] | None = None) -> pd.DataFrame:
    """Per type at ``size`` px, level 3: ms per calibrated output (warm start excluded)."""
    rows = []
    for name in types or list_perturbations():
        spec = get_perturbation(name)
        pool = [s for m, by_ds in by_modality.items() for v in by_ds.values() for s in v
                if spec.applies_to(m, s.n_channels)]
        if not pool:
            continue
        samples = [_upsample(s, size) for s in pool[:n_images]]
        keys = [("large", s.dataset, s.sample_id, name) for s in samples]
        warm = _warm_start(spec, [s.image for s in samples], keys, 3)
        t0 = time.process_time()
        cs = [_calibrate_with(spec, s.image, 3, k, warm, mask=s.mask) for s, k in zip(samples, keys, strict=True)]
        dt = time.process_time() - t0
        rows.append({"perturbation": name, "channels": samples[0].n_channels, "n": len(cs),
                     "ms_per_output": 1000 * dt / len(cs), "ssim_evals": float(np.mean([c.n_ssim_evals for c in cs])),
                     "hit_rate": float(np.mean([c.band_reached for c in cs]))})
    return pd.DataFrame(rows)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--suite-root", default="var/bench")
    ap.add_argument("--demo-root", default="var/data/demo")
    ap.add_argument("--n-per-modality", type=int, default=24)
    ap.add_argument("--max-per-dataset", type=int, default=8)
    ap.add_argument("--modalities", nargs="*", default=None, help="default: every modality of the suite")
    ap.add_argument("--levels", type=int, nargs="*", default=[1, 2, 3, 4, 5])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--large-size", type=int, default=1024, help="0 skips table 3")
    ap.add_argument("--large-images", type=int, default=3)
    ap.add_argument("--large-types", nargs="*", default=None, help="default: every registered type")
    ap.add_argument("--save-rows", default=None, help="write table 1's per-output rows (parquet)")
    ap.add_argument("--compare-rows", default=None, help="compare table 1's rows with this parquet")
    args = ap.parse_args(argv)
    root = Path(args.suite_root)
    extra = {"modalities": args.modalities} if args.modalities else {}
    suite = Suite(results_dir=str(root / "results"), mart_path=str(root / "m.duckdb"),
                  demo={"enabled": True, "root": args.demo_root, "n_per_modality": args.n_per_modality}, **extra)
    ensure_demo(suite)
    pd.set_option("display.width", 200)
    by_modality = load_suite_samples(suite, args.max_per_dataset)
    t, per_output = per_type_table(suite, by_modality, args.levels)
    print(f"\n## Per type (demo images, test split, levels {args.levels})\n")
    print(t.to_markdown(index=False, floatfmt=".3f"))
    reach = per_output[per_output["reachable"]]
    print(f"\nall types: {t['ms_per_output'].mean():.2f} ms/output, {t['ssim_evals'].mean():.2f} SSIM evals/output "
          f"(mean over types), hit rate {t['hit_rate'].mean():.3f}, reachable hit rate {t['hit_rate_reachable'].mean():.3f}, "
          f"types with reachable hit rate < 0.95: {list(t.loc[t['hit_rate_reachable'] < 0.95, 'perturbation'])}")
    print(f"all outputs ({len(per_output)}): {per_output['evals'].mean():.3f} SSIM evals/output, "
          f"{per_output['evals'].mean() + per_output['calib_evals'].mean():.3f} with the warm start's share, "
          f"in band {per_output['hit'].mean():.4f}, in band of reachable {reach['hit'].mean():.4f}")
    if args.save_rows:
        per_output.to_parquet(args.save_rows, index=False)
        print(f"per-output rows written to {args.save_rows}")
    if args.compare_rows:
        cmp = compare_rows(pd.read_parquet(args.compare_rows), per_output)
        print("\n## Against the saved rows\n")
        for k, v in cmp.items():
            print(f"- {k}: {v}")
    imgs = [s.image for v in by_modality.get("dermoscopy", {}).values() for s in v][:4]
    if imgs:
        v = vs_imagecorruptions(imgs, args.reps)
        if not v.empty:
            print("\n## Against imagecorruptions (256x256 RGB, same process; ratio < 1 = we are faster)\n")
            print(v.to_markdown(index=False, floatfmt=".3f"))
            print(f"\nmedian ratio apply-only: {v['ratio_apply'].median():.3f}  "
                  f"(speed-up {1 / v['ratio_apply'].median():.1f}x); "
                  f"median ratio with calibration: {v['ratio_calibrated'].median():.3f}; "
                  f"SSIM evals per calibrated output: {v['ssim_evals'].mean():.3f}")
    if args.large_size:
        lt = large_table(by_modality, args.large_size, args.large_images, args.large_types)
        print(f"\n## {args.large_size} px, level 3, per calibrated output (one process; warm start excluded)\n")
        print(lt.to_markdown(index=False, floatfmt=".3f"))
        print(f"\nmedian over types: {lt['ms_per_output'].median():.1f} ms per calibrated output per core, "
              f"{lt['ssim_evals'].mean():.3f} SSIM evals/output, in band {lt['hit_rate'].mean():.3f}")


if __name__ == "__main__":
    main()
