"""Checks and figures computed from the perturbation manifest (orchestration-free)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd

from medrobust_lib.config import Suite
from medrobust_lib.data.sample import Sample
from medrobust_lib.perturb.engine import regenerate
from medrobust_lib.perturb.gallery import GalleryCell, gallery_title, write_gallery
from medrobust_lib.store import results
from medrobust_lib.tracks.datasets import CLEAN_TABLE, load_clean_samples
from medrobust_lib.tracks.perturbed import PerturbSummary, read_manifest, selected_types

BAND_HIT_THRESHOLD = 0.95


@dataclass(frozen=True)
class CheckOutcome:
    name: str
    passed: bool
    severity: Literal["warn", "error"]
    metadata: dict[str, Any]


@dataclass
class PartitionChecks:
    results: list[CheckOutcome] = field(default_factory=list)
    table: pd.DataFrame = field(default_factory=pd.DataFrame)


def partition_checks(suite: Suite, modality: str, level: int, summary: PerturbSummary) -> PartitionChecks:
    """Band hit rate (reachable outputs), finite outputs and completeness of one partition."""
    df = read_manifest(suite, modality, level)
    out = PartitionChecks()
    if df.empty:
        for name in ("band_hit_rate", "finite_outputs", "completeness"):
            out.results.append(CheckOutcome(name, True, "warn", {"n_rows": 0, "note": "no datasets for modality"}))
        return out
    ok = df[df["status"] == "ok"]
    rate = summary.reachable_hit_rate
    out.results.append(CheckOutcome(
        "band_hit_rate", bool(math.isnan(rate) or rate >= BAND_HIT_THRESHOLD), "warn",
        {"hit_rate_reachable": float(rate) if not math.isnan(rate) else None, "threshold": BAND_HIT_THRESHOLD,
         "n_reachable": summary.n_reachable_rows, "n_unreachable": int((ok["miss_reason"] == "unreachable").sum()),
         "unreachable_types": ", ".join(summary.unreachable_types) or "none"},
    ))
    finite = bool(np.isfinite(ok["strength"]).all() and np.isfinite(ok["ssim"]).all()
                  and ok["ssim"].between(-1, 1).all())
    out.results.append(CheckOutcome("finite_outputs", finite, "error", {"n_ok": len(ok)}))
    index = results.read_partition(suite.results_dir, CLEAN_TABLE, {"modality": modality})
    n_dup = int(df.duplicated(["dataset", "sample_id", "perturbation"]).sum())
    expected = 0
    if not index.empty:
        sel = index[index["status"] == "ok"]
        if suite.perturbations.split != "all":
            sel = sel[sel["split"] == suite.perturbations.split]
        for (ds, ch), grp in sel.groupby(["dataset", "channels"]):
            n = len(grp) if suite.perturbations.max_samples is None else min(len(grp), suite.perturbations.max_samples)
            expected += n * len(selected_types(suite, modality, int(str(ch)), str(ds)))
    df = df[df["status"] != "not_applicable"]  # counted rows of mixed-channel datasets, not outputs
    n_err = int((df["status"] != "ok").sum())
    out.results.append(CheckOutcome(
        "completeness", n_dup == 0 and n_err == 0 and len(df) == expected, "error",
        {"n_rows": len(df), "n_expected": expected, "n_duplicates": n_dup, "n_error": n_err},
    ))
    out.table = (ok.groupby("perturbation")
                 .agg(n=("ssim", "size"), mean_strength=("strength", "mean"), mean_ssim=("ssim", "mean"),
                      hit_rate=("band_reached", "mean"), mean_evals=("n_ssim_evals", "mean"))
                 .reset_index())
    return out


def modality_gallery(suite: Suite, modality: str, out_dir: Path) -> list[Path]:
    """One gallery PNG per dataset of the modality, on its first selected sample, titled with what it
    shows (dataset, sample, the suite's levels) and how to read a caption (:func:`gallery_title`)."""
    manifest = read_manifest(suite, modality)
    if manifest.empty:
        return []
    samples = load_clean_samples(suite, modality, split=suite.perturbations.split,
                                 max_samples=suite.perturbations.max_samples)
    paths = []
    for ds, items in sorted(samples.items()):
        if not items:
            continue
        sample = items[0]
        rows = manifest[(manifest["dataset"] == ds) & (manifest["sample_id"] == sample.sample_id)]
        levels = suite.perturbations.levels
        paths.append(write_gallery(out_dir / f"{ds}.png", sample.image, gallery_cells(sample, rows), levels,
                                   gallery_title(ds, sample.sample_id, levels)))
    return paths


def gallery_cells(sample: Sample, rows: pd.DataFrame) -> dict[str, dict[int, GalleryCell]]:
    """The gallery tiles of one sample: every ``ok`` manifest row of it (``rows``), regenerated
    bit-exactly from the manifest, by type and level."""
    cells: dict[str, dict[int, GalleryCell]] = {}
    for r in rows.to_dict("records"):
        if r["sample_id"] == sample.sample_id and r["status"] == "ok":
            rec = {str(k): v for k, v in r.items()}
            cells.setdefault(str(rec["perturbation"]), {})[int(rec["level"])] = GalleryCell(
                regenerate(rec, sample).image, float(rec["ssim"]), bool(rec["band_reached"]))
    return cells
