"""``calibration_mode: reference`` equals the reference code's calibration, run on the same images.

Fixtures: ``tools/reference_protocol_fixtures.py`` ran the published
``Medical2DPerturbationGenerator.apply_perturbation_adaptive`` (first-image bisection, reuse,
min-max SSIM) with medrobust's types bound to its hooks, over three demo images per dataset.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from medrobust_lib.data.sample import Sample
from medrobust_lib.perturb.calibrate_reference import find_strength, minmax, reference_ssim
from medrobust_lib.perturb.engine import ChunkSpec, regenerate, run_chunk
from medrobust_lib.perturb.spec import get_perturbation
from medrobust_lib.perturb.ssim import ssim

FIX = Path(__file__).parent / "fixtures"
DATA = json.loads((FIX / "calibration_reference.json").read_text())


def _samples() -> dict[str, list[Sample]]:
    arrays = np.load(FIX / "calibration_images.npz")
    modality = {r["dataset"]: r["modality"] for r in DATA["rows"]}
    out: dict[str, list[Sample]] = {}
    for name in sorted(arrays.files):
        ds, sid = name.split("__")
        img = arrays[name].astype(np.float32) / np.float32(255)
        out.setdefault(ds, []).append(Sample(sid, ds, modality[ds], img))
    return out


SAMPLES = _samples()
GROUPS = sorted({(r["dataset"], r["perturbation"], r["level"]) for r in DATA["rows"]})


@pytest.mark.parametrize(("dataset", "perturbation", "level"), GROUPS)
def test_reference_mode_equals_the_reference_code(dataset: str, perturbation: str, level: int) -> None:
    expected = {r["sample_id"]: r for r in DATA["rows"]
                if (r["dataset"], r["perturbation"], r["level"]) == (dataset, perturbation, level)}
    band = tuple(DATA["bands"][str(level)])
    samples = SAMPLES[dataset]
    chunk = ChunkSpec(dataset, samples[0].modality, perturbation, level, band, DATA["seed"], 4, "reference")
    rows, stats = run_chunk(chunk, samples[::-1])  # input order does not matter: the first by sample id calibrates
    spec = get_perturbation(perturbation)
    assert len(rows) == len(expected)
    for row in rows:
        ref = expected[row["sample_id"]]
        assert row["status"] == "ok"
        assert row["strength"] == pytest.approx(spec.clamp(ref["param"]), abs=1e-6)
        assert row["dataset_strength"] == row["strength"]
        sample = next(s for s in samples if s.sample_id == row["sample_id"])
        out = regenerate(row, sample)
        assert reference_ssim(sample.image, out.image) == pytest.approx(ref["ssim_minmax"], abs=1e-6)
        # the manifest keeps the house SSIM (raw [0, 1] images) and flags the band honestly
        assert row["ssim"] == ssim(sample.image, out.image)
        assert row["band_reached"] == (band[0] <= row["ssim"] <= band[1])
    assert stats["dataset_strength"] == rows[0]["strength"]


def test_only_the_first_image_is_searched() -> None:
    samples = SAMPLES["us_ref"]
    rows, stats = run_chunk(ChunkSpec("us_ref", "ultrasound", "gaussian_noise", 3, (0.70, 0.79), 0, 4, "reference"),
                            samples)
    evals = {r["sample_id"]: r["n_ssim_evals"] for r in rows}
    assert evals["img0"] == stats["calibration_evals"] >= 1
    assert evals["img1"] == evals["img2"] == 1
    assert len({r["strength"] for r in rows}) == 1


def test_minmax_matches_the_published_normalisation() -> None:
    flat = np.full((8, 8), 0.3, np.float32)
    assert not minmax(flat).any()
    ramp = np.linspace(0.2, 0.6, 64, dtype=np.float32).reshape(8, 8)
    assert minmax(ramp).min() == 0 and minmax(ramp).max() == pytest.approx(1.0)
    # min-max SSIM ignores a global gain: a darkened copy is "identical"
    img = SAMPLES["us_ref"][0].image
    assert reference_ssim(img, img * np.float32(0.5)) == pytest.approx(1.0, abs=1e-6)
    assert ssim(img, img * np.float32(0.5)) < 0.95


def test_search_accepts_within_the_widened_band() -> None:
    img = SAMPLES["derm_ref"][0].image
    spec = get_perturbation("gaussian_noise")
    s, value, _, n = find_strength(spec, img, (0.70, 0.79), ("k",))
    assert 0.68 <= value <= 0.81 and 1 <= n <= 20 and spec.strength_range[0] < s < spec.strength_range[1]


def test_fixed_mode_uses_the_default_level_strength() -> None:
    samples = SAMPLES["derm_ref"]
    rows, _ = run_chunk(ChunkSpec("derm_ref", "dermoscopy", "gaussian_blur", 5, (0.50, 0.59), 0, 4, "fixed"), samples)
    spec = get_perturbation("gaussian_blur")
    assert {r["strength"] for r in rows} == {spec.clamp(spec.levels[4])}
    assert all(r["n_ssim_evals"] == 1 and r["status"] == "ok" for r in rows)
    for r in rows:
        s = next(x for x in samples if x.sample_id == r["sample_id"])
        assert r["ssim"] == ssim(s.image, regenerate(r, s).image)
