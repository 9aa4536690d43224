"""``medrobust validate`` and the suite's load-time checks, as a new user meets them."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from medrobust_cli import app
from medrobust_lib.config import load_suite
from medrobust_lib.tracks.validate import validate_suite


def _folder(root: Path, n: int = 3, corrupt: int = 1, masks: bool = True) -> Path:
    (root / "images").mkdir(parents=True)
    if masks:
        (root / "masks").mkdir()
    rng = np.random.default_rng(0)
    for i in range(n):
        img = (rng.random((32, 32)) * 255).astype(np.uint8)
        cv2.imwrite(str(root / "images" / f"case{i}.png"), img)
        if masks:
            m = np.zeros((32, 32), np.uint8)
            m[8:20, 8:20] = 255
            cv2.imwrite(str(root / "masks" / f"case{i}.png"), m)
    for j in range(corrupt):
        (root / "images" / f"broken{j}.png").write_bytes(b"not a png")
        if masks:
            (root / "masks" / f"broken{j}.png").write_bytes(b"not a png")
    return root


def _suite(tmp: Path, body: dict[str, object]) -> Path:
    p = tmp / "suite.yaml"
    p.write_text(yaml.safe_dump({"name": "mine", "results_dir": str(tmp / "var" / "results"),
                                 "mart_path": str(tmp / "var" / "marts.duckdb"), **body}))
    return p


def test_unknown_key_names_key_and_file(tmp_path: Path) -> None:
    p = _suite(tmp_path, {"segmentation": {"models": [{"id": "m", "chekpoint": "/w.pth"}]}})
    with pytest.raises(ValueError) as err:
        load_suite(p)
    assert str(p) in str(err.value) and "segmentation.models.0.chekpoint: unknown key" in str(err.value)
    p = _suite(tmp_path, {"colour": "blue"})
    with pytest.raises(ValueError, match=r"colour: unknown key"):
        load_suite(p)


def test_model_without_weights_rejected_outside_the_demo(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"segmentation model 'medsam' has no checkpoint"):
        load_suite(_suite(tmp_path, {"segmentation": {"models": [{"id": "medsam", "family": "medsam"}]}}))
    with pytest.raises(ValueError, match=r"segmentation model 'sam' has no checkpoint.*demo only"):
        load_suite(_suite(tmp_path, {"segmentation": {"models": [{"id": "sam", "checkpoint": "trained"}]}}))
    with pytest.raises(ValueError, match=r"VLM 'medgemma' has no source"):
        load_suite(_suite(tmp_path, {"vlm": {"models": [{"id": "medgemma"}]}}))
    # inside the demo, an unnamed checkpoint is the demo-trained one
    s = load_suite(_suite(tmp_path, {"demo": {"enabled": True},
                                     "segmentation": {"models": [{"id": "tiny", "arch": "tiny"}]}}))
    assert s.segmentation.models[0].checkpoint == "trained"


def test_validate_counts_samples_and_lists_problems(tmp_path: Path) -> None:
    root = _folder(tmp_path / "scans", n=3, corrupt=1)
    p = _suite(tmp_path, {"modalities": ["ct"], "datasets": [
        {"name": "scans", "modality": "ct", "format": "folder", "root": str(root)},
        {"name": "gone", "modality": "ct", "format": "folder", "root": str(tmp_path / "nowhere")}]})
    rep = validate_suite(p)
    assert not rep.ok
    scans, gone = rep.datasets
    # sorted ids: broken0 is among the first 3 decoded, so it is found before any run
    assert (scans.n_ok, scans.n_quarantined, scans.error) == (3, 1, None)
    assert scans.problems and scans.problems[0].startswith("broken0: ")
    assert gone.error is not None and "nowhere" in gone.error
    text = "\n".join(rep.lines())
    assert "scans (ct, folder): 3 samples, 1 quarantined" in text and "gone (ct, folder): error:" in text


def test_validate_images_without_masks(tmp_path: Path) -> None:
    root = _folder(tmp_path / "photos", n=2, corrupt=0, masks=False)
    p = _suite(tmp_path, {"modalities": ["ct"], "datasets": [
        {"name": "photos", "modality": "ct", "format": "folder", "root": str(root), "options": {"mask_dir": None}}]})
    rep = validate_suite(p)
    assert rep.ok, rep.lines()
    assert rep.datasets[0].n_ok == 2


def test_validate_cli_exit_codes(tmp_path: Path) -> None:
    runner = CliRunner()
    bad = runner.invoke(app, ["validate", "--suite", str(_suite(tmp_path, {"bogus": 1}))])
    assert bad.exit_code == 2 and "bogus: unknown key" in bad.output
    root = _folder(tmp_path / "ok", n=2, corrupt=0)
    good = _suite(tmp_path, {"modalities": ["ct"], "datasets": [
        {"name": "ok", "modality": "ct", "format": "folder", "root": str(root)}]})
    res = runner.invoke(app, ["validate", "--suite", str(good)])
    assert res.exit_code == 0, res.output
    assert "suite" in res.output and "OK" in res.output


def test_each_suite_writes_under_its_own_root(tmp_path: Path) -> None:
    """Two suites that name no locations never share results, mart, checkpoints, caches or reports;
    query/report --suite read that suite's mart."""
    from medrobust_lib.config import Suite
    from medrobust_lib.paths import suite_paths

    a, b = suite_paths(Suite(name="alpha")), suite_paths(Suite(name="beta"))
    for field in ("results", "mart", "checkpoints", "cache", "reports", "galleries", "dagster_state"):
        pa_, pb = getattr(a, field), getattr(b, field)
        assert pa_ != pb and pa_.is_relative_to(Path("var/alpha")) and pb.is_relative_to(Path("var/beta")), field
    demo = Suite(name="demo", results_dir="var/results", mart_path="var/marts.duckdb")
    assert suite_paths(demo).reports == Path("var/reports")  # the demo keeps its documented places
    assert suite_paths(Suite(name="x"), base=tmp_path).mart == tmp_path / "var/x/marts.duckdb"
    p = _suite(tmp_path, {"name": "gamma"})  # its mart_path: <tmp>/var/marts.duckdb (not built)
    res = CliRunner().invoke(app, ["query", "select 1", "--suite", str(p)])
    assert res.exit_code == 2 and "no mart at" in res.output and str(tmp_path / "var" / "marts.duckdb") in res.output


def test_each_suite_logs_into_its_own_experiments() -> None:
    """MLflow experiments derive from the suite like its folders do: ``<suite>/<experiment>``."""
    from medrobust_lib.config import Suite
    from medrobust_lib.paths import experiment_name

    assert experiment_name(Suite(name="demo"), "segmentation_eval") == "demo/segmentation_eval"
    assert experiment_name(Suite(name="alpha"), "reports") != experiment_name(Suite(name="beta"), "reports")
    for bad in ("", "a/b"):
        with pytest.raises(ValueError, match="experiment must be"):
            experiment_name(Suite(name="demo"), bad)


def test_validate_names_each_missing_yesno_file(tmp_path: Path) -> None:
    root = _folder(tmp_path / "photos", n=2, corrupt=0, masks=False)
    (tmp_path / "a.jsonl").write_text("")
    p = _suite(tmp_path, {"modalities": ["xray"], "datasets": [
        {"name": "photos", "modality": "xray", "format": "folder", "root": str(root), "options": {"mask_dir": None}}],
        "vlm": {"records": {"yesno": [{"path": str(tmp_path / "a.jsonl"), "dataset": "photos"},
                                      {"path": str(tmp_path / "b.jsonl"), "image_root": str(tmp_path / "none")}]}}})
    rep = validate_suite(p)
    assert rep.errors == [f"vlm.records.yesno.1: not found: {tmp_path / 'b.jsonl'}",
                          f"vlm.records.yesno.1.image_root: not found: {tmp_path / 'none'}"]
    p = _suite(tmp_path, {"modalities": ["xray"], "vlm": {"records": {"yesno": str(tmp_path / "c.jsonl")}}})
    assert f"vlm.records.yesno: not found: {tmp_path / 'c.jsonl'}" in validate_suite(p).errors
