"""The ``medrobust`` command line (typer).

Kept outside ``medrobust_lib`` because ``demo`` drives Dagster; every other command only needs
the library. Heavy imports happen inside the commands so ``medrobust --help`` is instant.
"""

from __future__ import annotations

import functools
import json
import os
import re
import sys
import time
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, TypeVar

import click
import typer
from pydantic import ValidationError

from medrobust_lib.paths import SuitePaths, suite_paths
from medrobust_lib.project import in_project, project_root
from medrobust_lib.types import ALL_MODALITIES, parse_modality
from medrobust_lib.vlm_tasks.score_files import score_file

_DEBUG = {"on": os.environ.get("MEDROBUST_DEBUG", "") not in ("", "0")}


def _one_line(exc: BaseException) -> str:
    """The exception's message on one line (DuckDB and pydantic messages span several)."""
    msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
    lines = [ln.strip() for ln in str(msg).splitlines() if ln.strip()]
    return "; ".join(lines) if lines else type(exc).__name__


def _is_user_error(exc: BaseException) -> bool:
    """Bad input rather than a bug: unreadable files, bad values or config, bad SQL, missing mart."""
    if isinstance(exc, (ValueError, LookupError, OSError)):
        return True
    return any(c.__module__.split(".")[0] in ("duckdb", "yaml", "pydantic", "pydicom", "nibabel", "PIL", "cv2")
               for c in type(exc).__mro__[:-2])


def _is_usage_error(exc: BaseException) -> bool:
    """typer's own usage exceptions (``typer.BadParameter``: not click's class in every typer
    release), which typer prints as a usage error with exit code 2."""
    return hasattr(exc, "exit_code") and hasattr(exc, "format_message") and callable(getattr(exc, "show", None))


def _stop_workers() -> None:
    """After Ctrl-C: stop the worker pools at once (exiting would otherwise wait for their running
    tasks)."""
    from medrobust_lib import runtime

    runtime.terminate_pools()


def guard_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run a command so that a user error prints one line ``error: ...`` and exits 2, any other
    failure prints one line and exits 1, and Ctrl-C prints ``error: interrupted`` and exits 130;
    the traceback only with ``medrobust --debug``."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort, click.exceptions.Exit, click.exceptions.Abort, click.ClickException):
            raise
        except KeyboardInterrupt:
            _stop_workers()
            if _DEBUG["on"]:
                raise
            typer.echo("error: interrupted", err=True)
            raise typer.Exit(130) from None
        except RecursionError:  # a hostile input nested too deep for a parser
            if _DEBUG["on"]:
                raise
            typer.echo("error: input nested too deeply to read", err=True)
            raise typer.Exit(2) from None
        except Exception as exc:
            if _DEBUG["on"] or _is_usage_error(exc):  # typer formats a bad option itself (exit 2)
                raise
            if _is_user_error(exc):
                typer.echo(f"error: {_one_line(exc)}", err=True)
                raise typer.Exit(2) from None
            typer.echo(f"error: internal error ({type(exc).__name__}: {_one_line(exc)}); "
                       "rerun with `medrobust --debug ...` for the traceback", err=True)
            raise typer.Exit(1) from None

    return wrapper


_Command = TypeVar("_Command", bound=Callable[..., Any])
"""A command function (Typer's ``CommandFunctionType``): the decorator returns it unchanged."""


class _GuardedTyper(typer.Typer):
    """A Typer whose every command runs inside :func:`guard_errors`."""

    def command(self, *args: Any, **kwargs: Any) -> Callable[[_Command], _Command]:
        register = super().command(*args, **kwargs)

        def decorator(fn: _Command) -> _Command:
            register(guard_errors(fn))
            return fn

        return decorator


app = _GuardedTyper(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None,
                    help="medrobust: how does a medical imaging foundation model fail?")


@app.callback()
def _root(debug: Annotated[bool, typer.Option("--debug", help="show the full traceback of an error "
                                                                "(also MEDROBUST_DEBUG=1)")] = False) -> None:
    """medrobust: how does a medical imaging foundation model fail?"""
    _DEBUG["on"] = debug or os.environ.get("MEDROBUST_DEBUG", "") not in ("", "0")

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


class ListFormat(StrEnum):
    """Formats of list-perturbations (printed, so no parquet)."""

    table = "table"
    csv = "csv"
    json = "json"
    markdown = "markdown"


class ImgFormat(StrEnum):
    png = "png"
    npy = "npy"


def _echo(msg: str) -> None:
    if msg.startswith("error: "):  # an error is one line, whatever the exception's message looks like
        msg = "error: " + "; ".join(ln.strip() for ln in msg[len("error: "):].splitlines() if ln.strip())
    typer.echo(msg, err=True)


def _live_writer() -> Callable[[str], None] | None:
    """Raw text to stderr when it is a terminal (the running step's progress line is rewritten in
    place); None into a file or a pipe (progress lines then come at most every 15 s)."""
    if not sys.stderr.isatty():
        return None

    def write(text: str) -> None:
        sys.stderr.write(text)
        sys.stderr.flush()

    return write


def _project_path(given: Path | str | None, default: str) -> Path:
    """A path option: what the user gave (relative to the current directory), else ``default``
    inside the project root (medrobust_lib.project), so commands work from any directory."""

    return Path(given).expanduser().resolve() if given is not None else in_project(default)


def _suite_file(suite: Path | str) -> Path:
    """``--suite FILE`` as typed (relative to the current folder, as every path typed on the
    command line), absolute; FileNotFoundError when there is no such file."""
    p = Path(suite).expanduser().resolve()
    if not p.is_file():
        raise FileNotFoundError(f"suite not found: {p}")
    return p


def _suite_workers(suite: Path) -> int:
    """The suite's ``workers`` (processes the machine can give one job)."""
    from medrobust_lib.runtime import load_suite  # parsed once per process

    return int(load_suite(suite).workers)


def _suite_locations(suite: str | None) -> SuitePaths | None:
    """The output locations of ``--suite FILE`` (None without the option), relative paths resolved
    against the project root, as the suite's own runs resolve them."""
    if suite is None:
        return None
    from medrobust_lib.runtime import load_suite  # parsed once per process

    path = _suite_file(suite)
    return suite_paths(load_suite(path), base=project_root(path))


def _suite_mce_baseline(path: Path) -> str | None:
    """The suite's ``segmentation.mce_baseline`` (the report's mCE baseline; None when unset)."""
    from medrobust_lib.runtime import load_suite  # parsed once per process

    return load_suite(path).segmentation.mce_baseline


def _report_experiment(suite: str | None) -> str:
    """The MLflow experiment of a report run: the suite's ``<suite name>/reports``, or ``reports``
    when no suite is named (the mart's suite is not known then)."""
    from medrobust_lib.report.paper import EXPERIMENT

    if suite is None:
        return EXPERIMENT
    from medrobust_lib.paths import experiment_name
    from medrobust_lib.runtime import load_suite  # parsed once per process

    return experiment_name(load_suite(_suite_file(suite)), EXPERIMENT)


def _enter_project(suite: Path | None = None) -> Path:
    """Change into the project root (of ``suite``, the suite file a command was given, if any): a
    suite's relative paths are relative to it. Returns the root."""

    root = project_root(suite)
    os.chdir(root)
    return root


def _claim_outputs(suite_path: Path, root: Path) -> None:
    """Refuse a suite that would write into another suite's outputs (one line naming both), else
    record that these outputs are this suite's."""
    from medrobust_lib.config.isolation import check_isolation, record_claim
    from medrobust_lib.runtime import load_suite  # parsed once per process

    s = load_suite(suite_path)
    check_isolation(s, suite_path, root)
    record_claim(s, suite_path, root)


def _home_prefix(suite_path: Path, root: Path) -> str:
    """``MEDROBUST_HOME=<root> `` when the project root came from that variable and the suite file
    does not lie inside the root (a hint without it would find another root), else ``""``."""
    if os.environ.get("MEDROBUST_HOME") and root not in suite_path.parents:
        return f"MEDROBUST_HOME={_shell_quote(str(root))} "
    return ""


def _shell_quote(text: str) -> str:
    import shlex

    return shlex.quote(text)


def _step_failed(exc: Any, suite_path: Path, select: list[str] | None = None) -> typer.Exit:
    """Print a failed step in one line (asset, partition, cause, what to run next) and return the
    exit: 130 when interrupted, 2 for bad input, 1 otherwise. ``--debug`` prints the traceback. A
    step whose upstream was never materialized (``MissingUpstream``) is answered with the same
    selection plus what it depends on (``--select +<token>``)."""
    if _DEBUG["on"] and exc.traceback:
        typer.echo(exc.traceback.rstrip(), err=True)
    if exc.interrupted:
        _stop_workers()
        _echo(f"error: interrupted while materializing {exc.label}")
        return typer.Exit(130)
    suite = _shell_quote(str(suite_path))
    home = _home_prefix(suite_path, project_root(suite_path))
    rerun = f"{home}medrobust run --suite {suite} --select {_shell_quote(exc.asset)}"
    if exc.cls_name == "MissingUpstream":
        tokens = select or [exc.asset]
        plus = " ".join(f"--select {_shell_quote(t if t.startswith('+') else '+' + t)}" for t in tokens)
        cause = str(exc.cause).split("MissingUpstream: ", 1)[-1]  # Dagster prefixes the class path
        _echo(f"error: {exc.label} failed: {cause}; run the selection with what it depends on: "
              f"`{home}medrobust run --suite {suite} {plus}`")
        return typer.Exit(2)
    if exc.user_error:
        _echo(f"error: {exc.label} failed: {exc.cause}; fix it, check with `{home}medrobust validate --suite "
              f"{suite}`, then `{rerun}`")
        return typer.Exit(2)
    debug = rerun.replace("medrobust run", "medrobust --debug run", 1)
    _echo(f"error: {exc.label} failed: {exc.cause}; for the traceback: `{debug}` (log: Dagster run {exc.run_id})")
    return typer.Exit(1)


def _modality_option(value: str | None) -> str | None:
    """``--modality``: case-insensitive; an unknown name is a usage error listing the valid ones."""
    if value is None:
        return None

    try:
        return parse_modality(value).value
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


def _dagster_home(suite_path: Path, root: Path) -> Path:
    """The Dagster instance folder the runs of ``suite_path`` went to (the demo's summary names it):
    the suite's own instance home (:func:`medrobust_assets.location_files.suite_instance_home`),
    whether or not ``$DAGSTER_HOME`` is set (``make`` sets it; ``.venv/bin/medrobust`` may not)."""
    from medrobust_assets.location_files import suite_instance_home
    from medrobust_lib.runtime import load_suite

    return suite_instance_home(load_suite(suite_path), root)


@app.command()
def demo(
    suite: Annotated[Path | None, typer.Option(help="a demo suite YAML (demo.enabled: true) [default: "
                                                    "configs/demo.yaml in the project, or configs/demo_full.yaml "
                                                    "with --full]; your own suite runs with `medrobust run --suite`",
                                               show_default=False)] = None,
    workers: Annotated[int, typer.Option(min=0, help="processes inside a partition (0: the suite's value)")] = 0,
    full: Annotated[bool, typer.Option("--full", help="the complete grid (configs/demo_full.yaml): every "
                                       "perturbation level and fine-tuning evaluation level")] = False,
    retrain: Annotated[bool, typer.Option("--retrain", help="train the demo models from the embedded data instead "
                                          "of copying the committed weights")] = False,
) -> None:
    """Materialize the whole asset graph on the embedded offline demo, with progress. Runs in the
    project root ($MEDROBUST_HOME, else the folder holding configs/demo.yaml), wherever it is
    started from; --full runs the complete grid. A failure prints one line."""
    if suite is not None and full:
        raise typer.BadParameter("give --suite or --full, not both")
    suite_path = _suite_file(suite) if suite is not None else \
        _project_path(None, "configs/demo_full.yaml" if full else "configs/demo.yaml")
    from medrobust_lib.runtime import load_suite  # parsed once per process

    if not load_suite(suite_path).demo.enabled:
        raise ValueError(f"{suite_path} is not a demo suite (demo.enabled is false): run your own suite with "
                         f"`medrobust run --suite {_shell_quote(str(suite_path))}`")
    root = _enter_project(suite_path)
    _claim_outputs(suite_path, root)
    from medrobust_assets.runner import StepFailed, run_demo  # the Definitions are built from this suite

    t0 = time.perf_counter()
    try:
        mart = run_demo(str(suite_path), workers=workers, log=_echo, retrain=retrain, live=_live_writer())
    except StepFailed as exc:
        raise _step_failed(exc, suite_path) from None
    from medrobust_lib.report.paper import build_report

    t1 = time.perf_counter()
    loc = _suite_locations(str(suite_path))
    assert loc is not None
    rep = build_report(mart, loc.reports, None, mlruns_dir=Path("mlruns"), log_mlflow=True,
                       experiment=_report_experiment(str(suite_path)),
                       workers=workers or _suite_workers(suite_path), mce_baseline=_suite_mce_baseline(suite_path))
    _echo(f"== report  {time.perf_counter() - t1:6.1f} s  ({len(rep.tables)} tables, {len(rep.figures)} figures)")
    default = suite is None or suite_path == in_project("configs/demo.yaml", root)
    with_suite = "" if default else f" --suite {_shell_quote(str(suite_path))}"
    home = f"MEDROBUST_HOME={_shell_quote(str(root))} " if os.environ.get("MEDROBUST_HOME") else ""
    typer.echo(f"\nDone in {time.perf_counter() - t0:.0f} s.")
    typer.echo(f"  mart:     {root / mart}   ({home}medrobust query{with_suite} \"SQL\")")
    typer.echo(f"  report:   {rep.html}   ({home}medrobust report{with_suite} [--models ...] rebuilds it)")
    typer.echo(f"  results:  {loc.results}/<table>/  (Parquet, hive-partitioned)")
    typer.echo(f"  MLflow:   {root / 'mlruns'}  (make mlflow-ui)      Dagster runs: {_dagster_home(suite_path, root)}  "
               "(make ui)")
    typer.echo("\nTry:")
    for q in EXAMPLE_QUERIES:
        typer.echo(f'  {home}medrobust query{with_suite} "{q}"')


@app.command()
def run(
    suite: Annotated[Path, typer.Option(help="suite YAML (relative to the current folder; the paths inside it "
                                             "are relative to the project root)")],
    select: Annotated[list[str] | None, typer.Option(
        help="an asset group (datasets, perturbations, segmentation, finetune, vlm, taxonomy, marts) or an asset "
             "key such as tiny-sam/clean_predictions; a leading + adds what it depends on; repeatable "
             "(default: everything)")] = None,
    workers: Annotated[int, typer.Option(help="processes inside a partition (0: the suite's value)")] = 0,
    partition: Annotated[list[str] | None, typer.Option(
        help="only this partition of the partitioned assets: a modality (ct) or modality|level (ct|4); "
             "repeatable; one outside the suite's modalities and levels is refused")] = None,
) -> None:
    """Materialize a suite's assets in dependency order, with progress: the way to run your own
    suite. One Dagster run per partition, recorded in the project's Dagster instance (the UI shows
    it). Relative paths inside the suite are relative to the project root ($MEDROBUST_HOME, else
    the folder holding configs/demo.yaml), from whichever folder this starts. A suite that would
    write into another suite's folders is refused. A failure prints one line: asset, partition,
    cause, what to run next (--debug: the traceback)."""
    suite_path = _suite_file(suite)
    root = _enter_project(suite_path)
    _claim_outputs(suite_path, root)
    from medrobust_assets.runner import StepFailed, run_suite  # the Definitions are built from this suite
    from medrobust_lib.runtime import load_suite  # parsed once per process

    mart = in_project(load_suite(suite_path).mart_path, root)
    before = mart.stat().st_mtime_ns if mart.is_file() else None
    t0 = time.perf_counter()
    try:
        run_suite(str(suite_path), select, workers=workers, log=_echo, partitions=partition, live=_live_writer())
    except StepFailed as exc:
        raise _step_failed(exc, suite_path, select) from None
    built = mart.is_file() and mart.stat().st_mtime_ns != before
    typer.echo(f"Done in {time.perf_counter() - t0:.0f} s. " + (
        f"Mart: {mart}  ({_home_prefix(suite_path, root)}medrobust query --suite {_shell_quote(str(suite_path))} "
        "\"SQL\")" if built else
        f"No mart built (add --select marts, or run without --select); results in {suite_paths(load_suite(suite_path), base=root).results}"))


@app.command()
def ui(
    suite: Annotated[Path | None, typer.Option(help="suite YAML whose graph the UI shows [default: the demo's, "
                                                    "configs/demo.yaml]", show_default=False)] = None,
    port: Annotated[int, typer.Option(help="port on 127.0.0.1")] = 3000,
    no_start: Annotated[bool, typer.Option("--no-start", help="only write the suite's code location and "
                                           "print its workspace file")] = False,
) -> None:
    """The Dagster UI and daemon (dagster dev) on 127.0.0.1 for a suite's asset graph. --suite
    writes the suite's code location (var/locations/<suite name>/: location.py, workspace.yaml)
    and serves it with the suite's own Dagster instance (var/<suite name>/dagster); without it,
    workspace.yaml of the project (the demo) and the project's instance. Stops within seconds of
    Ctrl-C."""
    from medrobust_assets.location_files import suite_instance_home, write_location

    if suite is not None:
        suite_path = _suite_file(suite)
        root = _enter_project(suite_path)
        from medrobust_lib.runtime import load_suite  # parsed once per process

        loaded = load_suite(suite_path)
        workspace = write_location(suite_path, loaded.name, root)
        home = suite_instance_home(loaded, root)
    else:
        root = _enter_project()
        workspace = root / "workspace.yaml"
        home = Path(os.environ.get("DAGSTER_HOME") or root)
    if no_start:
        typer.echo(str(workspace))
        return
    os.environ["DAGSTER_HOME"] = str(home)
    typer.echo(f"Dagster instance: {home}", err=True)
    from medrobust_assets.ui import main as ui_main

    raise typer.Exit(ui_main(["-h", "127.0.0.1", "-p", str(port), "-w", str(workspace)]))


@app.command()
def validate(
    suite: Annotated[Path, typer.Option(help="suite YAML (relative to the current folder; the paths inside it "
                                             "are relative to the project root)")],
    load: Annotated[int, typer.Option(help="samples decoded per dataset (0: index only)")] = 3,
) -> None:
    """Check a suite without running it: configuration (unknown keys, models without weights, the
    name's pattern), that no other suite writes its folders, every dataset's layout
    (samples found, quarantined, first problems, missing masks with the expected path, empty folders,
    unreadable images), each checkpoint's architecture against its `arch`, weights and record files;
    relative paths are checked from the project root. Exit 0 when usable, 2 when not."""
    from medrobust_lib.runtime import load_suite  # parsed once per process
    from medrobust_lib.tracks.validate import validate_suite

    suite_path = _suite_file(suite)
    loaded = load_suite(suite_path)  # a file that is no suite at all: one line, exit 2
    root = _enter_project(suite_path)
    report = validate_suite(suite_path, n_load=load, root=root)
    report.errors.extend(_demo_root_errors(loaded, root))
    for line in report.lines():
        typer.echo(line)
    if not report.ok:
        raise typer.Exit(2)


def _demo_root_errors(suite: Any, root: Path) -> list[str]:
    """The demo root's ownership check (issue 44, finding 3), as the demo build makes it first thing:
    a root holding folders the demo did not build is refused by ``validate`` too. (Here, not in the
    tracks' validate_suite: the demo's folder names live in the demo package, which the tracks do not
    import.)"""
    if not suite.demo.enabled:
        return []
    from medrobust_lib.demo.build import check_demo_root
    from medrobust_lib.ownership import NotOurs

    try:
        check_demo_root(in_project(suite.demo.root, root))
    except NotOurs as exc:
        return [str(exc)]
    return []


@app.command()
def query(
    sql: Annotated[str, typer.Argument(help="one read-only SQL statement (SELECT, WITH, DESCRIBE, SHOW, "
                                            "SUMMARIZE, EXPLAIN of a SELECT)")],
    format: Annotated[OutFormat | None, typer.Option(
        "--format", "-f", help="default: table on screen; with --out, from the file's extension")] = None,
    output: Annotated[Path | None, typer.Option(
        "--out", "--output", "-o", help="write the result to this file (.csv, .parquet, .json, .md)")] = None,
    mart: Annotated[Path | None, typer.Option(help="DuckDB mart [default: the --suite's, else var/marts.duckdb "
                                                   "in the project]", show_default=False)] = None,
    suite: Annotated[str | None, typer.Option(help="suite YAML whose mart is queried")] = None,
) -> None:
    """Run one SQL statement against the mart, read-only.

    Statements that write or change state (INSERT, COPY ... TO, ATTACH, SET, PRAGMA, CALL, ...) and
    several statements at once are refused with exit code 2 before anything runs; a failing query
    (bad SQL, unknown column, no mart) exits 2 too. --out never replaces the mart or the suite file.
    See medrobust_lib/store/query.py for exactly what is allowed.
    """
    import duckdb

    from medrobust_lib.store.query import (
        FILE_FORMATS,
        check_out_format,
        check_read_only,
        frame_to_json,
        run_query,
        write_frame,
    )

    try:
        check_read_only(sql)
    except ValueError as exc:
        _echo(f"error: {exc}")
        raise typer.Exit(2) from None
    except duckdb.Error as exc:
        _echo(f"error: query failed: {_one_line(exc)}")
        raise typer.Exit(2) from None
    fmt = format or OutFormat.table
    if output is not None:
        try:
            fmt = OutFormat(check_out_format(output, format.value if format is not None else None))
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="'--out' / '--format'") from None
    if fmt is OutFormat.parquet and output is None:
        raise typer.BadParameter("--format parquet needs --out FILE.parquet", param_hint="'--format'")
    loc = _suite_locations(suite)
    mart_file = _project_path(mart, str(loc.mart) if loc else "var/marts.duckdb")
    if output is not None:
        from medrobust_lib.paths import refuse_input, refuse_inside

        refuse_input(output, [mart_file, mart_file.with_name(mart_file.name + ".wal")]
                     + ([_suite_file(suite)] if suite is not None else []))
        refuse_inside(output, loc.results if loc else project_root() / "var" / "results", "the results folder")
    try:
        df = run_query(mart_file, sql)
    except (FileNotFoundError, ValueError) as exc:  # no mart; QueryRefused by the sandbox
        _echo(f"error: {exc}")
        raise typer.Exit(2) from None
    except duckdb.Error as exc:
        _echo(f"error: query failed: {_one_line(exc)}")
        raise typer.Exit(2) from None
    if output is not None and fmt.value in FILE_FORMATS:
        try:
            write_frame(df, output, fmt.value)
        except OSError as exc:
            _echo(f"error: cannot write {output}: {exc}")
            raise typer.Exit(1) from None
        _echo(f"wrote {len(df)} rows to {output} ({fmt.value})")
        return
    if fmt is OutFormat.table:
        text = _printable(df).to_string(index=False) if len(df) else "(no rows)"
    elif fmt is OutFormat.csv:
        text = df.to_csv(index=False)
    elif fmt is OutFormat.json:
        text = frame_to_json(df)
    else:
        text = _printable(df, markdown=True).to_markdown(index=False)
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text)
        _echo(f"wrote {len(df)} rows to {output} ({fmt.value})")
    else:
        typer.echo(text.rstrip("\n"))


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _printable(df: Any, *, markdown: bool = False) -> Any:
    """``df`` with control characters in its text cells shown escaped (``\\x1b``, ``\\n``): a value
    can neither drive the terminal (ESC sequences) nor break a table row; in Markdown a line break
    becomes ``<br>`` and ``|`` is escaped (issue 44, finding 12)."""

    def clean(v: Any) -> Any:
        if not isinstance(v, str):
            return v
        if markdown:
            v = v.replace("|", "\\|").replace("\r\n", "<br>").replace("\n", "<br>")
        return _CONTROL.sub(lambda m: repr(m.group())[1:-1], v)

    out = df.copy()
    for c in out.columns:
        if out[c].dtype == object:
            out[c] = out[c].map(clean)
    return out


@app.command("list-perturbations")
def list_perturbations_cmd(
    modality: Annotated[str | None, typer.Option(
        callback=_modality_option, help="only types for this modality (case-insensitive)")] = None,
    format: Annotated[ListFormat, typer.Option("--format", "-f", help="output format")] = ListFormat.table,
) -> None:
    """Every registered perturbation: name, family, modalities, geometry, channels, strength,
    reference. The table wraps to the terminal's width ($COLUMNS)."""
    from medrobust_lib.perturb.spec import get_perturbation, list_perturbations

    rows = []
    for name in list_perturbations(modality=modality):
        s = get_perturbation(name)
        mods = "all" if set(s.modalities) == set(ALL_MODALITIES) else ",".join(s.modalities)
        rows.append({"name": name, "family": s.family, "modalities": mods, "geometry": s.geometry,
                     "channels": s.channels, "strength": f"{s.strength_range[0]:g}..{s.strength_range[1]:g} {s.unit}".strip()
                     + (" (smaller is stronger)" if s.inverse else ""), "reference": s.reference})
    if format is ListFormat.json:
        typer.echo(json.dumps(rows, indent=1))
        return
    import pandas as pd

    df = pd.DataFrame(rows)
    if format is ListFormat.markdown:
        typer.echo(perturbation_table_markdown(df))
    elif format is ListFormat.csv:
        typer.echo(df.to_csv(index=False))
    else:
        import shutil

        typer.echo(wrapped_table(rows, ["name", "family", "geometry", "channels"], ["modalities", "strength", "reference"],
                                 max(40, shutil.get_terminal_size((100, 24)).columns)))


def wrapped_table(rows: list[dict[str, Any]], columns: list[str], notes: list[str], width: int) -> str:
    """``columns`` as an aligned table, each row followed by its ``notes`` fields as indented
    ``name: value`` lines wrapped to ``width`` characters (no line is longer, except a single word
    longer than the width)."""
    import textwrap

    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in columns}

    def line(values: dict[str, Any]) -> str:
        return "  ".join(str(values[c]).ljust(widths[c]) for c in columns).rstrip()[:width]

    out = [line({c: c for c in columns})]
    for r in rows:
        out.append(line(r))
        for n in notes:
            out.extend(textwrap.wrap(str(r[n]), width=width, initial_indent=f"    {n}: ",
                                     subsequent_indent="      ", break_on_hyphens=False))
    return "\n".join(out)


def perturbation_table_markdown(df: Any) -> str:
    """The perturbation table of docs/perturbations.md (kept in sync by a test)."""
    cols = ["name", "family", "modalities", "geometry", "channels", "strength", "reference"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in df[cols].to_dict("records"):
        lines.append("| " + " | ".join(str(r[c]).replace("|", "/") for c in cols) + " |")
    return "\n".join(lines)


@app.command()
def perturb(
    input: Annotated[Path, typer.Argument(help="image: PNG, JPEG, TIFF, DICOM, NIfTI slice or .npy")],
    type: Annotated[str, typer.Option("--type", "-t", help="perturbation name or 'all'")] = "all",
    level: Annotated[str, typer.Option("--level", "-l", help="1..5 or 'all'")] = "all",
    modality: Annotated[str | None, typer.Option(
        callback=_modality_option, help="modality (case-insensitive); adds its specific types to 'all'")] = None,
    seed: Annotated[int, typer.Option(help="seed of the random key (seed, 'cli', file stem, type)")] = 0,
    mask: Annotated[Path | None, typer.Option(help="mask image moved along with spatial types")] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="one output file (.png or .npy)")] = None,
    output_dir: Annotated[Path | None, typer.Option(help="folder for one file per (type, level)")] = None,
    format: Annotated[ImgFormat, typer.Option("--format", help="file format with --output-dir")] = ImgFormat.png,
    window_center: Annotated[float | None, typer.Option(help="DICOM/NIfTI: window center (with --window-width; "
                                                             "default: the file's window, else percentiles)")] = None,
    window_width: Annotated[float | None, typer.Option(help="DICOM/NIfTI: window width (> 0)")] = None,
) -> None:
    """Perturb one image file at calibrated severities; prints one JSON line per output (with the
    intensity window applied, for DICOM and NIfTI)."""
    from medrobust_lib.perturb.single import perturb_file

    try:
        for rec in perturb_file(input, type, level, modality=modality, seed=seed, mask_path=mask, output=output,
                                output_dir=output_dir, fmt=format.value, window_center=window_center,
                                window_width=window_width):
            typer.echo(json.dumps(rec, allow_nan=False))  # strict JSON: perturb_file refuses non-finite input
    except (ValueError, KeyError, FileNotFoundError) as exc:
        _echo(f"error: {exc}")
        raise typer.Exit(2) from None


class ScoreTask(StrEnum):
    vqa = "vqa"
    caption = "caption"
    grounding = "grounding"
    segmentation = "segmentation"


class BoxScale(StrEnum):
    unit = "0-1"
    thousandths = "0-1000"
    pixels = "pixels"


@app.command()
def score(
    task: Annotated[ScoreTask, typer.Argument(help="vqa, caption, grounding or segmentation")],
    predictions: Annotated[Path | None, typer.Option(
        "--predictions", "--pred", help="vqa, caption, grounding: JSONL, one {\"id\", \"prediction\", ...} per "
        "line; segmentation: a folder of mask files (PNG, JPEG, TIFF, BMP, .npy) [required]",
        show_default=False)] = None,
    references: Annotated[Path | None, typer.Option(
        "--references", "--ref", help="vqa, caption, grounding: JSONL, one reference record per line; segmentation: "
        "a folder of reference masks, matched to the predictions by file stem [required]", show_default=False)] = None,
    scale: Annotated[BoxScale | None, typer.Option(help="grounding: box scale of every answer "
                                                        "(default: detected per answer)")] = None,
    out: Annotated[Path | None, typer.Option(help="segmentation: write the per-file IoU / Dice CSV here (one row "
                                                  "per stem: status, iou, dice, files, pixel counts, error)")] = None,
    mask_threshold: Annotated[float | None, typer.Option(
        min=0, help="segmentation: raster masks are foreground where value > this (8-bit scale), as the datasets' "
        "mask_threshold [default: > 0 for PNG/TIFF/BMP, > 127 for JPEG]; .npy: probabilities > 0.5, labels > 0",
        show_default=False)] = None,
) -> None:
    """Score predictions made elsewhere against references; prints one JSON summary. Exit 1 when
    nothing was scored (no valid reference, or no prediction matches a reference id); 2 when a
    file is missing. segmentation: mask files matched by stem, IoU / Dice per pair with the
    pipeline's rules (empty reference: both empty 1.0, else 0.0); unmatched files and size
    mismatches are counted and listed, never fatal; one summary line on stderr; --out writes the
    per-file CSV."""
    if predictions is None or references is None:
        raise typer.BadParameter("--predictions (--pred) and --references (--ref) are both required")
    if task is ScoreTask.segmentation:
        if scale is not None:
            raise typer.BadParameter("--scale is for grounding only")
        _score_segmentation(predictions, references, out, mask_threshold)
        return
    if out is not None or mask_threshold is not None:
        raise typer.BadParameter("--out and --mask-threshold are for segmentation only")

    try:
        summary = score_file(task.value, predictions, references,  # type: ignore[arg-type]
                             declared_scale=scale.value if scale is not None else None)
    except (FileNotFoundError, IsADirectoryError, PermissionError, ValueError) as exc:
        _echo(f"error: {exc}")
        raise typer.Exit(2) from None
    typer.echo(json.dumps(summary, sort_keys=True, indent=2))
    if summary["n"] == 0:
        _echo("error: no valid reference: nothing was scored (see invalid_lines)")
        raise typer.Exit(1)
    if summary["n_matched_predictions"] == 0:
        _echo("error: no prediction matches a reference id: nothing was scored")
        raise typer.Exit(1)


def _score_segmentation(pred: Path, ref: Path, out: Path | None, mask_threshold: float | None) -> None:
    """``score segmentation``: the JSON summary on stdout, one line on stderr, the CSV at ``out``."""
    from medrobust_lib.paths import refuse_input
    from medrobust_lib.tracks.segmentation.score_files import score_folders, write_csv

    try:
        result = score_folders(pred, ref, mask_threshold=mask_threshold)
        if out is not None:
            out = out.expanduser()
            refuse_input(out, [pred / r.pred_file for r in result.rows if r.pred_file]
                         + [ref / r.ref_file for r in result.rows if r.ref_file])
            out.parent.mkdir(parents=True, exist_ok=True)
            write_csv(result, out)
    except (FileNotFoundError, NotADirectoryError, PermissionError, ValueError) as exc:
        _echo(f"error: {exc}")
        raise typer.Exit(2) from None
    summary = result.summary()
    typer.echo(json.dumps(summary, sort_keys=True, indent=2))
    _echo(result.summary_line() + (f"; per-file CSV: {out}" if out is not None else ""))
    if summary["n"] == 0:
        _echo("error: no prediction matches a readable reference of the same size: nothing was scored")
        raise typer.Exit(1)


@app.command("export-masks")
def export_masks(
    suite: Annotated[Path, typer.Option(help="suite YAML: its results folder and its mask store (<suite "
                                             "root>/pred_masks)")],
    out: Annotated[Path, typer.Option(help="output folder: new, empty, or written by export-masks before")],
    model: Annotated[str | None, typer.Option(help="only this model id")] = None,
    dataset: Annotated[str | None, typer.Option(help="only this dataset")] = None,
    condition: Annotated[str | None, typer.Option(help="only this condition (clean, perturbation, fgsm, pgd)")]
    = None,
    perturbation: Annotated[str | None, typer.Option(help="only this perturbation type")] = None,
    level: Annotated[int | None, typer.Option(help="only this level (0: clean)")] = None,
    sample: Annotated[str | None, typer.Option(help="only this sample id")] = None,
) -> None:
    """Write the predicted masks stored with segmentation_results rows (segmentation.store_masks) as
    PNG files (0 / 255) named <model>__<dataset>__<sample_id>__<perturbation>__L<level>.png, plus
    index.csv (keys, IoU, Dice, file). Prints how many masks it wrote and how many rows had none.
    Exit 2: no results, no matching row, or --out is a non-empty folder it did not write; 1: some
    stored masks are missing or corrupt (listed in index.csv)."""
    from medrobust_lib.tracks.segmentation.export_masks import export_masks as run_export

    loc = _suite_locations(str(suite))
    assert loc is not None
    summary = run_export(loc.results, loc.pred_masks, out.expanduser().resolve(),
                         {"model": model, "dataset": dataset, "condition": condition, "perturbation": perturbation,
                          "level": level, "sample_id": sample})
    typer.echo(summary.line())
    if summary.failed:
        name, reason = summary.failed[0]
        _echo(f"error: {len(summary.failed)} stored masks missing or corrupt, e.g. {name}: {reason}")
        raise typer.Exit(1)


class CheckFormat(StrEnum):
    table = "table"
    markdown = "markdown"
    json = "json"


@app.command()
def check(
    candidate: Annotated[str, typer.Option(help="model id, stored checkpoint hash or models:/name@alias")],
    baseline: Annotated[str, typer.Option(help="model id, stored checkpoint hash or models:/name@alias")],
    suite: Annotated[Path | None, typer.Option(help="suite YAML, gives the results dir and the evaluation set "
                                               "[default: configs/demo.yaml in the project]",
                                               show_default=False)] = None,
    results_dir: Annotated[Path | None, typer.Option(help="results store (default: the suite's)")] = None,
    mlruns: Annotated[Path | None, typer.Option(help="MLflow store for models:/ URIs "
                                                     "(default: $MEDROBUST_MLRUNS or mlruns)")] = None,
    max_iou_drop_increase: Annotated[float, typer.Option(help="tolerated mean IoU-drop increase")] = 0.01,
    max_dice_drop_increase: Annotated[float, typer.Option(help="tolerated mean Dice-drop increase")] = 0.01,
    alpha: Annotated[float, typer.Option(help="Benjamini-Hochberg q threshold; the bootstrap CI is 1 - alpha")]
    = 0.05,
    min_pairs: Annotated[int, typer.Option(help="groups with fewer paired samples never fail")] = 5,
    format: Annotated[CheckFormat, typer.Option("--format", "-f", help="table: plain text; markdown: for a CI "
                                                "step summary; json: everything")] = CheckFormat.table,
    details: Annotated[bool, typer.Option("--details", help="also print the full table of every condition "
                                                            "group")] = False,
    evaluate: Annotated[bool, typer.Option(help="evaluate a models:/ side that has no rows yet (on the suite's "
                                                "fine-tuning evaluation set); --no-evaluate only reuses rows")] = True,
) -> None:
    """Regression gate: exit 1 when the candidate is less robust than the baseline on the same
    samples and conditions (0: passed, 2: bad input). The first line is the verdict (PASS /
    FAIL: n regressions), then the regressions only. A regression: the paired bootstrap CI of the
    difference excludes 0, BH q < alpha and the difference exceeds the threshold. Each side's rows
    are reused when they exist, else (models:/ URIs) the version is evaluated first."""
    from medrobust_lib.config.segmentation import GateThresholds
    from medrobust_lib.runtime import load_suite  # parsed once per process
    from medrobust_lib.store.results import read_table
    from medrobust_lib.tracks.finetune.gate import (
        GateInputError,
        compare,
        gather_side,
        render,
    )
    from medrobust_lib.tracks.segmentation.evaluate import RESULTS_TABLE

    suite_path = _project_path(suite, "configs/demo.yaml")
    results_dir = results_dir.expanduser().resolve() if results_dir is not None else None
    if mlruns is not None:
        mlruns = mlruns.expanduser().resolve()
        os.environ["MEDROBUST_MLRUNS"] = str(mlruns)
    # the suite's relative paths (results, data, mlruns) are inside the project
    root = _enter_project(suite_path if suite is not None else None)
    try:
        try:
            thresholds = GateThresholds(max_iou_drop_increase=max_iou_drop_increase,
                                        max_dice_drop_increase=max_dice_drop_increase, alpha=alpha, min_pairs=min_pairs)
        except ValidationError as exc:  # one line per option, named as on the command line
            raise ValueError("; ".join(f"--{str(e['loc'][0]).replace('_', '-')}: {e['msg']} (got {e['input']})"
                                       for e in exc.errors())) from None
        if suite is not None and not suite_path.is_file():
            raise FileNotFoundError(f"suite not found: {suite_path}")
        s = load_suite(suite_path) if suite_path.is_file() else None
        if results_dir is None:
            if s is None:
                raise FileNotFoundError(f"no suite at {suite_path} (it gives the results dir; project root {root}): "
                                        "pass --suite or --results-dir")
            results_dir = Path(s.results_dir)
        rows = read_table(results_dir, RESULTS_TABLE)
        sides = {side: gather_side(ref, side, results_dir, suite=s, mlruns_dir=mlruns, evaluate=evaluate, log=_echo,
                                   rows=rows)
                 for side, ref in (("candidate", candidate), ("baseline", baseline))}
        result = compare(sides["candidate"], sides["baseline"], thresholds)
    except (GateInputError, ValueError, FileNotFoundError) as exc:
        _echo(f"error: {exc}")
        raise typer.Exit(2) from None
    typer.echo(render(result, format.value, details=details))
    if format is CheckFormat.json:
        _echo(result.verdict)
    if not result.passed:
        raise typer.Exit(1)


@app.command()
def report(
    models: Annotated[str | None, typer.Option(help="comma-separated model / taxonomy config ids (default: all)")] = None,
    out: Annotated[Path | None, typer.Option(help="output folder (index.html, tables/, figures/) "
                                                  "[default: var/reports in the project]", show_default=False)] = None,
    mart: Annotated[Path | None, typer.Option(help="DuckDB mart, opened read-only "
                                                   "[default: var/marts.duckdb in the project]",
                                              show_default=False)] = None,
    mlruns: Annotated[Path | None, typer.Option(help="MLflow folder (SQLite backend) the report run is logged to "
                                                     "[default: mlruns in the project]", show_default=False)] = None,
    suite: Annotated[str | None, typer.Option(help="suite YAML: its mart, its reports folder as --out and its "
                                                   "MLflow experiment <suite>/reports")] = None,
    no_mlflow: Annotated[bool, typer.Option("--no-mlflow", help="do not log the report to MLflow")] = False,
    include_floor: Annotated[bool, typer.Option("--include-floor", help="keep datasets whose clean IoU/Dice is "
                                                                        "below 0.1 in the segmentation averages and "
                                                                        "figures (default: left out, counted)")]
    = False,
    include_off_band: Annotated[bool, typer.Option("--include-off-band", help="keep perturbed outputs whose SSIM "
                                                   "missed their level's band in the segmentation averages and "
                                                   "figures (default: left out, counted as band_miss)")] = False,
    workers: Annotated[int, typer.Option(min=1, help="processes drawing the figure files (same bytes as 1)")] = 1,
    mce_baseline: Annotated[str | None, typer.Option(help="segmentation model id the mce table (MedMNIST-C's mCE "
                                                          "and relative mCE) normalises by [default: the suite's "
                                                          "segmentation.mce_baseline; none: the table is skipped]",
                                                     show_default=False)] = None,
) -> None:
    """Paper-ready tables (CSV, Markdown, LaTeX), figures (PNG 300 dpi, PDF, SVG) and one index.html
    from the mart; logged as artifacts of one MLflow run in the suite's experiment '<suite>/reports'
    ('reports' without --suite) (exit 2: no mart or unknown ids)."""
    from medrobust_lib.report.paper import build_report, parse_models

    try:
        loc = _suite_locations(suite)
        if mce_baseline is None and suite is not None:
            mce_baseline = _suite_mce_baseline(_suite_file(suite))
        summary = build_report(_project_path(mart, str(loc.mart) if loc else "var/marts.duckdb"),
                               _project_path(out, str(loc.reports) if loc else "var/reports"),
                               parse_models(models), mlruns_dir=_project_path(mlruns, str(in_project(
                                   "mlruns", project_root(_suite_file(suite) if suite is not None else None)))),
                               log_mlflow=not no_mlflow, include_floor=include_floor,
                               experiment=_report_experiment(suite), workers=workers,
                               include_off_band=include_off_band, mce_baseline=mce_baseline)
    except (FileNotFoundError, ValueError) as exc:
        _echo(f"error: {exc}")
        raise typer.Exit(2) from None
    for name, reason in summary.skipped.items():
        _echo(f"skipped {name}: {reason}")
    _echo(f"wrote {len(summary.tables)} tables x 3 formats and {len(summary.figures)} figures in "
          f"{summary.seconds:.1f} s" + (f"; MLflow run {summary.mlflow_run_id}" if summary.mlflow_run_id else ""))
    typer.echo(str(summary.html))
    if summary.mlflow_error:
        _echo(f"error: the report is written, but logging it to MLflow failed ({summary.mlflow_error}); "
              "free space and rerun, or rerun with --no-mlflow")
        raise typer.Exit(1)


convert_app = typer.Typer(no_args_is_help=True, help="Convert released checkpoints to loadable layouts.")
app.add_typer(convert_app, name="convert")


@convert_app.command("llava")
def convert_llava_cmd(
    src: Annotated[Path, typer.Argument(help="original llava-layout checkpoint folder (LLaVA-Med; "
                                                     "LLaVA-Rad is refused: it loads directly with kind: llava_rad)")],
    dst: Annotated[Path, typer.Argument(help="output folder (transformers LLaVA, safetensors)")],
    vision_tower: Annotated[Path | None, typer.Option(help="local transformers CLIP folder of the tower named by "
                                                           "mm_vision_tower")] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="replace files in a non-empty DST")] = False,
) -> None:
    """Original `llava` code-base checkpoint -> transformers LlavaForConditionalGeneration folder
    (exit 2, nothing written, when it cannot be converted faithfully; the message says why)."""
    from medrobust_lib.models.convert_llava import NotConvertible, convert_llava, describe

    try:
        rep = convert_llava(src, dst, vision_tower=vision_tower, overwrite=overwrite)
    except NotConvertible as exc:
        _echo(f"error: {src} cannot be converted faithfully: {exc}")
        raise typer.Exit(2) from None
    except (FileNotFoundError, FileExistsError) as exc:
        _echo(f"error: {exc}")
        raise typer.Exit(2) from None
    for line in describe(rep):
        typer.echo(line)


def main() -> Any:  # pragma: no cover
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")  # also set where ONNX Runtime is imported (models.onnx_engine)
    if "--debug" not in sys.argv[1:2] and os.environ.get("MEDROBUST_DEBUG", "") in ("", "0"):
        os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")  # no "creating tables" lines around an error
    return app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
