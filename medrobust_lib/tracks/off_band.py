"""Which result rows are off-band (issue 30): a perturbed row whose output missed its level's SSIM
band in ``perturbation_manifest``. The Python statistics (segmentation stats, strategy ranking, VLM
stats) leave these rows out by default, as the mart's views leave them out of their means
(:func:`medrobust_lib.store.views.common.off_band_sql` is the SQL form of the same rule)."""

from __future__ import annotations

import numpy as np
import pandas as pd

MANIFEST_TABLE = "perturbation_manifest"
"""The results table with the band flags (``medrobust_lib.tracks.perturbed.MANIFEST_TABLE``)."""
BAND_COLUMNS = ["dataset", "sample_id", "perturbation", "level"]
"""The key of a perturbed output in ``perturbation_manifest`` (one band flag per key)."""


def off_band(df: pd.DataFrame, bands: pd.DataFrame | None) -> np.ndarray:
    """Per row of ``df`` (``segmentation_results`` rows, or ``vlm_results`` rows, which have no
    ``condition``): a corruption row (condition ``perturbation``; for VLM rows a perturbation other
    than ``clean``) whose output missed its level's SSIM band. ``bands``: ``perturbation_manifest``
    rows (``BAND_COLUMNS``, ``status``, ``band_reached``); an output is in band when every ok manifest
    row of its key is, and a row the manifest does not describe is not off-band (the mart's rule,
    :func:`medrobust_lib.store.views.common.off_band_sql`). Returns bool (len(df),)."""
    if df.empty or bands is None or bands.empty or "band_reached" not in bands.columns:
        return np.zeros(len(df), bool)
    ok = bands[bands["status"] == "ok"] if "status" in bands.columns else bands
    flags = ok.groupby(BAND_COLUMNS, dropna=False)["band_reached"].all().rename("_in_band").reset_index()
    keyed = df[BAND_COLUMNS].copy()
    keyed["level"] = pd.to_numeric(keyed["level"], errors="coerce")
    flags["level"] = pd.to_numeric(flags["level"], errors="coerce")
    merged = keyed.merge(flags, on=BAND_COLUMNS, how="left")
    missed = merged["_in_band"].eq(False).to_numpy()
    corruption = df["condition"] == "perturbation" if "condition" in df.columns else df["perturbation"] != "clean"
    return corruption.to_numpy() & missed
