"""The device perturbation engine against the CPU engine (issue 48, item 1), on the CPU.

For every type with a device port, on the demo images at every level: the device output within
1/255 of the CPU output at the same strength (max abs, [0, 1] scale), its SSIM within 1e-4, the
calibrated strength within the search tolerance (:data:`STRENGTH_TOL` of the type's range) and
the band flag equal. The default run takes one demo image per type (and a gray and an RGB one for
the generic types); the slow run every modality's first demo image, and the warm-started chunk
protocol against :func:`medrobust_lib.perturb.engine.run_chunk`.
"""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from medrobust_lib.data.dataset import DatasetConfig, iter_dataset
from medrobust_lib.data.sample import Sample
from medrobust_lib.demo.manifest import DemoManifest
from medrobust_lib.perturb import torch_engine as E
from medrobust_lib.perturb import torch_ops as T
from medrobust_lib.perturb.calibrate import DEFAULT_BANDS, calibrate, severity
from medrobust_lib.perturb.engine import ChunkSpec, chunk_previous, perturbation_key, regenerate, run_chunk
from medrobust_lib.perturb.spec import get_perturbation, list_perturbations, remap_mask
from medrobust_lib.perturb.ssim import ssim, ssim_nchw, ssim_torch
from medrobust_lib.seeding import rng_for
from medrobust_lib.types import ALL_MODALITIES

OUTPUT_TOL = 1.0 / 255.0
SSIM_TOL = 1e-4
STRENGTH_TOL = 1e-4
"""Search tolerance: the largest difference of the two engines' calibrated strengths, in severity
(the fraction of the type's range; measured at most 5e-5, brightness on a saturating image)."""
GENERIC = {n for n in list_perturbations() if set(get_perturbation(n).modalities) == set(ALL_MODALITIES)}
DEVICE = list(E.DEVICE_TYPES)


@pytest.fixture(scope="module", autouse=True)
def one_thread(one_torch_thread: None) -> None:
    """One torch thread (tests/conftest.py): on a loaded two-core machine two threads make the small
    tensor operations of these tests 10-100 times slower (measured)."""


@pytest.fixture(scope="module")
def demo_images(demo_root: Path) -> dict[str, Sample]:
    """The first demo sample (by id) of every modality, 256 px."""
    out: dict[str, Sample] = {}
    for d in DemoManifest.load(demo_root).datasets:
        cfg = DatasetConfig(name=d.name, modality=d.modality, format=d.format, root=d.root, options=d.options)
        out[d.modality] = min((s for s in iter_dataset(cfg) if isinstance(s, Sample)), key=lambda s: s.sample_id)
    return out


@pytest.fixture(scope="module")
def small_demo_images(demo_images: dict[str, Sample]) -> dict[str, Sample]:
    """The same demo images reduced to 128 px (INTER_AREA; masks nearest), for the default run."""
    out = {}
    for m, s in demo_images.items():
        image = np.asarray(cv2.resize(s.image, (128, 128), interpolation=cv2.INTER_AREA), np.float32)
        mask = None if s.mask is None else cv2.resize(s.mask.astype(np.uint8), (128, 128),
                                                       interpolation=cv2.INTER_NEAREST).astype(bool)
        out[m] = Sample(s.sample_id, s.dataset, s.modality, image.reshape((128, 128) + s.image.shape[2:]), mask)
    return out


def _images_for(name: str, demo: dict[str, Sample], every: bool) -> list[Sample]:
    spec = get_perturbation(name)
    usable = [s for m, s in demo.items() if spec.applies_to(m, s.n_channels)]
    if every:
        return usable
    if name in GENERIC and get_perturbation(name).channels == "any":  # one gray and one RGB image
        return [next(s for s in usable if s.n_channels == 1), next(s for s in usable if s.n_channels == 3)]
    return usable[:1]


def _key(s: Sample, name: str) -> tuple[str]:
    return (perturbation_key(0, s.dataset, s.sample_id, name),)


def assert_engines_agree(name: str, samples: list[Sample], device: str = "cpu") -> dict[str, float]:
    """Calibrate ``name`` on every sample at every level on both engines (the device engine on
    ``device``) and compare; returns the worst differences seen."""
    spec = get_perturbation(name)
    items, bands, cpu = [], [], []
    for s in samples:
        item = E.prepare(spec, s.image, _key(s, name), device)
        for lv, band in DEFAULT_BANDS.items():
            cpu.append((s, lv, calibrate(spec, s.image, band, _key(s, name))))
            items.append(item)
            bands.append(band)
    dev = E.calibrate_batch(spec, items, bands)
    worst = {"output": 0.0, "ssim": 0.0, "strength": 0.0, "cal_ssim": 0.0}
    outs: list[np.ndarray] = []
    values: list[float] = []
    for k in range(0, len(items), len(DEFAULT_BANDS)):  # one image (shape) at a time
        same_strength = E.apply(spec, items[k : k + len(DEFAULT_BANDS)], [c.strength for _, _, c in cpu[k : k + 5]])
        outs += T.to_images(same_strength.images)
        values += ssim_nchw(torch.stack([it.clean for it in items[k : k + 5]]), same_strength.images).tolist()
    for (s, lv, c), d, out, v in zip(cpu, dev, outs, values, strict=True):
        what = f"{name} on {s.modality} at level {lv}"
        worst["output"] = max(worst["output"], float(np.abs(out - c.output.image).max()))
        worst["ssim"] = max(worst["ssim"], abs(v - c.ssim))
        sp = spec.for_shape(s.image.shape)
        worst["strength"] = max(worst["strength"], abs(severity(sp, d.strength) - severity(sp, c.strength)))
        worst["cal_ssim"] = max(worst["cal_ssim"], abs(d.ssim - c.ssim))
        assert np.abs(out - c.output.image).max() <= OUTPUT_TOL, what
        assert abs(v - c.ssim) <= SSIM_TOL, what
        assert d.band_reached == c.band_reached, what
        assert abs(severity(sp, d.strength) - severity(sp, c.strength)) <= STRENGTH_TOL, what
        assert abs(d.ssim - c.ssim) <= SSIM_TOL, what
    return worst


def test_every_type_is_ported_or_kept_on_the_host_with_a_reason() -> None:
    assert set(E.DEVICE_TYPES) | set(E.HOST_ONLY) == set(list_perturbations())
    assert not set(E.DEVICE_TYPES) & set(E.HOST_ONLY)
    assert set(E.HOST_ONLY) == {"jpeg_compression", "hair"}
    assert all(len(why) > 40 for why in E.HOST_ONLY.values())
    with pytest.raises(KeyError, match="no device port"):
        E.prepare(get_perturbation("hair"), np.zeros((16, 16, 3), np.float32), ("k",), "cpu")


@pytest.mark.parametrize("name", DEVICE)
def test_device_engine_equals_cpu_engine(name: str, small_demo_images: dict[str, Sample]) -> None:
    assert_engines_agree(name, _images_for(name, small_demo_images, every=False))


@pytest.mark.gpu
@pytest.mark.parametrize("name", DEVICE)
def test_cuda_engine_equals_cpu_engine(name: str, demo_images: dict[str, Sample]) -> None:
    """On a CUDA device (cuFFT, cuDNN without TF32, the GPU's float32 transcendentals), every
    demo modality at 256 px."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    assert_engines_agree(name, _images_for(name, demo_images, every=True), device="cuda")


@pytest.mark.slow
@pytest.mark.parametrize("name", DEVICE)
def test_device_engine_equals_cpu_engine_on_every_demo_modality(name: str, demo_images: dict[str, Sample]) -> None:
    assert_engines_agree(name, _images_for(name, demo_images, every=True))


PIXEL_TYPES = [n for n in DEVICE if get_perturbation(n).scales_with_size]


@pytest.mark.parametrize("name", PIXEL_TYPES)
def test_stretched_ranges_above_256_px(name: str, demo_images: dict[str, Sample]) -> None:
    """A 320 px image stretches the ranges of the types in pixels: Gaussian blur's strongest sigma
    (37.5) takes the DCT path, the motion and defocus kernels the FFT path."""
    spec = get_perturbation(name)
    s = next(s for m, s in demo_images.items() if spec.applies_to(m, s.n_channels))
    image = np.clip(cv2.resize(s.image, (320, 320), interpolation=cv2.INTER_CUBIC), 0, 1).astype(np.float32)
    key = ("stretch", name)
    item = E.prepare(spec, image, key, "cpu")
    strengths = [spec.level_start(3, image.shape), spec.strongest_for(image.shape)]
    out = E.apply(spec, [item, item], strengths)
    for st, got in zip(out.strengths, T.to_images(out.images), strict=True):
        ref = spec.apply(image, st, rng_for(*key)).image
        assert np.abs(got - ref).max() <= OUTPUT_TOL
        assert abs(ssim(image, got) - ssim(image, ref)) <= SSIM_TOL


@pytest.mark.parametrize("name", list_perturbations(geometry="spatial"))
def test_spatial_types_move_the_mask_as_the_cpu_does(name: str, demo_images: dict[str, Sample]) -> None:
    spec = get_perturbation(name)
    s = next(s for m, s in demo_images.items() if spec.applies_to(m, s.n_channels) and s.mask is not None)
    assert s.mask is not None
    out = E.perturbed_batch(name, [s, s], [spec.levels[1], spec.levels[4]], 0, device="cpu")
    assert out.masks is not None
    for st, got in zip(out.strengths, out.masks.numpy(), strict=True):
        maps = spec.fn(s.image, st, rng_for(perturbation_key(0, s.dataset, s.sample_id, name)))
        np.testing.assert_array_equal(got, remap_mask(s.mask, *maps))  # type: ignore[misc]


def test_ssim_torch_equals_the_project_ssim_on_the_demo_images(demo_images: dict[str, Sample]) -> None:
    """``ssim_torch`` (float64) and ``ssim_nchw`` in float32 against :func:`ssim` (which matches
    scikit-image), on every demo image against perturbed versions of it."""
    for s in demo_images.values():
        outs = [get_perturbation(n).apply(s.image, get_perturbation(n).levels[lv], rng_for("ssim", n)).image
                for n in ("gaussian_noise", "contrast", "gaussian_blur") for lv in (0, 4)]
        cpu = np.array([ssim(s.image, o) for o in outs])
        got = ssim_torch(torch.from_numpy(s.image), torch.from_numpy(np.stack(outs))).numpy()
        np.testing.assert_allclose(got, cpu, rtol=0, atol=1e-5)
        x = T.as_batch([s.image] * len(outs))
        np.testing.assert_allclose(ssim_nchw(x, T.as_batch(outs), dtype=torch.float32).numpy(), cpu, rtol=0, atol=1e-4)
    assert float(ssim_nchw(x[:1], x[:1])[0]) == 1.0


def test_lock_step_batches_do_not_change_the_result(demo_images: dict[str, Sample]) -> None:
    """One search at a time, or all levels of two images in shared batches of 3: the same steps."""
    spec = get_perturbation("gaussian_noise")
    samples = [demo_images["ct"], demo_images["mri"]]
    items = [E.prepare(spec, s.image, _key(s, spec.name), "cpu") for s in samples for _ in DEFAULT_BANDS]
    bands = [b for _ in samples for b in DEFAULT_BANDS.values()]
    together = E.calibrate_batch(spec, items, bands, max_batch=3)
    alone = [E.calibrate_batch(spec, [it], [b])[0] for it, b in zip(items, bands, strict=True)]
    assert [(c.strength, c.n_ssim_evals, c.band_reached) for c in together] == \
        [(c.strength, c.n_ssim_evals, c.band_reached) for c in alone]


def _chunk_vs_levels(name: str, demo_root: Path, per_modality: int) -> None:
    spec = get_perturbation(name)
    for d in DemoManifest.load(demo_root).datasets:
        cfg = DatasetConfig(name=d.name, modality=d.modality, format=d.format, root=d.root, options=d.options)
        samples = sorted((s for s in iter_dataset(cfg) if isinstance(s, Sample)), key=lambda s: s.sample_id)[:per_modality]
        if not spec.applies_to(d.modality, samples[0].n_channels):
            continue
        res = E.calibrate_levels(spec, samples, [1, 3, 5], 11, 2, device="cpu", chain=True)
        anchors = None
        for lv in (1, 3, 5):
            # chained as calibrate_levels chains them; each level from the device's own anchors, so
            # the two engines are compared level by level (float rounding in an anchor moves the next
            # level's first guess a little, and a wiggly type such as pixelate then lands elsewhere
            # in its band: 3e-4 in SSIM at level 5 from the engines' own chains)
            previous = chunk_previous([1, 3, 5], DEFAULT_BANDS, lv)
            rows, stats = run_chunk(ChunkSpec(d.name, d.modality, name, lv, DEFAULT_BANDS[lv], 11, 2,
                                              previous=previous), samples, anchors)
            anchors = {sid: (c.strength, c.ssim) for sid, c in zip(res.sample_ids, res.results[lv], strict=True)}
            ok = [r for r in rows if r["status"] == "ok"]
            sp = spec.for_shape(samples[0].image.shape)
            assert abs(severity(sp, res.warm[lv].strength) - severity(sp, stats["dataset_strength"])) <= STRENGTH_TOL
            for r, c in zip(ok, res.results[lv], strict=True):
                assert c.band_reached == r["band_reached"] and abs(c.ssim - r["ssim"]) <= SSIM_TOL
                assert abs(severity(sp, c.strength) - severity(sp, r["strength"])) <= STRENGTH_TOL
        return


@pytest.mark.parametrize("name", ["gaussian_noise", "rotation", "pixelate", "ring_artifact"])
def test_warm_started_levels_equal_the_cpu_chunks(name: str, demo_root: Path) -> None:
    _chunk_vs_levels(name, demo_root, 2)


@pytest.mark.slow
@pytest.mark.parametrize("name", DEVICE)
def test_warm_started_levels_equal_the_cpu_chunks_every_type(name: str, demo_root: Path) -> None:
    _chunk_vs_levels(name, demo_root, 4)


def test_regenerated_batches_equal_the_cpu_regeneration(demo_images: dict[str, Sample]) -> None:
    samples = [demo_images["ct"], demo_images["xray"]]
    rows = []
    for name in ("rotation", "gaussian_blur", "ring_artifact"):
        spec = get_perturbation(name)
        for s in samples:
            if spec.applies_to(s.modality, s.n_channels):
                rows.append({"perturbation": name, "strength": spec.levels[2], "dataset": s.dataset,
                             "sample_id": s.sample_id, "seed_key": perturbation_key(3, s.dataset, s.sample_id, name)})
    by_key = {(s.dataset, s.sample_id): s for s in samples}
    seen = 0
    for chunk, out in E.regenerate_batches(rows, by_key, device="cpu", batch_size=2):
        assert out.images.shape[0] == len(chunk) and out.images.dtype == torch.float32
        for r, img, m in zip(chunk, T.to_images(out.images), out.masks if out.masks is not None else [None] * len(chunk),
                             strict=True):
            ref = regenerate(r, by_key[(r["dataset"], r["sample_id"])])
            assert np.abs(img - ref.image).max() <= OUTPUT_TOL
            if m is not None and ref.mask is not None:
                np.testing.assert_array_equal(m.numpy(), ref.mask)
            seen += 1
    assert seen == len(rows)


def test_blood_threshold_is_numpys_quantile() -> None:
    """``blood`` thresholds its field at a quantile; the device port reads it off the sorted field
    with numpy's interpolation (float32 difference, float64 weights), equal to ``np.quantile``."""
    from medrobust_lib.perturb.torch_ports import _quantile

    g = np.random.default_rng(0)
    for n in (7, 1000, 65536):
        a = g.standard_normal(n).astype(np.float32)
        srt = np.sort(a)
        for q in [0.0, 0.5, 1.0, *g.random(200)]:
            assert _quantile(srt, float(q)) == float(np.quantile(a, q))


def test_window_level_port_at_strength_zero_and_on_a_flat_image(camera: np.ndarray) -> None:
    """The port returns the input where the CPU does (strength 0, a constant image), and the CPU's
    output bit for bit elsewhere, mixed in one batch, gray and RGB."""
    spec = get_perturbation("window_level")
    rgb = np.stack([camera, camera[::-1], 0.5 * camera + 0.2], axis=-1)
    for image in (camera, np.full_like(camera, 0.4), rgb):
        items = [E.prepare(spec, image, ("wl", k), "cpu") for k in range(3)]
        strengths = [0.0, 0.7, spec.strongest]
        got = T.to_images(E.apply(spec, items, strengths).images)
        for k, (s, out) in enumerate(zip(strengths, got, strict=True)):
            np.testing.assert_array_equal(out, spec.apply(image, s, rng_for("wl", k)).image)
        np.testing.assert_array_equal(got[0], image)
