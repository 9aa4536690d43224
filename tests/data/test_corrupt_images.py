"""Corrupt compressed images are errors, never data: a JPEG cut mid-scan with an end marker
appended (libjpeg's "premature end of data segment" warning), a progressive JPEG cut after a scan,
and TIFFs whose strips run past the end of the file are ``truncated``; sound files still read
exactly. The cut files are made here: PIL writes them, the test cuts them."""

from __future__ import annotations

import io
import struct
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from medrobust_cli import app
from medrobust_lib.data.imageio import read_raw
from medrobust_lib.data.sample import SampleError


def tiff_ifd_first(arr: np.ndarray, compression: str) -> bytes:
    """The strips PIL compresses, laid out as libtiff-style writers with the directory first do:
    header, IFD, strip data (PIL itself writes a compressed TIFF's IFD after the data, so a cut
    there loses the header and is ``unreadable_image`` anyway)."""
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "TIFF", compression=compression)
    data = buf.getvalue()
    with Image.open(io.BytesIO(data)) as im:
        offsets, counts, comp = im.tag_v2[273], im.tag_v2[279], im.tag_v2[259]
        predictor = im.tag_v2.get(317, 1)
    strips = [data[o:o + c] for o, c in zip(offsets, counts, strict=True)]
    h, w = arr.shape
    n = len(strips)
    entries: list[tuple[int, int, int, int | None]] = [(256, 4, 1, w), (257, 4, 1, h), (258, 3, 1, 8), (259, 3, 1, comp), (262, 3, 1, 1),
               (273, 4, n, None), (277, 3, 1, 1), (278, 4, 1, -(-h // n)), (279, 4, n, None), (317, 3, 1, predictor)]
    ifd_size = 2 + 12 * len(entries) + 4
    extra = 8 + ifd_size  # out-of-line arrays for n > 1
    arrays = b""
    data_start = extra + (8 * n if n > 1 else 0)
    offs, pos = [], data_start
    for s in strips:
        offs.append(pos)
        pos += len(s)
    out = bytearray(b"II*\x00" + struct.pack("<I", 8) + struct.pack("<H", len(entries)))
    for tag, typ, cnt, val in entries:
        if tag in (273, 279):
            vals = offs if tag == 273 else [len(s) for s in strips]
            if n == 1:
                out += struct.pack("<HHII", tag, typ, 1, vals[0])
            else:
                out += struct.pack("<HHII", tag, typ, n, extra + len(arrays))
                arrays += struct.pack(f"<{n}I", *vals)
        elif typ == 3:
            out += struct.pack("<HHIHH", tag, typ, cnt, int(val or 0), 0)
        else:
            out += struct.pack("<HHII", tag, typ, cnt, int(val or 0))
    out += struct.pack("<I", 0) + arrays + b"".join(strips)
    return bytes(out)


def _photo(h: int = 96, w: int = 128) -> np.ndarray:
    """A smooth gradient plus noise: a picture whose decoded grey level is not flat."""
    y, x = np.mgrid[0:h, 0:w]
    rng = np.random.default_rng(1)
    return np.clip(40 + x + y // 2 + rng.normal(0, 12, (h, w)), 0, 255).astype(np.uint8)


def _jpeg(progressive: bool, rgb: bool = False) -> bytes:
    arr = _photo()
    img = Image.fromarray(np.stack([arr, arr[::-1], 255 - arr], -1) if rgb else arr)
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=90, progressive=progressive)
    return buf.getvalue()


def _sos(data: bytes) -> list[int]:
    out, i = [], data.find(b"\xff\xda")
    while i >= 0:
        out.append(i)
        i = data.find(b"\xff\xda", i + 2)
    return out


@pytest.mark.parametrize("rgb", [False, True])
def test_a_baseline_jpeg_cut_mid_scan_with_an_end_marker_is_truncated(tmp_path: Path, rgb: bool) -> None:
    data = _jpeg(False, rgb)
    (first,) = _sos(data)
    cut = data[: first + (len(data) - first) // 3] + b"\xff\xd9"
    p = tmp_path / "cut.jpg"
    p.write_bytes(cut)
    lenient = np.asarray(Image.open(io.BytesIO(cut)).convert("L"))  # what a lenient decoder returns
    assert lenient.shape == (96, 128)
    with pytest.raises(SampleError) as e:
        read_raw(p)
    assert e.value.reason == "truncated"


@pytest.mark.parametrize("rgb", [False, True])
def test_a_progressive_jpeg_cut_after_its_first_scan_is_truncated(tmp_path: Path, rgb: bool) -> None:
    data = _jpeg(True, rgb)
    scans = _sos(data)
    assert len(scans) >= 4  # PIL writes several scans
    for k in (1, 2, len(scans) - 1):  # cut before scan k: the file ends cleanly with EOI
        p = tmp_path / f"prog{k}.jpg"
        p.write_bytes(data[: scans[k]] + b"\xff\xd9")
        Image.open(p).load()  # a lenient decoder accepts it
        with pytest.raises(SampleError) as e:
            read_raw(p)
        assert e.value.reason == "truncated" and "scan" in e.value.detail
    mid = tmp_path / "mid.jpg"
    mid.write_bytes(data[: scans[1] + (scans[2] - scans[1]) // 2] + b"\xff\xd9")
    with pytest.raises(SampleError, match="truncated"):
        read_raw(mid)


@pytest.mark.parametrize("progressive", [False, True])
@pytest.mark.parametrize("rgb", [False, True])
def test_sound_jpegs_still_read_as_pil_decodes_them(tmp_path: Path, progressive: bool, rgb: bool) -> None:
    p = tmp_path / "ok.jpg"
    p.write_bytes(_jpeg(progressive, rgb))
    ours = read_raw(p).astype(int)
    ref = np.asarray(Image.open(p)).astype(int)
    assert ours.shape == ref.shape and np.abs(ours - ref).max() <= 1  # same libjpeg family, same IDCT up to 1 level


@pytest.mark.parametrize("compression", ["tiff_lzw", "raw", "tiff_adobe_deflate"])
def test_a_truncated_tiff_is_truncated(tmp_path: Path, compression: str) -> None:
    arr = _photo(200, 160)
    data = tiff_ifd_first(arr, compression)
    src = tmp_path / "full.tif"
    src.write_bytes(data)
    np.testing.assert_array_equal(read_raw(src), arr)  # the whole file reads exactly
    for cut_bytes in (1, 10, 3000, (len(data) - 200) // 2):
        cut = tmp_path / f"cut{cut_bytes}.tif"
        cut.write_bytes(data[:-cut_bytes])  # the directory (at the front) stays, the strip is cut
        with pytest.raises(SampleError) as e:
            read_raw(cut)
        assert e.value.reason == "truncated" and "strip 0" in e.value.detail, (cut_bytes, e.value)
    pil = tmp_path / "pil.tif"
    Image.fromarray(arr).save(pil, compression=compression)
    np.testing.assert_array_equal(read_raw(pil), arr)
    cut = tmp_path / "pil_cut.tif"
    cut.write_bytes(pil.read_bytes()[:-10])
    with pytest.raises(SampleError) as e:
        read_raw(cut)
    assert e.value.reason in ("truncated", "unreadable_image")  # never accepted as data


def test_perturb_refuses_a_cut_jpeg(tmp_path: Path) -> None:
    data = _jpeg(False)
    (first,) = _sos(data)
    src = tmp_path / "cut.jpg"
    src.write_bytes(data[: first + (len(data) - first) // 3] + b"\xff\xd9")
    res = CliRunner().invoke(app, ["perturb", str(src), "--type", "gaussian_noise", "--level", "1",
                                   "--output", str(tmp_path / "out.npy")])
    assert res.exit_code == 2 and "truncated" in res.stderr
    assert not (tmp_path / "out.npy").exists()
