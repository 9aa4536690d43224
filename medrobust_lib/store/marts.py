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
    MartTable("segmentation_results", (
        ("model", "VARCHAR"), ("checkpoint", "VARCHAR"), ("strategy", "VARCHAR"), ("dataset", "VARCHAR"),
        ("modality", "VARCHAR"), ("sample_id", "VARCHAR"), ("condition", "VARCHAR"), ("perturbation", "VARCHAR"),
        ("level", "INTEGER"), ("strength", "DOUBLE"), ("ssim", "DOUBLE"), ("epsilon", "DOUBLE"), ("iou", "DOUBLE"),
        ("dice", "DOUBLE"), ("clean_iou", "DOUBLE"), ("clean_dice", "DOUBLE"), ("iou_drop", "DOUBLE"),
        ("dice_drop", "DOUBLE"), ("prompt", "VARCHAR"), ("status", "VARCHAR"), ("error", "VARCHAR"),
        ("empty_gt_policy", "VARCHAR"),
    ), "one row per (model, image, condition): IoU/Dice and signed drops vs clean"),
    MartTable("segmentation_stats", (
        ("model", "VARCHAR"), ("checkpoint", "VARCHAR"), ("strategy", "VARCHAR"), ("condition", "VARCHAR"),
        ("perturbation", "VARCHAR"), ("level", "INTEGER"), ("n", "INTEGER"), ("iou", "DOUBLE"), ("dice", "DOUBLE"),
        ("iou_drop", "DOUBLE"), ("iou_drop_ci_low", "DOUBLE"), ("iou_drop_ci_high", "DOUBLE"),
        ("dice_drop", "DOUBLE"), ("dice_drop_ci_low", "DOUBLE"), ("dice_drop_ci_high", "DOUBLE"),
        ("wilcoxon_p", "DOUBLE"), ("wilcoxon_q", "DOUBLE"),
    ), "per (model, condition, type, level): bootstrap CIs of the drops, paired Wilcoxon p and BH q"),
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
    "segmentation_by_level": """
        select r.model, r.checkpoint, r.strategy, r.condition, r.perturbation, r.level,
               count(*) as n, count(*) filter (where r.status <> 'ok') as n_failed,
               avg(r.iou) filter (where r.status = 'ok') as iou, avg(r.dice) filter (where r.status = 'ok') as dice,
               avg(r.iou_drop) filter (where r.status = 'ok') as iou_drop,
               avg(r.dice_drop) filter (where r.status = 'ok') as dice_drop,
               avg(r.ssim) as mean_ssim, any_value(r.epsilon) as epsilon,
               any_value(s.dice_drop_ci_low) as dice_drop_ci_low, any_value(s.dice_drop_ci_high) as dice_drop_ci_high,
               any_value(s.iou_drop_ci_low) as iou_drop_ci_low, any_value(s.iou_drop_ci_high) as iou_drop_ci_high,
               any_value(s.wilcoxon_p) as wilcoxon_p, any_value(s.wilcoxon_q) as wilcoxon_q
        from segmentation_results r
        left join segmentation_stats s using (model, checkpoint, strategy, condition, perturbation, level)
        where r.condition <> 'clean'
        group by all order by all""",
    "segmentation_summary": """
        with ok as (select * from segmentation_results where status = 'ok'),
        clean as (
            select model, checkpoint, strategy, avg(iou) as iou, avg(dice) as dice, count(*) as n
            from ok where condition = 'clean' group by all),
        per_type as (
            select model, checkpoint, strategy,
                   case when condition = 'perturbation' then 'corruption' else 'attack' end as row_kind,
                   perturbation, avg(iou) as iou, avg(dice) as dice, avg(iou_drop) as iou_drop,
                   avg(dice_drop) as dice_drop, count(*) as n
            from ok where condition <> 'clean' group by all),
        avg_row as (
            select model, checkpoint, strategy, avg(iou) as iou, avg(dice) as dice, avg(iou_drop) as iou_drop,
                   avg(dice_drop) as dice_drop, sum(n) as n
            from per_type where row_kind = 'corruption' group by all)
        select model, checkpoint, strategy, 'Clean' as row_kind, 'Clean' as perturbation, iou, dice,
               0.0 as iou_drop, 0.0 as dice_drop, n, 0 as sort_key from clean
        union all
        select model, checkpoint, strategy, row_kind, perturbation, iou, dice, iou_drop, dice_drop, n,
               case when row_kind = 'corruption' then 1 else 2 end from per_type
        union all
        select model, checkpoint, strategy, 'Avg', 'Avg', iou, dice, iou_drop, dice_drop, n, 3 from avg_row
        union all
        -- Delta: the mean paired drop over corruption types. Types cover different modalities, so
        -- Clean minus Avg(dice) would mix sample sets; the paired drop does not.
        select model, checkpoint, strategy, 'Delta', 'Delta', iou_drop, dice_drop, iou_drop, dice_drop, n, 4
        from avg_row
        order by model, strategy, sort_key, perturbation""",
    "segmentation_top_corruptions": """
        with per_type as (
            select model, strategy, perturbation, avg(dice_drop) as dice_drop, avg(iou_drop) as iou_drop,
                   count(*) as n
            from segmentation_results where status = 'ok' and condition = 'perturbation'
            group by model, strategy, perturbation)
        select *, rank() over (partition by model, strategy order by dice_drop desc) as rank
        from per_type order by model, strategy, rank""",
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
