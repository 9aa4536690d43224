"""Code locations for suites other than the demo: ``medrobust ui --suite my.yaml`` (and the
deploy recipes) write one here.

A location is a Python file of two lines, ``defs = definitions_for_file("<suite path>")``, and a
Dagster workspace file that loads it with the project root as working directory, both under
``var/locations/<suite name>/`` of the project. The suite is named in the file, never in an
environment variable. Plain standard library: importing this module imports no Dagster."""

from __future__ import annotations

import json
from pathlib import Path

LOCATIONS_DIR = Path("var") / "locations"
"""Where generated locations live, relative to the project root."""


def location_source(suite_path: Path) -> str:
    """The text of the location module of the suite at ``suite_path`` (an absolute path)."""
    return (f'"""Code location of the suite {suite_path} (written by `medrobust ui --suite`; '
            'regenerated on every call)."""\n\n'
            "from medrobust_assets.definitions import definitions_for_file\n\n"
            f"defs = definitions_for_file({json.dumps(str(suite_path))})\n")


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
