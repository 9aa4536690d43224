"""Header-first checks for image files: read only as far as the header allows.

The readers in :mod:`medrobust_lib.data.imageio` call these before any pixel data is read:

* :class:`BoundedReader` wraps an open file so that parsing a header reads at most
  :data:`HEADER_BUDGET` bytes (a hostile header cannot make a parser read a 10 GB chunk);
* :func:`max_file_bytes` is the most bytes a file declaring ``h x w`` pixels may take (a file
  larger than that is refused as ``too_large`` before it is read: the file size is never the bound);
* :func:`png_ihdr` reads a PNG's size from its fixed-place IHDR chunk;
* :func:`jpeg_frame_size` / :func:`j2k_frame_size` read the size an embedded JPEG / JPEG-LS /
  JPEG 2000 codestream declares (DICOM frames are checked with them before decoding);
* :func:`check_jpeg_scans` walks a JPEG's markers and refuses one whose scans stop before every
  component (and, progressive, every coefficient at full precision) is coded: a file cut after a
  scan with an end marker appended is ``truncated``;
* :func:`capture_libjpeg_warnings` collects what libjpeg prints while OpenCV decodes (its
  "Corrupt JPEG data: premature end of data segment" warnings), so that a file cut mid-scan is an
  error rather than grey fill;
* :func:`check_tiff_strips` refuses a TIFF whose strips or tiles run past the end of the file.
"""

from __future__ import annotations

import os
import struct
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any

from medrobust_lib.data.sample import SampleError

HEADER_BUDGET: int = 16 << 20
"""Bytes a header parser may read from a file (16 MiB: EXIF, ICC and a TIFF's tag arrays fit)."""
FILE_SLACK: int = 16 << 20
"""Bytes a file may hold beyond :data:`COMPRESSED_FACTOR` x its raw pixel bytes (metadata)."""
COMPRESSED_FACTOR: int = 4
"""A compressed image stores at most this many times its raw pixel bytes (real codecs: < 1.2)."""


def max_file_bytes(height: int, width: int, bands: int = 4, bytes_per_sample: int = 2, frames: int = 1) -> int:
    """The most bytes a file declaring ``frames x height x width x bands`` samples may take:
    ``COMPRESSED_FACTOR`` x the raw bytes + :data:`FILE_SLACK`."""
    raw = int(frames) * int(height) * int(width) * max(1, int(bands)) * max(1, int(bytes_per_sample))
    return COMPRESSED_FACTOR * raw + FILE_SLACK


def check_file_bound(size: int, height: int, width: int, where: object, *, bands: int = 4,
                     bytes_per_sample: int = 2, frames: int = 1) -> None:
    """SampleError ``too_large`` when a ``size``-byte file is larger than its header allows."""
    bound = max_file_bytes(height, width, bands, bytes_per_sample, frames)
    if size > bound:
        what = f"{frames} x {width} x {height}" if frames > 1 else f"{width} x {height}"
        raise SampleError("too_large", f"{where}: {size:,} bytes, more than the {bound:,} its header's {what} "
                                       "image can take; not read")


class BoundedReader:
    """A read-only file view that raises OSError once more than ``budget`` bytes were read
    (seeks are free). Enough of the file protocol for PIL's lazy ``Image.open``."""

    def __init__(self, f: IO[bytes], budget: int = HEADER_BUDGET) -> None:
        self._f, self._left = f, int(budget)

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = self._left + 1
        if n > self._left:
            data = self._f.read(self._left + 1)
            if len(data) > self._left:
                raise OSError(f"header larger than {HEADER_BUDGET:,} bytes; not read further")
        else:
            data = self._f.read(n)
        self._left -= len(data)
        return data

    def readline(self, limit: int = -1) -> bytes:  # PIL's text formats; bounded like read
        out = bytearray()
        while limit < 0 or len(out) < limit:
            c = self.read(1)
            if not c:
                break
            out += c
            if c == b"\n":
                break
        return bytes(out)

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._f.seek(offset, whence)

    def tell(self) -> int:
        return self._f.tell()

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True


def png_ihdr(head: bytes) -> tuple[int, int, int, int] | None:
    """``(height, width, bands, bytes_per_sample)`` from a PNG's first 33 bytes, or None when the
    IHDR is not where the format puts it (the caller lets the full parser decide)."""
    if len(head) < 29 or not head.startswith(b"\x89PNG\r\n\x1a\n") or head[12:16] != b"IHDR":
        return None
    width, height, depth, colour = struct.unpack(">IIBB", head[16:26])
    bands = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}.get(colour, 4)
    return height, width, bands, 2 if depth == 16 else 1


_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF, 0xF7}
"""Start-of-frame markers (baseline, extended, progressive, lossless, arithmetic; 0xF7: JPEG-LS)."""
_PROGRESSIVE = {0xC2, 0xC6, 0xCA, 0xCE}


def jpeg_frame_size(data: bytes) -> tuple[int, int] | None:
    """``(height, width)`` from a JPEG / JPEG-LS frame header (SOFn), walking marker segments from
    SOI; None when there is none before the first scan."""
    if not data.startswith(b"\xff\xd8"):
        return None
    i, n = 2, len(data)
    while i + 4 <= n:
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:
            i += 1
            continue
        if marker in (0x01, *range(0xD0, 0xD8)):
            i += 2
            continue
        if marker in (0xD9, 0xDA):
            return None
        seg_len = int.from_bytes(data[i + 2:i + 4], "big")
        if marker in _SOF and i + 9 <= n:
            height, width = struct.unpack(">HH", data[i + 5:i + 9])
            return int(height), int(width)
        i += 2 + seg_len
    return None


def j2k_frame_size(data: bytes) -> tuple[int, int] | None:
    """``(height, width)`` from a JPEG 2000 codestream's SIZ segment (``Ysiz - YOsiz``,
    ``Xsiz - XOsiz``), raw (SOC first) or inside a JP2 file (the ``jp2c`` box); None otherwise."""
    start = 0 if data.startswith(b"\xff\x4f\xff\x51") else data.find(b"\xff\x4f\xff\x51", 0, 1 << 16)
    if start < 0 or start + 4 + 2 + 2 + 16 > len(data):
        return None
    xsiz, ysiz, xo, yo = struct.unpack(">IIII", data[start + 8:start + 24])
    return int(ysiz) - int(yo), int(xsiz) - int(xo)


def embedded_frame_size(data: bytes) -> tuple[int, int] | None:
    """The size a compressed DICOM frame declares (JPEG family or JPEG 2000), or None (RLE, or an
    unknown codestream: its decoder allocates only what the DICOM header says)."""
    return jpeg_frame_size(data) or j2k_frame_size(data)


def check_jpeg_scans(data: bytes, where: object) -> None:
    """SampleError ``truncated`` when a JPEG's scans end before they code every component (and, for
    a progressive file, every one of the 64 coefficients at full precision, ``Al = 0``) or a scan
    is not followed by a marker. A file cut after a scan with an end marker appended passes the
    end-marker check and a lenient decoder fills the rest with grey; this refuses it."""
    i, n = 2, len(data)
    components: list[int] | None = None
    progressive = False
    done: dict[int, set[int]] = {}
    n_scans = 0
    while i + 2 <= n:
        if data[i] != 0xFF:
            raise SampleError("truncated", f"{where}: corrupt JPEG (no marker at byte {i})")
        marker = data[i + 1]
        if marker == 0xFF:
            i += 1
            continue
        if marker == 0xD9:
            break
        if marker in (0x01, *range(0xD0, 0xD8)):
            i += 2
            continue
        if i + 4 > n:
            break
        seg_len = int.from_bytes(data[i + 2:i + 4], "big")
        seg = data[i + 4:i + 2 + seg_len]
        if len(seg) < seg_len - 2:
            raise SampleError("truncated", f"{where}: JPEG segment at byte {i} runs past the end of the file")
        if marker in _SOF and len(seg) >= 6:
            progressive = marker in _PROGRESSIVE
            ncomp = seg[5]
            components = [seg[6 + 3 * k] for k in range(ncomp) if 6 + 3 * k < len(seg)]
        if marker == 0xDA and len(seg) >= 1:
            n_scans += 1
            ns = seg[0]
            if len(seg) < 1 + 2 * ns + 3:
                raise SampleError("truncated", f"{where}: JPEG scan header at byte {i} is cut")
            ids = [seg[1 + 2 * k] for k in range(ns)]
            ss, se, al = seg[1 + 2 * ns], seg[2 + 2 * ns], seg[3 + 2 * ns] & 0x0F
            if not progressive:
                ss, se, al = 0, 63, 0
            if al == 0:
                for c in ids:
                    done.setdefault(c, set()).update(range(ss, min(se, 63) + 1))
            j = i + 2 + seg_len  # skip the entropy-coded data to the next marker
            while True:
                j = data.find(b"\xff", j)
                if j < 0 or j + 1 >= n:
                    raise SampleError("truncated", f"{where}: JPEG scan {n_scans} runs to the end of the file")
                nxt = data[j + 1]
                if nxt == 0x00 or 0xD0 <= nxt <= 0xD7 or nxt == 0xFF:
                    j += 1 if nxt == 0xFF else 2
                    continue
                break
            i = j
            continue
        i += 2 + seg_len
    if not components:
        return  # no frame header found here: the decoder decides (and fails) on its own
    full = set(range(64))
    missing = [c for c in components if not done.get(c, set()) >= full]
    if missing:
        kind = "progressive " if progressive else ""
        raise SampleError("truncated", f"{where}: {kind}JPEG ends after scan {n_scans} before component(s) "
                                       f"{', '.join(map(str, missing))} are complete (cut, with an end marker added?)")


_CAPTURE_GUARD = threading.Lock()
LIBJPEG_WARNINGS: tuple[str, ...] = ("Corrupt JPEG data", "Premature end of JPEG file", "Invalid SOS parameters",
                                     "Inconsistent progression sequence", "Bogus")
"""Prefixes of what libjpeg prints for a recoverable fault (it then fills the rest with grey)."""


@contextmanager
def capture_libjpeg_warnings() -> Iterator[list[str]]:
    """Collect the lines libjpeg writes to file descriptor 2 while the block decodes (OpenCV leaves
    libjpeg's default message handler, which prints each warning there); yields a list filled with
    the warning lines at exit. Lines that are not libjpeg warnings (another thread's output) are
    written back to stderr. Decodes inside this block are serialised within the process."""
    found: list[str] = []
    with _CAPTURE_GUARD:
        try:
            sys.stderr.flush()
        except (AttributeError, ValueError, OSError):
            pass
        try:
            saved = os.dup(2)
        except OSError:  # no stderr at all (a detached daemon): nothing to capture from
            yield found
            return
        with tempfile.TemporaryFile() as tmp:
            os.dup2(tmp.fileno(), 2)
            try:
                yield found
            finally:
                os.dup2(saved, 2)
                os.close(saved)
                tmp.seek(0)
                text = tmp.read().decode("utf-8", errors="replace")
        other: list[str] = []
        for line in text.splitlines():
            (found if line.strip().startswith(LIBJPEG_WARNINGS) else other).append(line)
        if other:
            os.write(2, ("\n".join(other) + "\n").encode("utf-8", errors="replace"))


def check_tiff_strips(tags: Any, size: int, where: object) -> None:
    """SampleError ``truncated`` when a TIFF's first image has a strip or tile (offsets 273/324,
    byte counts 279/325 in PIL's ``tag_v2``) that runs past the ``size``-byte file."""
    for off_tag, cnt_tag, what in ((273, 279, "strip"), (324, 325, "tile")):
        offsets, counts = tags.get(off_tag), tags.get(cnt_tag)
        if offsets is None or counts is None:
            continue
        offsets = offsets if isinstance(offsets, tuple | list) else (offsets,)
        counts = counts if isinstance(counts, tuple | list) else (counts,)
        for k, (o, c) in enumerate(zip(offsets, counts, strict=False)):
            if int(o) + int(c) > size:
                raise SampleError("truncated", f"{where}: TIFF {what} {k} (bytes {int(o):,}..{int(o) + int(c):,}) "
                                               f"runs past the end of the file ({size:,} bytes)")
