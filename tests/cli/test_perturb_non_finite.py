"""``medrobust perturb`` refuses NaN / Inf input in one line, exit 2, before writing anything, and its
JSON output is strict JSON (issue 44, finding 10): a NIfTI slice with a NaN voxel, a DICOM whose
RescaleSlope is NaN or infinite, an infinite --window-width, ``--type all`` (which used to write two
files and then fail)."""

from __future__ import annotations

import json
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
from typer.testing import CliRunner

from medrobust_cli import app
from tests.data.test_imageio import ct_file

runner = CliRunner()


def _nifti_with_nan(path: Path) -> Path:
    a = np.random.default_rng(0).random((32, 32)).astype(np.float32)
    a[5, 5] = np.nan
    nib.save(nib.Nifti1Image(a, np.eye(4)), str(path))
    return path


def _refused(args: list[str], out: Path) -> str:
    res = runner.invoke(app, ["perturb", *args])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.output
    assert not out.exists() or not any(out.iterdir()) if out.suffix == "" else not out.exists()
    return lines[0]


def test_a_nan_voxel_is_refused_before_any_output(tmp_path: Path) -> None:
    src = _nifti_with_nan(tmp_path / "nan.nii.gz")
    msg = _refused([str(src), "--type", "all", "--level", "2", "--output-dir", str(tmp_path / "out")], tmp_path / "out")
    assert "NaN or infinite" in msg
    msg = _refused([str(src), "-t", "gaussian_noise", "-l", "2", "-o", str(tmp_path / "one.png")], tmp_path / "one.png")
    assert "NaN or infinite" in msg


@pytest.mark.parametrize("slope", ["nan", "inf"])
def test_a_dicom_with_a_non_finite_rescale_slope_is_refused(tmp_path: Path, slope: str) -> None:
    src = ct_file(tmp_path / "ct.dcm", np.full((32, 32), 1024, np.int16), RescaleSlope=slope)
    msg = _refused([str(src), "-t", "gaussian_noise", "-l", "2", "-o", str(tmp_path / "o.png")], tmp_path / "o.png")
    assert "error: " in msg


def test_an_infinite_window_is_refused(tmp_path: Path) -> None:
    src = ct_file(tmp_path / "ct.dcm", np.arange(32 * 32, dtype=np.int16).reshape(32, 32))
    msg = _refused([str(src), "-t", "gaussian_noise", "-l", "2", "-o", str(tmp_path / "o.png"), "--window-center", "40",
                    "--window-width", "inf"], tmp_path / "o.png")
    assert "--window-width must be a finite number" in msg


def test_the_output_is_strict_json(tmp_path: Path) -> None:
    src = ct_file(tmp_path / "ct.dcm", (np.arange(48 * 48, dtype=np.int16) % 400).reshape(48, 48))
    res = runner.invoke(app, ["perturb", str(src), "-t", "gaussian_noise", "-l", "2", "-o", str(tmp_path / "o.png")])
    assert res.exit_code == 0, res.output
    rec = json.loads(res.output.strip().splitlines()[-1], parse_constant=lambda c: pytest.fail(f"non-JSON {c}"))
    assert 0.0 <= rec["ssim"] <= 1.0
