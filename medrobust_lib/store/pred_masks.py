"""Content-addressed store of predicted segmentation masks.

A mask is a bool (H, W) array (the segmentation track stores, per ``segmentation_results`` row, the
union over the sample's box prompts of ``probability > 0.5``). Its address is the SHA-256 hex of
its canonical encoding (:func:`encode`)::

    b"MRM1" | H as uint32 little-endian | W as uint32 little-endian | np.packbits(mask) (row-major,
    big bit order, the last byte padded with zero bits)

so equal masks share one file and the ``pred_mask_sha256`` column of a result row both names the
file and checks its content. The file is ``<root>/<sha[:2]>/<sha>.mask.zlib``: the canonical
encoding, zlib-compressed (a 512 x 512 mask is at most 32 KiB before compression, typically well
under 1 KiB after). Reading it needs only the standard library and numpy::

    raw = zlib.decompress(path.read_bytes())
    h, w = struct.unpack("<II", raw[4:12])
    mask = np.unpackbits(np.frombuffer(raw[12:], np.uint8), count=h * w).reshape(h, w).astype(bool)

Writes are atomic (a temporary file in the same folder, then ``os.replace``) and idempotent (a
valid file already at the address is kept; a damaged one is replaced). Files are not fsynced: a
file torn by a crash fails its hash on read (:func:`get`) and the next :func:`put` of that mask
rewrites it. No path is built from anything but a validated 64-hex-digit address, and no symlink
inside the store is followed (a planted one raises), so a value read from a table cannot reach a
file outside ``root``.
"""

from __future__ import annotations

import hashlib
import os
import re
import struct
import uuid
import zlib
from pathlib import Path

import numpy as np
import numpy.typing as npt

MAGIC = b"MRM1"
"""First bytes of the canonical encoding (format version 1)."""
SUFFIX = ".mask.zlib"
"""File name suffix of a stored mask: ``<sha>.mask.zlib``."""
MAX_SIDE = 2**31 - 1
"""Largest mask side accepted (the header stores uint32; the pixel count is bounded separately)."""
MAX_PIXELS = 2**31
"""Largest H x W :func:`get` decodes (so a hostile header cannot make it allocate without bound)."""
_HEADER = struct.Struct("<4sII")
_SHA = re.compile(r"[0-9a-f]{64}")
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def _check_mask(mask: npt.ArrayLike) -> npt.NDArray[np.bool_]:
    m = np.asarray(mask)
    if m.dtype != np.bool_:
        raise ValueError(f"mask must be a bool array, got dtype {m.dtype}; binarize it first (prob > 0.5)")
    if m.ndim != 2:
        raise ValueError(f"mask must be 2-D (H, W), got shape {m.shape}")
    if not (1 <= m.shape[0] <= MAX_SIDE and 1 <= m.shape[1] <= MAX_SIDE):
        raise ValueError(f"mask sides must be in 1..{MAX_SIDE}, got shape {m.shape}")
    return m


def encode(mask: npt.NDArray[np.bool_]) -> bytes:
    """The canonical encoding of a bool (H, W) mask (see the module docstring); ValueError for any
    other dtype or shape."""
    m = _check_mask(mask)
    return _HEADER.pack(MAGIC, m.shape[0], m.shape[1]) + np.packbits(m, axis=None).tobytes()


def decode(raw: bytes, where: str = "mask") -> npt.NDArray[np.bool_]:
    """The bool (H, W) mask of a canonical encoding; ValueError naming ``where`` when it is not one
    (bad magic, a length that does not match H x W, non-zero padding bits)."""
    if len(raw) < _HEADER.size:
        raise ValueError(f"{where}: not a stored mask (only {len(raw)} bytes)")
    magic, h, w = _HEADER.unpack_from(raw)
    if magic != MAGIC:
        raise ValueError(f"{where}: not a stored mask (magic {magic!r}, expected {MAGIC!r})")
    if not (1 <= h <= MAX_SIDE and 1 <= w <= MAX_SIDE) or h * w > MAX_PIXELS:
        raise ValueError(f"{where}: invalid mask shape ({h}, {w})")
    n_bytes = (h * w + 7) // 8
    if len(raw) != _HEADER.size + n_bytes:
        raise ValueError(f"{where}: {len(raw) - _HEADER.size} data bytes for a ({h}, {w}) mask, expected {n_bytes}")
    bits = np.unpackbits(np.frombuffer(raw, np.uint8, offset=_HEADER.size))
    if bits[h * w:].any():
        raise ValueError(f"{where}: non-zero padding bits (not a canonical encoding)")
    return bits[: h * w].reshape(h, w).astype(bool)


def mask_sha256(mask: npt.NDArray[np.bool_]) -> str:
    """The address of a bool (H, W) mask: SHA-256 hex (64 lowercase digits) of :func:`encode`."""
    return hashlib.sha256(encode(mask)).hexdigest()


def check_sha(sha: object) -> str:
    """``sha`` if it is 64 lowercase hex digits, else ValueError (so no table value can name a path
    outside the store)."""
    if not isinstance(sha, str) or not _SHA.fullmatch(sha):
        raise ValueError(f"invalid mask address {str(sha)[:80]!r}: expected 64 lowercase hex digits (SHA-256)")
    return sha


def _shard(root: Path, sha: str, create: bool) -> Path:
    """``<root>/<sha[:2]>``, refusing a symlink or a non-folder there."""
    shard = Path(root) / sha[:2]
    if shard.is_symlink():
        raise ValueError(f"refusing to follow the symlink {shard} in the mask store {root}")
    if create:
        shard.mkdir(parents=True, exist_ok=True)
    if shard.exists() and not shard.is_dir():
        raise ValueError(f"{shard} in the mask store {root} is not a folder")
    return shard


def mask_path(root: Path, sha: str) -> Path:
    """Where the mask ``sha`` is (or would be) stored: ``<root>/<sha[:2]>/<sha>.mask.zlib``.
    ValueError for an address that is not 64 lowercase hex digits."""
    check_sha(sha)
    return Path(root) / sha[:2] / f"{sha}{SUFFIX}"


def _read_verified(path: Path, sha: str) -> npt.NDArray[np.bool_]:
    """The mask stored at ``path``, checked against ``sha``; ValueError naming the path otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW)
    except FileNotFoundError:
        raise ValueError(f"stored mask {sha} is missing: no file {path}") from None
    except OSError as exc:  # ELOOP: a symlink; EISDIR, EACCES, ...
        raise ValueError(f"stored mask {sha} is unreadable: {path} ({exc.strerror or exc})") from None
    try:
        with os.fdopen(fd, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise ValueError(f"stored mask {sha} is unreadable: {path} ({exc.strerror or exc})") from None
    d = zlib.decompressobj()
    try:
        head = d.decompress(data, _HEADER.size)
        if len(head) == _HEADER.size:
            _, h, w = _HEADER.unpack(head)
            limit = (min(h * w, MAX_PIXELS) + 7) // 8 + 1  # one byte more reveals trailing data
            raw = head + d.decompress(d.unconsumed_tail, limit)
        else:
            raw = head
        complete = d.eof and not d.unused_data and not d.unconsumed_tail
    except zlib.error as exc:
        raise ValueError(f"stored mask {sha} is corrupt: {path} (zlib: {exc})") from None
    if not complete:
        raise ValueError(f"stored mask {sha} is corrupt: {path} (truncated or trailing data)")
    actual = hashlib.sha256(raw).hexdigest()
    if actual != sha:
        raise ValueError(f"stored mask {sha} is corrupt: {path} fails its content hash (actual {actual[:16]}...)")
    try:
        return decode(raw, str(path))
    except ValueError as exc:
        raise ValueError(f"stored mask {sha} is corrupt: {exc}") from None


def put(root: Path, mask: npt.NDArray[np.bool_]) -> str:
    """Store a bool (H, W) mask under ``root`` and return its address (SHA-256 hex, 64 lowercase
    digits, of :func:`encode`). Idempotent: a valid file already at the address is kept (a damaged
    one is replaced). The file appears atomically (temporary file in the same folder, then
    ``os.replace``). ValueError for a mask that is not bool 2-D, or a symlink where the store keeps
    a folder; OSError when the disk refuses the write (no partial file is left)."""
    raw = encode(mask)
    sha = hashlib.sha256(raw).hexdigest()
    path = mask_path(root, sha)
    shard = _shard(Path(root), sha, create=True)
    if path.is_file() and not path.is_symlink():
        try:
            _read_verified(path, sha)
            return sha
        except ValueError:
            pass  # damaged (a crash mid-write on a file system without atomic rename, a flipped bit): rewrite
    tmp = shard / f".{sha}.{uuid.uuid4().hex}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(zlib.compress(raw, 9))
        os.replace(tmp, path)  # replaces a symlink at ``path`` itself, never its target
    finally:
        if tmp.exists() or tmp.is_symlink():
            tmp.unlink()
    return sha


def get(root: Path, sha: str) -> npt.NDArray[np.bool_]:
    """The bool (H, W) mask stored under ``root`` at address ``sha`` (a new, writable array).

    ValueError when ``sha`` is not 64 lowercase hex digits, or when the file is missing, unreadable,
    a symlink, or corrupt (not zlib, truncated, trailing data, content hash mismatch); the message
    names the path."""
    check_sha(sha)
    _shard(Path(root), sha, create=False)
    return _read_verified(mask_path(root, sha), sha)


def has(root: Path, sha: str) -> bool:
    """Whether a file exists at the address ``sha`` (not verified: :func:`get` verifies)."""
    p = mask_path(root, sha)
    return p.is_file() and not p.is_symlink() and not p.parent.is_symlink()
