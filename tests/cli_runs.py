"""Running the real CLI as a user does: a subprocess from another working folder, the project root
given by MEDROBUST_HOME (the integration tests of the own-data flow)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLI = ROOT / "medrobust_cli.py"


def cli_env(home: Path) -> dict[str, str]:
    """The environment of a user's shell with ``home`` as the project root (no DAGSTER_HOME, no debug)."""
    env = {k: v for k, v in os.environ.items() if k not in ("DAGSTER_HOME", "MEDROBUST_DEBUG")}
    env.update({"MEDROBUST_HOME": str(home), "PYTHONPATH": str(ROOT)})
    return env


def run_cli(args: list[str], cwd: Path, env: dict[str, str], timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """``medrobust <args>`` in ``cwd``; output captured, never raises for a non-zero exit."""
    return subprocess.run([sys.executable, str(CLI), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)
