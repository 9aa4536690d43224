"""Behaviour tests for the ultrasound perturbation family (beam travels down the rows)."""

from __future__ import annotations

from collections.abc import Callable

import cv2
import numpy as np
import pydicom
import pytest
from pydicom.data import get_testdata_file

from medrobust_lib.perturb.families import us
from medrobust_lib.perturb.spec import get_perturbation, list_perturbations
from medrobust_lib.perturb.ssim import ssim
from medrobust_lib.seeding import rng_for

N = 256


def _call(fn: Callable[..., object], *args: object) -> np.ndarray:
    """Call a registered perturbation function directly (unclipped), typed as an array."""
    return np.asarray(fn(*args), np.float32)


@pytest.fixture(scope="module")
def us_image() -> np.ndarray:
    """The B-mode region of pydicom-data's US1_UNCI.dcm (a lymph node; ships in the wheel), the
    power-Doppler colour overlay inpainted away, gray, 256x256."""
    rgb = pydicom.dcmread(str(get_testdata_file("US1_UNCI.dcm"))).pixel_array[108:335, 20:620]
    colour = (rgb.max(axis=2).astype(np.int16) - rgb.min(axis=2).astype(np.int16)) > 30
    gray = cv2.inpaint(cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY), colour.astype(np.uint8), 3, cv2.INPAINT_TELEA)
    return np.asarray(cv2.resize(gray.astype(np.float32) / 255.0, (N, N), interpolation=cv2.INTER_AREA), np.float32)


def test_family_registers_the_three_types() -> None:
    assert set(list_perturbations(family="us")) == {"acoustic_shadowing", "reverberation", "depth_gain_variation"}


def test_acoustic_shadowing_darkens_only_below_the_reflectors() -> None:
    img = np.full((N, N), 0.5, np.float32)
    a = 3.0
    out = _call(us.acoustic_shadowing, img, a, rng_for("t", "shadow"))
    for c0, _c1, depth, lateral in us.shadow_geometry(rng_for("t", "shadow"), N, N):
        plateau = np.flatnonzero(lateral == lateral.max())
        i = int(plateau[len(plateau) // 2])  # the middle of the reflector
        col, surface = c0 + i, float(depth[i])
        above = out[: int(surface) - 5, col]
        below = out[int(surface) + 5 :, col]
        np.testing.assert_allclose(above, 0.5, atol=1e-6)  # nothing changes before the beam hits it
        assert below.max() <= 0.5 * np.exp(-a) + 1e-6  # transmission exp(-a) or less behind it
        assert (np.diff(below) <= 1e-7).all()  # and darker still with depth
        s0 = int(round(surface))
        assert out[s0 - 2 : s0 + 3, col].max() > 0.8  # the reflecting surface itself is bright


def test_reverberation_echoes_are_equally_spaced_and_decay_as_r_power_k() -> None:
    r = 0.8
    out = _call(us.reverberation, np.zeros((N, N), np.float32), r, rng_for("t", "rev"))
    depth, _thick, profile = us.reverberation_draw(rng_for("t", "rev"), N, N)
    col = out[:, int(np.argmax(profile))]
    ks = [k for k in range(1, 5) if (k + 1) * depth < N]
    for k in ks:
        window = col[k * depth - depth // 2 : k * depth + depth // 2]
        assert int(np.argmax(window)) == depth // 2  # echo k sits at depth k d
    for k in ks[:-1]:
        assert col[(k + 1) * depth] / col[k * depth] == pytest.approx(r, rel=1e-3)


def test_depth_gain_variation_depends_on_depth_only() -> None:
    img = np.full((N, N), 0.01, np.float32)
    db = 20.0
    out = _call(us.depth_gain_variation, img, db, rng_for("t", "tgc"))
    gain_db = 20.0 * np.log10(out.astype(np.float64) / 0.01)
    assert np.ptp(gain_db, axis=1).max() < 1e-3  # one gain per row (depth)
    assert np.abs(gain_db).max() == pytest.approx(db, rel=1e-3)  # largest error = strength in dB
    assert np.abs(np.diff(gain_db[:, 0], 2)).max() < 0.5  # a smooth TGC curve


@pytest.mark.parametrize("name", ["acoustic_shadowing", "reverberation", "depth_gain_variation"])
def test_ssim_non_increasing_and_reaches_low_band(name: str, us_image: np.ndarray) -> None:
    spec = get_perturbation(name)
    values = [ssim(us_image, spec.apply(us_image, float(s), rng_for("test", name)).image)
              for s in np.linspace(spec.weakest, spec.strongest, 8)]
    assert values[0] >= 0.98
    assert (np.diff(values) <= 1e-3).all(), np.round(values, 4)
    assert values[-1] < 0.6, np.round(values, 4)
