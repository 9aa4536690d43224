"""Read-only ad-hoc SQL over the mart, and writing a result to CSV, Parquet or JSON.

What ``medrobust query`` accepts (checked with DuckDB's own parser, before any connection is
opened, so a refused statement never runs and nothing is written):

* exactly one statement;
* ``SELECT`` in every form DuckDB parses as a select: ``WITH ...``, ``FROM t``, ``VALUES``,
  ``TABLE t``, set operations, and the inspection commands ``DESCRIBE``, ``SHOW``, ``SUMMARIZE``;
* ``EXPLAIN [ANALYZE] [(options)]`` of such a select (``EXPLAIN ANALYZE`` runs the select, which
  is read-only; ``EXPLAIN ANALYZE COPY ...`` would run the copy, so the explained statement is
  parsed again and must be a select).

Everything else is refused, including ``PRAGMA`` and ``CALL``: some pragmas change settings or
write files (``PRAGMA profiling_output``; DuckDB also parses ``COPY FROM DATABASE`` as a pragma)
and ``CALL checkpoint`` is a call; the read-only information is available from table functions
inside a select (``select * from pragma_table_info('t')``, ``duckdb_tables()``,
``duckdb_settings()``). A standalone ``PIVOT`` (DuckDB parses it as several statements) is refused
too.

The parser check is the second wall. The first is the connection itself (:func:`connect_sandboxed`):
the mart is opened read-only with ``enable_external_access = false`` (no file or network access
beyond the database file: ``read_text``, ``read_csv``, ``read_blob``, ``glob``, ``read_parquet``,
``COPY ... TO``, ``ATTACH`` and ``INSTALL`` fail with a permission error, whatever the statement's
shape, e.g. a ``COPY`` inside a CTE that DuckDB labels SELECT), extension autoload and autoinstall
off, community extensions off, and ``lock_configuration = true`` so no statement can turn any of it
back on. DuckDB's spill folder (``temp_directory``, by default ``<mart>.tmp/`` beside the mart, which
a query could fill or which may already hold someone's files) is a fresh private folder (mode 0700)
under the system's temporary folder, created for the query and removed after it. The mart needs nothing outside its own file: every table is copied in at build time and the
views read only those tables. A statement stopped by the sandbox raises :class:`QueryRefused` with
DuckDB's one-line reason.
"""

from __future__ import annotations

import os
import re
import tempfile
import uuid
from pathlib import Path
from typing import Final

import duckdb
import pandas as pd

SANDBOX_CONFIG: Final[dict[str, str | bool]] = {
    "enable_external_access": False,
    "autoload_known_extensions": False,
    "autoinstall_known_extensions": False,
    "allow_community_extensions": False,
    "lock_configuration": True,
}
"""DuckDB settings of the query connection (checked against DuckDB 2.0's "Securing DuckDB" page;
``lock_configuration`` last in effect: it freezes the others for the connection's lifetime)."""

FILE_FORMATS: Final[tuple[str, ...]] = ("csv", "parquet", "json")
"""Formats :func:`write_frame` writes; also the file extensions it recognises (``.csv`` ...)."""


class QueryRefused(ValueError):
    """A statement that could write or change state, or more than one statement."""


# Leading whitespace and SQL comments, then one keyword; used only to find the statement an
# EXPLAIN wraps, which is then parsed again by DuckDB (so a wrong match refuses, never allows).
_SKIP = r"(?:\s|--[^\n]*(?:\n|$)|/\*.*?\*/)*"
_EXPLAIN = re.compile(_SKIP + r"explain\b" + _SKIP + r"(?:analyze\b)?", re.IGNORECASE | re.DOTALL)


def _statement_types(sql: str) -> list[duckdb.StatementType]:
    """The parsed statement types; a syntax error propagates as ``duckdb.ParserException``."""
    try:
        return [s.type for s in duckdb.extract_statements(sql)]
    except duckdb.Error:
        raise
    except ValueError as exc:  # a statement type this client's enum does not know (e.g. UPDATE EXTENSIONS)
        raise QueryRefused(f"refused: a statement type this tool does not know ({exc}); "
                           "the mart is read-only, only SELECT is allowed") from None


def _explained_is_select(sql: str) -> bool:
    """Whether the statement an ``EXPLAIN [ANALYZE] [(options)]`` wraps is a single select."""
    m = _EXPLAIN.match(sql)
    if m is None:
        return False
    rest = sql[m.end():]
    candidates = [rest]
    opts = re.match(_SKIP + r"\(", rest, re.DOTALL)
    if opts is not None:  # an option list such as (FORMAT json), or a parenthesised select
        depth, i = 1, opts.end()
        while i < len(rest) and depth:
            depth += {"(": 1, ")": -1}.get(rest[i], 0)
            i += 1
        candidates.append(rest[i:])
    for cand in candidates:
        try:
            types = _statement_types(cand)
        except (duckdb.Error, QueryRefused):
            continue
        if types == [duckdb.StatementType.SELECT]:
            return True
    return False


def check_read_only(sql: str) -> None:
    """Raise :class:`QueryRefused` (a ``ValueError``) unless ``sql`` is one read-only statement.

    See the module docstring for what is allowed. A syntax error is not a refusal: it propagates
    as ``duckdb.ParserException`` (a ``duckdb.Error``), as running it would.
    """
    types = _statement_types(sql)
    if not types:
        raise QueryRefused("refused: no SQL statement given")
    if len(types) > 1:
        names = ", ".join(t.name for t in types)
        raise QueryRefused(f"refused: one statement at a time, got {len(types)} ({names})")
    kind = types[0]
    if kind is duckdb.StatementType.SELECT:
        return
    if kind is duckdb.StatementType.EXPLAIN:
        if _explained_is_select(sql):
            return
        raise QueryRefused("refused: EXPLAIN is allowed only of a SELECT (the mart is read-only)")
    raise QueryRefused(f"refused: {kind.name} statement; the mart is read-only, only SELECT "
                       "(with WITH/DESCRIBE/SHOW/SUMMARIZE) and EXPLAIN of a SELECT are allowed")


def run_query(mart_path: str | Path, sql: str) -> pd.DataFrame:
    """Run one read-only statement against the mart and return the whole result.

    Raises :class:`QueryRefused` before connecting when ``sql`` is not allowed (or, from the
    sandboxed connection, when it tries to touch a file, an extension or a setting),
    ``FileNotFoundError`` when there is no mart, ``duckdb.Error`` when the query fails. Nullable
    integer and boolean columns come back as pandas' nullable dtypes, NULL doubles as NaN.
    """
    check_read_only(sql)
    with tempfile.TemporaryDirectory(prefix="medrobust-query-") as spill:
        con = connect_sandboxed(mart_path, spill_dir=spill)
        try:
            res = con.execute(sql)
            types = [str(d[1]) for d in (res.description or [])]
            return _keep_integers(res.df(), types)
        except duckdb.PermissionException as exc:
            raise QueryRefused(f"refused by the sandbox: {_first_line(exc)} (the query connection reads only "
                               "the mart; no files, extensions or settings)") from None
        finally:
            con.close()


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def connect_sandboxed(mart_path: str | Path, spill_dir: str | Path | None = None) -> duckdb.DuckDBPyConnection:
    """A read-only connection to the mart that can touch no other file, load no extension and
    change no setting (:data:`SANDBOX_CONFIG`); ``FileNotFoundError`` when there is no mart.
    ``spill_dir``: DuckDB's spill folder (the caller's private temporary folder; None: nothing
    may spill, ``max_temp_directory_size`` 0, so ``<mart>.tmp/`` is never written)."""
    p = Path(mart_path)
    if not p.is_file():
        raise FileNotFoundError(f"no mart at {p}: {MART_HINT}")
    # DuckDB applies the settings in order: temp_directory only after external access is off
    spill: dict[str, str | bool] = {"temp_directory": str(spill_dir)} if spill_dir is not None else \
        {"max_temp_directory_size": "0B"}
    return duckdb.connect(str(p), read_only=True,
                          config={"enable_external_access": False, **spill, **SANDBOX_CONFIG})


MART_HINT: Final[str] = ("build it with `medrobust run --suite SUITE.yaml` (your suite; query it with --suite) or "
                         "`medrobust demo` (the demo's)")
"""What to run when a mart is missing."""


_WIDE_INTEGERS = ("HUGEINT", "UHUGEINT")
_EXACT_IN_FLOAT = 2 ** 53


def _keep_integers(df: pd.DataFrame, types: list[str]) -> pd.DataFrame:
    """DuckDB's 128-bit integers (``sum()`` of integers is HUGEINT) arrive as float64; turn them
    back into nullable Int64 when every value is exactly representable, so CSV/JSON/Markdown
    print ``54``, not ``54.0``."""
    for i, typ in enumerate(types[: df.shape[1]]):
        if typ not in _WIDE_INTEGERS:
            continue
        v = df.iloc[:, i]
        vals = v.dropna()
        if len(vals) and not ((vals.abs() < _EXACT_IN_FLOAT) & (vals == vals.round())).all():
            continue
        df.isetitem(i, v.astype("Int64").array)
    return df


TEXT_EXTENSIONS: Final[dict[str, str]] = {"md": "markdown", "markdown": "markdown"}
"""Extensions of the printed formats when written to a file with ``--out``."""


def check_out_format(path: str | Path, fmt: str | None) -> str:
    """The format to write ``path`` in: ``fmt`` when given, else from the extension (the
    :data:`FILE_FORMATS` and :data:`TEXT_EXTENSIONS`). A known extension that names another format
    than ``fmt`` is a ValueError (``--format csv --out x.json`` would write CSV into a .json file)."""
    ext = Path(path).suffix.lower().lstrip(".")
    by_ext = ext if ext in FILE_FORMATS else TEXT_EXTENSIONS.get(ext)
    if fmt is None:
        if by_ext is None:
            valid = ", ".join(f".{f}" for f in (*FILE_FORMATS, *TEXT_EXTENSIONS))
            raise ValueError(f"cannot tell the format of {str(path)!r} from its extension; use one of {valid} "
                             "or give --format")
        return by_ext
    if by_ext is not None and by_ext != fmt:
        raise ValueError(f"--format {fmt} does not match the extension of {str(path)!r} ({by_ext}); "
                         "change one of them")
    return fmt


def infer_format(path: str | Path) -> str:
    """The file format named by ``path``'s extension (case-insensitive); ``ValueError`` otherwise."""
    ext = Path(path).suffix.lower().lstrip(".")
    if ext not in FILE_FORMATS:
        valid = ", ".join(f".{f}" for f in FILE_FORMATS)
        raise ValueError(f"cannot tell the format of {str(path)!r} from its extension; use one of {valid} "
                         "or give --format")
    return ext


def frame_to_json(df: pd.DataFrame) -> str:
    """``df`` as a JSON array of records: NaN, NaT and None become null, timestamps ISO 8601
    with microseconds (``2024-01-02T03:04:05.123456``), dates as midnight timestamps."""
    return df.to_json(orient="records", date_format="iso", date_unit="us", force_ascii=False)


def write_frame(df: pd.DataFrame, path: str | Path, fmt: str | None = None) -> Path:
    """Write ``df`` (without its index) to ``path`` as ``fmt`` (one of :data:`FILE_FORMATS`;
    ``None``: from the extension) and return the path.

    The file is written next to its destination and renamed into place, so a failed write leaves
    no partial file; parent folders are created. CSV writes NULL as an empty field (so it cannot
    tell NULL from an empty string); Parquet keeps the column types and NULLs; JSON as
    :func:`frame_to_json`.
    """
    out = Path(path)
    fmt = infer_format(out) if fmt is None else fmt.lower()
    if fmt not in FILE_FORMATS:
        raise ValueError(f"unknown format {fmt!r}; valid: {', '.join(FILE_FORMATS)}")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{uuid.uuid4().hex}.tmp")
    try:
        if fmt == "csv":
            df.to_csv(tmp, index=False)
        elif fmt == "parquet":
            df.to_parquet(tmp, index=False)
        else:
            tmp.write_text(frame_to_json(df), encoding="utf-8")
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out
