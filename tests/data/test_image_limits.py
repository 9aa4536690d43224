"""Hostile and broken images are refused before they cost memory: decompression bombs (PNG,
DICOM, NIfTI, .npy) by their declared size, truncated PNG/JPEG without a lenient fallback, images
under 7x7; a multi-frame DICOM decodes only the requested frame."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import cv2
import nibabel as nib
import numpy as np
import pytest
from PIL import Image

from medrobust_lib.data import imageio
from medrobust_lib.data.dataset import DatasetConfig, iter_dataset
from medrobust_lib.data.imageio import (
    DEFAULT_MAX_PIXELS,
    current_max_pixels,
    pixel_limit,
    read_dicom,
    read_image,
    read_raw,
)
from medrobust_lib.data.sample import QuarantineRecord, SampleError


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)


def bomb_png(path: Path, width: int = 20000, height: int = 20000) -> Path:
    """A few KB that declares ``width x height`` 8-bit grayscale: a valid IHDR, the first rows of
    zero-filtered zeros compressed, and IEND (a decoder would allocate the whole image first)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    rows = zlib.compress(b"\x00" * ((width + 1) * 64), 9)
    data = b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", rows) + _chunk(b"IEND", b"")
    path.write_bytes(data)
    return path


def truncated_png_keeping_iend(path: Path) -> Path:
    """A real 64x48 PNG whose IDAT stops halfway while IEND stays: the missing-IEND check passes,
    OpenCV rejects it, and PIL would return the missing rows as zeros."""
    rng = np.random.default_rng(0)
    ok, buf = cv2.imencode(".png", rng.integers(0, 255, (48, 64), dtype=np.uint8))
    assert ok
    data = buf.tobytes()
    idat = data.index(b"IDAT") - 4
    (length,) = struct.unpack(">I", data[idat:idat + 4])
    body = data[idat + 8: idat + 8 + length // 2]
    iend = data.index(b"IEND") - 4
    path.write_bytes(data[:idat] + _chunk(b"IDAT", body) + data[iend:])
    return path


def test_a_decompression_bomb_png_is_too_large_and_never_decoded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = bomb_png(tmp_path / "bomb.png")
    assert p.stat().st_size < 5000  # a few KB declaring 400 megapixels
    calls: list[int] = []
    monkeypatch.setattr(imageio.cv2, "imdecode", lambda *a, **k: calls.append(1))
    with pytest.raises(SampleError) as e:
        read_raw(p)
    assert e.value.reason == "too_large" and "400000000" in e.value.detail.replace(",", "")
    assert calls == []  # refused from the header, before any decoder ran


def test_the_limit_is_a_setting(tmp_path: Path) -> None:
    p = tmp_path / "img.png"
    Image.fromarray(np.full((100, 100), 7, np.uint8)).save(p)
    assert current_max_pixels() == DEFAULT_MAX_PIXELS == 64_000_000
    assert read_raw(p).shape == (100, 100)
    with pixel_limit(9999):
        assert current_max_pixels() == 9999
        with pytest.raises(SampleError, match="too_large"):
            read_raw(p)
    assert read_raw(p).shape == (100, 100)  # the limit is scoped to the block
    with pytest.raises(ValueError, match="at least 49"):
        with pixel_limit(10):
            pass


def test_a_truncated_png_is_truncated_not_zero_filled(tmp_path: Path) -> None:
    p = truncated_png_keeping_iend(tmp_path / "cut.png")
    with Image.open(p) as im:  # the lenient decoder this replaces would have "succeeded"
        Image.LOAD_TRUNCATED_IMAGES = True
        try:
            im.load()
            assert np.asarray(im)[-1].max() == 0  # the missing rows come back as zeros
        except OSError:
            pass
        finally:
            Image.LOAD_TRUNCATED_IMAGES = False
    with pytest.raises(SampleError) as e:
        read_image(p)
    assert e.value.reason == "truncated" and "64 x 48" in e.value.detail


def test_tiff_may_still_fall_back_to_pil(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = tmp_path / "a.tif"
    arr = np.arange(81, dtype=np.uint8).reshape(9, 9)
    Image.fromarray(arr).save(p)
    monkeypatch.setattr(imageio.cv2, "imdecode", lambda *a, **k: None)  # OpenCV gives up
    np.testing.assert_array_equal(read_raw(p), arr)
    png = tmp_path / "a.png"
    Image.fromarray(arr).save(png)
    with pytest.raises(SampleError, match="truncated"):  # PNG never does
        read_raw(png)


def _dicom(path: Path, rows: int, cols: int, frames: int, pixels: bytes) -> Path:
    import pydicom
    from pydicom.dataset import FileMetaDataset
    from pydicom.uid import ExplicitVRLittleEndian, generate_uid

    meta = FileMetaDataset()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    meta.MediaStorageSOPClassUID = "1.2.840.10008.5.1.4.1.1.7"
    meta.MediaStorageSOPInstanceUID = generate_uid()
    ds = pydicom.Dataset()
    ds.file_meta = meta
    ds.Modality = "OT"
    ds.Rows, ds.Columns = rows, cols
    if frames > 1:
        ds.NumberOfFrames = frames
    ds.SamplesPerPixel = 1
    ds.PhotometricInterpretation = "MONOCHROME2"
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 8, 8, 7, 0
    ds.PixelData = pixels
    ds.save_as(path, enforce_file_format=True)
    return path


def test_a_dicom_declaring_a_huge_image_is_too_large_before_decoding(tmp_path: Path) -> None:
    p = _dicom(tmp_path / "bomb.dcm", 20000, 20000, 1, b"\x00" * 64)
    with pytest.raises(SampleError) as e:
        read_dicom(p)
    assert e.value.reason == "too_large" and "20000 x 20000" in e.value.detail


def test_a_multiframe_dicom_decodes_only_the_requested_frame(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    frames = np.stack([np.full((8, 9), 10 * (k + 1), np.uint8) for k in range(4)])
    p = _dicom(tmp_path / "multi.dcm", 8, 9, 4, frames.tobytes())
    import pydicom.pixels

    seen: list[int | None] = []
    real = pydicom.pixels.pixel_array

    def spy(src: object, **kw: object) -> np.ndarray:
        seen.append(kw.get("index"))  # type: ignore[arg-type]
        out: np.ndarray = real(src, **kw)  # type: ignore[arg-type]
        return out

    monkeypatch.setattr(pydicom.pixels, "pixel_array", spy)
    image, meta = read_dicom(p, frame=2, window_center=127.5, window_width=255.0)
    assert seen == [2]  # one frame decoded, not the stack
    np.testing.assert_allclose(image, np.full((8, 9), (30 - 0.0) / 255.0, np.float32), atol=1e-6)
    assert meta["dicom"]["frame"] == 2


def test_a_nifti_declaring_a_huge_slice_is_too_large_before_reading(tmp_path: Path) -> None:
    hdr = nib.Nifti1Header()
    hdr.set_data_shape((20000, 20000))
    hdr.set_data_dtype(np.uint8)
    hdr["vox_offset"] = 352
    p = tmp_path / "bomb.nii"
    p.write_bytes(hdr.binaryblock + b"\x00" * 4 + b"\x00" * 64)  # header + extension flag + a few voxels
    with pytest.raises(SampleError) as e:
        read_image(p)
    assert e.value.reason == "too_large"


def test_a_npy_over_the_limit_is_too_large(tmp_path: Path) -> None:
    p = tmp_path / "big.npy"
    np.save(p, np.zeros((100, 100), np.float32))
    with pixel_limit(1000), pytest.raises(SampleError, match="too_large"):
        read_image(p)


def test_datasets_quarantine_bombs_truncated_and_tiny_images(tmp_path: Path) -> None:
    img = tmp_path / "images"
    img.mkdir()
    Image.fromarray(np.full((16, 16), 100, np.uint8)).save(img / "good.png")
    Image.fromarray(np.full((5, 16), 100, np.uint8)).save(img / "tiny.png")
    bomb_png(img / "bomb.png")
    truncated_png_keeping_iend(img / "cut.png")
    (img / "zero.png").write_bytes(b"")
    cfg = DatasetConfig(name="hostile", modality="dermoscopy", format="folder", root=str(tmp_path), size=None,
                        options={"mask_dir": None})
    out = {(o.sample_id if isinstance(o, QuarantineRecord) else o.sample_id): o for o in iter_dataset(cfg)}
    reasons = {k: (v.reason if isinstance(v, QuarantineRecord) else "ok") for k, v in out.items()}
    assert reasons == {"good": "ok", "tiny": "too_small", "bomb": "too_large", "cut": "truncated",
                       "zero": "empty_file"}
    small = DatasetConfig(name="hostile", modality="dermoscopy", format="folder", root=str(tmp_path), size=None,
                          max_pixels=100, options={"mask_dir": None})
    again = {o.sample_id: getattr(o, "reason", "ok") for o in iter_dataset(small)}
    assert again["good"] == "too_large"  # 256 pixels over a dataset limit of 100
