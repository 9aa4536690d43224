"""Every reader reads only as far as the header allows: the declared size is checked against
``max_pixels`` before any pixel data is read, and a file larger than its header allows is refused
without being read (the file size is never the bound). Sparse 10 GB files (``truncate``: they take
no disk) and a 64 x 64 DICOM carrying a 12000 x 12000 JPEG, each given to ``medrobust perturb`` in a
subprocess whose address space is limited to 2 GB: exit 2 with ``too_large``."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import cv2
import nibabel as nib
import numpy as np
import pytest

from medrobust_lib.data.imageio import read_dicom
from medrobust_lib.data.sample import SampleError
from tests.data.test_corrupt_images import tiff_ifd_first
from tests.data.test_image_limits import bomb_png

ROOT = Path(__file__).resolve().parents[2]
TEN_GB = 10 * 1024**3
AS_LIMIT = 2 * 1024**3

RUNNER = textwrap.dedent("""
    import json, resource, sys
    resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[1]), int(sys.argv[1])))
    from typer.testing import CliRunner
    from medrobust_cli import app
    for path in sys.argv[3:]:
        res = CliRunner().invoke(app, ["perturb", path, "--type", "gaussian_noise", "--level", "1",
                                       "--output", sys.argv[2]])
        print(json.dumps([path, res.exit_code, res.stderr.strip()]), flush=True)
""")


def _sparse(path: Path, head: bytes, size: int = TEN_GB) -> Path:
    path.write_bytes(head)
    os.truncate(path, size)  # a hole: no disk used
    return path


def _small() -> np.ndarray:
    return np.random.default_rng(0).integers(0, 255, (64, 64), dtype=np.uint8)


def _png(arr: np.ndarray) -> bytes:
    ok, buf = cv2.imencode(".png", arr)
    assert ok
    return buf.tobytes()


def _jpeg(arr: np.ndarray) -> bytes:
    ok, buf = cv2.imencode(".jpg", arr)
    assert ok
    return buf.tobytes()


def _npy_header(shape: tuple[int, ...]) -> bytes:
    f = io.BytesIO()
    np.lib.format.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False, "shape": shape})
    return f.getvalue()


def _nifti_header(shape: tuple[int, ...]) -> bytes:
    hdr = nib.Nifti1Header()
    hdr.set_data_shape(shape)
    hdr.set_data_dtype(np.uint8)
    hdr["vox_offset"] = 352
    return hdr.binaryblock + b"\x00" * 4


def _dicom(path: Path, rows: int, cols: int, pixels: bytes, encapsulated: bool = False) -> Path:
    import pydicom
    from pydicom.dataset import FileMetaDataset
    from pydicom.encaps import encapsulate
    from pydicom.uid import ExplicitVRLittleEndian, JPEGBaseline8Bit, generate_uid

    meta = FileMetaDataset()
    meta.TransferSyntaxUID = JPEGBaseline8Bit if encapsulated else ExplicitVRLittleEndian
    meta.MediaStorageSOPClassUID = "1.2.840.10008.5.1.4.1.1.7"
    meta.MediaStorageSOPInstanceUID = generate_uid()
    ds = pydicom.Dataset()
    ds.file_meta = meta
    ds.Modality = "OT"
    ds.Rows, ds.Columns = rows, cols
    ds.SamplesPerPixel = 1
    ds.PhotometricInterpretation = "MONOCHROME2"
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 8, 8, 7, 0
    ds.PixelData = encapsulate([pixels]) if encapsulated else pixels
    if encapsulated:
        ds["PixelData"].VR = "OB"
        ds["PixelData"].is_undefined_length = True
    ds.save_as(path, enforce_file_format=True)
    return path


def big_jpeg_in_small_dicom(path: Path) -> Path:
    """A DICOM whose header says 64 x 64 and whose one JPEG frame is 12000 x 12000 (a few MB)."""
    big = np.zeros((12000, 12000), np.uint8)
    big[::97] = 255
    return _dicom(path, 64, 64, _jpeg(big), encapsulated=True)


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("hostile")
    small = _small()
    dcm = _dicom(d / "tail.dcm", 64, 64, small.tobytes())
    os.truncate(dcm, TEN_GB)
    files = {
        "png_tail": _sparse(d / "tail.png", _png(small)),
        "png_declares_big": _sparse(d / "big.png", bomb_png(d / "b.png", 12000, 12000).read_bytes()),
        "jpeg_tail": _sparse(d / "tail.jpg", _jpeg(small)),
        "tiff_tail": _sparse(d / "tail.tif", tiff_ifd_first(small, "raw")),
        "npy_tail": _sparse(d / "tail.npy", _npy_header((64, 64)) + small.astype(np.float32).tobytes()),
        "npy_declares_big": _sparse(d / "big.npy", _npy_header((12000, 12000))),
        "nifti_tail": _sparse(d / "tail.nii", _nifti_header((64, 64)) + small.tobytes()),
        "nifti_declares_big": _sparse(d / "big.nii", _nifti_header((12000, 12000))),
        "dicom_tail": dcm,
        "dicom_big_jpeg": big_jpeg_in_small_dicom(d / "bigjpeg.dcm"),
    }
    for p in files.values():
        assert p.stat().st_blocks * 512 < 64 << 20  # sparse: the 10 GB take no disk
    return files


def test_sparse_10_gb_files_and_a_big_embedded_jpeg_are_too_large_under_a_2_gb_address_space(
        hostile: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "out.npy"
    try:
        res = subprocess.run([sys.executable, "-c", RUNNER, str(AS_LIMIT), str(out), *map(str, hostile.values())],
                             env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                             timeout=240)
    except subprocess.TimeoutExpired as e:  # a reader that reads the 10 GB: say which ones finished
        pytest.fail(f"a reader did not return; finished: {e.stdout!r}")
    assert res.returncode == 0, res.stderr[-3000:]
    got = {line[0]: line[1:] for line in map(json.loads, res.stdout.strip().splitlines())}
    for name, path in hostile.items():
        code, err = got[str(path)]
        assert code == 2 and "too_large" in err and err.count("\n") == 0, (name, code, err)
    assert not out.exists()


def test_the_same_files_trimmed_to_what_their_header_allows_still_read(hostile: dict[str, Path],
                                                                       tmp_path: Path) -> None:
    from medrobust_lib.data.imageio import read_image

    small = _small()
    trimmed = {
        "a.png": _png(small), "a.jpg": _jpeg(small), "a.tif": tiff_ifd_first(small, "raw"),
        "a.npy": _npy_header((64, 64)) + (small.astype(np.float32) / 255).tobytes(),
        "a.nii": _nifti_header((64, 64)) + small.tobytes(),
    }
    for name, data in trimmed.items():
        p = tmp_path / name
        p.write_bytes(data)
        assert read_image(p).shape == (64, 64), name
    dcm = _dicom(tmp_path / "a.dcm", 64, 64, small.tobytes())
    np.testing.assert_array_equal(read_dicom(dcm, window_center=127.5, window_width=255)[0] * 255,
                                  np.clip(small.astype(np.float64), 0, 255).astype(np.float32))


def test_an_embedded_frame_is_checked_by_its_own_header_before_decoding(tmp_path: Path) -> None:
    p = big_jpeg_in_small_dicom(tmp_path / "x.dcm")
    with pytest.raises(SampleError) as e:
        read_dicom(p)
    assert e.value.reason == "too_large" and "12000 x 12000" in e.value.detail and "64 x 64" in e.value.detail
    ok = _dicom(tmp_path / "ok.dcm", 64, 64, _jpeg(_small()), encapsulated=True)  # a matching frame decodes
    img, meta = read_dicom(ok)
    assert img.shape == (64, 64) and meta["dicom"]["rows"] == 64


def test_dataset_readers_quarantine_sparse_10_gb_arrays_and_volumes(tmp_path: Path) -> None:
    from medrobust_lib.data.dataset import DatasetConfig, iter_dataset
    from medrobust_lib.data.sample import QuarantineRecord

    npy = tmp_path / "npy"
    (npy / "imgs").mkdir(parents=True)
    (npy / "gts").mkdir()
    small = (_small() / 255).astype(np.float32)
    for name in ("ok", "tail"):
        np.save(npy / "imgs" / f"{name}.npy", small)
        np.save(npy / "gts" / f"{name}.npy", (small > 0.5).astype(np.uint8))
    os.truncate(npy / "imgs" / "tail.npy", TEN_GB)
    out = {o.sample_id: getattr(o, "reason", "ok") for o in iter_dataset(DatasetConfig(
        name="n", modality="ct", format="npy_single", root=str(npy), size=None))}
    assert out == {"ok": "ok", "tail": "too_large"}

    nii = tmp_path / "nii"
    (nii / "imagesTr").mkdir(parents=True)
    (nii / "labelsTr").mkdir()
    vol = np.random.default_rng(0).random((16, 12, 3)).astype(np.float32)
    lab = np.zeros((16, 12, 3), np.uint8)
    lab[4:9, 3:7, :] = 1
    for case in ("liver_0", "liver_1"):
        nib.save(nib.Nifti1Image(vol, np.eye(4)), nii / "imagesTr" / f"{case}.nii")
        nib.save(nib.Nifti1Image(lab, np.eye(4)), nii / "labelsTr" / f"{case}.nii")
    os.truncate(nii / "imagesTr" / "liver_1.nii", TEN_GB)
    got = list(iter_dataset(DatasetConfig(name="m", modality="ct", format="nifti", root=str(nii), size=None)))
    reasons = {o.sample_id: o.reason for o in got if isinstance(o, QuarantineRecord)}
    assert {k for k in reasons if k.startswith("liver_1")} and all(
        v == "too_large" for k, v in reasons.items() if k.startswith("liver_1"))
    assert any(not isinstance(o, QuarantineRecord) and o.sample_id.startswith("liver_0") for o in got)
