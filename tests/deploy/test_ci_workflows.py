"""deploy/ci: the GitHub and GitLab robustness-gate workflows parse, trigger on a new registered
version (dispatch / pipeline trigger) and on a checkpoint change, and their own shell steps, run
by bash, produce a ``medrobust check`` command that passes a good candidate (exit 0) and fails a
degraded one (exit 1) against the champion of a real SQLite MLflow registry.

The step scripts run unchanged with a stand-in ``medrobust`` first on PATH that records its
arguments (and exits with a chosen code, to check that the step fails with it despite the ``tee``);
the recorded arguments then run through the real CLI in-process. Exit codes only: the gate's text
layout is not part of this contract.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from medrobust_cli import app
from tests.tracks.finetune.test_gate import make_rows, shift, write_results

ROOT = Path(__file__).resolve().parents[2]
GITHUB = ROOT / "deploy" / "ci" / "github-robustness-gate.yml"
GITLAB = ROOT / "deploy" / "ci" / "gitlab-robustness-gate.yml"
NAME = "medrobust-seg-tiny-sam-lora"
SHIM = """#!/bin/sh
printf '%s\\0' "$@" > "$ARGV_FILE"
echo "| stand-in gate output |"
exit "${SHIM_EXIT:-0}"
"""


def _github() -> dict[str, Any]:
    doc = yaml.safe_load(GITHUB.read_text())
    doc["on"] = doc.pop(True, doc.get("on"))  # YAML 1.1 reads the key `on` as true
    return doc


def _step(doc: dict[str, Any], name_start: str) -> dict[str, Any]:
    steps = doc["jobs"]["gate"]["steps"]
    (step,) = [s for s in steps if s.get("name", "").startswith(name_start)]
    return step


@pytest.fixture
def bin_dir(tmp_path: Path) -> Path:
    d = tmp_path / "bin"
    d.mkdir()
    (d / "medrobust").write_text(SHIM)
    (d / "medrobust").chmod(0o755)
    (d / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')  # the venv's interpreter
    (d / "python").chmod(0o755)
    return d


@pytest.fixture(scope="module")
def registry_state(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Built once: v1 champion, v2 a candidate as robust as v1, v3 one that drops more on
    gaussian_noise level 3; each version's rows stored under its registry evaluation id."""
    from medrobust_lib.store.model_registry import register_checkpoint, set_alias

    base = tmp_path_factory.mktemp("registry")
    frames = []
    for v, extra in ((1, None), (2, None), (3, {("gaussian_noise", 3): shift(0.05)})):
        ckpt = base / f"ckpt{v}"
        ckpt.mkdir()
        (ckpt / "model.safetensors").write_bytes(f"weights v{v}".encode())
        assert register_checkpoint(ckpt, NAME, tags={"strategy": "lora"}, mlruns_dir=base / "mlruns").version == v
        digest = hashlib.sha256(f"weights v{v}".encode()).hexdigest()[:16]
        frames.append(make_rows(f"{NAME}-v{v}", digest, extra))
    set_alias(NAME, "champion", 1, mlruns_dir=base / "mlruns")
    write_results(base / "results", pd.concat(frames))
    return base


@pytest.fixture
def registry(registry_state: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """This test's copy of the registry (SQLite store) and the shared results, as the CI variables."""
    mlruns = tmp_path / "mlruns"
    shutil.copytree(registry_state / "mlruns", mlruns)
    monkeypatch.setenv("MEDROBUST_MLRUNS", str(mlruns))  # restored after the test (the CLI sets it too)
    return {"MEDROBUST_MLRUNS": str(mlruns), "MEDROBUST_RESULTS_DIR": str(registry_state / "results"),
            "MEDROBUST_GATE_SUITE": str(ROOT / "configs" / "demo.yaml"), "MEDROBUST_GATE_EVALUATE": "--no-evaluate"}


def _bash(script: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", script], env=env, cwd=cwd, capture_output=True, text=True, timeout=120)


def _env(bin_dir: Path, tmp_path: Path, **extra: str) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if k in ("HOME", "LANG", "LC_ALL", "TMPDIR")}
    return {**keep, "PATH": f"{bin_dir}:/usr/bin:/bin", "ARGV_FILE": str(tmp_path / "argv"), **extra}


def _run_recorded(tmp_path: Path) -> int:
    argv = (tmp_path / "argv").read_bytes().split(b"\0")[:-1]
    args = [a.decode() for a in argv]
    assert args[0] == "check"
    return CliRunner().invoke(app, args).exit_code


def _github_env_file(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if line)


# ---------------------------------------------------------------- GitHub Actions


def test_github_workflow_triggers() -> None:
    doc = _github()
    on = doc["on"]
    assert set(on["workflow_dispatch"]["inputs"]) == {"model_name", "model_version"}
    assert on["repository_dispatch"]["types"] == ["model-version-registered"]
    assert any("model.safetensors" in p for p in on["pull_request"]["paths"])
    gate = _step(doc, "Robustness gate")
    assert "medrobust check" in gate["run"] and "$GITHUB_STEP_SUMMARY" in gate["run"]
    assert "@champion" in gate["run"] and "pipefail" in gate["run"]
    assert doc["permissions"] == {"contents": "read"}


@pytest.mark.parametrize("version, expected", [("2", 0), ("3", 1)])
def test_github_steps_run_the_gate(version: str, expected: int, tmp_path: Path, bin_dir: Path,
                                   registry: dict[str, str]) -> None:
    doc = _github()
    gh_env, summary = tmp_path / "github_env", tmp_path / "summary.md"
    gh_env.touch()
    env = _env(bin_dir, tmp_path, GITHUB_ENV=str(gh_env), GITHUB_STEP_SUMMARY=str(summary), **registry)
    resolve = _bash(_step(doc, "Resolve the candidate")["run"],
                    {**env, "INPUT_MODEL_NAME": NAME, "INPUT_MODEL_VERSION": version}, tmp_path)
    assert resolve.returncode == 0, resolve.stderr
    env.update(_github_env_file(gh_env))
    assert env["GATE_CANDIDATE"] == f"models:/{NAME}/{version}"
    gate = _step(doc, "Robustness gate")["run"]
    done = _bash(gate, env, ROOT)
    assert done.returncode == 0, done.stderr
    assert "stand-in gate output" in summary.read_text()
    assert _run_recorded(tmp_path) == expected
    failing = _bash(gate, {**env, "SHIM_EXIT": "1"}, ROOT)  # a failing gate fails the step through the tee
    assert failing.returncode == 1


def test_github_resolve_refuses_bad_input(tmp_path: Path, bin_dir: Path) -> None:
    gh_env = tmp_path / "github_env"
    env = _env(bin_dir, tmp_path, GITHUB_ENV=str(gh_env), INPUT_MODEL_NAME="x; rm -rf /", INPUT_MODEL_VERSION="1")
    assert _bash(_step(_github(), "Resolve the candidate")["run"], env, tmp_path).returncode == 2
    assert not gh_env.exists() or gh_env.read_text() == ""


@pytest.mark.slow  # a Python subprocess imports MLflow to register (about 10 s); the dispatch paths above run always
def test_github_pull_request_registers_the_changed_checkpoint(tmp_path: Path, bin_dir: Path,
                                                              registry: dict[str, str]) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    (repo / "README").write_text("x")
    subprocess.run([*git, "add", "-A"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "base"], cwd=repo, check=True)
    base = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, check=True, capture_output=True,
                          text=True).stdout.strip()
    (repo / "checkpoints" / "lora").mkdir(parents=True)
    (repo / "checkpoints" / "lora" / "model.safetensors").write_bytes(b"weights v2")  # as robust as v1
    subprocess.run([*git, "add", "-A"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "new checkpoint"], cwd=repo, check=True)
    gh_env = tmp_path / "github_env"
    gh_env.touch()
    env = _env(bin_dir, tmp_path, GITHUB_ENV=str(gh_env), GITHUB_STEP_SUMMARY=str(tmp_path / "s.md"),
               MODEL_NAME=NAME, BASE_SHA=base, GITHUB_SHA="0" * 40, PYTHONPATH=str(ROOT),
               MLFLOW_DISABLE_TELEMETRY="true", **registry)
    reg = _bash(_step(_github(), "Register the changed checkpoint")["run"], env, repo)
    assert reg.returncode == 0, reg.stderr
    assert f"models:/{NAME}/4" in reg.stdout
    env.update(_github_env_file(gh_env))
    assert env["GATE_CANDIDATE"] == f"models:/{NAME}@candidate"
    assert _bash(_step(_github(), "Robustness gate")["run"], env, ROOT).returncode == 0
    # v4 has the weights of v2, whose rows the gate reuses: it passes
    assert _run_recorded(tmp_path) == 0


# ---------------------------------------------------------------- GitLab CI


def test_gitlab_job_triggers() -> None:
    job = yaml.safe_load(GITLAB.read_text())["robustness-gate"]
    rules = job["rules"]
    assert any("trigger" in r["if"] and "$MODEL_VERSION" in r["if"] for r in rules)
    (mr,) = [r for r in rules if "merge_request_event" in r["if"]]
    assert any("model.safetensors" in c for c in mr["changes"])
    assert "robustness-gate.md" in job["artifacts"]["paths"] and job["artifacts"]["when"] == "always"


@pytest.mark.parametrize("version, expected", [("2", 0), ("3", 1)])
def test_gitlab_script_runs_the_gate(version: str, expected: int, tmp_path: Path, bin_dir: Path,
                                     registry: dict[str, str]) -> None:
    job = yaml.safe_load(GITLAB.read_text())["robustness-gate"]
    variables = {k: str(v) for k, v in job["variables"].items()}
    env = _env(bin_dir, tmp_path, **{**variables, **registry}, CI_PIPELINE_SOURCE="trigger", MODEL_NAME=NAME,
               MODEL_VERSION=version)
    script = "\n".join(job["script"])
    work = tmp_path / "work"
    work.mkdir()
    done = _bash(script, env, work)
    assert done.returncode == 0, done.stderr
    assert "stand-in gate output" in (work / "robustness-gate.md").read_text()
    assert _run_recorded(tmp_path) == expected
    assert _bash(script, {**env, "SHIM_EXIT": "1"}, work).returncode == 1
