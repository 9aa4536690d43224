"""Re-runs of a result partition that keep what is done and retry only infrastructure failures.

A partition's chunks record the fingerprint of their inputs (:mod:`medrobust_lib.store.results`).
When a partition is run again with the same fingerprint, every stored row whose outcome is not
``error`` is kept as it is and only the missing and ``error`` rows are computed; the new rows and
the kept ones are merged by a row key, so a row is never duplicated or lost. A run interrupted
before it writes leaves the stored rows untouched, and one interrupted between its per-dataset
chunks resumes from the chunks it wrote (they carry the current fingerprint).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from medrobust_lib.store import results
from medrobust_lib.store.completeness import ERROR_OUTCOME

logger = logging.getLogger(__name__)


def row_key(row: Mapping[str, Any], key: Sequence[str]) -> tuple[str, ...]:
    """The row's values of the ``key`` columns, as strings (a stored 0 and a new 0 compare equal)."""
    return tuple(str(row[k]) for k in key)


def reusable_rows(results_dir: str, table: str, partition: Mapping[str, object], fp: str, columns: Sequence[str],
                  key: Sequence[str]) -> dict[tuple[str, ...], dict[str, Any]]:
    """Rows of the partition's chunks stored with fingerprint ``fp`` whose ``outcome`` is not
    ``error`` and that verify (:func:`results.verify_chunk`; a damaged chunk's rows are recomputed), by :func:`row_key`, as dicts over ``columns`` (partition columns restored except the
    folder-only ones not in ``columns``; missing values None)."""
    import pandas as pd

    folder = results.partition_dir(results_dir, table, partition)
    out: dict[tuple[str, ...], dict[str, Any]] = {}
    for f in sorted(folder.glob("*.parquet")) if folder.is_dir() else []:
        if results.read_chunk_fingerprint(f) != fp:
            continue
        try:
            df = results.verify_chunk(f).to_pandas()
        except results.CorruptChunkError as exc:  # recompute its rows rather than copy damaged values
            logger.warning("%s; its rows are recomputed", exc)
            continue
        if df.empty:
            continue
        df = df[df["outcome"] != ERROR_OUTCOME].astype(object).where(pd.notna, None)
        for rec in df.to_dict("records"):
            r: dict[str, Any] = dict.fromkeys(columns)
            r.update({str(k): v for k, v in rec.items() if k in r})
            r.update({k: v for k, v in partition.items() if k in r})
            out[row_key(r, key)] = r
    return out


def merge_rows(kept: Mapping[tuple[str, ...], dict[str, Any]], new: Iterable[dict[str, Any]],
               key: Sequence[str]) -> list[dict[str, Any]]:
    """Kept rows plus new rows, one per key (a new row replaces a kept one with the same key)."""
    merged = dict(kept)
    merged.update((row_key(r, key), r) for r in new)
    return list(merged.values())
