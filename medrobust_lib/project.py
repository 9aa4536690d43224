"""Where the project's files are, independent of the current directory.

Suites name their paths (``results_dir``, ``mart_path``, data roots, ``mlruns``) relative to the
project root. :func:`project_root` finds that root so a command run from any directory reads and
writes the same files as one run from the root:

1. ``$MEDROBUST_HOME`` when set (must be a folder);
2. else, for a command given a suite file, the nearest of the suite file's ancestors that holds
   ``configs/demo.yaml`` (a suite inside a project belongs to it, whichever folder the command
   starts in);
3. else the nearest of the current directory and its ancestors that holds ``configs/demo.yaml``;
4. else the checkout this module was imported from, when it holds ``configs/demo.yaml``
   (a clone or an editable install);
5. else the current directory.
"""

from __future__ import annotations

import os
from pathlib import Path

MARKER = Path("configs") / "demo.yaml"
"""A folder holding this file is a medrobust project root."""


def project_root(suite: Path | str | None = None) -> Path:
    """The absolute project root (see the module docstring); ``suite``: the suite file a command
    was given, if any. Raises NotADirectoryError when ``$MEDROBUST_HOME`` names something that is
    not a folder."""
    env = os.environ.get("MEDROBUST_HOME")
    if env:
        p = Path(env).expanduser().resolve()
        if not p.is_dir():
            raise NotADirectoryError(f"MEDROBUST_HOME={env!r} is not a folder")
        return p
    if suite is not None:
        for d in Path(suite).expanduser().resolve().parents:
            if (d / MARKER).is_file():
                return d
    cwd = Path.cwd().resolve()
    for d in (cwd, *cwd.parents):
        if (d / MARKER).is_file():
            return d
    checkout = Path(__file__).resolve().parent.parent
    if (checkout / MARKER).is_file():
        return checkout
    return cwd


def in_project(path: str | Path, root: Path | None = None) -> Path:
    """``path`` unchanged when absolute, else joined to the project root (``root`` or
    :func:`project_root`)."""
    p = Path(path).expanduser()
    return p if p.is_absolute() else (root or project_root()) / p


__all__ = ["MARKER", "in_project", "project_root"]
