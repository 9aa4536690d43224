"""The DuckDB mart: tables copied from the Parquet results plus summary views.

The mart is rebuilt as a whole by one writer (the mart asset) into a temporary file that then
replaces ``marts.duckdb`` atomically, so readers never see a half-built database and partitions
never write it concurrently. Tables whose Parquet folder is missing are created empty with their
declared columns, so every view always exists.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from pathlib import Path

import duckdb


@dataclass(frozen=True)
class MartTable:
    """A table loaded from ``<results_dir>/<name>/**/*.parquet``; ``columns`` (name, SQL type)
    fix its schema and order, which are stable and documented in the README."""

    name: str
    columns: tuple[tuple[str, str], ...]
    description: str


MART_TABLES: list[MartTable] = [
    MartTable("clean_samples", (
        ("sample_id", "VARCHAR"), ("dataset", "VARCHAR"), ("modality", "VARCHAR"), ("split", "VARCHAR"),
        ("image_path", "VARCHAR"), ("height", "INTEGER"), ("width", "INTEGER"), ("channels", "INTEGER"),
        ("mask_area", "BIGINT"), ("n_boxes", "INTEGER"), ("sha256", "VARCHAR"), ("status", "VARCHAR"),
        ("reason", "VARCHAR"), ("detail", "VARCHAR"),
    ), "one row per sample found by a reader; status 'ok' or 'quarantined' with the reason"),
    MartTable("perturbation_manifest", (
        ("sample_id", "VARCHAR"), ("dataset", "VARCHAR"), ("modality", "VARCHAR"), ("perturbation", "VARCHAR"),
        ("family", "VARCHAR"), ("geometry", "VARCHAR"), ("level", "INTEGER"), ("band_low", "DOUBLE"),
        ("band_high", "DOUBLE"), ("strength", "DOUBLE"), ("dataset_strength", "DOUBLE"), ("ssim", "DOUBLE"),
        ("band_reached", "BOOLEAN"), ("miss_reason", "VARCHAR"), ("n_ssim_evals", "INTEGER"),
        ("seed_key", "VARCHAR"), ("sha256", "VARCHAR"), ("status", "VARCHAR"), ("error", "VARCHAR"),
    ), "one row per (sample, perturbation, level): calibrated strength, SSIM and band flag"),
]

MART_VIEWS: dict[str, str] = {
    "perturbation_summary": """
        select modality, perturbation, any_value(family) as family, level,
               count(*) as n,
               count(*) filter (where status <> 'ok') as n_error,
               avg(strength) as mean_strength,
               avg(ssim) as mean_ssim, min(ssim) as min_ssim, max(ssim) as max_ssim,
               avg(case when band_reached then 1.0 else 0.0 end) filter (where status = 'ok') as band_hit_rate,
               count(*) filter (where miss_reason = 'unreachable') as n_unreachable,
               avg(n_ssim_evals) as mean_ssim_evals
        from perturbation_manifest
        group by modality, perturbation, level
        order by modality, perturbation, level""",
    "quarantine": """
        select dataset, modality, sample_id, image_path, reason, detail
        from clean_samples where status <> 'ok' order by dataset, sample_id""",
}


def register_table(table: MartTable) -> None:
    """Add a table declared by a later track (idempotent by name)."""
    if all(t.name != table.name for t in MART_TABLES):
        MART_TABLES.append(table)


def register_view(name: str, sql: str) -> None:
    MART_VIEWS[name] = sql


def build_mart(results_dir: str | Path, mart_path: str | Path) -> dict[str, int]:
    """Rebuild the mart from Parquet; returns row counts per table."""
    mart = Path(mart_path)
    mart.parent.mkdir(parents=True, exist_ok=True)
    tmp = mart.with_name(f".{mart.name}.{uuid.uuid4().hex}.tmp")
    counts: dict[str, int] = {}
    con = duckdb.connect(str(tmp))
    try:
        for t in MART_TABLES:
            cols = ", ".join(f"{c} {typ}" for c, typ in t.columns)
            con.execute(f"create table {t.name} ({cols})")
            folder = Path(results_dir, t.name)
            if folder.is_dir() and any(folder.rglob("*.parquet")):
                names = ", ".join(c for c, _ in t.columns)
                src = f"read_parquet('{folder.as_posix()}/**/*.parquet', hive_partitioning = true, union_by_name = true)"
                con.execute(f"insert into {t.name} ({names}) select {_select_list(con, src, t)} from {src}")
            counts[t.name] = int(con.execute(f"select count(*) from {t.name}").fetchall()[0][0])
            desc = t.description.replace("'", "''")
            con.execute(f"comment on table {t.name} is '{desc}'")
        for name, sql in MART_VIEWS.items():
            con.execute(f"create view {name} as {sql}")
        con.execute("checkpoint")
    finally:
        con.close()
    os.replace(tmp, mart)
    wal = tmp.with_name(tmp.name + ".wal")
    if wal.exists():
        wal.unlink()
    return counts


def _select_list(con: duckdb.DuckDBPyConnection, src: str, t: MartTable) -> str:
    """Cast each declared column; a column missing from the files becomes NULL."""
    present = {r[0] for r in con.execute(f"describe select * from {src}").fetchall()}
    return ", ".join(f"cast({c} as {typ})" if c in present else f"cast(null as {typ})" for c, typ in t.columns)


def connect_readonly(mart_path: str | Path) -> duckdb.DuckDBPyConnection:
    """A read-only connection; raises FileNotFoundError naming the command that builds the mart."""
    p = Path(mart_path)
    if not p.is_file():
        raise FileNotFoundError(f"no mart at {p}: run `medrobust demo` (or materialize the 'marts' asset) first")
    return duckdb.connect(str(p), read_only=True)
