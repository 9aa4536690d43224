"""Calibration behaviour on synthetic specs with known answers, and on real types."""

from __future__ import annotations

import numpy as np
import pytest

from medrobust_lib.perturb.calibrate import (
    DEFAULT_BANDS,
    DEFAULT_SLOPE,
    SLOPE_RANGE,
    WarmStart,
    calibrate,
    dataset_strength,
    fit_slope,
    predict_severity,
    severity,
    strength_at,
    validate_bands,
    warm_start,
)
from medrobust_lib.perturb.spec import PerturbationSpec, get_perturbation
from medrobust_lib.perturb.ssim import ssim
from medrobust_lib.seeding import rng_for


def _contrast(image: np.ndarray, s: float, rng: np.random.Generator) -> np.ndarray:
    return image.mean() + (image - image.mean()) * (1.0 - s)


def _spec(fn=_contrast, rng_=(0.0, 1.0), integer=False, inverse=False) -> PerturbationSpec:  # type: ignore[no-untyped-def]
    return PerturbationSpec(name="t", family="test", modalities=("ct",), geometry="intensity", strength_range=rng_,
                            levels=(0.1, 0.2, 0.3, 0.4, 0.5) if not inverse else (50, 40, 30, 20, 10),
                            reference="test", fn=fn, integer=integer, inverse=inverse)


@pytest.mark.parametrize("level", [1, 2, 3, 4, 5])
def test_hits_every_band(gray_image: np.ndarray, level: int) -> None:
    band = DEFAULT_BANDS[level]
    c = calibrate(get_perturbation("gaussian_noise"), gray_image, band, ("cal", level), start=0.5)
    assert c.band_reached and band[0] <= c.ssim <= band[1]
    # the recorded SSIM is the SSIM of the returned output
    assert c.ssim == ssim(gray_image, c.output.image)


def test_warm_start_in_band_costs_one_evaluation(gray_image: np.ndarray) -> None:
    spec = get_perturbation("gaussian_noise")
    first = calibrate(spec, gray_image, DEFAULT_BANDS[3], ("warm",))
    again = calibrate(spec, gray_image, DEFAULT_BANDS[3], ("warm",), start=first.strength)
    assert again.n_ssim_evals == 1 and again.strength == first.strength


def test_unreachable_band_is_flagged_not_accepted(gray_image: np.ndarray) -> None:
    # contrast toward the mean can never push SSIM below ~0 here; ask for an impossible band
    spec = _spec(rng_=(0.0, 0.5))
    c = calibrate(spec, gray_image, (0.0, 0.05), ("u",))
    assert not c.band_reached
    assert c.strength == spec.strongest
    assert c.ssim > 0.05


def test_integer_strengths_bracket_and_report_closer_side(gray_image: np.ndarray) -> None:
    def steps(image: np.ndarray, s: float, rng: np.random.Generator) -> np.ndarray:
        # only 4 distinct outputs: SSIM jumps over narrow bands
        return _contrast(image, 0.3 * round(s), rng)

    spec = _spec(steps, rng_=(0.0, 3.0), integer=True)
    values = {k: ssim(gray_image, spec.apply(gray_image, k, rng_for("i")).image) for k in range(4)}
    # a band strictly between two consecutive integer outputs
    hi_k = next(k for k in range(3) if values[k] > 0.5 > values[k + 1])
    gap = values[hi_k] - values[hi_k + 1]
    band = (values[hi_k + 1] + 0.2 * gap, values[hi_k] - 0.4 * gap)  # closer to the stronger side
    c = calibrate(spec, gray_image, band, ("i",), start=0.0)
    assert not c.band_reached
    assert float(c.strength).is_integer() and int(c.strength) in (hi_k, hi_k + 1)
    closer = min((hi_k, hi_k + 1), key=lambda k: min(abs(values[k] - band[0]), abs(values[k] - band[1])))
    assert int(c.strength) == closer == hi_k + 1


def test_inverse_types_search_in_the_right_direction(gray_image: np.ndarray) -> None:
    spec = get_perturbation("jpeg_compression")
    assert spec.inverse and spec.integer
    c = calibrate(spec, gray_image, DEFAULT_BANDS[1], ("jpeg",), start=100)
    assert c.ssim <= DEFAULT_BANDS[1][1] or not c.band_reached
    assert c.n_ssim_evals <= 24


def test_dataset_strength_is_median_of_subset(gray_image: np.ndarray, rgb_image: np.ndarray) -> None:
    spec = get_perturbation("gaussian_noise")
    imgs = [(gray_image, ("d", i)) for i in range(3)]
    warm, n = dataset_strength(spec, imgs, DEFAULT_BANDS[2])
    each = [calibrate(spec, im, DEFAULT_BANDS[2], key).strength for im, key in imgs]
    assert warm == pytest.approx(float(np.median(each)))
    assert n >= 3


def test_band_validation() -> None:
    validate_bands(dict(DEFAULT_BANDS))
    with pytest.raises(ValueError, match="below"):
        validate_bands({1: (0.8, 0.9), 2: (0.85, 0.95)})
    with pytest.raises(ValueError, match="0 <= low"):
        validate_bands({1: (0.9, 0.8)})


def test_fit_slope_recovers_a_power_law() -> None:
    # three images on exact curves 1 - SSIM = A_i * t**1.7 with different offsets A_i
    spec = _spec(rng_=(0.0, 2.0))
    points = [[(s, 1.0 - a * (s / 2.0) ** 1.7) for s in (0.2, 0.5, 1.1)] for a in (0.3, 0.6, 0.9)]
    assert fit_slope(points, spec) == pytest.approx(1.7, rel=1e-9)
    # one point per image (or only t = 0 / SSIM 1) carries no slope: the default
    assert fit_slope([[(0.5, 0.8)], [(0.0, 1.0), (0.7, 0.6)]], spec) == DEFAULT_SLOPE
    # clipped to the documented range
    steep = [[(s, 1.0 - 0.5 * (s / 2.0) ** 9) for s in (1.0, 2.0)]]
    assert fit_slope(steep, spec) == SLOPE_RANGE[1]


def test_predicted_severity_is_exact_on_the_model() -> None:
    a, b = 0.4, 1.3
    t = predict_severity(0.2, 1.0 - a * 0.2**b, 0.75, b)
    assert 1.0 - a * t**b == pytest.approx(0.75, abs=1e-12)
    spec = _spec(rng_=(10.0, 90.0), inverse=True)  # severity runs from 90 (weakest) to 10
    assert severity(spec, 90.0) == 0.0 and severity(spec, 10.0) == 1.0
    assert strength_at(spec, severity(spec, 30.0)) == pytest.approx(30.0)


@pytest.mark.parametrize("name", ["gaussian_noise", "jpeg_compression", "rotation"])
def test_warm_start_search_verifies_the_band_and_records_every_point(
        gray_image: np.ndarray, name: str) -> None:
    spec = get_perturbation(name)
    for level in (1, 3, 5):
        band = DEFAULT_BANDS[level]
        subset = [(gray_image, ("sub", i)) for i in range(3)]
        warm = warm_start(spec, subset, band, start=spec.levels[level - 1])
        assert SLOPE_RANGE[0] <= warm.slope <= SLOPE_RANGE[1] and warm.n_evals >= 3
        assert warm.strength == spec.clamp(warm.strength)
        c = calibrate(spec, gray_image, band, ("img", level), warm=warm)
        assert c.n_ssim_evals == len(c.points) and c.points[0][0] == warm.strength
        assert (c.strength, c.ssim) in c.points
        assert c.ssim == ssim(gray_image, c.output.image)
        assert c.band_reached == (band[0] <= c.ssim <= band[1])
        # the same strength from the default search gives the same bytes (common random numbers)
        again = spec.apply(gray_image, c.strength, rng_for("img", level))
        assert np.array_equal(again.image, c.output.image)


def test_warm_start_without_images_costs_nothing() -> None:
    spec = get_perturbation("gaussian_noise")
    w = warm_start(spec, [], DEFAULT_BANDS[2], start=spec.levels[1])
    assert w == WarmStart(spec.levels[1], DEFAULT_SLOPE, 0)
