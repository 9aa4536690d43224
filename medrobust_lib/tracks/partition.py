"""The partition-evaluation core that every track uses.

A track evaluates one result partition at a time (a model or configuration x modality x level).
What the partition's rows depend on is one frozen :class:`PartitionInputs` dataclass per track
(:class:`~medrobust_lib.tracks.segmentation.evaluate.SegCleanInputs`,
:class:`~medrobust_lib.tracks.vlm.evaluate.VLMInputs`, ...): its fields ARE the fingerprint
(:attr:`PartitionInputs.fingerprint`, :func:`medrobust_lib.hashing.digest` of the fields in
declaration order), so an input cannot be left out of the fingerprint without being left out of
the dataclass, and ``tests/tracks/test_partition_inputs.py`` changes every result-relevant suite
setting and checks that the fingerprint moves.

:class:`Partition` is the rest of the shared shell: where the partition lives, the reuse check
(whole partition or row by row), the chunk writes (one chunk per dataset, rows in a fixed order),
``error`` rows and outcome counts. A track supplies only how to load its model and how to score
its samples.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import pandas as pd

from medrobust_lib.data.sample import Sample
from medrobust_lib.hashing import digest
from medrobust_lib.store import rerun, results
from medrobust_lib.store.completeness import ERROR_OUTCOME

EVAL_VERSION = 1
"""The version of the evaluation code every track's inputs start from; raising it (or one track's
``version`` default) makes every stored partition of those tracks stale."""

_LEGACY = "medrobust.legacy"


def added(legacy: Any = None) -> Any:
    """A field of an inputs dataclass added after results were fingerprinted without it: it is left
    out of the payload while it holds ``legacy`` (the value every earlier result was computed
    with), so those results stay current, and enters it (moving the fingerprint) with any other
    value. The same rule as :class:`medrobust_lib.config.common.AddedKeys`. The field has no
    default: every builder states it."""
    return field(metadata={_LEGACY: legacy})


@dataclass(frozen=True, kw_only=True)
class PartitionInputs:
    """What a partition's rows depend on. Every field enters :attr:`fingerprint`, in declaration
    order (``PAYLOAD = "list"``) or by name (``"mapping"``), except an :func:`added` field that
    holds its legacy value. Fields hold JSON values (lists, dicts, strings, numbers, None)."""

    PAYLOAD: ClassVar[Literal["list", "mapping"]] = "list"
    version: int = EVAL_VERSION

    def payload(self) -> list[Any] | dict[str, Any]:
        """The JSON value whose :func:`~medrobust_lib.hashing.digest` is the fingerprint."""
        kept = [(f.name, getattr(self, f.name)) for f in dataclasses.fields(self)
                if not (_LEGACY in f.metadata and getattr(self, f.name) == f.metadata[_LEGACY])]
        return dict(kept) if self.PAYLOAD == "mapping" else [v for _, v in kept]

    @property
    def fingerprint(self) -> str:
        """Hex SHA-256 of :meth:`payload` (:func:`medrobust_lib.hashing.digest`), stored in every
        chunk of the partition."""
        return digest(self.payload())


def sample_hashes(samples: Iterable[Sample]) -> list[tuple[str, str]]:
    """(sample id, content hash) of each sample, sorted: the images a clean partition scored."""
    return sorted((s.sample_id, s.content_hash()) for s in samples)


def manifest_hashes(manifest: pd.DataFrame) -> list[str]:
    """The output hashes (``sha256``) of a manifest partition, sorted: the perturbed images a
    perturbed partition scored (none for an empty manifest)."""
    return sorted(manifest["sha256"].dropna()) if len(manifest) else []


def unusable_state(unusable: Mapping[tuple[str, str], str],
                   keep: Iterable[tuple[str, str]] | None = None) -> list[Any]:
    """The unusable samples (of ``keep`` when given) and their reasons, sorted: an input, since each
    gets an ``error`` row that says why."""
    wanted = None if keep is None else set(keep)
    return sorted([list(k), v] for k, v in unusable.items() if wanted is None or k in wanted)


@dataclass(frozen=True)
class Condition:
    """An image to ask about (VLM and taxonomy tracks): the (possibly perturbed) pixels of
    ``sample``, the manifest fields of its perturbation, and the grounding boxes moved with them
    (item record id -> (1, 4) box, or None when moved out of view; empty where no task grounds)."""

    sample: Sample
    image: np.ndarray
    perturbation: str = "clean"
    level: int = 0
    strength: float | None = None
    ssim: float | None = None
    boxes: dict[str, np.ndarray | None] = field(default_factory=dict)


@dataclass(frozen=True)
class Partition:
    """One partition of a result table: folder ``<results_dir>/<table>/<key>=<value>/...``, one
    chunk per dataset, ``columns`` in each chunk, rows sorted by ``order`` within a chunk."""

    results_dir: str | Path
    table: str
    keys: Mapping[str, object]
    columns: Sequence[str]
    order: Callable[[Mapping[str, Any]], Any]

    def reusable(self, fp: str, datasets: Iterable[str]) -> pd.DataFrame | None:
        """The stored rows when a resumed run need not compute the partition again: it holds one
        chunk per dataset of ``datasets`` and no other, each written from inputs ``fp`` and
        verifying; None otherwise (a chunk missing, stale or failing its checksums)."""
        if not results.chunks_current(self.results_dir, self.table, self.keys, datasets, fp):
            return None
        try:
            return results.read_partition(self.results_dir, self.table, self.keys)
        except results.CorruptChunkError:
            return None

    def kept_rows(self, fp: str, row_key: Sequence[str]) -> dict[tuple[str, ...], dict[str, Any]]:
        """Rows stored from inputs ``fp`` that a re-run keeps (every outcome but ``error``), by
        ``row_key`` (:func:`medrobust_lib.store.rerun.reusable_rows`)."""
        return rerun.reusable_rows(str(self.results_dir), self.table, self.keys, fp, self.columns, row_key)

    def write(self, rows: Sequence[Mapping[str, Any]], fp: str) -> None:
        """Replace the partition with ``rows`` (one chunk per dataset, chunks of other datasets
        removed), each chunk recording fingerprint ``fp``."""
        results.write_rows_by_dataset(self.results_dir, self.table, self.keys, rows, fp, self.columns,
                                      sort_key=self.order)

    def read(self) -> pd.DataFrame:
        return results.read_partition(self.results_dir, self.table, self.keys)


def error_row(row: dict[str, Any], reason: str, *, column: str = "outcome",
              outcome: str = ERROR_OUTCOME) -> dict[str, Any]:
    """``row`` marked as not scored: ``column`` (``outcome``; segmentation: ``status``) set to
    ``outcome`` (``error``: an infrastructure failure or a sample that cannot be used now, retried by
    the next run and counted in no denominator) and ``error`` to ``reason``."""
    row[column] = outcome
    row["error"] = reason
    return row


def outcome_counts(rows: Sequence[Mapping[str, Any]] | pd.DataFrame, column: str = "outcome") -> dict[str, int]:
    """Rows per value of ``column`` (none for no rows)."""
    df = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))
    if df.empty or column not in df:
        return {}
    return {str(k): int(v) for k, v in df[column].value_counts().items()}
