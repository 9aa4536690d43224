"""Your own suite next to a finished demo, run as a user runs it (the real CLI, in subprocesses,
from another working directory, with the project root given by MEDROBUST_HOME):

- the shipped example suite (configs/example_real.yaml, its data pointed at a temp folder with
  MEDROBUST_DATA, the documented mechanism) leaves every file of the demo unchanged (hashes) and
  writes only under var/real/;
- the path rule: a suite's relative paths land under the project root, nothing in the current
  folder, and the printed hint works as printed from a third folder;
- a failed step prints at most three lines, names asset and partition, says what to run next, is
  a user error (exit 2), never "internal"; Ctrl-C prints "interrupted" and exits 130.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.data.test_imageio import ct_file
from tests.data.test_readers import _busi, image_u8, rect_mask, save, save_mask

ROOT = Path(__file__).resolve().parents[2]
CLI = ROOT / "medrobust_cli.py"
pytestmark = pytest.mark.slow

SMALL_DEMO = {
    "name": "demo", "seed": 0, "results_dir": "var/results", "mart_path": "var/marts.duckdb", "workers": 1,
    "modalities": ["ct"],
    "demo": {"enabled": True, "root": "var/data/demo", "n_per_modality": 4, "seed": 0},
    "perturbations": {"include": ["gaussian_noise", "rotation"], "levels": [2], "split": "all",
                      "calibration_subset": 2},
}


PROGRESS = re.compile(r"^(== .*|  \S.*\s\d+\.\d s|    \[\S+\] .* \d+/\d+ .*)$")
"""A progress line of the runner: a stage header, a step with its seconds, or a running partition's
count (``    [asset[partition]] perturbed images 12/40 (30 %), ...``)."""

def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DAGSTER_HOME", "MEDROBUST_DEBUG")}
    env.update({"MEDROBUST_HOME": str(home), "PYTHONPATH": str(ROOT), **extra})
    return env


def _cli(args: list[str], cwd: Path, env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(CLI), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def _hashes(folder: Path, skip: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder).as_posix()
        if p.is_file() and not any(rel == s or rel.startswith(s + "/") for s in skip):
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _example_data(data: Path) -> None:
    """The example's four datasets in their published layouts, a few images each."""
    hw = (48, 48)
    for i, sid in enumerate(["ISIC_0000000", "ISIC_0000001", "ISIC_0000002"]):
        save(data / "ISIC2016" / "ISBI2016_ISIC_Part1_Test_Data" / f"{sid}.jpg", image_u8(hw, sid), quality=95)
        save_mask(data / "ISIC2016" / "ISBI2016_ISIC_Part1_Test_GroundTruth" / f"{sid}_Segmentation.png",
                  rect_mask(hw, 5 + i, 6, 30, 33))
    for i, sid in enumerate(["cju0qkwl35piu0993l0dewei2", "cju0qoxqj9q6s0835b43399p4"]):
        save(data / "Kvasir-SEG" / "images" / f"{sid}.jpg", image_u8(hw, sid), quality=90)
        save_mask(data / "Kvasir-SEG" / "masks" / f"{sid}.jpg", rect_mask(hw, 8, 10 + i, 30, 40), quality=75)
    _busi(data)
    for i in range(2):
        stored = np.full((32, 32), 1024, np.int16)
        stored[8:20, 8:20] = 1024 + 200
        ct_file(data / "ct_slices" / f"slice{i}.dcm", stored)
        save_mask(data / "ct_slices" / "masks" / f"slice{i}.png", rect_mask((32, 32), 8, 8, 20, 20))


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project root (MEDROBUST_HOME) with a small finished demo, run from another folder."""
    base = tmp_path_factory.mktemp("own")
    home = base / "proj"
    (home / "configs").mkdir(parents=True)
    (home / "configs" / "demo.yaml").write_text(yaml.safe_dump(SMALL_DEMO))
    elsewhere = base / "elsewhere"
    elsewhere.mkdir()
    res = _cli(["run", "--suite", "../proj/configs/demo.yaml"], elsewhere, _env(home))
    assert res.returncode == 0, res.stderr
    assert list(elsewhere.iterdir()) == [], "nothing is written in the current folder"
    assert (home / "var" / "marts.duckdb").is_file() and (home / "var" / "results").is_dir()
    assert (home / "var" / "dagster" / "storage").is_dir(), "runs go to a persistent instance under the root"
    (base / "hint.txt").write_text(res.stdout)
    return home


def test_the_printed_hint_works_as_printed_from_another_folder(project: Path) -> None:
    out = (project.parent / "hint.txt").read_text()
    assert f"Mart: {project / 'var' / 'marts.duckdb'}" in out
    hint = out.split("(", 1)[1].rsplit(")", 1)[0]  # medrobust query --suite /abs/demo.yaml "SQL"
    argv = shlex.split(hint)
    assert argv[0] == "medrobust" and argv[-1] == "SQL"
    third = project.parent / "third"
    third.mkdir(exist_ok=True)
    env = _env(project)
    env.pop("MEDROBUST_HOME")  # the hint names the suite by its absolute path: no variable needed
    res = _cli([*argv[1:-1], "select count(*) as n from perturbation_manifest"], third, env)
    assert res.returncode == 0, res.stderr
    assert int(res.stdout.split()[-1]) > 0


def test_the_example_suite_leaves_the_demo_untouched(project: Path, tmp_path: Path) -> None:
    _example_data(tmp_path / "data")
    skip = ("dagster", ".suites", "real")  # the shared Dagster instance, the claims, the example's own
    before = _hashes(project / "var", skip)
    assert any(k.startswith("results/") for k in before) and "marts.duckdb" in before
    res = _cli(["run", "--suite", str(ROOT / "configs" / "example_real.yaml"), "--select", "datasets",
                "--select", "marts"], tmp_path, _env(project, MEDROBUST_DATA=str(tmp_path / "data")))
    assert res.returncode == 0, res.stderr
    assert _hashes(project / "var", skip) == before
    assert (project / "var" / "real" / "marts.duckdb").is_file()
    tables = {p.name for p in (project / "var" / "real" / "results").iterdir()}
    assert tables, "the example wrote its own results"
    res = _cli(["query", "--suite", str(ROOT / "configs" / "example_real.yaml"),
                "select count(distinct dataset) as n from clean_samples"], tmp_path,
               _env(project, MEDROBUST_DATA=str(tmp_path / "data")))
    assert res.returncode == 0 and res.stdout.split()[-1] == "4", res.stdout + res.stderr


def test_a_failed_step_is_at_most_three_lines(project: Path, tmp_path: Path) -> None:
    suite = tmp_path / "broken.yaml"
    suite.write_text(yaml.safe_dump({"name": "broken", "modalities": ["ct"], "datasets": [
        {"name": "scans", "modality": "ct", "format": "folder", "root": "data/missing"}]}))
    res = _cli(["run", "--suite", suite.name, "--select", "clean_samples"], tmp_path, _env(project))
    lines = [ln for ln in (res.stdout + res.stderr).splitlines() if ln.strip()]
    assert res.returncode == 2 and len(lines) <= 3, lines
    last = lines[-1]
    assert last.startswith("error: clean_samples[ct] failed: ") and str(project / "data" / "missing") in last
    assert f"medrobust validate --suite {suite}" in last and "--select clean_samples" in last
    assert "internal" not in res.stdout + res.stderr and "Traceback" not in res.stdout + res.stderr
    debug = _cli(["--debug", "run", "--suite", str(suite), "--select", "clean_samples"], tmp_path, _env(project))
    assert debug.returncode == 2 and 'File "' in debug.stderr and "index_folder" in debug.stderr  # the stack


def test_ctrl_c_prints_interrupted_and_exits_130(project: Path, tmp_path: Path) -> None:
    suite = tmp_path / "big.yaml"
    suite.write_text(yaml.safe_dump({**SMALL_DEMO, "name": "big", "results_dir": "var/big/results",
                                     "mart_path": "var/big/marts.duckdb", "modalities": ["ct", "mri", "xray"],
                                     "demo": {"enabled": True, "root": "var/big/data", "n_per_modality": 24}}))
    proc = subprocess.Popen([sys.executable, str(CLI), "run", "--suite", str(suite)], cwd=tmp_path,
                            env=_env(project), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    t0 = time.monotonic()
    seen = []
    while time.monotonic() - t0 < 300:  # wait until a materialization runs
        line = proc.stderr.readline()
        seen.append(line)
        if line.startswith("== ") or not line:
            break
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    lines = [ln for ln in (out + err).splitlines() if ln.strip()]
    assert proc.returncode == 130, (seen, out, err)
    # progress lines of the steps that finished before the interrupt reached the runner are normal
    # output; what the interrupt itself prints is at most 3 lines, the last one saying so
    said = [ln for ln in lines if not PROGRESS.match(ln)]
    assert "interrupted" in said[-1] and len(said) <= 3, lines
    assert "internal" not in out + err
