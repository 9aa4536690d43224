"""Safety-taxonomy statistics tables ("Consistent but Dangerous").

:func:`write_taxonomy_stats` recomputes the ``taxonomy_quadrant_stats`` and
``taxonomy_correlation_stats`` tables from every ``taxonomy_results`` row (the statistics
themselves live in :mod:`medrobust_lib.taxonomy.aggregates`; the figures in
:mod:`medrobust_lib.report.figures.taxonomy`). :func:`write_screening_stats` writes the
``taxonomy_screening_stats`` table: confidence screening of the Dangerous quadrant
(:mod:`medrobust_lib.taxonomy.confidence_screening`) over every ``taxonomy_results`` row of the
complete partitions, one chunk ``taxonomy_screening_stats/batch=all/stats.parquet``.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from medrobust_lib.config.common import DEFAULT_MIN_N
from medrobust_lib.hashing import digest
from medrobust_lib.store import results
from medrobust_lib.store.completeness import DEFAULT_MAX_ERROR_SHARE, complete_rows
from medrobust_lib.store.schema import (
    DEFAULT_ABSTENTION_TAU,
    TAXONOMY_CORRELATION_STATS_COLUMNS,
    TAXONOMY_QUADRANT_STATS_COLUMNS,
    TAXONOMY_SCREENING_TABLE,
    TAXONOMY_TABLE,
    column_names,
)
from medrobust_lib.store.schema import (
    TAXONOMY_COLUMN_NAMES as COLUMN_NAMES,
)
from medrobust_lib.taxonomy.confidence_screening import KEEP_IDEAL, screening_stats
from medrobust_lib.tracks.off_band import MANIFEST_TABLE, off_band

QUADRANT_STATS_TABLE = "taxonomy_quadrant_stats"
CORRELATION_STATS_TABLE = "taxonomy_correlation_stats"
CORRELATION_PARTITION: dict[str, object] = {"batch": "all"}
"""The single partition of ``taxonomy_correlation_stats`` (not ``scope``: that is a stored column)."""
QUADRANT_STATS_COLUMNS: tuple[str, ...] = tuple(c for c, _ in TAXONOMY_QUADRANT_STATS_COLUMNS)
CORRELATION_STATS_COLUMNS: tuple[str, ...] = tuple(c for c, _ in TAXONOMY_CORRELATION_STATS_COLUMNS)
SCREENING_PARTITION: dict[str, object] = {"batch": "all"}


def read_taxonomy_results(results_dir: str | Path) -> pd.DataFrame:
    """``taxonomy_results`` in schema column order, with the hive partition columns restored as
    ``config`` (str) and ``level`` (int); the ``run`` folder key is dropped. Empty if no rows."""
    df = results.read_table(results_dir, TAXONOMY_TABLE)
    if df.empty:
        return pd.DataFrame(columns=list(COLUMN_NAMES))
    df = df.reindex(columns=list(COLUMN_NAMES))
    df["config"] = df["config"].astype(str)
    df["level"] = pd.to_numeric(df["level"]).astype(int)
    return df


def write_taxonomy_stats(results_dir: str | Path, seed: int = 0, abstention_tau: float | None = None, *,
                         max_error_share: float = DEFAULT_MAX_ERROR_SHARE,
                         min_n: int = DEFAULT_MIN_N, include_off_band: bool = False) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Recompute both taxonomy stats tables from every ``taxonomy_results`` row and return them
    as (quadrant stats, correlation stats). ``abstention_tau`` (nats; None: the default ln 2) is
    the band of the sensitivity column ``share_abstention``. Quadrant stats: one chunk per configuration under
    ``taxonomy_quadrant_stats/config=<id>/stats.parquet`` (folders of configurations without
    stats are removed); correlation stats: one chunk ``taxonomy_correlation_stats/batch=all/
    stats.parquet`` (removed when there are none).

    Off-band records (perturbed images whose SSIM missed their level's band in
    ``perturbation_manifest``) are left out of both tables unless ``include_off_band`` (the suite's
    ``perturbations.include_off_band``), as the segmentation and VLM statistics leave them out;
    ``band_miss`` counts them per group (on the group's four rows) either way."""
    from medrobust_lib.taxonomy.aggregates import GROUP_COLUMNS, flip_dangerous_correlation, quadrant_stats

    tau = DEFAULT_ABSTENTION_TAU if abstention_tau is None else abstention_tau
    df = complete_rows(read_taxonomy_results(results_dir), TAXONOMY_TABLE, max_error_share)  # complete partitions
    missed = off_band(df, results.read_table(results_dir, MANIFEST_TABLE))
    misses = df[missed].groupby(list(GROUP_COLUMNS), dropna=False).size().rename("band_miss").reset_index()
    if not include_off_band:
        df = df[~missed]
    if df.empty:
        quad = pd.DataFrame(columns=list(QUADRANT_STATS_COLUMNS))
        corr = pd.DataFrame(columns=list(CORRELATION_STATS_COLUMNS))
    else:
        quad = quadrant_stats(df, seed, abstention_tau=tau, min_n=min_n).reindex(columns=list(QUADRANT_STATS_COLUMNS))
        corr = flip_dangerous_correlation(df, seed, min_n=min_n).reindex(columns=list(CORRELATION_STATS_COLUMNS))
    if len(quad):
        quad["config"] = quad["config"].astype(str)
        quad["level"] = pd.to_numeric(quad["level"]).astype(int)
        quad = _with_band_miss(quad, misses)
    if len(corr) and "level" in corr.columns:
        corr["level"] = pd.to_numeric(corr["level"]).astype("Int64")

    fp = digest(["taxonomy_stats", seed, tau, len(df), len(quad), len(corr), include_off_band])
    results.write_per_key(results_dir, QUADRANT_STATS_TABLE, quad, "config", fp)

    keep: set[str] = set()
    if len(corr):
        path = results.chunk_path(results_dir, CORRELATION_STATS_TABLE, CORRELATION_PARTITION, "stats")
        results.write_chunk(path, corr, fp)
        keep.add(path.parent.name)
    _remove_stale(results_dir, CORRELATION_STATS_TABLE, keep)
    return quad, corr


def _with_band_miss(quad: pd.DataFrame, misses: pd.DataFrame) -> pd.DataFrame:
    """``quad`` with ``band_miss`` per group: its off-band records (0 when none). ``misses``: the
    group columns and ``band_miss`` of the groups with some."""
    from medrobust_lib.taxonomy.aggregates import GROUP_COLUMNS

    quad = quad.drop(columns=["band_miss"], errors="ignore")
    if len(misses):
        quad = quad.merge(misses, on=list(GROUP_COLUMNS), how="left")
    quad["band_miss"] = quad["band_miss"].fillna(0).astype("int64") if "band_miss" in quad else 0
    return quad.reindex(columns=list(QUADRANT_STATS_COLUMNS))


def _remove_stale(results_dir: str | Path, table: str, keep: set[str]) -> None:
    """Remove the partition folders of ``table`` (one level deep) whose name is not in ``keep``."""
    root = Path(results_dir, table)
    if not root.is_dir():
        return
    for d in root.iterdir():
        if d.is_dir() and d.name not in keep:
            for f in d.iterdir():
                f.unlink()
            d.rmdir()


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
