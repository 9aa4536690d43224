"""The ``taxonomy_screening_stats`` table: confidence screening of the Dangerous quadrant
(:mod:`medrobust_lib.taxonomy.screening`) over every ``taxonomy_results`` row of the complete
partitions, one chunk ``taxonomy_screening_stats/batch=all/stats.parquet``."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from medrobust_lib.hashing import digest
from medrobust_lib.store import results
from medrobust_lib.store.completeness import DEFAULT_MAX_ERROR_SHARE, complete_rows
from medrobust_lib.store.schema import TAXONOMY_SCREENING_TABLE, TAXONOMY_TABLE, column_names
from medrobust_lib.taxonomy.screening import KEEP_IDEAL, screening_stats
from medrobust_lib.tracks.taxonomy.stats import read_taxonomy_results

SCREENING_PARTITION: dict[str, object] = {"batch": "all"}


def write_screening_stats(results_dir: str | Path, *, keep: float = KEEP_IDEAL,
                          max_error_share: float = DEFAULT_MAX_ERROR_SHARE) -> pd.DataFrame:
    """Recompute ``taxonomy_screening_stats`` from the ``taxonomy_results`` rows of the complete
    partitions and return it; the chunk is removed when there are no rows."""
    df = complete_rows(read_taxonomy_results(results_dir), TAXONOMY_TABLE, max_error_share)
    stats = screening_stats(df, keep).reindex(columns=list(column_names(TAXONOMY_SCREENING_TABLE)))
    path = results.chunk_path(results_dir, TAXONOMY_SCREENING_TABLE, SCREENING_PARTITION, "stats")
    if len(stats):
        stats["level"] = pd.to_numeric(stats["level"]).astype(int)
        results.write_chunk(path, stats, digest(["taxonomy_screening", keep, len(df), len(stats)]))
    elif path.is_file():
        path.unlink()
    return stats
