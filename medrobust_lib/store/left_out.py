"""What a run left out, counted with the reason, read from the Parquet results of a suite
(:func:`left_out`; :func:`summary_lines` for the end of ``medrobust run`` / ``medrobust demo``).

Nothing leaves a mean silently: a quarantined sample, a perturbation type that does not apply to a
dataset's images (``not_applicable`` manifest rows, e.g. an RGB-only type on grayscale images), a
failed or unscored segmentation row, a dataset whose clean score is at the floor
(:data:`~medrobust_lib.store.views.common.SEG_FLOOR`: left out of the averages unless every dataset
of its model is at the floor), and VLM / taxonomy rows with an ``error`` or ``excluded:*`` outcome.
Read from the results, not the mart, so it also works after a run that built no mart."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from medrobust_lib.store.schema import TAXONOMY_TABLE, VLM_TABLE
from medrobust_lib.store.views.common import SEG_FLOOR, SEGMENTATION_FLOOR_SQL

CLEAN = "clean_samples"
MANIFEST = "perturbation_manifest"
SEGMENTATION = "segmentation_results"


@dataclass(frozen=True)
class LeftOut:
    """``n`` ``unit`` (samples, rows, datasets) of ``table`` left out of the means, ``where`` they
    are (a dataset, a model, a type on a dataset) and ``reason``."""

    table: str
    unit: str
    n: int
    where: str
    reason: str

    def text(self) -> str:
        return f"{self.table}: {self.n} {self.unit} of {self.where}: {self.reason}"


def _view(con: Any, results_dir: Path, table: str) -> bool:
    root = results_dir / table
    if not root.is_dir() or not any(root.rglob("*.parquet")):
        return False
    glob = str(root / "**" / "*.parquet").replace("'", "''")
    con.execute(f"create view {table} as select * from read_parquet('{glob}', hive_partitioning = true, "
                "union_by_name = true)")
    return True


def _columns(con: Any, table: str) -> set[str]:
    return {str(r[0]) for r in con.execute(f"describe {table}").fetchall()}


def left_out(results_dir: str | Path) -> list[LeftOut]:
    """Every group of rows the suite's results leave out of their means, with the reason (see the
    module docstring), in a fixed order: clean samples, manifest, segmentation rows, floor
    datasets, VLM, taxonomy."""
    import duckdb

    root = Path(results_dir)
    out: list[LeftOut] = []
    con = duckdb.connect()
    try:
        if _view(con, root, CLEAN):
            for ds, reason, n in con.execute(
                    f"select dataset, coalesce(reason, 'unknown'), count(*) from {CLEAN} where status <> 'ok' "
                    "group by all order by all").fetchall():
                out.append(LeftOut(CLEAN, "samples", int(n), f"dataset {ds}", f"quarantined ({reason})"))
        if _view(con, root, MANIFEST):
            for ds, pert, status, n, total, reason in con.execute(f"""
                    select dataset, perturbation, status, count(distinct sample_id) as n,
                           any_value(n_all) as total, min(error) as reason
                    from (select *, count(distinct sample_id) over (partition by dataset) as n_all from {MANIFEST})
                    where status <> 'ok' group by dataset, perturbation, status order by all""").fetchall():
                share = "every sample" if int(n) >= int(total) else f"{n} of {total} samples"
                out.append(LeftOut(MANIFEST, "samples", int(n), f"type {pert} on dataset {ds}",
                                   f"{status} ({share}): {reason or 'no reason recorded'}"))
        if _view(con, root, SEGMENTATION):
            for model, status, n, reason in con.execute(
                    f"select model, status, count(*), min(error) from {SEGMENTATION} where status <> 'ok' "
                    "group by all order by all").fetchall():
                out.append(LeftOut(SEGMENTATION, "rows", int(n), f"model {model}",
                                   f"{status}" + (f" (e.g. {reason})" if reason else "")))
            for model, strategy, ds, iou, dice, every in con.execute(f"""
                    with floor_ds as ({SEGMENTATION_FLOOR_SQL})
                    select model, strategy, dataset, clean_iou, clean_dice,
                           bool_and(floor_effect) over (partition by model, checkpoint, strategy) as all_floor
                    from floor_ds qualify floor_effect order by model, strategy, dataset""").fetchall():
                who = f"model {model}" + (f" ({strategy})" if strategy else "")
                what = ("kept, the model flagged floor_effect: every dataset of it is at the floor" if every
                        else "left out of the averages and rankings (the _all views and --include-floor keep it)")
                out.append(LeftOut("segmentation floor", "dataset", 1, f"{ds} for {who}",
                                   f"clean IoU {_num(iou)}, Dice {_num(dice)} below {SEG_FLOOR:g}: {what}"))
        for table, who in ((VLM_TABLE, "model"), (TAXONOMY_TABLE, "config")):  # taxonomy rows name a configuration
            cols = _columns(con, table) if _view(con, root, table) else set()
            if "outcome" in cols and who in cols:
                err = "min(error)" if "error" in cols else "null"
                for name, outcome, n, reason in con.execute(
                        f"select {who}, outcome, count(*), {err} from {table} "
                        "where outcome = 'error' or outcome like 'excluded:%' group by all order by all").fetchall():
                    out.append(LeftOut(table, "rows", int(n), f"{who} {name}",
                                       f"{outcome}" + (f" (e.g. {reason})" if reason else "")))
    finally:
        con.close()
    return out


def _num(v: Any) -> str:
    return "n/a" if v is None else f"{float(v):.3f}"


def summary_lines(items: list[LeftOut]) -> list[str]:
    """The run summary's lines: a header with the count, then one indented line per group; one
    line saying nothing was left out when ``items`` is empty."""
    if not items:
        return ["== left out: nothing (every sample, type and row is in the means)"]
    return [f"== left out ({len(items)} group(s), each counted with its reason):",
            *(f"  {i.text()}" for i in items)]
