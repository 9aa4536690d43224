"""The demo's code location (``workspace.yaml`` at the project root loads it): the Definitions
of ``configs/demo.yaml`` in the project root, built with :func:`definitions_for`.

Another suite's location is a file of the same two lines that ``medrobust ui --suite`` writes
(:mod:`medrobust_assets.location_files`); no environment variable chooses the suite. Both pin the suite file and the MLflow store, so resource
config sent with a launch (the UI's launchpad) cannot point a run elsewhere (issue 44, finding 4)."""

from __future__ import annotations

from medrobust_assets.definitions import definitions_for_file
from medrobust_lib.project import MARKER, project_root

defs = definitions_for_file(project_root() / MARKER, pin=True)  # launch config cannot move its paths
