"""imageio: every format read in the medrobust convention, lossless writes, corrupt files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import cv2
import nibabel as nib
import numpy as np
import pydicom
import pytest
from PIL import Image
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.uid import UID, ExplicitVRLittleEndian, ImplicitVRLittleEndian, generate_uid

from medrobust_lib.data.imageio import (
    intensity_to_native,
    read_dicom,
    read_image,
    read_image_meta,
    read_raw,
    write_image,
    write_mask,
)
from medrobust_lib.data.sample import SampleError
from medrobust_lib.seeding import rng_for

# --------------------------------------------------------------------------------------------------
# fixtures written in the real formats


def u8(shape: tuple[int, ...], key: str) -> np.ndarray:
    return rng_for("test_imageio", key).integers(0, 256, shape, dtype=np.uint8)


def write_dicom(
    path: Path,
    pixels: np.ndarray,
    *,
    photometric: str = "MONOCHROME2",
    modality: str = "CT",
    slope: float | None = None,
    intercept: float | None = None,
    window: tuple[float, float] | None = None,
    implicit: bool = False,
) -> Path:
    """A minimal valid single-frame DICOM file (Secondary Capture SOP class), little endian.

    ``pixels``: int16/uint16/uint8 (H, W) for monochrome, uint8 (H, W, 3) for RGB."""
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = UID("1.2.840.10008.5.1.4.1.1.7")
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = UID(ImplicitVRLittleEndian if implicit else ExplicitVRLittleEndian)
    ds = Dataset()
    ds.file_meta = meta
    ds.SOPClassUID = meta.MediaStorageSOPClassUID
    ds.SOPInstanceUID = meta.MediaStorageSOPInstanceUID
    ds.Modality = modality
    ds.PatientID = "anon"
    ds.Rows, ds.Columns = int(pixels.shape[0]), int(pixels.shape[1])
    ds.PhotometricInterpretation = photometric
    if pixels.ndim == 3:
        ds.SamplesPerPixel = 3
        ds.PlanarConfiguration = 0
    else:
        ds.SamplesPerPixel = 1
    bits = 8 * pixels.dtype.itemsize
    ds.BitsAllocated = bits
    ds.BitsStored = bits
    ds.HighBit = bits - 1
    ds.PixelRepresentation = 1 if pixels.dtype.kind == "i" else 0
    if slope is not None:
        ds.RescaleSlope = slope
    if intercept is not None:
        ds.RescaleIntercept = intercept
    if window is not None:
        ds.WindowCenter, ds.WindowWidth = window
    ds.PixelData = np.ascontiguousarray(pixels).tobytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    ds.save_as(path, enforce_file_format=True)
    return path


def ct_file(path: Path, pixels: np.ndarray, **kw: Any) -> Path:
    """Start from pydicom's shipped CT_small.dcm (int16, intercept -1024) and replace the pixels."""
    from pydicom.data import get_testdata_file

    ds = pydicom.dcmread(str(get_testdata_file("CT_small.dcm")))
    ds.Rows, ds.Columns = pixels.shape
    ds.PixelData = pixels.astype(np.int16).tobytes()
    for k, v in kw.items():
        setattr(ds, k, v)
    path.parent.mkdir(parents=True, exist_ok=True)
    ds.save_as(path)
    return path


# --------------------------------------------------------------------------------------------------
# raster formats


def test_png_8bit_gray_and_rgb(tmp_path: Path) -> None:
    g = u8((7, 9), "g")
    rgb = u8((7, 9, 3), "rgb")
    Image.fromarray(g).save(tmp_path / "g.png")
    Image.fromarray(rgb).save(tmp_path / "rgb.png")
    a = read_image(tmp_path / "g.png")
    b = read_image(tmp_path / "rgb.png")
    assert a.dtype == np.float32 and a.shape == (7, 9)
    assert b.dtype == np.float32 and b.shape == (7, 9, 3)
    np.testing.assert_array_equal(a, g.astype(np.float32) / 255)
    np.testing.assert_array_equal(b, rgb.astype(np.float32) / 255)  # RGB order, not BGR


def test_rgb_with_equal_channels_stays_rgb_unless_to_gray(tmp_path: Path) -> None:
    g = u8((6, 5), "eq")
    Image.fromarray(np.stack([g, g, g], axis=2)).save(tmp_path / "eq.png")
    assert read_image(tmp_path / "eq.png").shape == (6, 5, 3)
    gray = read_image(tmp_path / "eq.png", to_gray=True)
    assert gray.shape == (6, 5)
    np.testing.assert_allclose(gray, g / 255, atol=1e-6)


def test_alpha_is_dropped(tmp_path: Path) -> None:
    rgba = u8((5, 6, 4), "rgba")
    Image.fromarray(rgba, "RGBA").save(tmp_path / "a.png")
    out = read_image(tmp_path / "a.png")
    assert out.shape == (5, 6, 3)
    np.testing.assert_array_equal(out, rgba[..., :3] / np.float32(255))
    la = Image.fromarray(u8((5, 6), "la")).convert("LA")
    la.save(tmp_path / "la.png")
    assert read_image(tmp_path / "la.png").ndim in (2, 3)


def test_png_16bit_gray_and_rgb(tmp_path: Path) -> None:
    rng = rng_for("test_imageio", "16")
    g16 = rng.integers(0, 65536, (8, 10), dtype=np.uint16)
    rgb16 = rng.integers(0, 65536, (8, 10, 3), dtype=np.uint16)
    cv2.imwrite(str(tmp_path / "g16.png"), g16)
    cv2.imwrite(str(tmp_path / "rgb16.png"), rgb16[..., ::-1])  # cv2 writes BGR
    a, meta = read_image_meta(tmp_path / "g16.png")
    assert meta["intensity"]["high"] == 65535 and meta["intensity"]["bit_depth"] == 16
    np.testing.assert_allclose(a, g16 / 65535.0, atol=1e-7)
    b = read_image(tmp_path / "rgb16.png")
    np.testing.assert_allclose(b, rgb16 / 65535.0, atol=1e-7)


def test_jpeg_tiff_bmp(tmp_path: Path) -> None:
    rgb = np.zeros((16, 16, 3), np.uint8)
    rgb[..., 0] = 200  # pure-ish red survives JPEG as R > B
    Image.fromarray(rgb).save(tmp_path / "x.jpg", quality=95)
    out = read_image(tmp_path / "x.jpg")
    assert out.shape == (16, 16, 3)
    assert out[..., 0].mean() > 0.7 and out[..., 2].mean() < 0.1
    Image.fromarray(rgb[..., 0]).save(tmp_path / "g.jpg")
    assert read_image(tmp_path / "g.jpg").shape == (16, 16)

    tif = u8((9, 11, 3), "tif")
    Image.fromarray(tif).save(tmp_path / "x.tif")
    np.testing.assert_array_equal(read_raw(tmp_path / "x.tif"), tif)
    t16 = rng_for("tif16").integers(0, 65536, (9, 11), dtype=np.uint16)
    cv2.imwrite(str(tmp_path / "x16.tiff"), t16)
    np.testing.assert_allclose(read_image(tmp_path / "x16.tiff"), t16 / 65535.0, atol=1e-7)

    bmp = u8((9, 11), "bmp")
    Image.fromarray(bmp).save(tmp_path / "x.bmp")
    np.testing.assert_array_equal(read_raw(tmp_path / "x.bmp"), bmp)


def test_npy(tmp_path: Path) -> None:
    a = rng_for("npy").random((5, 4, 3)).astype(np.float32)
    np.save(tmp_path / "a.npy", a)
    np.testing.assert_array_equal(read_image(tmp_path / "a.npy"), a)
    np.save(tmp_path / "f64.npy", a.astype(np.float64))
    with pytest.raises(SampleError) as e:
        read_image(tmp_path / "f64.npy")
    assert e.value.reason == "unreadable_image" and "dtype" in e.value.detail
    np.save(tmp_path / "big.npy", (a * 2).astype(np.float32))
    with pytest.raises(SampleError, match="unreadable_image"):
        read_image(tmp_path / "big.npy")


# --------------------------------------------------------------------------------------------------
# corrupt files


@pytest.mark.parametrize("name", ["z.png", "z.jpg", "z.tif", "z.npy", "z.dcm", "z.nii.gz"])
def test_zero_byte_is_empty_file(tmp_path: Path, name: str) -> None:
    (tmp_path / name).write_bytes(b"")
    with pytest.raises(SampleError) as e:
        read_image(tmp_path / name)
    assert e.value.reason == "empty_file"


@pytest.mark.parametrize("ext", [".png", ".jpg"])
def test_truncated_is_quarantined_as_truncated(tmp_path: Path, ext: str) -> None:
    Image.fromarray(u8((40, 50, 3), "trunc")).save(tmp_path / f"full{ext}")
    data = (tmp_path / f"full{ext}").read_bytes()
    (tmp_path / f"cut{ext}").write_bytes(data[: len(data) // 2])
    with pytest.raises(SampleError) as e:
        read_image(tmp_path / f"cut{ext}")
    assert e.value.reason == "truncated"


def test_garbage_and_float_tiff_are_unreadable(tmp_path: Path) -> None:
    (tmp_path / "junk.png").write_bytes(b"this is not an image at all")
    with pytest.raises(SampleError, match="unreadable_image"):
        read_image(tmp_path / "junk.png")
    Image.fromarray(np.zeros((4, 4), np.float32), "F").save(tmp_path / "f.tif")
    with pytest.raises(SampleError, match="unreadable_image"):
        read_image(tmp_path / "f.tif")


def test_unknown_extension_is_value_error(tmp_path: Path) -> None:
    (tmp_path / "x.gif").write_bytes(b"GIF89a")
    with pytest.raises(ValueError, match="valid"):
        read_image(tmp_path / "x.gif")


# --------------------------------------------------------------------------------------------------
# writing


def test_write_16bit_gray_round_trip(tmp_path: Path) -> None:
    a = rng_for("rt16").random((13, 17)).astype(np.float32)
    a[0, 0], a[0, 1] = 0.0, 1.0
    p = write_image(tmp_path / "a.png", a)  # 16-bit default for grayscale
    assert read_raw(p).dtype == np.uint16
    back = read_image(p)
    assert back.dtype == np.float32 and back.shape == a.shape
    assert np.abs(back.astype(np.float64) - a).max() <= 0.5 / 65535 + 1e-7


def test_write_rgb_8_and_16_bit_round_trip(tmp_path: Path) -> None:
    a = rng_for("rtrgb").random((6, 7, 3)).astype(np.float32)
    back8 = read_image(write_image(tmp_path / "a8.png", a))  # 8-bit default for RGB
    assert np.abs(back8.astype(np.float64) - a).max() <= 0.5 / 255 + 1e-7
    back16 = read_image(write_image(tmp_path / "a16.png", a, bit_depth=16))
    assert np.abs(back16.astype(np.float64) - a).max() <= 0.5 / 65535 + 1e-7
    np.testing.assert_array_less(np.abs(back16[..., 0] - a[..., 0]), 1e-4)  # channel order kept


def test_write_npy_exact_and_validation(tmp_path: Path) -> None:
    a = rng_for("rtnpy").random((4, 5)).astype(np.float32)
    np.testing.assert_array_equal(read_image(write_image(tmp_path / "a.npy", a)), a)
    with pytest.raises(ValueError, match="float32"):
        write_image(tmp_path / "b.png", a.astype(np.float64))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        write_image(tmp_path / "b.png", a * 2)
    with pytest.raises(ValueError, match="lossless"):
        write_image(tmp_path / "b.jpg", a)
    assert not (tmp_path / "b.png").exists()


def test_write_mask(tmp_path: Path) -> None:
    m = np.zeros((5, 6), bool)
    m[1:3, 2:5] = True
    raw = read_raw(write_mask(tmp_path / "m.png", m))
    np.testing.assert_array_equal(raw, m.astype(np.uint8) * 255)


# --------------------------------------------------------------------------------------------------
# DICOM


def test_dicom_hu_window_known_values(tmp_path: Path) -> None:
    stored = np.array([[1024, 1024 - 160], [1024 + 240, 0]], np.int16)  # HU 0, -160, 240, -1024
    p = ct_file(tmp_path / "ct.dcm", stored)
    img, meta = read_dicom(p, window_center=40, window_width=400)
    # HU 0 -> (0 - 40 + 200) / 400 = 0.4; -160 -> 0.0; 240 -> 1.0; -1024 clipped to 0
    np.testing.assert_allclose(img, [[0.4, 0.0], [1.0, 0.0]], atol=1e-6)
    rec = meta["intensity"]
    assert rec["unit"] == "HU" and rec["source"] == "options"
    assert (rec["low"], rec["high"]) == (-160.0, 240.0)
    assert rec["rescale_intercept"] == -1024.0 and rec["rescale_slope"] == 1.0
    # invertible inside the window
    assert intensity_to_native(np.float32(0.4), rec) == pytest.approx(0.0, abs=1e-3)
    # read_image delegates to the same mapping
    assert read_image(p).shape == (2, 2)


def test_dicom_window_sources_and_monochrome1(tmp_path: Path) -> None:
    px = np.arange(100, dtype=np.uint16).reshape(10, 10) * 10  # 0..990
    p_file = write_dicom(tmp_path / "w.dcm", px, modality="MR", window=(500, 200))
    img, meta = read_dicom(p_file)
    assert meta["intensity"]["source"] == "file"
    assert img[px == 500][0] == pytest.approx(0.5)
    p_pct = write_dicom(tmp_path / "p.dcm", px, modality="MR", implicit=True)
    img, meta = read_dicom(p_pct)
    assert meta["intensity"]["source"] == "percentile"
    lo, hi = np.percentile(px.astype(np.float64), [0.5, 99.5])
    assert meta["intensity"]["low"] == pytest.approx(lo) and meta["intensity"]["high"] == pytest.approx(hi)
    assert img.min() == 0.0 and img.max() == 1.0
    p_m1 = write_dicom(tmp_path / "m1.dcm", px, modality="CR", photometric="MONOCHROME1", window=(500, 1000))
    img1, meta1 = read_dicom(p_m1)
    assert meta1["intensity"]["invert"] is True
    assert img1[0, 0] == pytest.approx(1.0) and img1[-1, -1] < 0.02  # low stored value shows bright
    np.testing.assert_allclose(intensity_to_native(img1, meta1["intensity"]), px, atol=0.1)


def test_dicom_rgb_to_gray_or_kept(tmp_path: Path) -> None:
    rgb = u8((6, 8, 3), "us")
    p = write_dicom(tmp_path / "us.dcm", rgb, photometric="RGB", modality="US")
    gray, meta = read_dicom(p)
    assert gray.shape == (6, 8) and meta["intensity"]["color"] == "bt601_luminance"
    expect = (rgb.astype(np.float64) / 255) @ np.array([0.299, 0.587, 0.114])
    np.testing.assert_allclose(gray, expect, atol=1e-5)
    kept, _ = read_dicom(p, keep_rgb=True)
    np.testing.assert_array_equal(kept, rgb / np.float32(255))
    assert read_image(p).shape == (6, 8, 3)  # read_image keeps what the file has


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_dicom_unreadable(tmp_path: Path) -> None:
    (tmp_path / "bad.dcm").write_bytes(b"\x00" * 128 + b"DICM" + b"\x02\x00\x10\x00garbage")
    with pytest.raises(SampleError) as e:
        read_dicom(tmp_path / "bad.dcm")
    assert e.value.reason == "unreadable_dicom"
    (tmp_path / "text.dcm").write_text("hello, not dicom")
    with pytest.raises(SampleError, match="unreadable_dicom"):
        read_image(tmp_path / "text.dcm")


# --------------------------------------------------------------------------------------------------
# NIfTI


def test_nifti_2d_and_single_slice(tmp_path: Path) -> None:
    arr = np.arange(12 * 7, dtype=np.float32).reshape(12, 7)
    nib.save(nib.Nifti1Image(arr, np.eye(4)), tmp_path / "a.nii")
    nib.save(nib.Nifti1Image(arr[:, :, None], np.eye(4)), tmp_path / "b.nii.gz")
    a, meta = read_image_meta(tmp_path / "a.nii", window_center=41.5, window_width=83)
    b = read_image(tmp_path / "b.nii.gz")
    assert a.shape == (7, 12) and b.shape == (7, 12)  # transposed: rows follow the 2nd stored axis
    np.testing.assert_allclose(a, np.clip(arr.T / 83.0, 0, 1), atol=1e-6)
    assert meta["intensity"]["source"] == "options"
    nib.save(nib.Nifti1Image(np.zeros((4, 4, 2), np.float32), np.eye(4)), tmp_path / "c.nii.gz")
    with pytest.raises(SampleError, match="unsupported_nifti"):
        read_image(tmp_path / "c.nii.gz")


def test_shipped_dicom_files() -> None:
    """Real files from the pydicom / pydicom-data wheels (asked for by name: no download)."""
    from pydicom.data import get_testdata_file

    mr_path = get_testdata_file("MR_small.dcm")
    assert isinstance(mr_path, str)
    mr, meta = read_dicom(mr_path)
    assert mr.shape == (64, 64) and meta["intensity"]["source"] == "file"
    assert (meta["intensity"]["low"], meta["intensity"]["high"]) == (-200.0, 1400.0)  # c 600, w 1600
    us_path = get_testdata_file("US1_UNCR.dcm")
    assert us_path is not None, "pydicom-data (a declared dependency) must provide US1_UNCR.dcm"
    us, meta = read_dicom(str(us_path))
    assert us.shape == (480, 640) and us.dtype == np.float32 and meta["dicom"]["modality"] == "US"
