"""The location files of suites other than the demo (the demo's code location is
:mod:`medrobust_assets.location`): ``medrobust ui --suite my.yaml`` (and the deploy recipes) write one
with this module.

A location is a Python file of two lines, ``defs = definitions_for_file("<suite path>", pin=True)``, and a
Dagster workspace file that loads it with the project root as working directory, both under
``var/locations/<suite name>/`` of the project. The suite is named in the file, never in an
environment variable. Plain standard library: importing this module imports no Dagster.

Each suite also has a Dagster instance of its own (:func:`suite_instance_home`): its runs, asset
materializations, sensor cursors and dynamic partitions live under the suite's own Dagster state
folder (:attr:`medrobust_lib.paths.SuitePaths.dagster_state`, ``var/<suite name>/dagster``), so
one suite's ``litemedsam/perturbed_predictions`` never shows another suite's materialization
(docs/deployment.md, "One suite, one Dagster instance")."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from medrobust_lib.paths import suite_paths

LOCATIONS_DIR = Path("var") / "locations"
"""Where generated locations live, relative to the project root."""


def location_source(suite_path: Path) -> str:
    """The text of the location module of the suite at ``suite_path`` (an absolute path)."""
    # the path reaches the generated code only through repr(): a file name holding quotes, triple
    # quotes or newlines stays one string literal (issue 44, finding 5)
    return ('"""Code location of one suite (written by `medrobust ui --suite`; regenerated on every call)."""\n\n'
            "from medrobust_assets.definitions import definitions_for_file\n\n"
            f"SUITE = {str(suite_path)!r}\n"
            "defs = definitions_for_file(SUITE, pin=True)\n")


def write_location(suite_path: str | Path, suite_name: str, root: Path) -> Path:
    """Write ``<root>/var/locations/<suite_name>/location.py`` and ``workspace.yaml`` for the
    suite at ``suite_path``; returns the workspace file (for ``dagster dev -w``). The location's
    name is the suite's name; runs execute with ``root`` as working directory."""
    folder = root / LOCATIONS_DIR / suite_name
    folder.mkdir(parents=True, exist_ok=True)
    module = folder / "location.py"
    module.write_text(location_source(Path(suite_path).resolve()))
    workspace = folder / "workspace.yaml"
    workspace.write_text(  # JSON strings are valid YAML scalars: any path quotes safely
        "load_from:\n  - python_file:\n"
        f"      relative_path: {json.dumps(str(module))}\n"
        f"      working_directory: {json.dumps(str(root.resolve()))}\n"
        f"      location_name: {json.dumps(suite_name)}\n")
    return workspace


class _SuiteLocations(Protocol):
    name: str
    results_dir: str
    mart_path: str


PROJECT_STATE_DIR = Path("var") / "dagster"
"""The storage folder of the project's own dagster.yaml (relative to the project root): the
Dagster state folder of the demo suite, whose instance is the project root's dagster.yaml itself."""

DEFAULT_INSTANCE_YAML = """\
storage:
  sqlite:
    base_dir: var/dagster/storage
local_artifact_storage:
  module: dagster._core.storage.root
  class: LocalArtifactStorage
  config:
    base_dir: var/dagster
compute_logs:
  module: dagster._core.storage.local_compute_log_manager
  class: LocalComputeLogManager
  config:
    base_dir: var/dagster/logs
telemetry:
  enabled: false
nux:
  enabled: false
"""
"""The instance a suite gets when the project root has no dagster.yaml to copy."""

_BASE_DIR = re.compile(r"^(?P<lead>\s*base_dir:\s*)[\"']?var/dagster(?P<rest>/[^\"'\s#]*)?[\"']?\s*$")


def instance_yaml(template: str, state_dir: Path) -> str:
    """``template`` (the project's dagster.yaml) with every ``base_dir: var/dagster...`` moved to
    the absolute ``state_dir``: the same instance settings (run queue, run monitoring, telemetry,
    nux), the suite's own storage."""
    out = []
    for line in template.splitlines():
        m = _BASE_DIR.match(line)
        if m:
            line = f"{m['lead']}{json.dumps(str(state_dir) + (m['rest'] or ''))}"
        out.append(line)
    return ("# Dagster instance of one suite, written by medrobust (medrobust_assets/location_files.py) from the\n"
            "# project's dagster.yaml on every run and `medrobust ui --suite`: edit that file, not this one.\n"
            + "\n".join(out) + "\n")


def suite_instance_home(suite: _SuiteLocations, root: Path, environ: Mapping[str, str] | None = None) -> Path:
    """The ``DAGSTER_HOME`` of ``suite`` (a :class:`medrobust_lib.config.Suite`) in the project at
    ``root``; writes its dagster.yaml when it is the suite's own.

    - ``$DAGSTER_HOME`` set to a folder other than the project root: that instance (a deployment's
      PostgreSQL instance, a test's folder), as given: whoever sets it chose what it holds.
    - The demo (Dagster state ``var/dagster``, the storage of the project's dagster.yaml): the
      project root, whose dagster.yaml is the demo's instance (unchanged since before suites had
      instances of their own; ``make demo`` and ``make ui`` keep working as they did).
    - Any other suite: its Dagster state folder (``var/<suite name>/dagster``), with a dagster.yaml
      copied from the project's (:func:`instance_yaml`), rewritten each call so edits of the
      project's file reach every suite.
    """
    env = os.environ if environ is None else environ
    root = root.resolve()
    given = env.get("DAGSTER_HOME")
    if given and Path(given).expanduser().resolve() != root:
        return Path(given).expanduser()
    state = suite_paths(suite, base=root).dagster_state.resolve()
    project_yaml = root / "dagster.yaml"
    if state == (root / PROJECT_STATE_DIR).resolve() and project_yaml.is_file():
        return root
    state.mkdir(parents=True, exist_ok=True)
    template = project_yaml.read_text() if project_yaml.is_file() else DEFAULT_INSTANCE_YAML
    text = instance_yaml(template, state)
    target = state / "dagster.yaml"
    if not target.is_file() or target.read_text() != text:
        tmp = state / f".dagster.yaml.{os.getpid()}"
        tmp.write_text(text)
        os.replace(tmp, target)  # a concurrent reader sees the old file or the new one, never half of one
    return state
