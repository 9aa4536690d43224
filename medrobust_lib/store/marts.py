"""The DuckDB mart: tables copied from the Parquet results plus summary views.

The mart is rebuilt as a whole by one writer (the mart asset) into a temporary file that then
replaces ``marts.duckdb`` atomically, so readers never see a half-built database and partitions
never write it concurrently. Tables whose Parquet folder is missing are created empty with their
declared columns, so every view always exists.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import duckdb

from medrobust_lib.processes import pid_alive
from medrobust_lib.store.completeness import (
    COMPLETENESS_COLUMNS,
    COMPLETENESS_TABLE,
    DEFAULT_MAX_ERROR_SHARE,
    PARTITION_KEYS,
    complete_filter_sql,
    error_share_sql,
)
from medrobust_lib.store.coverage import (
    BAND_ROWS_SQL,
    COVERAGE_VIEWS,
    off_band_sql,
    vlm_chance_sql,
    vlm_floor_sql,
)
from medrobust_lib.store.results import CorruptChunkError, verify_chunk
from medrobust_lib.store.schema import (
    MART_TABLES,
    PRIMARY_METRIC,
    QUADRANTS,
    TAXONOMY_TABLE,
    VLM_TABLE,
    MartTable,
)
from medrobust_lib.store.summary_views import SUMMARY_VIEWS, off_band_summary_views
from medrobust_lib.store.writer_lock import suite_writer_lock

VLM_SCORED_OUTCOMES: tuple[str, ...] = ("ok", "unparseable", "refused")
"""Outcomes inside the denominators (the last two scored as wrong). ``error`` (infrastructure) and
``excluded:<reason>`` are outside every denominator and only counted."""
VLM_PRIMARY_COLUMN: dict[str, str] = {t: ("acc_50" if m == "acc@0.5" else m) for t, m in PRIMARY_METRIC.items()}
"""Task -> the ``vlm_by_level`` column of its primary metric (``acc@0.5`` is the column ``acc_50``)."""

_SCORED_SQL = "outcome in (" + ", ".join(f"'{o}'" for o in VLM_SCORED_OUTCOMES) + ")"
_PRIMARY_SQL = "case task " + " ".join(f"when '{t}' then {c}" for t, c in VLM_PRIMARY_COLUMN.items()) + " end"
_BLEU_TINY_SQL = "1e-15"
_BLEU_SMALL_SQL = "1e-9"
_BLEU4_SQL = (
    "power(" + " * ".join(f"((c{k} + {_BLEU_TINY_SQL}) / (g{k} + {_BLEU_SMALL_SQL}))" for k in range(1, 5))
    + ", 0.25)"
)
_BLEU_RATIO_SQL = f"((hyp_len + {_BLEU_TINY_SQL}) / (ref_len + {_BLEU_SMALL_SQL}))"

# vlm_by_level: one row per (model, checkpoint, adapter, task, perturbation, level) over image_mode
# 'image' of complete partitions (partition_completeness). Counts: n (all rows), n_scored, n_unparseable,
# n_refused, n_error, n_excluded, n_truncated (answers that hit their token cap; scored as they are). Metrics over
# the scored rows: accuracy in [0, 1] (VQA and grounding, NULL for captions); grounding mean_iou,
# acc_50 (= accuracy), acc_75; captions cider_d (mean, >= 0), rouge_l (mean, [0, 1]) and bleu_4, the
# corpus BLEU-4 from the summed sufficient statistics (medrobust_lib.metrics.caption.bleu_from_stats,
# same constants and brevity penalty); mean_ssim over all rows; chance: the chance level of the primary
# metric (multiple choice: the mean of 1/n_options over the scored rows, medrobust_lib.store.coverage);
# band_miss: rows whose perturbed image missed its level's SSIM band (perturbation_manifest), left out of
# n and every metric unless include_off_band.
def vlm_by_level(include_off_band: bool | str = False) -> str:
    """The ``vlm_by_level`` view; off-band rows enter the counts and metrics only with
    ``include_off_band`` (a bool or a SQL boolean such as ``$include_off_band``)."""
    inc_ob = include_off_band if isinstance(include_off_band, str) else ("true" if include_off_band else "false")
    return f"""
        with band_rows as ({BAND_ROWS_SQL}),
        base_any as (
            select v.*, {_SCORED_SQL} as scored,
                   {off_band_sql("v.perturbation <> 'clean'", "b.band_reached")} as off_band
            from {VLM_TABLE} v
            left join band_rows b on b.dataset = v.dataset and b.sample_id = v.sample_id
                 and b.perturbation = v.perturbation and b.level = v.level
            where v.image_mode = 'image' and {complete_filter_sql(VLM_TABLE, "v")}),
        miss as (
            select model, checkpoint, adapter, task, perturbation, level,
                   cast(count(*) filter (where off_band) as bigint) as band_miss
            from base_any group by model, checkpoint, adapter, task, perturbation, level),
        base as (select * from base_any where {inc_ob} or not off_band),
        agg as (
            select model, checkpoint, adapter, task, perturbation, level,
                   count(*) as n,
                   count(*) filter (where scored) as n_scored,
                   count(*) filter (where outcome = 'unparseable') as n_unparseable,
                   count(*) filter (where outcome = 'refused') as n_refused,
                   count(*) filter (where outcome = 'error') as n_error,
                   count(*) filter (where outcome like 'excluded:%') as n_excluded,
                   count(*) filter (where truncated) as n_truncated,
                   avg(correct) filter (where scored) as mean_correct,
                   avg(iou) filter (where scored) as mean_iou_all,
                   avg(acc_75) filter (where scored) as mean_acc_75,
                   avg(cider_d) filter (where scored) as mean_cider_d,
                   avg(rouge_l) filter (where scored) as mean_rouge_l,
                   sum(bleu_c1) filter (where scored) as c1, sum(bleu_c2) filter (where scored) as c2,
                   sum(bleu_c3) filter (where scored) as c3, sum(bleu_c4) filter (where scored) as c4,
                   sum(bleu_g1) filter (where scored) as g1, sum(bleu_g2) filter (where scored) as g2,
                   sum(bleu_g3) filter (where scored) as g3, sum(bleu_g4) filter (where scored) as g4,
                   sum(hyp_len) filter (where scored) as hyp_len, sum(ref_len) filter (where scored) as ref_len,
                   avg(ssim) as mean_ssim,
                   avg(1.0 / nullif(n_options, 0)) filter (where scored) as inv_options
            from base group by model, checkpoint, adapter, task, perturbation, level),
        cells as (
            select m.model, m.checkpoint, m.adapter, m.task, m.perturbation, m.level, m.band_miss,
                   a.* exclude (model, checkpoint, adapter, task, perturbation, level)
            from miss m
            left join agg a on a.model = m.model and a.checkpoint is not distinct from m.checkpoint
                 and a.adapter is not distinct from m.adapter and a.task = m.task
                 and a.perturbation = m.perturbation and a.level = m.level)
        select model, checkpoint, adapter, task, perturbation, level, coalesce(n, 0) as n,
               coalesce(n_scored, 0) as n_scored, coalesce(n_unparseable, 0) as n_unparseable,
               coalesce(n_refused, 0) as n_refused, coalesce(n_error, 0) as n_error,
               coalesce(n_excluded, 0) as n_excluded,
               case when task <> 'caption' then mean_correct end as accuracy,
               case when task = 'grounding' then mean_iou_all end as mean_iou,
               case when task = 'grounding' then mean_correct end as acc_50,
               case when task = 'grounding' then mean_acc_75 end as acc_75,
               case when task = 'caption' then mean_cider_d end as cider_d,
               case when task = 'caption' then mean_rouge_l end as rouge_l,
               case when task = 'caption' then
                   {_BLEU4_SQL}
                   * case when {_BLEU_RATIO_SQL} < 1 then exp(1 - 1 / {_BLEU_RATIO_SQL}) else 1.0 end
               end as bleu_4,
               mean_ssim, {vlm_chance_sql("inv_options")} as chance, band_miss,
               coalesce(n_truncated, 0) as n_truncated
        from cells
        order by model, checkpoint, adapter, task, perturbation, level"""


_VLM_BY_LEVEL = vlm_by_level()

# vlm_task_drops: the published wide table in long form. Per (model, checkpoint, adapter, task):
# column_name 'Clean' (level 0), one row per perturbation type (the primary metric averaged over the
# per-level values of levels 1..5), 'Avg' (mean over types) and 'ΔTP' (Clean - Avg; positive = worse
# under perturbation). metric names the primary metric column; n_unparseable / n_error / n_truncated are
# the unparseable answers, the infrastructure errors (outside the number) and the answers cut at their
# token cap (inside it) behind each number (Avg: all
# types; ΔTP: Clean plus all types); drop = Clean - value (the ΔTP row: ΔTP itself; Clean: 0) and
# rel_drop = drop / Clean (NULL when Clean is 0 or missing); ord orders the columns (Clean 0, types
# alphabetically, then Avg, ΔTP); chance: the task's chance level on its clean items (vlm_by_level) and
# floor_effect: Clean at or below chance (the drops cannot show a loss), on every row of the task.
_VLM_TASK_DROPS = f"""
        with lv as (
            select model, checkpoint, adapter, task, perturbation, level, {_PRIMARY_SQL} as value,
                   n_unparseable, n_error, n_truncated
            from vlm_by_level),
        clean as (
            select model, checkpoint, adapter, task, 'Clean' as column_name, 0 as grp, avg(value) as value,
                   cast(sum(n_unparseable) as bigint) as n_unparseable, cast(sum(n_error) as bigint) as n_error,
                   cast(sum(n_truncated) as bigint) as n_truncated
            from lv where perturbation = 'clean' and level = 0
            group by model, checkpoint, adapter, task),
        per_type as (
            select model, checkpoint, adapter, task, perturbation as column_name, 1 as grp, avg(value) as value,
                   cast(sum(n_unparseable) as bigint) as n_unparseable, cast(sum(n_error) as bigint) as n_error,
                   cast(sum(n_truncated) as bigint) as n_truncated
            from lv where perturbation <> 'clean' and level between 1 and 5
            group by model, checkpoint, adapter, task, perturbation),
        avg_row as (
            select model, checkpoint, adapter, task, 'Avg' as column_name, 2 as grp, avg(value) as value,
                   cast(sum(n_unparseable) as bigint) as n_unparseable, cast(sum(n_error) as bigint) as n_error,
                   cast(sum(n_truncated) as bigint) as n_truncated
            from per_type group by model, checkpoint, adapter, task),
        delta as (
            select model, checkpoint, adapter, task, 'ΔTP' as column_name, 3 as grp,
                   max(value) filter (where column_name = 'Clean') - max(value) filter (where column_name = 'Avg')
                       as value,
                   cast(sum(n_unparseable) as bigint) as n_unparseable, cast(sum(n_error) as bigint) as n_error,
                   cast(sum(n_truncated) as bigint) as n_truncated
            from (select * from clean union all select * from avg_row)
            group by model, checkpoint, adapter, task),
        rows as (
            select * from clean union all select * from per_type union all select * from avg_row
            union all select * from delta),
        with_clean as (
            select *, max(case when column_name = 'Clean' then value end)
                          over (partition by model, checkpoint, adapter, task) as clean_value
            from rows),
        with_drop as (
            select *, case when column_name = 'ΔTP' then value else clean_value - value end as drop
            from with_clean),
        task_chance as (
            select model, checkpoint, adapter, task, avg(chance) as chance
            from vlm_by_level where perturbation = 'clean' and level = 0
            group by model, checkpoint, adapter, task)
        select d.model, d.checkpoint, d.adapter, d.task, d.column_name,
               case d.task {" ".join(f"when '{t}' then '{c}'" for t, c in VLM_PRIMARY_COLUMN.items())} end as metric,
               d.value, d.drop, d.drop / nullif(d.clean_value, 0) as rel_drop, d.n_unparseable, d.n_error,
               d.n_truncated,
               cast(row_number() over (partition by d.model, d.checkpoint, d.adapter, d.task
                                       order by d.grp, d.column_name) - 1 as integer) as ord,
               c.chance, {vlm_floor_sql("d.clean_value", "c.chance")} as floor_effect
        from with_drop d
        left join task_chance c on d.model = c.model and d.checkpoint is not distinct from c.checkpoint
             and d.adapter is not distinct from c.adapter and d.task = c.task
        order by d.model, d.checkpoint, d.adapter, d.task, ord"""

MART_VIEWS: dict[str, str] = {
    "perturbation_summary": """
        select modality, perturbation, any_value(family) as family, level,
               count(*) as n,
               count(*) filter (where status = 'error') as n_error,
               count(*) filter (where status = 'not_applicable') as n_not_applicable,
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
    "vlm_by_level": _VLM_BY_LEVEL,
    "vlm_task_drops": _VLM_TASK_DROPS,
}


class MartBuildError(RuntimeError):
    """The mart could not be rebuilt; the previous ``marts.duckdb`` is untouched. The message names
    the table and, for an unreadable chunk, the file and the partition to re-materialise."""


def mart_views(include_off_band: bool = False) -> dict[str, str]:
    """Every view of the mart, in creation order: :data:`MART_VIEWS`, where ``include_off_band`` (the
    suite's ``perturbations.include_off_band``) puts the rows whose perturbed output missed its SSIM
    band back into the by-level and summary means (they are always counted in ``band_miss``)."""
    if not include_off_band:
        return dict(MART_VIEWS)
    return {**MART_VIEWS, **off_band_summary_views(True), "vlm_by_level": vlm_by_level(True)}


def build_mart(results_dir: str | Path, mart_path: str | Path,
               max_error_share: float = DEFAULT_MAX_ERROR_SHARE, include_off_band: bool = False) -> dict[str, int]:
    """Rebuild the mart from Parquet; returns row counts per table. ``max_error_share`` (the
    suite setting) decides which partitions ``partition_completeness`` marks complete;
    ``include_off_band`` (the suite's ``perturbations.include_off_band``) keeps rows whose perturbed
    output missed its SSIM band in the level means (:func:`mart_views`).

    Crash safety: the new mart is built in ``.<name>.<pid>.<uuid>.tmp`` next to the old one,
    fsynced, renamed over it (atomic on POSIX) and the folder fsynced, so a reader sees the old
    mart or the new one, never a mixture, and a power cut after the return keeps the new one. On any
    failure (disk full, a corrupt chunk, an interrupt) the temporary file is removed and the old
    mart stays; a temporary file left by a killed build (its process gone) is removed by the next
    build. A chunk that cannot be read, or fails its page checksums or content hash
    (:func:`medrobust_lib.store.results.verify_chunk`), raises :class:`MartBuildError` naming the
    table, the file and its partition. The build holds the suite's writer lock
    (:func:`medrobust_lib.store.writer_lock.suite_writer_lock`; :class:`SuiteBusyError` when another
    process writes the results).
    """
    with suite_writer_lock(results_dir):  # one writer per suite (re-entrant inside medrobust run)
        return _build_mart(results_dir, mart_path, max_error_share, include_off_band)


def _build_mart(results_dir: str | Path, mart_path: str | Path, max_error_share: float,
                include_off_band: bool = False) -> dict[str, int]:
    mart = Path(mart_path)
    mart.parent.mkdir(parents=True, exist_ok=True)
    _remove_orphaned_temps(mart)
    tmp = mart.with_name(f".{mart.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    counts: dict[str, int] = {}
    try:
        con = duckdb.connect(str(tmp))
        try:
            for t in MART_TABLES:
                cols = ", ".join(f"{c} {typ}" for c, typ in t.columns)
                con.execute(f"create table {t.name} ({cols})")
                folder = Path(results_dir, t.name)
                if folder.is_dir() and any(folder.rglob("*.parquet")):
                    _verify_chunks(t.name, folder)
                    names = ", ".join(c for c, _ in t.columns)
                    src = (f"read_parquet('{folder.as_posix()}/**/*.parquet', hive_partitioning = true, "
                           "union_by_name = true)")
                    try:
                        con.execute(f"insert into {t.name} ({names}) select {_select_list(con, src, t)} from {src}")
                    except duckdb.Error as exc:
                        raise _chunk_error(t.name, folder, exc) from None
                if t.name == COMPLETENESS_TABLE:
                    _fill_completeness(con, max_error_share)
                counts[t.name] = int(con.execute(f"select count(*) from {t.name}").fetchall()[0][0])
                desc = t.description.replace("'", "''")
                con.execute(f"comment on table {t.name} is '{desc}'")
            for name, sql in mart_views(include_off_band).items():
                con.execute(f"create view {name} as {sql}")
            con.execute("checkpoint")
        finally:
            con.close()
        _fsync_file(tmp)
        os.replace(tmp, mart)
        _fsync_dir(mart.parent)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        for side in (tmp.with_name(tmp.name + ".wal"), tmp.with_name(tmp.name + ".tmp")):
            if side.is_file():
                side.unlink(missing_ok=True)
    return counts


def _verify_chunks(table: str, folder: Path) -> None:
    """Page checksums and content hash of every chunk of ``table`` (one chunk in memory at a time)
    before DuckDB reads them; :class:`MartBuildError` naming table, file and partition."""
    for f in sorted(folder.rglob("*.parquet")):
        try:
            verify_chunk(f)
        except CorruptChunkError as exc:
            raise MartBuildError(f"mart not rebuilt (the previous one is kept): {exc}; re-materialise that "
                                 f"partition of the asset that writes {table!r} (or delete the file), then "
                                 "rebuild the mart") from None


def _chunk_error(table: str, folder: Path, exc: duckdb.Error) -> MartBuildError:
    """Find the first chunk of ``table`` DuckDB cannot read and name it with its partition."""
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    probe = duckdb.connect()
    try:
        for f in sorted(folder.rglob("*.parquet")):
            try:
                probe.execute(f"select count(*) from read_parquet('{f.as_posix()}')").fetchall()
            except duckdb.Error as bad:
                rel = f.relative_to(folder)
                part = ", ".join(p for p in rel.parent.parts if "=" in p) or "(unpartitioned)"
                reason = (str(bad).strip().splitlines() or [type(bad).__name__])[0]
                return MartBuildError(
                    f"mart not rebuilt (the previous one is kept): table {table!r}, partition {part}: "
                    f"chunk {f} is unreadable ({reason}); re-materialise that partition of the asset that "
                    f"writes {table!r} (or delete the file), then rebuild the mart")
    finally:
        probe.close()
    return MartBuildError(f"mart not rebuilt (the previous one is kept): table {table!r} from {folder}: {first}")


def _remove_orphaned_temps(mart: Path) -> None:
    """Remove ``.<mart>.<pid>.<uuid>.tmp`` files whose building process no longer exists."""
    for f in mart.parent.glob(f".{mart.name}.*.tmp*"):
        parts = f.name[len(mart.name) + 2:].split(".")
        pid = int(parts[0]) if parts and parts[0].isdigit() else None
        if pid is not None and pid != os.getpid() and pid_alive(pid):
            continue  # another build is running (should not happen: one writer), leave it
        if pid == os.getpid():
            continue
        f.unlink(missing_ok=True)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return  # platforms without directory fds
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems refuse fsync on a directory; the rename itself is still atomic
    finally:
        os.close(fd)
def _fill_completeness(con: duckdb.DuckDBPyConnection, max_error_share: float) -> None:
    """Rows of ``partition_completeness`` from the results tables loaded so far (it is declared
    after them)."""
    names = ", ".join(c for c, _ in COMPLETENESS_COLUMNS)
    for table in PARTITION_KEYS:
        con.execute(f"insert into {COMPLETENESS_TABLE} ({names}) {error_share_sql(table, table, max_error_share)}")


def _select_list(con: duckdb.DuckDBPyConnection, src: str, t: MartTable) -> str:
    """Cast each declared column; a column missing from the files becomes NULL."""
    present = {r[0] for r in con.execute(f"describe select * from {src}").fetchall()}
    return ", ".join(f"cast({c} as {typ})" if c in present else f"cast(null as {typ})" for c, typ in t.columns)


def connect_readonly(mart_path: str | Path) -> duckdb.DuckDBPyConnection:
    """A read-only connection; raises FileNotFoundError naming the command that builds the mart."""
    p = Path(mart_path)
    if not p.is_file():
        raise FileNotFoundError(f"no mart at {p}: build it with `medrobust run --suite SUITE.yaml` (your suite; "
                                "then pass --suite) or `medrobust demo` (the demo's)")
    return duckdb.connect(str(p), read_only=True)


# --- Safety taxonomy ("Consistent but Dangerous"): per-sample rows, quadrant and correlation stats ---


_QUADRANT_ORDER_SQL = "case {col} " + " ".join(f"when '{q}' then {i}" for i, q in enumerate(QUADRANTS)) + " end"
"""Sort key of a quadrant column: Ideal, Fragile, Dangerous, Worst (unknown values last)."""

# taxonomy_transitions: each perturbed ok row paired with the clean ok row (perturbation 'clean') of
# the same (config, dataset, record_id, image_mode). n pairs per (cell, from, to); share_of_from =
# n / all pairs of that from_quadrant in the same (config, dataset, perturbation, level, image_mode).
# n_error: error rows of the perturbed cell (outside every pair; the same on the cell's rows); a cell
# with errors only has one row with NULL quadrants and n = 0.
_TAXONOMY_TRANSITIONS = f"""
        with errs as (
            select config, dataset, perturbation, level, image_mode, count(*) as n_error
            from {TAXONOMY_TABLE} t
            where outcome = 'error' and perturbation <> 'clean' and {complete_filter_sql(TAXONOMY_TABLE, "t")}
            group by all),
        ok as (
            select config, dataset, record_id, image_mode, perturbation, level, quadrant
            from {TAXONOMY_TABLE} t
            where outcome = 'ok' and quadrant is not null and {complete_filter_sql(TAXONOMY_TABLE, "t")}),
        clean as (select config, dataset, record_id, image_mode, quadrant from ok where perturbation = 'clean'),
        pert as (select * from ok where perturbation <> 'clean'),
        counts as (
            select p.config, p.dataset, p.perturbation, p.level, p.image_mode, c.quadrant as from_quadrant,
                   p.quadrant as to_quadrant, count(*) as n
            from pert p join clean c
              on p.config = c.config and p.dataset = c.dataset and p.record_id = c.record_id
                 and p.image_mode = c.image_mode
            group by all),
        cells as (
            select config, dataset, perturbation, level, image_mode, from_quadrant, to_quadrant,
                   cast(n as bigint) as n,
                   cast(n as double) / sum(n) over (
                       partition by config, dataset, perturbation, level, image_mode, from_quadrant) as share_of_from
            from counts
            union all
            select config, dataset, perturbation, level, image_mode, null, null, cast(0 as bigint), null
            from errs e where not exists (
                select 1 from counts c where c.config = e.config and c.dataset = e.dataset
                  and c.perturbation = e.perturbation and c.level = e.level and c.image_mode = e.image_mode))
        select c.*, cast(coalesce(e.n_error, 0) as bigint) as n_error
        from cells c left join errs e using (config, dataset, perturbation, level, image_mode)
        order by config, dataset, perturbation, level, image_mode, {_QUADRANT_ORDER_SQL.format(col="from_quadrant")},
                 {_QUADRANT_ORDER_SQL.format(col="to_quadrant")}"""

MART_VIEWS.update({
    "taxonomy_quadrants": f"""
        select * from taxonomy_quadrant_stats
        order by config, dataset, perturbation, level, image_mode, {_QUADRANT_ORDER_SQL.format(col="quadrant")}""",
    "taxonomy_transitions": _TAXONOMY_TRANSITIONS,
    "taxonomy_correlation": """
        select * from taxonomy_correlation_stats
        order by case scope when 'headline' then 0 when 'condition' then 1 else 2 end,
                 perturbation nulls first, level nulls first, image_mode nulls first""",
})

# taxonomy_screening: taxonomy_screening_stats (medrobust_lib.taxonomy.screening) in a fixed order, the signals
# max_p, margin, entropy within each group
MART_VIEWS["taxonomy_screening"] = """
        select * from taxonomy_screening_stats
        order by config, dataset, perturbation, level, image_mode,
                 case signal when 'max_p' then 0 when 'margin' then 1 else 2 end"""

# --- Infrastructure failures: error share and completeness per partition (medrobust_lib.store.completeness) ---

MART_VIEWS["incomplete_partitions"] = f"""
        select * from {COMPLETENESS_TABLE} where not complete
        order by source_table, model, modality, level"""
# averaging / ranking views without and with floor datasets (medrobust_lib.store.summary_views), and
# coverage and floor effects (medrobust_lib.store.coverage): after the views they read
MART_VIEWS.update(SUMMARY_VIEWS)
MART_VIEWS.update(COVERAGE_VIEWS)
