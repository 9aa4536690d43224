"""Commands that never mislead: options validated with the valid values listed, nothing offered
that does nothing, exit 1 when nothing was scored, integers stay integers, full option names in
--help at 80 columns, unique perturb outputs, DICOM windows, paths from the project root."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from medrobust_cli import app
from medrobust_lib.perturb.spec import list_perturbations
from medrobust_lib.project import in_project, project_root
from medrobust_lib.store import results
from medrobust_lib.store.marts import build_mart

runner = CliRunner()


# --- filter and format options ---------------------------------------------------------------

def test_list_perturbations_modality_is_validated_and_case_insensitive() -> None:
    res = runner.invoke(app, ["list-perturbations", "--modality", "bogus"])
    assert res.exit_code == 2 and "unknown modality 'bogus'" in res.stderr and "mri" in res.stderr
    upper = runner.invoke(app, ["list-perturbations", "--modality", "MRI", "--format", "json"])
    lower = runner.invoke(app, ["list-perturbations", "--modality", "mri", "--format", "json"])
    assert upper.exit_code == lower.exit_code == 0
    names = [r["name"] for r in json.loads(upper.stdout)]
    assert names == [r["name"] for r in json.loads(lower.stdout)] == list_perturbations(modality="mri")
    assert "kspace_spike" in names


def test_list_perturbations_offers_no_parquet() -> None:
    res = runner.invoke(app, ["list-perturbations", "--format", "parquet"])
    assert res.exit_code == 2 and "'table', 'csv', 'json', 'markdown'" in res.stderr


def test_perturb_modality_is_validated(tmp_path: Path) -> None:
    src = tmp_path / "x.npy"
    np.save(src, np.full((32, 32), 0.5, np.float32))
    res = runner.invoke(app, ["perturb", str(src), "--modality", "brain", "--output-dir", str(tmp_path)])
    assert res.exit_code == 2 and "valid: ct, mri" in res.stderr


def test_help_shows_full_option_names_at_80_columns() -> None:
    for cmd in ("check", "query", "perturb", "report", "score", "demo", "list-perturbations"):
        res = runner.invoke(app, [cmd, "--help"], terminal_width=80, env={"COLUMNS": "80"})
        assert res.exit_code == 0, res.output
        assert "…" not in res.stdout
        assert max(len(line) for line in res.stdout.splitlines()) <= 80
    res = runner.invoke(app, ["check", "--help"], terminal_width=80, env={"COLUMNS": "80"})
    for opt in ("--max-iou-drop-increase", "--max-dice-drop-increase", "--results-dir", "--details",
                "--no-evaluate", "--min-pairs"):
        assert opt in res.stdout


# --- query: integers and --out ---------------------------------------------------------------

@pytest.fixture()
def mart(tmp_path: Path) -> Path:
    p = results.chunk_path(tmp_path / "results", "segmentation_results", {"modality": "mri", "level": 2}, "c")
    results.write_chunk(p, [{"model": "sam", "sample_id": s, "condition": "perturbation", "perturbation": "noise",
                             "iou": 0.5, "status": "ok"} for s in "abc"], "fp")
    out = tmp_path / "m.duckdb"
    build_mart(tmp_path / "results", out)
    return out


SUM_SQL = "select model, sum(level) as s, count(*) as n from segmentation_results group by all"


@pytest.mark.parametrize("fmt", ["csv", "json", "markdown", "table"])
def test_sum_of_integers_prints_as_an_integer(mart: Path, fmt: str) -> None:
    res = runner.invoke(app, ["query", SUM_SQL, "--mart", str(mart), "--format", fmt])
    assert res.exit_code == 0, res.output
    assert "6.0" not in res.stdout and re.search(r"\b6\b", res.stdout)
    if fmt == "json":
        assert json.loads(res.stdout) == [{"model": "sam", "s": 6, "n": 3}]


def test_out_md_and_format_extension_mismatch(mart: Path, tmp_path: Path) -> None:
    md = tmp_path / "r.md"
    res = runner.invoke(app, ["query", SUM_SQL, "--mart", str(mart), "--out", str(md)])
    assert res.exit_code == 0, res.output
    assert md.read_text().startswith("| model") and "|   6 |" in md.read_text()
    bad = tmp_path / "x.json"
    res = runner.invoke(app, ["query", SUM_SQL, "--mart", str(mart), "--format", "csv", "--out", str(bad)])
    assert res.exit_code == 2 and "does not match" in res.stderr and not bad.exists()


# --- score --------------------------------------------------------------------------------------

def _jsonl(path: Path, recs: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def test_score_exits_1_when_nothing_matches(tmp_path: Path) -> None:
    refs = _jsonl(tmp_path / "r.jsonl", [{"id": "q1", "question_type": "yesno", "answer": "no"}])
    preds = _jsonl(tmp_path / "p.jsonl", [{"id": "other", "prediction": "no"}])
    res = runner.invoke(app, ["score", "vqa", "--predictions", str(preds), "--references", str(refs)])
    assert res.exit_code == 1 and "nothing was scored" in res.stderr
    assert json.loads(res.stdout)["n_matched_predictions"] == 0


def test_score_inverted_box_is_an_invalid_line_and_all_invalid_exits_1(tmp_path: Path) -> None:
    refs = _jsonl(tmp_path / "r.jsonl", [{"id": "g1", "box": [40, 10, 20, 30], "image_hw": [100, 100]}])
    preds = _jsonl(tmp_path / "p.jsonl", [{"id": "g1", "prediction": "[20, 10, 40, 30]"}])
    res = runner.invoke(app, ["score", "grounding", "--predictions", str(preds), "--references", str(refs)])
    assert res.exit_code == 1, res.output
    out = json.loads(res.stdout)
    assert out["n"] == 0 and out["n_invalid_lines"] == 1 and "inverted" in out["invalid_lines"][0]["reason"]


# --- perturb --------------------------------------------------------------------------------------

def test_perturb_outputs_are_unique_per_input_file(tmp_path: Path, gray_image: np.ndarray) -> None:
    import cv2

    u8 = np.round(gray_image * 255).astype(np.uint8)
    paths = []
    for ext in ("png", "tif"):
        src = tmp_path / f"cam.{ext}"
        cv2.imwrite(str(src), u8)
        res = runner.invoke(app, ["perturb", str(src), "-t", "gaussian_blur", "-l", "1",
                                  "--output-dir", str(tmp_path / "out")])
        assert res.exit_code == 0, res.output
        paths.append(json.loads(res.stdout)["path"])
    assert len(set(paths)) == 2 and all(Path(p).is_file() for p in paths)


def test_perturb_dicom_window_options_and_record(tmp_path: Path) -> None:
    from pydicom.data import get_testdata_file

    dcm = str(get_testdata_file("CT_small.dcm"))
    args = ["perturb", dcm, "-t", "gaussian_blur", "-l", "2", "--output-dir", str(tmp_path)]
    res = runner.invoke(app, [*args, "--window-center", "40", "--window-width", "400"])
    assert res.exit_code == 0, res.output
    win = json.loads(res.stdout)["window"]
    assert win["center"] == 40 and win["width"] == 400 and (win["low"], win["high"]) == (-160, 240)
    assert win["source"] == "options" and win["unit"] == "HU"
    res = runner.invoke(app, args)  # the file's own window (or percentiles), reported too
    assert res.exit_code == 0 and json.loads(res.stdout)["window"]["source"] in ("file", "percentile")
    res = runner.invoke(app, [*args, "--window-center", "40"])
    assert res.exit_code == 2 and "both" in res.stderr


# --- any working directory ----------------------------------------------------------------------

def test_project_root_from_anywhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    here = project_root()
    assert (here / "configs" / "demo.yaml").is_file()
    monkeypatch.chdir(tmp_path)  # outside any project: the checkout this code runs from
    assert project_root() == here and in_project("var/marts.duckdb") == here / "var" / "marts.duckdb"
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "demo.yaml").write_text("name: x\n")
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")  # inside another project: its root
    assert project_root() == tmp_path
    monkeypatch.setenv("MEDROBUST_HOME", str(here))
    assert project_root() == here
    assert in_project("/abs/x") == Path("/abs/x")


def test_query_default_mart_is_the_projects(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mart: Path) -> None:
    home = tmp_path / "proj"
    (home / "configs").mkdir(parents=True)
    (home / "configs" / "demo.yaml").write_text("name: x\n")
    (home / "var").mkdir()
    os.link(mart, home / "var" / "marts.duckdb")
    monkeypatch.setenv("MEDROBUST_HOME", str(home))
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, ["query", SUM_SQL, "-f", "csv"])
    assert res.exit_code == 0, res.output
    (home / "var" / "marts.duckdb").unlink()
    res = runner.invoke(app, ["query", SUM_SQL])
    assert res.exit_code == 2 and str(home / "var" / "marts.duckdb") in res.stderr


def test_library_list_perturbations_validates_modality() -> None:
    assert list_perturbations(modality="MRI") == list_perturbations(modality="mri")
    with pytest.raises(ValueError, match="valid: ct, mri"):
        list_perturbations(modality="bogus")
