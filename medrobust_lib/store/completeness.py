"""Infrastructure failures per partition of a results table: error share and completeness.

Outcomes of model answers split in two. Model behaviour (``ok``, ``unparseable``, ``refused``) is
scored. Infrastructure (``error``: transport failure, retries exhausted, cache failure, CUDA OOM,
an exception in the runner) says nothing about the model: it is outside every denominator and is
retried by the next run of its partition. Rows a condition cannot score at all
(``excluded:<reason>``) are never asked and never retried.

A partition (one asset partition of a results table, identified by :data:`PARTITION_KEYS`) has

    error_share = n_error / n_attempted,   n_attempted = rows whose outcome is not excluded:<reason>

and is *complete* when ``error_share <= max_error_share`` (the suite setting, default
:data:`DEFAULT_MAX_ERROR_SHARE`; a partition without attempted rows is complete). An incomplete
partition fails its ERROR-severity asset check, is marked ``complete = false`` in the mart table
``partition_completeness`` and is left out of every view, statistic and report until a re-run
brings its share under the limit.

One SQL definition (:func:`error_share_sql`) serves the mart (over the loaded tables), the asset
check (over one partition's rows) and the statistics (over a whole table's rows), so the three
never disagree. pandas and duckdb are imported inside the functions: the mart module imports this
one and stays free of pandas at import time.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from medrobust_lib.store.schema import COMPLETENESS_COLUMNS, COMPLETENESS_TABLE

if TYPE_CHECKING:
    import pandas as pd

ERROR_OUTCOME = "error"
DEFAULT_MAX_ERROR_SHARE = 0.02
PARTITION_KEYS: dict[str, tuple[str, str, str]] = {
    "vlm_results": ("model", "modality", "level"),
    "taxonomy_results": ("config", "modality", "level"),
}
"""Results table -> the columns that identify one asset partition: (model or configuration id,
modality, level); level 0 is the clean partition, 1-5 the perturbed ones."""



def check_max_error_share(value: float) -> float:
    """``value`` as a float in [0, 1]; raises ValueError otherwise."""
    v = float(value)
    if not (math.isfinite(v) and 0.0 <= v <= 1.0):
        raise ValueError(f"max_error_share must be a number in [0, 1], got {value!r}")
    return v


def error_share_sql(relation: str, table: str, max_error_share: float) -> str:
    """SELECT of one :data:`COMPLETENESS_COLUMNS` row per partition of ``relation`` (a table, view
    or registered frame holding rows of the results table ``table``, with its key columns and
    ``outcome``). Raises KeyError for a table without partition keys."""
    if table not in PARTITION_KEYS:
        raise KeyError(f"no partition keys for table {table!r}; known: {', '.join(PARTITION_KEYS)}")
    owner, modality, level = PARTITION_KEYS[table]
    limit = repr(check_max_error_share(max_error_share))
    return f"""
        select '{table}' as source_table, model, modality, level, n, n_excluded, n_attempted, n_error,
               cast(n_error as double) / nullif(n_attempted, 0) as error_share,
               cast({limit} as double) as max_error_share,
               coalesce(cast(n_error as double) / nullif(n_attempted, 0), 0.0) <= {limit} as complete
        from (
            select cast({owner} as varchar) as model, cast({modality} as varchar) as modality,
                   cast({level} as integer) as level, count(*) as n,
                   count(*) filter (where coalesce(outcome like 'excluded:%', false)) as n_excluded,
                   count(*) filter (where not coalesce(outcome like 'excluded:%', false)) as n_attempted,
                   count(*) filter (where outcome = '{ERROR_OUTCOME}') as n_error
            from {relation}
            group by all)"""


def complete_filter_sql(table: str, alias: str) -> str:
    """A SQL predicate, true for rows (``alias``) of ``table`` whose partition is marked complete
    in the mart's ``partition_completeness`` table."""
    owner, modality, level = PARTITION_KEYS[table]
    return (f"exists (select 1 from {COMPLETENESS_TABLE} pc where pc.source_table = '{table}' and pc.complete "
            f"and pc.model = cast({alias}.{owner} as varchar) and pc.modality = {alias}.{modality} "
            f"and pc.level = {alias}.{level})")


def error_shares(df: pd.DataFrame, table: str, max_error_share: float = DEFAULT_MAX_ERROR_SHARE) -> pd.DataFrame:
    """One row per partition present in ``df`` (rows of ``table``), columns
    :data:`COMPLETENESS_COLUMNS`, sorted by the partition keys; empty input gives an empty frame."""
    import duckdb
    import pandas as pd

    names = [c for c, _ in COMPLETENESS_COLUMNS]
    if df.empty:
        return pd.DataFrame(columns=names)
    con = duckdb.connect()
    try:
        con.register("rows_in", df[[*PARTITION_KEYS[table], "outcome"]])
        out = con.execute(error_share_sql("rows_in", table, max_error_share) + " order by model, modality, level").df()
    finally:
        con.close()
    return out[names]


def complete_rows(df: pd.DataFrame, table: str, max_error_share: float = DEFAULT_MAX_ERROR_SHARE) -> pd.DataFrame:
    """The rows of ``df`` whose partition is complete (index and columns kept)."""
    if df.empty:
        return df
    shares = error_shares(df, table, max_error_share)
    owner, modality, level = PARTITION_KEYS[table]
    ok = {(str(m), str(mo), int(lv)) for m, mo, lv, c in
          zip(shares["model"], shares["modality"], shares["level"], shares["complete"], strict=True) if c}
    keep = [(str(m), str(mo), int(lv)) in ok for m, mo, lv in
            zip(df[owner], df[modality], df[level], strict=True)]
    return df[keep]


@dataclass(frozen=True)
class PartitionErrorShare:
    """Error share of one partition (see the module docstring); ``error_share`` is NaN without
    attempted rows."""

    n: int
    n_excluded: int
    n_attempted: int
    n_error: int
    error_share: float
    max_error_share: float
    complete: bool

    def metadata(self) -> dict[str, float | int | bool]:
        return {"n_rows": self.n, "n_excluded": self.n_excluded, "n_attempted": self.n_attempted,
                "n_error": self.n_error, "error_share": self.error_share, "max_error_share": self.max_error_share,
                "complete": self.complete}


def partition_error_share(results_dir: str | Path, table: str, partition: Mapping[str, object],
                          max_error_share: float = DEFAULT_MAX_ERROR_SHARE) -> PartitionErrorShare:
    """Error share of the rows stored in one partition folder of ``table`` (e.g.
    ``{"model": m, "run": "clean", "modality": "ct", "level": 0}``); no rows: complete, share NaN."""
    from medrobust_lib.store import results

    limit = check_max_error_share(max_error_share)
    df = results.read_partition(results_dir, table, partition)
    if df.empty:
        return PartitionErrorShare(0, 0, 0, 0, float("nan"), limit, True)
    shares = error_shares(df, table, limit)
    if len(shares) != 1:
        raise ValueError(f"partition {dict(partition)} of {table} holds rows of {len(shares)} partitions")
    r = shares.iloc[0]
    share = float(r["error_share"]) if r["error_share"] is not None and not _isnan(r["error_share"]) else float("nan")
    return PartitionErrorShare(int(r["n"]), int(r["n_excluded"]), int(r["n_attempted"]), int(r["n_error"]), share,
                               limit, bool(r["complete"]))


def _isnan(x: object) -> bool:
    return isinstance(x, float) and math.isnan(x)
