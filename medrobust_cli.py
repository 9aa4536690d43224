"""The ``medrobust`` command line (typer).

Kept outside ``medrobust_lib`` because ``demo`` drives Dagster; every other command only needs
the library. Heavy imports happen inside the commands so ``medrobust --help`` is instant.
"""

from __future__ import annotations

import json
import os
import sys
import time
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="medrobust: how does a medical imaging foundation model fail?")

EXAMPLE_QUERIES = [
    "select modality, level, round(avg(band_hit_rate), 3) as hit_rate, round(avg(mean_ssim), 3) as ssim "
    "from perturbation_summary group by all order by all",
    "select perturbation, level, n, round(mean_strength, 4) as strength, round(mean_ssim, 3) as ssim "
    "from perturbation_summary where modality = 'mri' order by perturbation, level",
    "select perturbation, count(*) as unreachable from perturbation_manifest "
    "where miss_reason = 'unreachable' group by all order by 2 desc",
    "select strategy, kind, round(mean_iou_drop, 4) as iou_drop, round(iou_drop_ci_low, 4) as lo, "
    "round(iou_drop_ci_high, 4) as hi, n_trainable, rank from strategy_ranking order by kind, rank",
]


class OutFormat(StrEnum):
    table = "table"
    csv = "csv"
    json = "json"
    parquet = "parquet"
    markdown = "markdown"


class ImgFormat(StrEnum):
    png = "png"
    npy = "npy"


def _echo(msg: str) -> None:
    typer.echo(msg, err=True)


@app.command()
def demo(
    suite: Annotated[str, typer.Option(help="suite YAML (default: configs/demo.yaml, or configs/demo_full.yaml "
                                             "with --full)")] = "",
    workers: Annotated[int, typer.Option(help="processes inside a partition (0: the suite's value)")] = 0,
    full: Annotated[bool, typer.Option("--full", help="the complete grid (configs/demo_full.yaml): every "
                                       "perturbation level and fine-tuning evaluation level")] = False,
    retrain: Annotated[bool, typer.Option("--retrain", help="train the demo models from the embedded data instead "
                                          "of copying the committed weights")] = False,
) -> None:
    """Materialize the whole asset graph on the embedded offline demo, with progress. The default
    grid (configs/demo.yaml) takes about 10 minutes on 2 cores; --full runs the complete grid."""
    from medrobust_assets.runner import run_demo

    if suite and full:
        raise typer.BadParameter("give --suite or --full, not both")
    suite = suite or ("configs/demo_full.yaml" if full else "configs/demo.yaml")
    t0 = time.perf_counter()
    mart = run_demo(suite, workers=workers, log=_echo, retrain=retrain)
    from medrobust_lib.report.paper import build_report

    t1 = time.perf_counter()
    rep = build_report(mart, Path("var/reports"), None, mlruns_dir=Path("mlruns"), log_mlflow=True)
    _echo(f"== report  {time.perf_counter() - t1:6.1f} s  ({len(rep.tables)} tables, {len(rep.figures)} figures)")
    typer.echo(f"\nDone in {time.perf_counter() - t0:.0f} s.")
    typer.echo(f"  mart:     {mart}   (medrobust query \"SQL\")")
    typer.echo(f"  report:   {rep.html}   (medrobust report [--models ...] rebuilds it)")
    typer.echo("  results:  <results_dir>/<table>/  (Parquet, hive-partitioned; see the suite YAML)")
    typer.echo("  MLflow:   mlruns/  (make mlflow-ui)      Dagster runs: var/dagster  (make ui)")
    typer.echo("\nTry:")
    for q in EXAMPLE_QUERIES:
        typer.echo(f'  medrobust query "{q}"')


@app.command()
def run(
    suite: Annotated[str, typer.Option(help="suite YAML")],
    select: Annotated[list[str] | None, typer.Option(
        help="an asset group (datasets, perturbations, segmentation, finetune, vlm, taxonomy, marts) or an asset "
             "key such as tiny-sam/clean_predictions; a leading + adds what it depends on; repeatable "
             "(default: everything)")] = None,
    workers: Annotated[int, typer.Option(help="processes inside a partition (0: the suite's value)")] = 0,
) -> None:
    """Materialize a suite's assets in dependency order, with progress (one Dagster run per partition,
    visible in the UI). A failure prints one line: asset, partition, cause (full log in the run)."""
    from medrobust_assets.runner import StepFailed, run_suite

    t0 = time.perf_counter()
    try:
        mart = run_suite(suite, select, workers=workers, log=_echo)
    except StepFailed as exc:
        _echo(f"error: {exc}")
        raise typer.Exit(1) from None
    except (FileNotFoundError, ValueError) as exc:
        _echo(f"error: {exc}")
        raise typer.Exit(2) from None
    typer.echo(f"Done in {time.perf_counter() - t0:.0f} s. Mart: {mart}  (medrobust query --suite {suite} \"SQL\")")


@app.command()
def validate(
    suite: Annotated[str, typer.Option(help="suite YAML")],
    load: Annotated[int, typer.Option(help="samples decoded per dataset (0: index only)")] = 3,
) -> None:
    """Check a suite without running it: configuration (unknown keys, models without weights), every
    dataset's layout (samples found, quarantined, first problems), weights and record files.
    Exit 0 when usable, 2 when not."""
    from medrobust_lib.tracks.validate import validate_suite

    report = validate_suite(suite, n_load=load)
    for line in report.lines():
        typer.echo(line)
    if not report.ok:
        raise typer.Exit(2)


@app.command()
def query(
    sql: Annotated[str, typer.Argument(help="one read-only SQL statement (SELECT, WITH, DESCRIBE, SHOW, "
                                            "SUMMARIZE, EXPLAIN of a SELECT)")],
    format: Annotated[OutFormat | None, typer.Option(
        "--format", "-f", help="default: table on screen; with --out, from the file's extension")] = None,
    output: Annotated[Path | None, typer.Option(
        "--out", "--output", "-o", help="write the result to this file (.csv, .parquet, .json)")] = None,
    mart: Annotated[str, typer.Option(help="DuckDB mart")] = "var/marts.duckdb",
) -> None:
    """Run one SQL statement against the mart, read-only.

    Statements that write or change state (INSERT, COPY ... TO, ATTACH, SET, PRAGMA, CALL, ...) and
    several statements at once are refused with exit code 2 before anything runs; a failing query
    exits 1. See medrobust_lib/store/query.py for exactly what is allowed.
    """
    import duckdb

    from medrobust_lib.store.query import (
        FILE_FORMATS,
        check_read_only,
        frame_to_json,
        infer_format,
        run_query,
        write_frame,
    )

    try:
        check_read_only(sql)
    except ValueError as exc:
        _echo(str(exc))
        raise typer.Exit(2) from None
    except duckdb.Error as exc:
        _echo(f"query failed: {exc}")
        raise typer.Exit(1) from None
    fmt = format or OutFormat.table
    if output is not None and format is None:
        try:
            fmt = OutFormat(infer_format(output))
        except ValueError as exc:
            _echo(str(exc))
            raise typer.Exit(2) from None
    if fmt is OutFormat.parquet and output is None:
        _echo("--format parquet needs --out FILE")
        raise typer.Exit(2)
    try:
        df = run_query(mart, sql)
    except FileNotFoundError as exc:
        _echo(str(exc))
        raise typer.Exit(2) from None
    except duckdb.Error as exc:
        _echo(f"query failed: {exc}")
        raise typer.Exit(1) from None
    if output is not None and fmt.value in FILE_FORMATS:
        try:
            write_frame(df, output, fmt.value)
        except OSError as exc:
            _echo(f"cannot write {output}: {exc}")
            raise typer.Exit(1) from None
        _echo(f"wrote {len(df)} rows to {output} ({fmt.value})")
        return
    if fmt is OutFormat.table:
        text = df.to_string(index=False) if len(df) else "(no rows)"
    elif fmt is OutFormat.csv:
        text = df.to_csv(index=False)
    elif fmt is OutFormat.json:
        text = frame_to_json(df)
    else:
        text = df.to_markdown(index=False)
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text)
        _echo(f"wrote {len(df)} rows to {output} ({fmt.value})")
    else:
        typer.echo(text.rstrip("\n"))


@app.command("list-perturbations")
def list_perturbations_cmd(
    modality: Annotated[str | None, typer.Option(help="only types for this modality")] = None,
    format: Annotated[OutFormat, typer.Option("--format", "-f")] = OutFormat.table,
) -> None:
    """Every registered perturbation: name, family, modalities, geometry, strength, reference."""
    from medrobust_lib.perturb.spec import get_perturbation, list_perturbations
    from medrobust_lib.types import ALL_MODALITIES

    rows = []
    for name in list_perturbations(modality=modality):
        s = get_perturbation(name)
        mods = "all" if set(s.modalities) == set(ALL_MODALITIES) else ",".join(s.modalities)
        rows.append({"name": name, "family": s.family, "modalities": mods, "geometry": s.geometry,
                     "channels": s.channels, "strength": f"{s.strength_range[0]:g}..{s.strength_range[1]:g} {s.unit}".strip()
                     + (" (smaller is stronger)" if s.inverse else ""), "reference": s.reference})
    if format is OutFormat.json:
        typer.echo(json.dumps(rows, indent=1))
        return
    import pandas as pd

    df = pd.DataFrame(rows)
    if format is OutFormat.markdown:
        typer.echo(perturbation_table_markdown(df))
    else:
        typer.echo(df.to_csv(index=False) if format is OutFormat.csv else df.to_string(index=False))


def perturbation_table_markdown(df: Any) -> str:
    """The README table (kept in sync by a test)."""
    cols = ["name", "family", "modalities", "geometry", "strength", "reference"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in df[cols].to_dict("records"):
        lines.append("| " + " | ".join(str(r[c]).replace("|", "/") for c in cols) + " |")
    return "\n".join(lines)


@app.command()
def perturb(
    input: Annotated[Path, typer.Argument(help="image: PNG, JPEG, TIFF, DICOM, NIfTI slice or .npy")],
    type: Annotated[str, typer.Option("--type", "-t", help="perturbation name or 'all'")] = "all",
    level: Annotated[str, typer.Option("--level", "-l", help="1..5 or 'all'")] = "all",
    modality: Annotated[str | None, typer.Option(help="modality; adds its specific types to 'all'")] = None,
    seed: Annotated[int, typer.Option()] = 0,
    mask: Annotated[Path | None, typer.Option(help="mask image moved along with spatial types")] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="one output file (.png or .npy)")] = None,
    output_dir: Annotated[Path | None, typer.Option(help="folder for one file per (type, level)")] = None,
    format: Annotated[ImgFormat, typer.Option("--format", help="file format with --output-dir")] = ImgFormat.png,
) -> None:
    """Perturb one image file at calibrated severities; prints one JSON line per output."""
    from medrobust_lib.perturb.single import perturb_file

    try:
        for rec in perturb_file(input, type, level, modality=modality, seed=seed, mask_path=mask, output=output,
                                output_dir=output_dir, fmt=format.value):
            typer.echo(json.dumps(rec))
    except (ValueError, KeyError, FileNotFoundError) as exc:
        _echo(f"error: {exc}")
        raise typer.Exit(2) from None


class ScoreTask(StrEnum):
    vqa = "vqa"
    caption = "caption"
    grounding = "grounding"


class BoxScale(StrEnum):
    unit = "0-1"
    thousandths = "0-1000"
    pixels = "pixels"


@app.command()
def score(
    task: Annotated[ScoreTask, typer.Argument(help="vqa, caption or grounding")],
    predictions: Annotated[Path, typer.Option(help="JSONL: one {\"id\", \"prediction\", ...} per line")],
    references: Annotated[Path, typer.Option(help="JSONL: one reference record per line")],
    scale: Annotated[BoxScale | None, typer.Option(help="grounding: box scale of every answer "
                                                        "(default: detected per answer)")] = None,
) -> None:
    """Score predictions made elsewhere against references; prints one JSON summary."""
    from medrobust_lib.tasks.score_files import score_file

    try:
        summary = score_file(task.value, predictions, references,  # type: ignore[arg-type]
                             declared_scale=scale.value if scale is not None else None)
    except (FileNotFoundError, IsADirectoryError, PermissionError, ValueError) as exc:
        _echo(f"error: {exc}")
        raise typer.Exit(2) from None
    typer.echo(json.dumps(summary, sort_keys=True, indent=2))


class CheckFormat(StrEnum):
    table = "table"
    markdown = "markdown"
    json = "json"


@app.command()
def check(
    candidate: Annotated[str, typer.Option(help="model id, stored checkpoint hash or models:/name@alias")],
    baseline: Annotated[str, typer.Option(help="model id, stored checkpoint hash or models:/name@alias")],
    suite: Annotated[str, typer.Option(help="suite YAML (gives the results dir)")] = "configs/demo.yaml",
    results_dir: Annotated[Path | None, typer.Option(help="results store (default: the suite's)")] = None,
    mlruns: Annotated[Path | None, typer.Option(help="MLflow store for models:/ URIs "
                                                     "(default: $MEDROBUST_MLRUNS or mlruns)")] = None,
    max_iou_drop_increase: Annotated[float, typer.Option(help="tolerated mean IoU-drop increase")] = 0.01,
    max_dice_drop_increase: Annotated[float, typer.Option(help="tolerated mean Dice-drop increase")] = 0.01,
    alpha: Annotated[float, typer.Option(help="Benjamini-Hochberg q threshold")] = 0.05,
    min_pairs: Annotated[int, typer.Option(help="groups with fewer paired samples never fail")] = 5,
    format: Annotated[CheckFormat, typer.Option("--format", "-f")] = CheckFormat.table,
    evaluate: Annotated[bool, typer.Option(help="evaluate a models:/ side that has no rows yet (on the suite's "
                                                "fine-tuning evaluation set); --no-evaluate only reuses rows")] = True,
) -> None:
    """Regression gate: exit 1 when the candidate is significantly less robust than the baseline
    on the same samples and conditions (0: passed, 2: bad input). Each side's rows are reused when
    they exist, else (models:/ URIs) the version is evaluated first."""
    from medrobust_lib.config import load_suite
    from medrobust_lib.store.results import read_table
    from medrobust_lib.tracks.finetune.gate import (
        GateInputError,
        GateThresholds,
        compare,
        gather_side,
        render,
    )
    from medrobust_lib.tracks.segmentation.evaluate import RESULTS_TABLE

    if mlruns is not None:
        os.environ["MEDROBUST_MLRUNS"] = str(mlruns)
    try:
        thresholds = GateThresholds(max_iou_drop_increase, max_dice_drop_increase, alpha, min_pairs)
        s = load_suite(suite) if Path(suite).is_file() else None
        if results_dir is None:
            if s is None:
                raise FileNotFoundError(f"suite {suite} not found (it gives the results dir); pass --results-dir")
            results_dir = Path(s.results_dir)
        rows = read_table(results_dir, RESULTS_TABLE)
        sides = {side: gather_side(ref, side, results_dir, suite=s, mlruns_dir=mlruns, evaluate=evaluate, log=_echo,
                                   rows=rows)
                 for side, ref in (("candidate", candidate), ("baseline", baseline))}
        result = compare(sides["candidate"], sides["baseline"], thresholds)
    except (GateInputError, ValueError, FileNotFoundError) as exc:
        _echo(f"error: {exc}")
        raise typer.Exit(2) from None
    typer.echo(render(result, format.value))
    if format is CheckFormat.json:
        _echo(result.verdict)
    if not result.passed:
        raise typer.Exit(1)


@app.command()
def report(
    models: Annotated[str | None, typer.Option(help="comma-separated model / taxonomy config ids (default: all)")] = None,
    out: Annotated[Path, typer.Option(help="output folder (index.html, tables/, figures/)")] = Path("var/reports"),
    mart: Annotated[str, typer.Option(help="DuckDB mart (opened read-only)")] = "var/marts.duckdb",
    mlruns: Annotated[Path, typer.Option(help="MLflow folder (SQLite backend)")] = Path("mlruns"),
    no_mlflow: Annotated[bool, typer.Option("--no-mlflow", help="do not log the report to MLflow")] = False,
) -> None:
    """Paper-ready tables (CSV, Markdown, LaTeX), PNG figures and one index.html from the mart;
    logged as artifacts of one MLflow run in experiment 'reports' (exit 2: no mart or unknown ids)."""
    from medrobust_lib.report.paper import build_report, parse_models

    try:
        summary = build_report(mart, out, parse_models(models), mlruns_dir=mlruns, log_mlflow=not no_mlflow)
    except (FileNotFoundError, ValueError) as exc:
        _echo(f"error: {exc}")
        raise typer.Exit(2) from None
    for name, reason in summary.skipped.items():
        _echo(f"skipped {name}: {reason}")
    _echo(f"wrote {len(summary.tables)} tables x 3 formats and {len(summary.figures)} figures in "
          f"{summary.seconds:.1f} s" + (f"; MLflow run {summary.mlflow_run_id}" if summary.mlflow_run_id else ""))
    typer.echo(str(summary.html))


def main() -> Any:  # pragma: no cover
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    return app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
