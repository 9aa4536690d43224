"""Calibration behaviour on synthetic specs with known answers, and on real types."""

from __future__ import annotations

import numpy as np
import pytest

from medrobust_lib.perturb.calibrate import DEFAULT_BANDS, calibrate, dataset_strength, validate_bands
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
