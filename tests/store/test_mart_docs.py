"""The ``## Mart schema`` section of docs/mart-schema.md stays true to the mart.

Every table of ``MART_TABLES`` is documented with exactly its declared column names and SQL types in
declared order, every view of ``MART_VIEWS`` is documented, nothing unknown is documented, a freshly
built empty mart has exactly those tables and columns, every view can be queried without data, and
the section's example queries run (read-only) against it.
"""

from __future__ import annotations

import re
from pathlib import Path

import duckdb
import pytest

from medrobust_lib.store.marts import MART_TABLES, MART_VIEWS, build_mart, connect_readonly
from medrobust_lib.store.query import check_read_only

PAGE = Path(__file__).resolve().parents[2] / "docs" / "mart-schema.md"
SECTION_HEADING = "## Mart schema"
TABLE_HEADING = re.compile(r"^### `([a-z_][a-z0-9_]*)`\s*$", re.MULTILINE)
SUBSECTION = re.compile(r"^### ", re.MULTILINE)
VIEW_ITEM = re.compile(r"^- `([a-z_][a-z0-9_]*)`", re.MULTILINE)
SQL_BLOCK = re.compile(r"```sql\n(.*?)```", re.DOTALL)
COLUMNS_HEADER = ["column", "type", "meaning (unit, range, allowed values)"]
DECLARED: dict[str, list[tuple[str, str]]] = {t.name: list(t.columns) for t in MART_TABLES}


def mart_schema_section(text: str) -> str:
    """The text from the ``## Mart schema`` heading (exact line) to the next ``## `` heading."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.rstrip() == SECTION_HEADING]
    if len(starts) != 1:
        raise ValueError(f"docs/mart-schema.md needs exactly one line '{SECTION_HEADING}', found {len(starts)}")
    body = lines[starts[0] + 1:]
    end = next((i for i, line in enumerate(body) if line.startswith("## ")), len(body))
    return "\n".join(body[:end])


def _subsections(section: str) -> dict[str, str]:
    """``### `` heading line (without the hashes) -> its body, for every subsection."""
    marks = [m.start() for m in SUBSECTION.finditer(section)] + [len(section)]
    out: dict[str, str] = {}
    for a, b in zip(marks, marks[1:], strict=False):
        head, _, body = section[a:b].partition("\n")
        key = head[4:].strip()
        if key in out:
            raise ValueError(f"duplicate subsection {key!r} in the mart schema section")
        out[key] = body
    return out


def _cells(line: str) -> list[str]:
    """Cells of a Markdown table row (escaped pipes ``\\|`` stay inside a cell)."""
    inner = line.strip()
    if not (inner.startswith("|") and inner.endswith("|")):
        raise ValueError(f"not a table row: {line!r}")
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", inner[1:-1])]


def documented_tables(section: str) -> dict[str, list[tuple[str, str]]]:
    """Table name -> documented (column, type) rows, in the order written."""
    out: dict[str, list[tuple[str, str]]] = {}
    for head, body in _subsections(section).items():
        m = TABLE_HEADING.match(f"### {head}")
        if m is None:
            continue
        rows = [line for line in body.splitlines() if line.lstrip().startswith("|")]
        assert len(rows) >= 3, f"table {m.group(1)}: no column table under its heading"
        assert _cells(rows[0]) == COLUMNS_HEADER, f"table {m.group(1)}: header {rows[0]!r}"
        assert all(set(c) <= {"-", ":"} and c for c in _cells(rows[1])), f"table {m.group(1)}: bad separator row"
        cols: list[tuple[str, str]] = []
        for row in rows[2:]:
            cells = _cells(row)
            assert len(cells) == 3, f"table {m.group(1)}: row {row!r} has {len(cells)} cells, need 3"
            name = re.fullmatch(r"`([a-z_][a-z0-9_]*)`", cells[0])
            assert name is not None, f"table {m.group(1)}: column cell {cells[0]!r} is not a `name`"
            assert cells[2], f"table {m.group(1)}: column {cells[0]} has no meaning"
            cols.append((name.group(1), cells[1]))
        out[m.group(1)] = cols
    return out


def documented_views(section: str) -> list[str]:
    """View names listed as ``- `name` ...`` items under ``### Views``."""
    subs = _subsections(section)
    assert "Views" in subs, "the mart schema section needs a '### Views' subsection"
    return VIEW_ITEM.findall(subs["Views"])


def example_queries(section: str) -> list[str]:
    """The statements of the section's ```sql blocks (split on ';')."""
    stmts: list[str] = []
    for block in SQL_BLOCK.findall(section):
        stmts.extend(s.strip() for s in block.split(";") if s.strip() and not _only_comments(s))
    return stmts


def _only_comments(sql: str) -> bool:
    return all(not line.strip() or line.strip().startswith("--") for line in sql.splitlines())


@pytest.fixture(scope="module")
def section() -> str:
    return mart_schema_section(PAGE.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def empty_mart(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("mart_docs")
    mart = root / "marts.duckdb"
    counts = build_mart(root / "results", mart)
    assert counts == {name: 0 for name in DECLARED}
    return mart


def test_every_table_is_documented_with_its_declared_columns_in_order(section: str) -> None:
    docs = documented_tables(section)
    assert sorted(set(DECLARED) - set(docs)) == [], "tables of MART_TABLES missing from docs/mart-schema.md"
    assert sorted(set(docs) - set(DECLARED)) == [], "docs/mart-schema.md documents tables the mart does not have"
    for name, cols in DECLARED.items():
        assert docs[name] == cols, (
            f"docs/mart-schema.md columns of {name} differ from MART_TABLES (names, SQL types and order must match):\n"
            f"documented {docs[name]}\ndeclared   {cols}")


def test_tables_are_documented_in_declaration_order(section: str) -> None:
    assert list(documented_tables(section)) == list(DECLARED)


def test_every_view_is_documented_once_and_none_unknown(section: str) -> None:
    views = documented_views(section)
    assert len(views) == len(set(views)), f"views documented twice: {sorted({v for v in views if views.count(v) > 1})}"
    assert sorted(set(MART_VIEWS) - set(views)) == [], "views of MART_VIEWS missing from docs/mart-schema.md"
    assert sorted(set(views) - set(MART_VIEWS)) == [], "docs/mart-schema.md documents views the mart does not have"


def test_section_states_the_contract(section: str) -> None:
    assert "tests/store/test_mart_docs.py" in section
    assert "read-only" in section and "medrobust query" in section
    assert len(example_queries(section)) >= 3


def test_empty_mart_has_exactly_the_declared_tables_and_columns(empty_mart: Path) -> None:
    con = connect_readonly(empty_mart)
    try:
        tables = {r[0] for r in con.execute("select table_name from duckdb_tables()").fetchall()}
        assert tables == set(DECLARED)
        for name, cols in DECLARED.items():
            described = [(r[0], r[1]) for r in con.execute(f"describe {name}").fetchall()]
            assert described == cols, f"{name}: built {described}, declared {cols}"
    finally:
        con.close()


@pytest.mark.parametrize("view", sorted(MART_VIEWS))
def test_every_view_exists_and_is_queryable_without_data(empty_mart: Path, view: str) -> None:
    con = connect_readonly(empty_mart)
    try:
        views = {r[0] for r in con.execute("select view_name from duckdb_views() where not internal").fetchall()}
        assert views == set(MART_VIEWS)
        assert con.execute(f"select * from {view} limit 0").fetchall() == []
        assert con.execute(f"select count(*) from {view}").fetchall() == [(0,)]
    finally:
        con.close()


def test_example_queries_are_read_only_and_run_on_the_empty_mart(section: str, empty_mart: Path) -> None:
    con = connect_readonly(empty_mart)
    try:
        for sql in example_queries(section):
            check_read_only(sql)
            try:
                con.execute(sql).fetchall()
            except duckdb.Error as exc:
                pytest.fail(f"docs/mart-schema.md example query fails on the mart: {exc}\n{sql}")
    finally:
        con.close()


def test_parser_notices_a_renamed_or_retyped_column(section: str) -> None:
    """The checks above can fail: a renamed, retyped or moved column changes what is parsed."""
    name, cols = next(iter(DECLARED.items()))
    first, typ = cols[0]
    renamed = section.replace(f"| `{first}` | {typ} |", f"| `{first}_renamed` | {typ} |", 1)
    assert documented_tables(renamed)[name] != cols
    retyped = section.replace(f"| `{first}` | {typ} |", f"| `{first}` | BLOB |", 1)
    assert documented_tables(retyped)[name] != cols
    dropped_view = section.replace(f"- `{next(iter(MART_VIEWS))}`", "- `not_a_view`", 1)
    assert set(documented_views(dropped_view)) != set(MART_VIEWS)


def test_view_list_is_generated_from_the_registered_views() -> None:
    """docs/mart-schema.md lists exactly what tools/gen_mart_schema.py writes from the views'
    registry (rerun the tool after adding or changing a view)."""
    from tests.tools.tool_loader import load_tool

    gen = load_tool("gen_mart_schema")
    page = PAGE.read_text(encoding="utf-8")
    assert gen.render(page) == page, "docs/mart-schema.md is out of date: run python -m tools.gen_mart_schema"
    changed = page.replace("- `quarantine`", "- `quarantined`", 1)
    assert gen.render(changed) != changed  # the comparison notices an edited item
