"""Compare two marts table by table: ``python -m tools.compare_marts OLD.duckdb NEW.duckdb``.

For every base table of either mart: row counts, the set of key tuples (the table's VARCHAR and
integer identity columns that both marts have, e.g. model, dataset, sample_id, perturbation,
level), and the sum of every numeric column both have (absolute tolerance ``--atol`` times the
row count, relative ``--rtol``). Columns present on one side only are listed, not failed.
Prints one line per table (``match`` or what differs) and exits 1 when anything differs.
``--views`` compares the views instead, the same way: each view both marts define (a view the new
code added or dropped is listed, not failed), so a changed view definition shows on equal tables.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import duckdb

NUMERIC = ("DOUBLE", "FLOAT", "REAL", "DECIMAL", "BIGINT", "INTEGER", "SMALLINT", "TINYINT", "HUGEINT", "UBIGINT",
           "UINTEGER", "USMALLINT", "UTINYINT")
KEY_TYPES = ("VARCHAR", "BIGINT", "INTEGER", "SMALLINT", "TINYINT", "BOOLEAN", "DATE")
# identity-like columns; free text, hashes of runs and timestamps are not keys
NOT_KEYS = {"error", "detail", "answer", "raw", "response", "text", "prediction", "created_at", "run_id",
            "mlflow_run_id", "dagster_run_id", "path", "image_path", "mask_path", "note", "miss_reason", "judge_model",
            "judge_outcome", "judge_parsed", "warning"}


def _tables(con: duckdb.DuckDBPyConnection, kind: str = "BASE TABLE") -> dict[str, dict[str, str]]:
    """Columns and types of every relation of ``kind`` (``BASE TABLE`` or ``VIEW``)."""
    rows = con.execute("select table_name, column_name, data_type from information_schema.columns "
                       "where table_schema = 'main' and table_name in (select table_name from "
                       "information_schema.tables where table_type = ?) order by ordinal_position", [kind]).fetchall()
    out: dict[str, dict[str, str]] = {}
    for t, c, ty in rows:
        out.setdefault(t, {})[c] = ty
    return out


def _keys(con: duckdb.DuckDBPyConnection, table: str, cols: list[str]) -> set[tuple[object, ...]]:
    if not cols:
        return set()
    q = ", ".join(f'"{c}"' for c in cols)
    return set(con.execute(f'select distinct {q} from "{table}"').fetchall())


def _sums(con: duckdb.DuckDBPyConnection, table: str, cols: list[str]) -> dict[str, float]:
    if not cols:
        return {}
    q = ", ".join(f'sum(cast("{c}" as double)) as "{c}"' for c in cols)
    vals = con.execute(f'select {q} from "{table}"').fetchone() or ()
    return {c: (float(v) if v is not None else math.nan) for c, v in zip(cols, vals, strict=True)}


def compare(old: Path, new: Path, atol: float = 1e-9, rtol: float = 1e-9,
            ignore_columns: frozenset[str] = frozenset(), views: bool = False) -> list[tuple[str, bool, str]]:
    """(table, matches, description) for every table (``views``: every view) of either mart."""
    a = duckdb.connect(str(old), read_only=True)
    b = duckdb.connect(str(new), read_only=True)
    try:
        kind = "VIEW" if views else "BASE TABLE"
        ta, tb = _tables(a, kind), _tables(b, kind)
        out: list[tuple[str, bool, str]] = []
        for t in sorted(set(ta) | set(tb)):
            if t not in ta or t not in tb:
                out.append((t, views, f"only in {'old' if t in ta else 'new'}"))
                continue
            notes: list[str] = []
            ok = True
            na = a.execute(f'select count(*) from "{t}"').fetchone()[0]  # type: ignore[index]
            nb = b.execute(f'select count(*) from "{t}"').fetchone()[0]  # type: ignore[index]
            if na != nb:
                ok = False
                notes.append(f"rows {na} -> {nb}")
            common = [c for c in ta[t] if c in tb[t] and c not in ignore_columns]
            only = sorted((set(ta[t]) ^ set(tb[t])) - ignore_columns)
            if only:
                notes.append("columns on one side only: " + ", ".join(only))
            keys = [c for c in common if ta[t][c].split("(")[0] in KEY_TYPES and tb[t][c].split("(")[0] in KEY_TYPES
                    and c not in NOT_KEYS and not c.endswith(("_at", "_s", "seconds"))]
            ka, kb = _keys(a, t, keys), _keys(b, t, keys)
            if ka != kb:
                ok = False
                notes.append(f"key tuples ({', '.join(keys)}): {len(ka - kb)} only old, {len(kb - ka)} only new")
            nums = [c for c in common if ta[t][c].split("(")[0] in NUMERIC and tb[t][c].split("(")[0] in NUMERIC
                    and not c.endswith(("_s", "seconds"))]
            sa, sb = _sums(a, t, nums), _sums(b, t, nums)
            for c in nums:
                x, y = sa[c], sb[c]
                if math.isnan(x) and math.isnan(y):
                    continue
                if math.isnan(x) != math.isnan(y) or not math.isclose(x, y, rel_tol=rtol, abs_tol=atol * max(na, 1)):
                    ok = False
                    notes.append(f"sum({c}) {x:.10g} -> {y:.10g}")
            out.append((t, ok, "match" if ok and not notes else "; ".join(notes) or "match"))
        return out
    finally:
        a.close()
        b.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("--atol", type=float, default=1e-9, help="absolute tolerance per row of a column sum")
    ap.add_argument("--rtol", type=float, default=1e-9, help="relative tolerance of a column sum")
    ap.add_argument("--ignore-column", action="append", default=[], help="a column left out (repeatable)")
    ap.add_argument("--views", action="store_true", help="compare the views both marts define instead of the tables")
    args = ap.parse_args(argv)
    for p in (args.old, args.new):
        if not p.is_file():
            print(f"error: no mart at {p}", file=sys.stderr)
            return 2
    rows = compare(args.old, args.new, args.atol, args.rtol, frozenset(args.ignore_column), args.views)
    width = max((len(t) for t, _, _ in rows), default=5)
    for t, ok, text in rows:
        print(f"{t:<{width}}  {'ok  ' if ok else 'DIFF'}  {text}")
    n_bad = sum(not ok for _, ok, _ in rows)
    print(f"{len(rows) - n_bad} of {len(rows)} {'views' if args.views else 'tables'} match")
    return 1 if n_bad else 0


if __name__ == "__main__":
    sys.exit(main())
