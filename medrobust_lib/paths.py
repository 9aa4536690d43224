"""On-disk locations the project derives from its configuration.

:func:`suite_paths`: every folder a suite writes (results, mart, checkpoints, API caches, reports,
galleries, stored predicted masks), all under the suite's own root (the parent of its
``results_dir``; by default ``var/<suite name>/``, the demo's ``var/``), so no suite writes into
another's.
:func:`experiment_name`: the MLflow experiment a suite's runs go to (``<suite name>/<experiment>``),
so no suite logs into another's either.
:data:`RECORD_FILES`: where the embedded demo writes its VLM record files, relative to the demo
root (read by the VLM configuration when the demo is enabled, written by the demo generator).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


class _Named(Protocol):
    name: str


class _HasLocations(Protocol):
    name: str
    results_dir: str
    mart_path: str


@dataclass(frozen=True)
class SuitePaths:
    """Where a suite's outputs live (paths as given in the suite: relative ones are relative to the
    project root)."""

    root: Path
    results: Path
    mart: Path
    checkpoints: Path
    cache: Path
    reports: Path
    galleries: Path
    dagster_state: Path
    pred_masks: Path
    """The content-addressed store of predicted segmentation masks
    (:mod:`medrobust_lib.store.pred_masks`), addressed by ``segmentation_results.pred_mask_sha256``."""


def suite_paths(suite: _HasLocations, base: Path | None = None) -> SuitePaths:
    """The locations of ``suite`` (a :class:`medrobust_lib.config.Suite`); relative ones joined to
    ``base`` when given (the project root), else left relative (to the working directory)."""
    def at(p: str) -> Path:
        q = Path(p).expanduser()
        return q if base is None or q.is_absolute() else base / q

    results = at(suite.results_dir)
    root = results.parent
    return SuitePaths(root=root, results=results, mart=at(suite.mart_path), checkpoints=root / "checkpoints",
                      cache=root / "cache", reports=root / "reports", galleries=root / "galleries",
                      dagster_state=root / "dagster", pred_masks=root / "pred_masks")


def checkpoint_dir(suite: _HasLocations, model_id: str) -> Path:
    """The folder of a model's local weights: ``<suite root>/checkpoints/<model id>/`` (a trained
    or installed demo model, a fine-tuned VLM adapter under ``adapter/``)."""
    return suite_paths(suite).checkpoints / model_id


def default_locations(name: str) -> tuple[str, str]:
    """``(results_dir, mart_path)`` of a suite that names neither: ``var/<name>/results`` and
    ``var/<name>/marts.duckdb``."""
    return f"var/{name}/results", f"var/{name}/marts.duckdb"


def experiment_name(suite: _Named, experiment: str) -> str:
    """The MLflow experiment of ``suite`` (a :class:`medrobust_lib.config.Suite`) for the kind of
    run ``experiment`` (``segmentation_eval``, ``reports``, ...): ``<suite name>/<experiment>``,
    e.g. ``demo/segmentation_eval``. Registered-model names are not scoped by suite: a checkpoint
    is registered once, whichever suite evaluates it."""
    if not experiment or "/" in experiment:
        raise ValueError(f"experiment must be a non-empty name without '/', got {experiment!r}")
    return f"{suite.name}/{experiment}"


def same_file(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` name one file (the same resolved path, or one file reached through
    a hard link or a symlink)."""
    if a.expanduser().resolve() == b.expanduser().resolve():
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def refuse_input(out: Path, inputs: list[Path]) -> None:
    """Raise ValueError when writing ``out`` would overwrite one of ``inputs``."""
    for src in inputs:
        if same_file(out, src):
            raise ValueError(f"refusing to write {out}: it is the input {src} (choose another output)")


def refuse_inside(out: Path, folder: Path, what: str) -> None:
    """Raise ValueError when ``out`` lies inside ``folder`` (links resolved): e.g. a query result
    written among the result chunks would replace one (issue 44, finding 12)."""
    o, f = Path(os.path.realpath(out)), Path(os.path.realpath(folder))
    if o == f or f in o.parents:
        raise ValueError(f"refusing to write {out}: it is inside {what} {folder} (choose another output)")


RECORD_FILES: dict[str, str] = {
    "omnimedvqa": "records/omnimedvqa.json",
    "yesno_paraphrases": "records/yesno_paraphrases.jsonl",
    "roco_captions": "records/roco_captions.csv",
    "roco_images": "records/roco_images.csv",
    "mecovqa_grounding": "records/mecovqa_grounding.json",
    "splits": "records/splits.csv",
}
"""Record name -> path relative to the demo root."""
