"""Issue 47, item 5: SSIM evaluations per calibrated output on a fixed demo subset (a property of
the calibration's steps, not a timing), the in-band share where the band is reachable, and the
warm start's aim (the stretch most subset images have in band)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from medrobust_lib.data.dataset import DatasetConfig, iter_dataset
from medrobust_lib.data.sample import Sample
from medrobust_lib.demo.manifest import DemoManifest
from medrobust_lib.perturb import calibrate as cal
from medrobust_lib.perturb.calibrate import DEFAULT_BANDS
from medrobust_lib.perturb.engine import ChunkSpec, chunk_previous, run_chunk
from medrobust_lib.perturb.spec import get_perturbation

MODALITIES = ("ct", "mri", "dermoscopy", "xray")
TYPES = ("gaussian_noise", "brightness", "contrast", "gaussian_blur", "jpeg_compression", "rotation",
         "speckle_noise", "pixelate")
LEVELS = (2, 4)
EVALS_BOUND = 1.35
"""Measured on this subset (256 outputs: 4 demo images per modality, seed 0, calibration subset 2):
1.508 SSIM evaluations per output with the median-centre warm start (CALIBRATION_VERSION 2), 1.473
with the most-covered aim (3); 1.406 when a subset image starts from its own subset search and
1.285 when level 4 also starts from each image's own level-2 point, as the suite chains them (4);
the bound sits between the last two, so losing the cross-level start fails."""
IN_BAND_FLOOR = 0.99


def _samples(demo_root: Path) -> dict[str, list[Sample]]:
    out: dict[str, list[Sample]] = {}
    for d in DemoManifest.load(demo_root).datasets:
        if d.modality in MODALITIES:
            cfg = DatasetConfig(name=d.name, modality=d.modality, format=d.format, root=d.root, options=d.options)
            out[d.name] = sorted((s for s in iter_dataset(cfg) if isinstance(s, Sample)), key=lambda s: s.sample_id)
    return out


@pytest.fixture(scope="module")
def subset_rows(demo_root: Path) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for name, samples in sorted(_samples(demo_root).items()):
        for t in TYPES:
            if not get_perturbation(t).applies_to(samples[0].modality, samples[0].n_channels):
                continue
            for lv in LEVELS:
                previous = chunk_previous(LEVELS, DEFAULT_BANDS, lv)  # level 4 anchored on level 2, as in a suite
                out, _ = run_chunk(ChunkSpec(name, samples[0].modality, t, lv, DEFAULT_BANDS[lv], 0, 2, previous=previous),
                                   samples)
                rows.extend(r for r in out if r["status"] == "ok")
    return rows


def test_evals_per_output_below_the_measured_bound(subset_rows: list[dict[str, object]]) -> None:
    n = len(subset_rows)
    assert n >= 150
    per_output = sum(int(r["n_ssim_evals"]) for r in subset_rows) / n  # type: ignore[call-overload]
    assert per_output <= EVALS_BOUND, per_output


def test_in_band_where_reachable(subset_rows: list[dict[str, object]]) -> None:
    reachable = [r for r in subset_rows if r["miss_reason"] != "unreachable"]
    share = sum(bool(r["band_reached"]) for r in reachable) / len(reachable)
    assert share >= IN_BAND_FLOOR, share


def test_warm_start_aims_where_most_subset_images_are_in_band() -> None:
    """Five subset images under the exact model (slope 1): two agree, two others agree, one lies
    between. The median of the centres is the lone image's centre (in band for it alone); the aim
    is inside a stretch two images share."""
    spec = get_perturbation("gaussian_noise")
    band = DEFAULT_BANDS[4]
    d_target = cal.distortion(0.5 * sum(band))
    centres = (-2.0, -1.95, -1.5, -1.2, -1.15)  # log severity at which each image hits the band's centre

    def in_band(c: float, t: float) -> bool:
        return band[0] <= 1.0 - math.exp(d_target - c + math.log(t)) <= band[1]

    def run(c: float) -> tuple[float, list[tuple[float, float]], int]:
        pts = [(cal.strength_at(spec, t), 1.0 - math.exp(d_target - c + math.log(cal.severity(spec, cal.strength_at(spec, t)))))
               for t in (0.2, 0.4)]
        return pts[-1][0], pts, 2

    ws = cal.fit_warm_start(spec, [run(c) for c in centres], band)
    assert abs(ws.slope - 1.0) < 1e-6
    t = cal.severity(spec, ws.strength)
    median = math.exp(-1.5)
    assert sum(in_band(c, median) for c in centres) == 1
    assert sum(in_band(c, t) for c in centres) == 2
