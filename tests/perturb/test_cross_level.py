"""Issue 47, item 5: warm starts from the image's own point at the suite's previous level (its
anchor) and from a subset image's own subset search; the first guess, the bracket the known
points give, and that outputs do not depend on the order in which levels are built."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from medrobust_lib.config import Suite
from medrobust_lib.data.boxes import mask_to_boxes
from medrobust_lib.data.sample import Sample
from medrobust_lib.demo.manifest import DemoManifest
from medrobust_lib.perturb import calibrate as cal
from medrobust_lib.perturb.calibrate import DEFAULT_BANDS
from medrobust_lib.perturb.engine import (
    ChunkSpec,
    anchor_chunk,
    anchors_from_rows,
    calibration_subset,
    chunk_previous,
    output_hash,
    run_chunk,
    verify_row,
)
from medrobust_lib.perturb.spec import get_perturbation
from medrobust_lib.tracks import perturbed as tp
from medrobust_lib.tracks.datasets import build_clean_index


def _model_ssim(offset: float, slope: float, t: float) -> float:
    """SSIM of an exact model image: log(1 - SSIM) = offset + slope * log t."""
    return 1.0 - math.exp(offset + slope * math.log(t))


def _offset_for(value: float, slope: float, t: float) -> float:
    return cal.distortion(value) - slope * math.log(t)


def test_anchor_slope_fit_lands_every_model_image_in_band() -> None:
    """Images whose curves share the slope 1.6 between the two levels but differ in offset (by
    a factor of 2 in strength): the warm start alone lands in level 4's narrow band for few; the
    slope fitted on the subset's anchors carries each image's own level-2 point into it."""
    spec = get_perturbation("gaussian_noise")
    band2, band4 = DEFAULT_BANDS[2], DEFAULT_BANDS[4]
    slope = 1.6
    offsets = [_offset_for(0.5 * sum(band4), slope, t) for t in (0.2, 0.26, 0.31, 0.4)]  # centre at t

    def anchor(offset: float) -> tuple[float, float]:
        # the image's calibrated level-2 point: somewhere in band 2 (not its centre)
        t = math.exp((cal.distortion(0.87) - offset) / slope)
        s = cal.strength_at(spec, t)
        return s, _model_ssim(offset, slope, cal.severity(spec, s))

    def run(offset: float) -> tuple[float, list[tuple[float, float]], int]:
        pts = []
        for t in (0.15, 0.5):  # a level-4 search's points around the band
            s = cal.strength_at(spec, t)
            pts.append((s, _model_ssim(offset, slope, cal.severity(spec, s))))
        return pts[-1][0], pts, 2

    subset = offsets[:3]
    ws = cal.fit_warm_start(spec, [run(o) for o in subset], band4, [anchor(o) for o in subset])
    assert ws.anchor_slope is not None and abs(ws.anchor_slope - slope) < 0.2
    hits_warm = hits_anchor = 0
    for o in offsets + [_offset_for(0.5 * sum(band4), slope, 0.35)]:
        first = cal.first_strength(spec, band4, None, ws, [anchor(o)])
        hits_anchor += band4[0] <= _model_ssim(o, slope, cal.severity(spec, first)) <= band4[1]
        hits_warm += band4[0] <= _model_ssim(o, slope, cal.severity(spec, ws.strength)) <= band4[1]
    assert hits_anchor == 5 and hits_warm <= 2
    # without anchors the fit has no anchor slope and the first strength is the warm start's
    plain = cal.fit_warm_start(spec, [run(o) for o in subset], band4)
    assert plain.anchor_slope is None
    assert cal.first_strength(spec, band4, None, plain, [anchor(offsets[0])]) == spec.clamp(plain.strength)
    assert all(band2[0] <= anchor(o)[1] <= band2[1] for o in offsets)


def test_a_known_in_band_point_is_tried_first_and_reproduced(gray_image: np.ndarray) -> None:
    spec = get_perturbation("gaussian_noise")
    band = DEFAULT_BANDS[3]
    key = ("k", 1)
    c = cal.calibrate(spec, gray_image, band, key)
    assert c.band_reached
    again = cal.calibrate(spec, gray_image, band, key, known=list(c.points))
    assert again.n_ssim_evals == 1 and again.strength == c.strength and again.ssim == c.ssim
    assert output_hash(again.output) == output_hash(c.output)  # the same strength, the same bytes


def test_known_points_bracket_the_search(gray_image: np.ndarray) -> None:
    """Known points on both sides of the band: every evaluated strength lies strictly inside them."""
    spec = get_perturbation("gaussian_noise")
    band = DEFAULT_BANDS[4]
    key = ("k", 2)
    c = cal.calibrate(spec, gray_image, band, key)
    sev = cal.severity(spec, c.strength)
    above, below = cal.strength_at(spec, 0.6 * sev), cal.strength_at(spec, 1.6 * sev)
    known = []
    for s in (above, below):
        known.append((s, cal.calibrate(spec, gray_image, (0.0, 1.0), key, start=s).ssim))
    assert known[0][1] > band[1] and known[1][1] < band[0]
    b = cal.calibrate(spec, gray_image, band, key, known=known)
    assert b.band_reached
    assert all(above < s < below for s, _ in b.points)


def test_a_known_unreachable_strongest_is_evaluated_once_and_flagged(gray_image: np.ndarray) -> None:
    spec = get_perturbation("gaussian_noise")
    band = (0.0, 0.01)  # beyond any strength of the type
    key = ("k", 3)
    top = spec.strongest
    value = cal.calibrate(spec, gray_image, (0.0, 1.0), key, start=top).ssim
    c = cal.calibrate(spec, gray_image, band, key, known=[(top, value)])
    assert not c.band_reached and c.strength == top and c.n_ssim_evals == 1 and c.ssim == value


def _samples(gray: np.ndarray, square: tuple[np.ndarray, np.ndarray]) -> list[Sample]:
    img, mask = square
    out = []
    for i, base in enumerate([gray, img, np.flipud(gray).copy(), np.fliplr(img).copy(), np.rot90(gray).copy()]):
        m = mask if i % 2 else mask[::-1].copy()
        out.append(Sample(f"s{i}", "ds", "ct", np.ascontiguousarray(base, np.float32), m, mask_to_boxes(m)))
    return out


@pytest.mark.parametrize("name", ["gaussian_noise", "rotation", "pixelate"])
def test_an_anchored_chunk_is_the_same_with_or_without_its_anchor_rows(
        name: str, gray_image: np.ndarray, square_sample: tuple[np.ndarray, np.ndarray]) -> None:
    """A level-4 chunk anchored on level 2: computing the level-2 chunk inside the call (nothing
    built yet) and passing the level-2 chunk's rows (built before) give the same rows; every
    output regenerates bit-exactly; and a subset image costs one evaluation."""
    samples = _samples(gray_image, square_sample)
    levels = [2, 4]
    ch4 = ChunkSpec("ds", "ct", name, 4, DEFAULT_BANDS[4], 7, 2, previous=chunk_previous(levels, DEFAULT_BANDS, 4))
    ch2 = anchor_chunk(ch4)
    assert ch2 == ChunkSpec("ds", "ct", name, 2, DEFAULT_BANDS[2], 7, 2)
    rows2, _ = run_chunk(ch2, samples)
    alone, _ = run_chunk(ch4, samples[::-1])  # the anchor level computed here
    given, _ = run_chunk(ch4, samples, anchors_from_rows(rows2))
    pd.testing.assert_frame_equal(pd.DataFrame(alone), pd.DataFrame(given))
    by_id = {s.sample_id: s for s in samples}
    assert all(verify_row(r, by_id[r["sample_id"]]) for r in given if r["status"] == "ok")
    # a subset image starts from its own subset search's in-band point: one evaluation
    subset = {s.sample_id for s in calibration_subset(samples, 7, 2)}
    assert all(r["n_ssim_evals"] == 1 for r in given if r["sample_id"] in subset and r["band_reached"])
    assert sum(r["band_reached"] for r in given if r["sample_id"] in subset) == 2


def _demo_suite(tmp_path: Path, demo_root: Path, levels: list[int]) -> Suite:
    d = next(d for d in DemoManifest.load(demo_root).datasets if d.modality == "ct")
    return Suite.model_validate({
        "name": "order", "seed": 3, "results_dir": str(tmp_path / "results"),
        "mart_path": str(tmp_path / "marts.duckdb"), "workers": 1, "modalities": ["ct"],
        "demo": {"enabled": False},
        "datasets": [{"name": d.name, "modality": "ct", "format": d.format, "root": str(d.root),
                      "options": d.options, "size": None}],
        "perturbations": {"include": ["gaussian_noise", "rotation"], "levels": levels, "split": "all",
                          "calibration_subset": 2},
    })


def test_partitions_are_the_same_whatever_order_the_levels_are_built_in(tmp_path: Path, demo_root: Path) -> None:
    """Level 4 built before level 2 (its anchor computed in the call) and after it (its anchor read
    from the current level-2 chunk) writes the same manifest; a suite without level 2 gives level
    4 its own (unanchored) chunk fingerprint."""
    frames = {}
    for order in ([2, 4], [4, 2]):
        suite = _demo_suite(tmp_path / "-".join(map(str, order)), demo_root, [2, 4])
        build_clean_index(suite, "ct")
        for lv in order:
            tp.build_perturbed(suite, "ct", lv)
        frames[tuple(order)] = tp.read_manifest(suite).sort_values(["level", "perturbation", "sample_id"])
    a, b = frames[(2, 4)], frames[(4, 2)]
    assert len(a) > 0 and set(a["status"]) == {"ok"}
    pd.testing.assert_frame_equal(a.reset_index(drop=True), b.reset_index(drop=True))
    # the built level-2 chunk is read back as level 4's anchors (not recomputed): the same rows
    from medrobust_lib.tracks.datasets import load_clean_samples

    built = _demo_suite(tmp_path / "2-4", demo_root, [2, 4])
    for ds, samples in load_clean_samples(built, "ct", split="all").items():
        for t in ("gaussian_noise", "rotation"):
            ch4 = tp.chunk_spec(built, ds, "ct", t, 4)
            read = tp.current_lower_rows(built, ch4, samples)
            prev = anchor_chunk(ch4)
            assert prev is not None and set(read) == {prev.level}
            assert read[prev.level] == anchors_from_rows(run_chunk(prev, samples)[0])
    alone = _demo_suite(tmp_path / "alone", demo_root, [4])
    ch_pair = tp.chunk_spec(_demo_suite(tmp_path / "x", demo_root, [2, 4]), "ds", "ct", "rotation", 4)
    ch_alone = tp.chunk_spec(alone, "ds", "ct", "rotation", 4)
    assert ch_pair.previous == ((2, DEFAULT_BANDS[2]),) and ch_alone.previous == ()
    assert tp._chunk_fields(ch_alone) != tp._chunk_fields(ch_pair)


def test_a_chain_stops_at_the_highest_current_lower_level(tmp_path: Path, demo_root: Path) -> None:
    """Levels 2, 3, 4 with only level 2 built: level 4's anchor chain (3, then 2) reads level 2 from
    disk instead of computing it again, and the rows equal the whole chain computed from scratch."""
    from medrobust_lib.tracks.datasets import load_clean_samples

    suite = _demo_suite(tmp_path / "chain", demo_root, [2, 3, 4])
    build_clean_index(suite, "ct")
    tp.build_perturbed(suite, "ct", 2)
    for ds, samples in load_clean_samples(suite, "ct", split="all").items():
        ch4 = tp.chunk_spec(suite, ds, "ct", "gaussian_noise", 4)
        lower = tp.current_lower_rows(suite, ch4, samples)
        assert set(lower) == {2}  # level 3 is not built: the chain goes down to level 2, which is
        from_disk, _ = run_chunk(ch4, samples, lower=lower)
        scratch, _ = run_chunk(ch4, samples)
        assert pd.DataFrame(from_disk).equals(pd.DataFrame(scratch))
        # a wrong level-2 row set is used when given: proof the chain read it instead of recomputing
        wrong = {sid: (a[0] * 0.5, a[1]) for sid, a in lower[2].items()}
        moved, _ = run_chunk(ch4, samples, lower={2: wrong})
        assert not pd.DataFrame(moved).equals(pd.DataFrame(scratch))


def test_an_integer_bracket_of_known_points_reports_the_closer_side() -> None:
    """Both sides of the band already known on two neighbouring integers (no integer between): the
    search evaluates the first strength (the farther side) and then the closer known one, and
    reports the closer side, flagged, as an evaluated output."""
    spec = get_perturbation("jpeg_compression")
    band = DEFAULT_BANDS[4]
    a, b = 40.0, 41.0
    weak_s, strong_s = (a, b) if cal.severity(spec, a) < cal.severity(spec, b) else (b, a)
    truth = {weak_s: band[1] + 0.01, strong_s: band[0] - 0.05}  # the weak side is 5x closer
    gen = cal.search(spec, band, strong_s, known=list(truth.items()))
    asked = [next(gen)]
    try:
        while True:
            asked.append(gen.send(truth[asked[-1]]))
    except StopIteration as stop:
        strength, reached = stop.value
    assert asked == [strong_s, weak_s]
    assert (strength, reached) == (weak_s, False)
