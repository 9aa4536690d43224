"""Every user error of the CLI is one line ``error: ...`` and exit 2; tracebacks only with --debug."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import typer
from PIL import Image
from typer.testing import CliRunner

import medrobust_cli
from medrobust_cli import app, guard_errors
from tests.data.test_image_limits import bomb_png, truncated_png_keeping_iend

runner = CliRunner()


def _one_error_line(res: object, code: int = 2) -> str:
    assert res.exit_code == code, (res.exit_code, res.stdout, res.stderr, res.exception)  # type: ignore[attr-defined]
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]  # type: ignore[attr-defined]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr  # type: ignore[attr-defined]
    assert "Traceback" not in res.stdout + res.stderr  # type: ignore[attr-defined]
    return lines[0]


def _inputs(tmp_path: Path) -> dict[str, Path]:
    (tmp_path / "zero.png").write_bytes(b"")
    (tmp_path / "notes.png").write_text("not an image at all")
    Image.fromarray(np.full((5, 5), 90, np.uint8)).save(tmp_path / "tiny.png")
    return {
        "zero_byte": tmp_path / "zero.png",
        "not_an_image": tmp_path / "notes.png",
        "tiny": tmp_path / "tiny.png",
        "bomb": bomb_png(tmp_path / "bomb.png"),
        "truncated": truncated_png_keeping_iend(tmp_path / "cut.png"),
        "missing": tmp_path / "missing.png",
    }


EXPECTED = {"zero_byte": "empty_file", "not_an_image": "unreadable_image", "tiny": "too_small",
            "bomb": "too_large", "truncated": "truncated", "missing": "not found"}


@pytest.mark.parametrize("case", list(EXPECTED))
def test_perturb_refuses_bad_input_with_one_line(tmp_path: Path, case: str) -> None:
    src = _inputs(tmp_path)[case]
    res = runner.invoke(app, ["perturb", str(src), "--type", "gaussian_noise", "--level", "1",
                              "--output", str(tmp_path / "out.npy")])
    assert EXPECTED[case] in _one_error_line(res)
    assert not (tmp_path / "out.npy").exists()


def test_bad_suite_config_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "suite.yaml"
    bad.write_text("modalities: [mri, not_a_modality]\nperturbations: {levels: [9]}\n")
    res = runner.invoke(app, ["check", "--candidate", "a", "--baseline", "b", "--suite", str(bad)])
    line = _one_error_line(res)
    assert "not_a_modality" in line or "levels" in line


def test_missing_mart_is_one_line(tmp_path: Path) -> None:
    res = runner.invoke(app, ["report", "--mart", str(tmp_path / "none.duckdb"), "--out", str(tmp_path / "r"),
                              "--no-mlflow"])
    assert "medrobust demo" in _one_error_line(res)


def test_an_unexpected_failure_is_one_line_exit_1_and_debug_shows_the_traceback(
        monkeypatch: pytest.MonkeyPatch) -> None:
    sub = typer.Typer()

    @sub.command()
    @guard_errors
    def boom() -> None:
        raise RuntimeError("a bug\nwith two lines")

    @sub.command()
    def other() -> None:
        pass

    res = runner.invoke(sub, ["boom"])
    line = _one_error_line(res, code=1)
    assert "internal error (RuntimeError: a bug; with two lines)" in line and "--debug" in line
    monkeypatch.setitem(medrobust_cli._DEBUG, "on", True)
    res = runner.invoke(sub, ["boom"])
    assert isinstance(res.exception, RuntimeError)  # re-raised: typer prints the traceback


def test_debug_flag_reaches_the_commands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import medrobust_lib.perturb.single as single

    def broken(*a: object, **k: object) -> None:
        raise RuntimeError("decoder bug")

    monkeypatch.setattr(single, "perturb_file", broken)
    args = ["perturb", str(tmp_path / "x.png"), "--output", str(tmp_path / "o.npy")]
    res = runner.invoke(app, ["--debug", *args])
    assert isinstance(res.exception, RuntimeError)  # propagates with its traceback
    res = runner.invoke(app, args)
    assert "decoder bug" in _one_error_line(res, code=1)  # and the flag does not stick


def test_the_demo_summary_names_the_dagster_instance_without_dagster_home(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``.venv/bin/medrobust demo --suite ...`` outside make has no $DAGSTER_HOME: the summary's
    "Dagster runs" is the suite's own instance (the demo: the project root; another demo suite:
    var/<name>/dagster), not a KeyError after a finished run. A copy of the project's dagster.yaml in
    a temporary root stands for the project (the call writes the suite's instance file)."""
    import shutil

    import medrobust_cli

    repo = Path(__file__).resolve().parents[2]
    shutil.copy(repo / "dagster.yaml", tmp_path / "dagster.yaml")
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    assert medrobust_cli._dagster_home(repo / "configs" / "demo.yaml", tmp_path) == tmp_path.resolve()
    home = medrobust_cli._dagster_home(repo / "configs" / "demo_reference.yaml", tmp_path)
    assert home == tmp_path.resolve() / "var" / "demo_reference" / "dagster" and (home / "dagster.yaml").is_file()
