"""The content-addressed mask store: round trips, idempotence, damage and hostile addresses raise."""

from __future__ import annotations

import hashlib
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest

from medrobust_lib.config import Suite
from medrobust_lib.paths import suite_paths
from medrobust_lib.store import pred_masks as pm


@pytest.mark.parametrize("shape", [(1, 1), (3, 500), (512, 512), (7, 1)])
def test_round_trip_of_random_masks_of_odd_sizes(tmp_path: Path, shape: tuple[int, int]) -> None:
    rng = np.random.default_rng(sum(shape))
    mask = rng.random(shape) > 0.5
    sha = pm.put(tmp_path, mask)
    assert len(sha) == 64 and sha == pm.mask_sha256(mask)
    assert sha == hashlib.sha256(b"MRM1" + struct.pack("<II", *shape) + np.packbits(mask).tobytes()).hexdigest()
    path = pm.mask_path(tmp_path, sha)
    assert path == tmp_path / sha[:2] / f"{sha}.mask.zlib" and path.is_file()
    back = pm.get(tmp_path, sha)
    assert back.dtype == np.bool_ and back.shape == shape and np.array_equal(back, mask)
    back[...] = ~back  # a new, writable array
    # the documented stdlib + numpy reader
    raw = zlib.decompress(path.read_bytes())
    h, w = struct.unpack("<II", raw[4:12])
    plain = np.unpackbits(np.frombuffer(raw[12:], np.uint8), count=h * w).reshape(h, w).astype(bool)
    assert np.array_equal(plain, mask)


def test_put_is_idempotent_and_shape_is_part_of_the_address(tmp_path: Path) -> None:
    mask = np.zeros((4, 6), bool)
    mask[1:3, 2:5] = True
    sha = pm.put(tmp_path, mask)
    path = pm.mask_path(tmp_path, sha)
    before = path.stat()
    assert pm.put(tmp_path, mask.copy()) == sha
    after = path.stat()
    assert (before.st_ino, before.st_mtime_ns) == (after.st_ino, after.st_mtime_ns)  # kept, not rewritten
    assert pm.put(tmp_path, mask.reshape(6, 4)) != sha  # same bits, another shape
    assert not list(tmp_path.rglob("*.tmp"))
    assert pm.has(tmp_path, sha) and not pm.has(tmp_path, "0" * 64)


def test_a_compact_file(tmp_path: Path) -> None:
    yy, xx = np.mgrid[:256, :256]
    blob = (yy - 120) ** 2 / 50**2 + (xx - 130) ** 2 / 70**2 < 1
    assert pm.mask_path(tmp_path, pm.put(tmp_path, blob)).stat().st_size < 1024


@pytest.mark.parametrize("bad", [np.zeros((3, 3), np.uint8), np.zeros((3,), bool), np.zeros((2, 2, 2), bool),
                                 np.zeros((0, 5), bool), np.zeros((3, 3), np.float32)])
def test_put_refuses_what_is_not_a_bool_2d_mask(tmp_path: Path, bad: np.ndarray) -> None:
    with pytest.raises(ValueError, match="mask"):
        pm.put(tmp_path, bad)


def _stored(tmp_path: Path) -> tuple[str, Path, np.ndarray]:
    mask = np.random.default_rng(1).random((33, 17)) > 0.3
    sha = pm.put(tmp_path, mask)
    return sha, pm.mask_path(tmp_path, sha), mask


@pytest.mark.parametrize("damage", ["flip", "truncate", "trailing", "empty", "not_zlib", "other_mask"])
def test_a_corrupt_file_raises_naming_the_path_and_put_repairs_it(tmp_path: Path, damage: str) -> None:
    sha, path, mask = _stored(tmp_path)
    data = path.read_bytes()
    if damage == "flip":
        raw = bytearray(zlib.decompress(data))
        raw[20] ^= 0x01
        data = zlib.compress(bytes(raw))
    elif damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "trailing":
        data = data + b"\x00"
    elif damage == "empty":
        data = b""
    elif damage == "not_zlib":
        data = b"hello, world"
    else:
        data = zlib.compress(pm.encode(~mask))
    path.write_bytes(data)
    with pytest.raises(ValueError, match="corrupt") as info:
        pm.get(tmp_path, sha)
    assert str(path) in str(info.value)
    assert pm.put(tmp_path, mask) == sha  # a damaged file is replaced
    assert np.array_equal(pm.get(tmp_path, sha), mask)


def test_a_missing_file_raises_naming_the_path(tmp_path: Path) -> None:
    sha = "ab" * 32
    with pytest.raises(ValueError, match="missing") as info:
        pm.get(tmp_path, sha)
    assert str(pm.mask_path(tmp_path, sha)) in str(info.value)


@pytest.mark.parametrize("sha", ["../../etc/passwd", "AB" * 32, "ab" * 31, "", "ab" * 32 + "\n", "ab" * 33,
                                 "../" + "a" * 61, "/" + "a" * 63, "g" * 64, None, 123])
def test_a_hostile_address_raises(tmp_path: Path, sha: object) -> None:
    with pytest.raises(ValueError, match="64 lowercase hex"):
        pm.get(tmp_path, sha)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="64 lowercase hex"):
        pm.mask_path(tmp_path, sha)  # type: ignore[arg-type]


def test_symlinks_inside_the_store_are_not_followed(tmp_path: Path) -> None:
    root, outside = tmp_path / "store", tmp_path / "outside"
    outside.mkdir()
    mask = np.eye(5, dtype=bool)
    sha = pm.mask_sha256(mask)
    root.mkdir()
    (root / sha[:2]).symlink_to(outside, target_is_directory=True)  # a planted shard folder
    with pytest.raises(ValueError, match="symlink"):
        pm.put(root, mask)
    with pytest.raises(ValueError, match="symlink"):
        pm.get(root, sha)
    assert not any(outside.iterdir())
    (root / sha[:2]).unlink()
    victim = outside / "victim"
    victim.write_bytes(zlib.compress(pm.encode(mask)))  # valid content, reached through a file symlink
    (root / sha[:2]).mkdir()
    pm.mask_path(root, sha).symlink_to(victim)
    with pytest.raises(ValueError, match="unreadable"):
        pm.get(root, sha)
    assert pm.put(root, mask) == sha  # replaces the link itself, never writes through it
    assert not pm.mask_path(root, sha).is_symlink() and victim.read_bytes() == zlib.compress(pm.encode(mask))


def test_decode_refuses_non_canonical_padding() -> None:
    raw = bytearray(pm.encode(np.ones((1, 3), bool)))
    raw[-1] |= 0x01  # a padding bit
    with pytest.raises(ValueError, match="padding"):
        pm.decode(bytes(raw))


def test_the_suite_locates_its_store_and_may_turn_it_off() -> None:
    s = Suite(name="alpha")
    assert suite_paths(s).pred_masks == Path("var/alpha/pred_masks")
    assert s.segmentation.store_masks is True
    assert Suite.model_validate({"name": "b", "segmentation": {"store_masks": False}}).segmentation.store_masks is False
    with pytest.raises(ValueError, match="store_mask"):
        Suite.model_validate({"name": "b", "segmentation": {"store_mask": False}})
