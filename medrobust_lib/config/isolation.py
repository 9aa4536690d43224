"""Every suite's outputs are its own: :func:`check_isolation` refuses a suite whose output folders
or mart are another suite's, :func:`record_claim` remembers which suite uses which folders.

A suite's outputs (:func:`medrobust_lib.paths.suite_paths`: results, mart, checkpoints, cache,
reports, galleries, Dagster state, and the demo data when the demo is enabled) default to
``var/<name>/``; the demo keeps ``var/results`` and ``var/marts.duckdb``. Two suites *with the same
name* are one suite (``configs/demo.yaml`` and ``configs/demo_full.yaml``). Two suites with
different names conflict when an output of one is, or lies inside, an output of the other.

The other suites are the project's own suite files (``configs/*.yaml``) and every suite that ran
here before (a claim file per suite name in ``var/.suites/``, written by ``medrobust run`` and
``medrobust demo``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from medrobust_lib.config.suite import Suite, load_suite
from medrobust_lib.paths import suite_paths

CLAIMS_DIR = Path("var") / ".suites"
"""Claim files, relative to the project root: ``<suite name>.json``."""


@dataclass(frozen=True)
class Claim:
    """The outputs of one suite, absolute: ``folders`` maps a label to a path."""

    name: str
    source: str
    folders: dict[str, Path]
    claim_file: str = ""
    """The claim file this came from (empty: a suite file of the project)."""

    def to_json(self) -> str:
        return json.dumps({"name": self.name, "suite": self.source,
                           "folders": {k: str(v) for k, v in self.folders.items()}}, indent=1, sort_keys=True)


def claim_of(suite: Suite, source: str | Path, root: Path) -> Claim:
    """The outputs of ``suite`` (read from ``source``), relative paths joined to the project ``root``."""
    loc = suite_paths(suite, base=root)
    folders = {"results folder": loc.results, "mart": loc.mart, "checkpoints": loc.checkpoints,
               "cache": loc.cache, "reports": loc.reports, "galleries": loc.galleries,
               "dagster state": loc.dagster_state}
    if suite.demo.enabled:
        data = Path(suite.demo.root).expanduser()
        folders["demo data"] = data if data.is_absolute() else root / data
    return Claim(suite.name, str(Path(source).resolve()), {k: _norm(v) for k, v in folders.items()})


def _norm(p: Path) -> Path:
    """The path with every existing symlink resolved (``var/alias -> sa`` is ``sa``: a suite cannot
    reach another's folders through a link; issue 44, finding 8), absolute and normalised."""
    return Path(os.path.realpath(os.path.normpath(p.expanduser().absolute())))


def _inside(a: Path, b: Path) -> bool:
    return a == b or b in a.parents


def _read_claim(path: Path) -> Claim | None:
    try:
        data = json.loads(path.read_text())
        return Claim(str(data["name"]), str(data["suite"]),
                     {str(k): _norm(Path(v)) for k, v in data["folders"].items()}, str(path))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None  # a damaged claim file claims nothing


def known_claims(root: Path) -> list[Claim]:
    """The claims of the project's suite files (``configs/*.yaml`` that load) and of the suites
    recorded in ``var/.suites/``."""
    out: list[Claim] = []
    for f in sorted((root / "configs").glob("*.yaml")):
        try:
            out.append(claim_of(load_suite(f), f, root))
        except (OSError, ValueError):
            continue  # a broken suite file is its own command's error
    claims = root / CLAIMS_DIR
    if claims.is_dir():
        out.extend(c for f in sorted(claims.glob("*.json")) if (c := _read_claim(f)) is not None)
    return out


def conflict(mine: Claim, other: Claim) -> str | None:
    """One line naming both suites and the shared folder, or None when they share nothing."""
    if mine.name == other.name:
        return None
    for label, path in mine.folders.items():
        for olabel, opath in other.folders.items():
            if _inside(path, opath) or _inside(opath, path):
                shared = path if _inside(path, opath) else opath
                what = label if label == olabel else f"{label} of {mine.name!r}, {olabel} of {other.name!r}"
                return (f"suites {mine.name!r} ({mine.source}) and {other.name!r} ({other.source}) both write "
                        f"{shared} ({what}): give {mine.name!r} its own results_dir and mart_path, or leave both "
                        f"out to use var/{mine.name}/"
                        + (f" (if {other.name!r} is gone, delete {other.claim_file})" if other.claim_file else ""))
    return None


def check_isolation(suite: Suite, source: str | Path, root: Path) -> None:
    """Raise ValueError (one line naming both suites) when ``suite`` would write into another
    suite's outputs (see the module docstring)."""
    mine = claim_of(suite, source, root)
    for other in known_claims(root):
        msg = conflict(mine, other)
        if msg is not None:
            raise ValueError(msg)


def record_claim(suite: Suite, source: str | Path, root: Path) -> Path:
    """Remember that ``suite`` uses its outputs (``var/.suites/<name>.json``); returns the file."""
    path = root / CLAIMS_DIR / f"{suite.name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(claim_of(suite, source, root).to_json())
    os.replace(tmp, path)
    return path


__all__ = ["CLAIMS_DIR", "Claim", "check_isolation", "claim_of", "conflict", "known_claims", "record_claim"]
