"""Your own data, safely (issue 30, and issue 32's footguns): suite names, ``${VAR}`` paths, deep
YAML, isolated outputs, the path rule, ``validate``'s checks, refusals to overwrite inputs, failures
in at most three lines, Ctrl-C."""

from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path

import numpy as np
import pytest
import typer
import yaml
from PIL import Image
from typer.testing import CliRunner

import medrobust_cli
from medrobust_cli import app
from medrobust_lib.config import load_suite
from medrobust_lib.config.isolation import CLAIMS_DIR, check_isolation, record_claim
from medrobust_lib.config.suite import MAX_YAML_DEPTH, Suite
from medrobust_lib.tracks.validate import checkpoint_arch_error, encoder_shape, validate_suite

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


@pytest.fixture(autouse=True)
def _restore_cwd(monkeypatch: pytest.MonkeyPatch) -> None:
    """The commands change into the project root; put the working directory back after each test."""
    monkeypatch.chdir(Path.cwd())


def _lines(res: object) -> list[str]:
    out = res.stdout + res.stderr  # type: ignore[attr-defined]
    return [ln for ln in out.splitlines() if ln.strip()]


def _project(tmp_path: Path) -> Path:
    """A project root of its own (MEDROBUST_HOME) holding a copy of the demo suite file."""
    home = tmp_path / "proj"
    (home / "configs").mkdir(parents=True)
    (home / "configs" / "demo.yaml").write_text((ROOT / "configs" / "demo.yaml").read_text())
    return home


def _folder_dataset(root: Path, n: int = 3, masks: bool = True) -> Path:
    rng = np.random.default_rng(0)
    for i in range(n):
        (root / "images").mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 255, (40, 40), dtype=np.uint8)).save(root / "images" / f"s{i}.png")
        if masks:
            m = np.zeros((40, 40), np.uint8)
            m[5:20, 5:20] = 255
            (root / "masks").mkdir(parents=True, exist_ok=True)
            Image.fromarray(m).save(root / "masks" / f"s{i}.png")
    return root


def _suite(path: Path, **cfg: object) -> Path:
    base: dict[str, object] = {"name": "mine", "modalities": ["ct"]}
    base.update(cfg)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(base))
    return path


# --- suite names, ${VAR}, deep YAML --------------------------------------------------------------

@pytest.mark.parametrize("name", ["", "../../x", "a/b", "Demo", ".hidden", "x" * 65, "-x"])
def test_suite_names_are_restricted_to_a_safe_pattern(name: str) -> None:
    with pytest.raises(ValueError, match="suite name .* is not allowed"):
        Suite.model_validate({"name": name})


def test_a_suite_name_is_its_output_folder() -> None:
    s = Suite.model_validate({"name": "my-suite_2"})
    assert (s.results_dir, s.mart_path) == ("var/my-suite_2/results", "var/my-suite_2/marts.duckdb")


def test_environment_variables_in_suite_values(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = _suite(tmp_path / "s.yaml", results_dir="${H30A_OUT:-var/fallback}/results",
               datasets=[{"name": "a", "modality": "ct", "format": "folder", "root": "${H30A_DATA}/a"}])
    monkeypatch.delenv("H30A_OUT", raising=False)
    monkeypatch.delenv("H30A_DATA", raising=False)
    with pytest.raises(ValueError, match=r"datasets.0.root: environment variable H30A_DATA is not set"):
        load_suite(p)
    monkeypatch.setenv("H30A_DATA", "/somewhere")
    s = load_suite(p)
    assert s.results_dir == "var/fallback/results" and s.datasets[0].root == "/somewhere/a"
    monkeypatch.setenv("H30A_OUT", "/out")
    assert load_suite(p).results_dir == "/out/results"


@pytest.mark.parametrize("text", ["name: x\nseed: " + "[" * 5000 + "]" * 5000 + "\n",
                                  "name: x\nseed:\n" + "".join(" " * (i + 1) + "a:\n" for i in range(5000)),
                                  "name: x\nseed: " + "[" * (MAX_YAML_DEPTH + 1) + "]" * (MAX_YAML_DEPTH + 1)])
def test_deeply_nested_yaml_is_exit_2_with_one_line(tmp_path: Path, text: str) -> None:
    p = tmp_path / "deep.yaml"
    p.write_text(text)
    for cmd in (["validate", "--suite", str(p)], ["run", "--suite", str(p)]):
        res = runner.invoke(app, cmd)
        assert res.exit_code == 2, (res.output, res.exception)
        lines = _lines(res)
        assert len(lines) == 1 and "nested deeper than" in lines[0] and "internal" not in lines[0], lines


# --- isolation -----------------------------------------------------------------------------------

def test_the_shipped_example_uses_its_own_folders() -> None:
    s = load_suite(ROOT / "configs" / "example_real.yaml")
    assert (s.results_dir, s.mart_path) == (f"var/{s.name}/results", f"var/{s.name}/marts.duckdb")
    check_isolation(s, ROOT / "configs" / "example_real.yaml", ROOT)  # no conflict with the demo's


@pytest.mark.parametrize("over", [{"results_dir": "var/results"}, {"mart_path": "var/marts.duckdb"},
                                  {"results_dir": "var/results/mine"}, {"name": "reports"},
                                  {"results_dir": "var/x/results", "mart_path": "var/checkpoints/m.duckdb"}])
def test_a_suite_using_the_demos_folders_is_refused_by_validate_and_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, over: dict[str, str]) -> None:
    home = _project(tmp_path)
    monkeypatch.setenv("MEDROBUST_HOME", str(home))
    p = _suite(tmp_path / "mine.yaml", **over)
    for cmd in ("validate", "run"):
        res = runner.invoke(app, [cmd, "--suite", str(p)])
        assert res.exit_code == 2, (cmd, res.output, res.exception)
        bad = [ln for ln in _lines(res) if "both write" in ln]
        assert len(bad) == 1, res.output
        assert str(p) in bad[0] and str(home / "configs" / "demo.yaml") in bad[0] and "'demo'" in bad[0]
    assert not (home / "var" / "results").exists()  # nothing was written for the refused run


def test_a_claim_of_an_earlier_run_refuses_another_name(tmp_path: Path) -> None:
    home = _project(tmp_path)
    first = load_suite(_suite(tmp_path / "a.yaml", name="alpha", results_dir="var/shared/results",
                              mart_path="var/shared/m.duckdb"))
    record_claim(first, tmp_path / "a.yaml", home)
    assert json.loads((home / CLAIMS_DIR / "alpha.json").read_text())["name"] == "alpha"
    same_name = load_suite(tmp_path / "a.yaml")
    check_isolation(same_name, tmp_path / "a.yaml", home)  # the same suite again: fine
    other = load_suite(_suite(tmp_path / "b.yaml", name="beta", results_dir="var/shared/results"))
    with pytest.raises(ValueError, match=r"suites 'beta' .* and 'alpha' .* both write .*var/shared/results .*"
                                         r"delete .*alpha.json"):
        check_isolation(other, tmp_path / "b.yaml", home)
    check_isolation(load_suite(_suite(tmp_path / "c.yaml", name="gamma")), tmp_path / "c.yaml", home)


def test_a_symlink_does_not_hide_another_suites_folder(tmp_path: Path) -> None:
    """Issue 44, finding 8: ``results_dir: var/alias/results`` with ``var/alias -> sa`` is suite sa's
    folder: the isolation check resolves links (it used to compare the unresolved paths)."""
    home = _project(tmp_path)
    first = load_suite(_suite(tmp_path / "a.yaml", name="sa", results_dir="var/sa/results",
                              mart_path="var/sa/m.duckdb"))
    record_claim(first, tmp_path / "a.yaml", home)
    (home / "var" / "sa").mkdir(parents=True, exist_ok=True)
    (home / "var" / "alias").symlink_to(home / "var" / "sa", target_is_directory=True)
    other = load_suite(_suite(tmp_path / "b.yaml", name="sb", results_dir="var/alias/results",
                              mart_path="var/sb/m.duckdb"))
    with pytest.raises(ValueError, match=r"suites 'sb' .* and 'sa' .* both write"):
        check_isolation(other, tmp_path / "b.yaml", home)


# --- validate ------------------------------------------------------------------------------------

def _validate(home: Path, p: Path) -> tuple[int, list[str]]:
    res = runner.invoke(app, ["validate", "--suite", str(p)])
    return res.exit_code, _lines(res)


def test_validate_resolves_relative_paths_from_the_project_root(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    home = _project(tmp_path)
    _folder_dataset(home / "data" / "scans")
    monkeypatch.setenv("MEDROBUST_HOME", str(home))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    _suite(elsewhere / "ok.yaml", datasets=[{"name": "scans", "modality": "ct", "format": "folder",
                                             "root": "data/scans"}])
    code, lines = _validate(home, Path("ok.yaml"))  # typed relative to the current folder
    assert code == 0 and "scans (ct, folder): 3 samples, 0 quarantined" in "\n".join(lines), lines
    bad = _suite(elsewhere / "bad.yaml", datasets=[{"name": "scans", "modality": "ct", "format": "folder",
                                                    "root": "data/nope"}])
    code, lines = _validate(home, bad)
    assert code == 2
    assert f"root {home / 'data' / 'nope'} does not exist (relative paths are relative to the project root" \
        in "\n".join(lines), lines


def test_validate_names_the_expected_mask_path_and_the_option_when_every_mask_is_missing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = _project(tmp_path)
    _folder_dataset(tmp_path / "d", masks=False)
    (tmp_path / "d" / "masks").mkdir()
    monkeypatch.setenv("MEDROBUST_HOME", str(home))
    p = _suite(tmp_path / "s.yaml", datasets=[{"name": "scans", "modality": "ct", "format": "folder",
                                               "root": str(tmp_path / "d")}])
    code, lines = _validate(home, p)
    text = "\n".join(lines)
    assert code == 2 and "every sample lacks its mask" in text
    assert f"expected {tmp_path / 'd' / 'masks' / 's0.png'}" in text
    assert "mask_dir" in text and "mask_suffix" in text and "mask_dir: null" in text


def test_validate_reports_an_empty_folder_and_unreadable_images(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    home = _project(tmp_path)
    (tmp_path / "empty" / "images").mkdir(parents=True)
    (tmp_path / "empty" / "masks").mkdir(parents=True)
    junk = tmp_path / "junk"
    for i in range(2):
        (junk / "images").mkdir(parents=True, exist_ok=True)
        (junk / "images" / f"s{i}.png").write_text("not an image at all")
    monkeypatch.setenv("MEDROBUST_HOME", str(home))
    p = _suite(tmp_path / "s.yaml", datasets=[
        {"name": "empty", "modality": "ct", "format": "folder", "root": str(tmp_path / "empty")},
        {"name": "junk", "modality": "ct", "format": "folder", "root": str(junk), "options": {"mask_dir": None}}])
    code, lines = _validate(home, p)
    text = "\n".join(lines)
    assert code == 2
    assert f"empty (ct, folder): error: no samples found under {tmp_path / 'empty'}" in text
    assert "junk (ct, folder): error: no image decodes" in text and "s0: unreadable_image" in text


def test_validate_compares_the_checkpoints_architecture_with_arch(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from safetensors.numpy import save_file

    home = _project(tmp_path)
    _folder_dataset(tmp_path / "d")
    monkeypatch.setenv("MEDROBUST_HOME", str(home))
    tiny = {"image_encoder.patch_embed.proj.weight": np.zeros((64, 3, 16, 16), np.float32),
            "image_encoder.blocks.0.norm1.weight": np.zeros(64, np.float32),
            "image_encoder.blocks.1.norm1.weight": np.zeros(64, np.float32)}
    (tmp_path / "w1").mkdir()
    save_file(tiny, str(tmp_path / "w1" / "tiny.safetensors"))
    (tmp_path / "w2").mkdir()
    (tmp_path / "w2" / "model.pth").write_bytes(b"not read: config.json decides")
    (tmp_path / "w2" / "config.json").write_text(json.dumps({"arch": "tiny", "family": "sam"}))
    ds = [{"name": "scans", "modality": "ct", "format": "folder", "root": str(tmp_path / "d")}]
    for ck, says in ((tmp_path / "w1" / "tiny.safetensors", "holds a 64-wide, 2-block one: set arch: tiny"),
                     (tmp_path / "w2" / "model.pth", f"but {tmp_path / 'w2' / 'config.json'} says 'tiny'")):
        p = _suite(tmp_path / "s.yaml", datasets=ds,
                   segmentation={"models": [{"id": "m", "family": "sam", "arch": "vit_b", "checkpoint": str(ck)}]})
        code, lines = _validate(home, p)
        assert code == 2 and any(says in ln and "arch 'vit_b'" in ln for ln in lines), lines
        p = _suite(tmp_path / "s.yaml", datasets=ds,
                   segmentation={"models": [{"id": "m", "family": "sam", "arch": "tiny", "checkpoint": str(ck)}]})
        code, lines = _validate(home, p)
        assert code == 0, lines
    assert encoder_shape({"module.image_encoder.patch_embed.proj.weight": [768, 3, 16, 16],
                          **{f"module.image_encoder.blocks.{i}.x": [1] for i in range(12)}}) == (768, 12)
    assert checkpoint_arch_error("m", "tiny", tmp_path / "w1" / "tiny.safetensors") is None


def test_a_safetensors_file_with_lying_offsets_fails_validate(tmp_path: Path) -> None:
    """Issue 44, finding 12: the header's data_offsets must span each tensor's shape x dtype inside the
    file (validate read only the shapes, so a file refused at load passed)."""
    import struct

    import torch
    from safetensors.torch import save_file

    good = tmp_path / "good.safetensors"
    save_file({"image_encoder.patch_embed.proj.weight": torch.zeros(64, 3, 16, 16),
               "image_encoder.blocks.0.norm1.weight": torch.zeros(64),
               "image_encoder.blocks.1.norm1.weight": torch.zeros(64)}, str(good))
    assert checkpoint_arch_error("m", "tiny", good) is None
    raw = good.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    entry = header["image_encoder.blocks.0.norm1.weight"]
    entry["data_offsets"] = [entry["data_offsets"][0], entry["data_offsets"][1] + 10_000_000]  # past the end
    text = json.dumps(header).encode()
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + n :])
    err = checkpoint_arch_error("m", "tiny", bad) or ""
    assert "cannot read checkpoint" in err and "data_offsets" in err, err


def test_validate_of_the_committed_tiny_sam_weights() -> None:
    w = ROOT / "medrobust_lib" / "demo" / "weights" / "tiny-sam"
    ck = next(p for p in w.iterdir() if p.suffix in (".pth", ".safetensors"))
    assert checkpoint_arch_error("tiny-sam", "tiny", ck) is None
    assert "says 'tiny'" in (checkpoint_arch_error("tiny-sam", "vit_b", ck) or "")


def test_validate_library_call_reports_isolation(tmp_path: Path) -> None:
    home = _project(tmp_path)
    rep = validate_suite(_suite(tmp_path / "s.yaml", results_dir="var/results"), root=home)
    assert not rep.ok and any("both write" in e for e in rep.errors)


# --- refusals to overwrite inputs ----------------------------------------------------------------

def _mart(tmp_path: Path) -> Path:
    import duckdb

    m = tmp_path / "m.duckdb"
    con = duckdb.connect(str(m))
    con.execute("create table t as select 1 as x")
    con.close()
    return m


def test_query_out_refuses_the_mart_and_the_suite(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    m = _mart(tmp_path)
    before = m.read_bytes()
    for out in (m, tmp_path / "." / "m.duckdb"):
        res = runner.invoke(app, ["query", "select * from t", "--mart", str(m), "-f", "csv", "--out", str(out)])
        assert res.exit_code == 2 and "refusing to write" in res.stderr and len(_lines(res)) == 1, res.output
    os.link(m, tmp_path / "alias.duckdb")
    res = runner.invoke(app, ["query", "select * from t", "--mart", str(m), "-f", "csv",
                              "--out", str(tmp_path / "alias.duckdb")])
    assert res.exit_code == 2 and "refusing to write" in res.stderr
    assert m.read_bytes() == before
    home = _project(tmp_path)
    monkeypatch.setenv("MEDROBUST_HOME", str(home))
    p = _suite(tmp_path / "s.yaml", mart_path=str(m), results_dir=str(tmp_path / "res"))
    res = runner.invoke(app, ["query", "select * from t", "--suite", str(p), "-f", "csv", "--out", str(p)])
    assert res.exit_code == 2 and "refusing to write" in res.stderr
    res = runner.invoke(app, ["query", "select * from t", "--suite", str(p), "-f", "csv",
                              "--out", str(tmp_path / "ok.csv")])
    assert res.exit_code == 0 and (tmp_path / "ok.csv").read_text().split() == ["x", "1"]


def test_perturb_output_refuses_its_inputs(tmp_path: Path, gray_image: np.ndarray) -> None:
    img = tmp_path / "cam.png"
    Image.fromarray((gray_image * 255).astype(np.uint8)).save(img)
    mask = tmp_path / "m.png"
    m = np.zeros((128, 128), np.uint8)
    m[40:60, 40:60] = 255
    Image.fromarray(m).save(mask)
    before = img.read_bytes(), mask.read_bytes()
    for out in (img, tmp_path / "sub" / ".." / "cam.png", mask):
        res = runner.invoke(app, ["perturb", str(img), "-t", "gaussian_noise", "-l", "2", "--mask", str(mask),
                                  "-o", str(out)])
        assert res.exit_code == 2 and "refusing to write" in res.stderr and len(_lines(res)) == 1, res.output
    assert (img.read_bytes(), mask.read_bytes()) == before


def test_query_spills_to_a_private_folder_outside_the_mart(tmp_path: Path) -> None:
    from medrobust_lib.store.query import connect_sandboxed, run_query

    m = _mart(tmp_path)
    (tmp_path / "m.duckdb.tmp").mkdir()  # DuckDB's default spill folder exists beside the mart
    with tempfile.TemporaryDirectory(prefix="medrobust-query-") as spill:
        con = connect_sandboxed(m, spill_dir=spill)
        try:
            got = con.execute("select current_setting('temp_directory')").fetchone()
        finally:
            con.close()
        assert got is not None and Path(got[0]) == Path(spill)
        assert stat.S_IMODE(os.stat(spill).st_mode) == 0o700
        assert not Path(spill).is_relative_to(tmp_path)
    con = connect_sandboxed(m)
    try:
        size = con.execute("select current_setting('max_temp_directory_size')").fetchone()
    finally:
        con.close()
    assert size is not None and size[0].startswith("0")
    assert run_query(m, "select count(*) as n from range(100000)")["n"].tolist() == [100000]
    assert list((tmp_path / "m.duckdb.tmp").iterdir()) == []


# --- smaller inconsistencies ---------------------------------------------------------------------

def test_query_help_states_the_exit_code_a_failing_query_has(tmp_path: Path) -> None:
    res = runner.invoke(app, ["query", "--help"], terminal_width=100)
    assert "a failing query" in res.stdout and "exits 2" in " ".join(res.stdout.split())
    m = _mart(tmp_path)
    assert runner.invoke(app, ["query", "select nope from t", "--mart", str(m)]).exit_code == 2


@pytest.mark.parametrize("columns", [60, 80, 120])
def test_list_perturbations_wraps_to_the_terminal(monkeypatch: pytest.MonkeyPatch, columns: int) -> None:
    from medrobust_lib.perturb.spec import get_perturbation, list_perturbations

    monkeypatch.setenv("COLUMNS", str(columns))
    res = runner.invoke(app, ["list-perturbations"])
    assert res.exit_code == 0
    lines = res.stdout.splitlines()
    assert max(len(ln) for ln in lines) <= columns
    text = " ".join(res.stdout.split())
    for name in list_perturbations():
        assert any(ln.startswith(name + " ") for ln in lines)
        assert " ".join(get_perturbation(name).reference.split()) in text


def test_demo_suite_option_takes_demo_suites_only(tmp_path: Path) -> None:
    p = _suite(tmp_path / "mine.yaml")
    res = runner.invoke(app, ["demo", "--suite", str(p)])
    assert res.exit_code == 2 and f"medrobust run --suite {p}" in res.stderr and len(_lines(res)) == 1


# --- failures in at most three lines, never "internal" for bad input, Ctrl-C -----------------

def test_six_kinds_of_failure_each_print_at_most_three_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             gray_image: np.ndarray) -> None:
    home = _project(tmp_path)
    monkeypatch.setenv("MEDROBUST_HOME", str(home))
    m = _mart(tmp_path)
    deep = tmp_path / "deep.yaml"
    deep.write_text("name: x\nseed: " + "[" * 5000 + "]" * 5000)
    unknown = _suite(tmp_path / "unknown.yaml", chekpoint="x")
    clash = _suite(tmp_path / "clash.yaml", results_dir="var/results")
    (tmp_path / "notes.png").write_text("not an image")
    cases = {
        "unknown suite key": (["run", "--suite", str(unknown)], "chekpoint: unknown key"),
        "deep YAML": (["validate", "--suite", str(deep)], "nested deeper"),
        "another suite's folder": (["run", "--suite", str(clash)], "both write"),
        "missing suite": (["run", "--suite", str(tmp_path / "nope.yaml")], "suite not found"),
        "no mart": (["query", "select 1", "--mart", str(tmp_path / "none.duckdb")], "no mart at"),
        "bad SQL": (["query", "select nope from t", "--mart", str(m)], "query failed"),
        "unreadable image": (["perturb", str(tmp_path / "notes.png"), "-o", str(tmp_path / "o.png"),
                              "-t", "gaussian_noise", "-l", "1"], "unreadable_image"),
        "missing score file": (["score", "vqa", "--predictions", str(tmp_path / "p.jsonl"), "--references",
                                str(tmp_path / "r.jsonl")], "file not found"),
        "not a demo suite": (["demo", "--suite", str(_suite(tmp_path / "own.yaml"))], "is not a demo suite"),
    }
    for kind, (cmd, says) in cases.items():
        res = runner.invoke(app, cmd)
        lines = _lines(res)
        assert res.exit_code == 2, (kind, res.output, res.exception)
        assert 1 <= len(lines) <= 3 and says in lines[-1], (kind, lines)
        assert "internal" not in res.output and "Traceback" not in res.output, (kind, res.output)


def test_ctrl_c_is_interrupted_exit_130(monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(*_: object, **__: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(medrobust_cli, "_suite_file", interrupted)
    res = runner.invoke(app, ["validate", "--suite", "x.yaml"])
    assert res.exit_code == 130 and _lines(res) == ["error: interrupted"]
    monkeypatch.setitem(medrobust_cli._DEBUG, "on", False)

    @medrobust_cli.guard_errors
    def fn() -> None:
        raise KeyboardInterrupt

    with pytest.raises(typer.Exit) as err:
        fn()
    assert err.value.exit_code == 130
