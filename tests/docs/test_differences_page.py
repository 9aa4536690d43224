"""docs/differences-from-reference.md names real switches and real tests.

Every table of the page with a ``reference switch`` column is parsed. Checked, per row:

- the switch cell names at least one suite key, or starts with "none" / "none needed" and says why;
- every backticked suite key path in it (a dotted span such as ``segmentation.attacks.levels`` or a
  ``key: value`` span such as ``protocol: reference``; ``models[]`` / ``datasets[]`` is an entry of
  that list) is a field of :class:`medrobust_lib.config.suite.Suite` and its nested models; a value
  written as a mapping (``segmentation.finetune.train: {epochs: 20, ...}``) has its keys checked too,
  down to fields that are free-keyed mappings (``types_by_dataset: {<dataset>: ...}``); a dataset's
  ``options`` keys are checked against the registered readers' option models;
- the test cell names at least one test, or starts with "none" and says why; every test file
  (``tests/...py``), test function (``tests/...py::test_name``) and fixture (``name.json``,
  ``name.npz``) it names exists.

Spans that are neither dotted nor ``key: value`` (column names, values, constants, file paths) are
not keys and are left alone.
"""

from __future__ import annotations

import functools
import operator
import re
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union, get_args, get_origin

import pytest
import yaml
from pydantic import BaseModel

from medrobust_lib.config.datasets import DatasetConfig
from medrobust_lib.config.suite import Suite
from medrobust_lib.data.formats import READERS

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "differences-from-reference.md"
FIXTURES = ROOT / "tests" / "reference_protocol" / "fixtures"
SWITCH, TEST, WHAT = "reference switch", "test", "what"

SPAN = re.compile(r"`([^`]+)`")
KEY_PATH = re.compile(r"[a-z_][a-z0-9_]*(?:\[\])?(?:\.[a-z_][a-z0-9_]*(?:\[\])?)*")
TEST_REF = re.compile(r"(tests/[\w/]+\.py)(?:::(\w+))?")
FIXTURE_REF = re.compile(r"[\w.-]+\.(?:json|npz)")
NONE_WITH_REASON = re.compile(r"^none(?: needed)?\s*[(:;,]\s*\S.*", re.IGNORECASE | re.DOTALL)


@dataclass(frozen=True)
class Row:
    section: str
    cells: dict[str, str]

    @property
    def name(self) -> str:
        return f"{self.section} / {self.cells.get(WHAT, '?')}"


def _cells(line: str) -> list[str]:
    """The cells of one Markdown table line (``\\|`` is a pipe inside a cell)."""
    parts = re.split(r"(?<!\\)\|", line.strip())[1:-1]
    return [p.strip().replace("\\|", "|") for p in parts]


def _rows(text: str) -> list[Row]:
    """Every body row of every table whose header has a ``reference switch`` column."""
    rows: list[Row] = []
    lines = text.splitlines()
    section = ""
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            section = line.lstrip("#").strip()
        is_header = (line.startswith("|") and i + 1 < len(lines)
                     and re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", lines[i + 1].strip()) is not None)
        if not is_header:
            i += 1
            continue
        header = [h.lower() for h in _cells(line)]
        i += 2
        while i < len(lines) and lines[i].startswith("|"):
            if SWITCH in header:
                cells = _cells(lines[i])
                assert len(cells) == len(header), f"{section}: row has {len(cells)} cells, header {len(header)}: {lines[i]}"
                rows.append(Row(section, dict(zip(header, cells, strict=True))))
            i += 1
    return rows


ROWS = _rows(PAGE.read_text(encoding="utf-8"))


# -- resolving key paths against the suite model -----------------------------------------------------

def _alternatives(tp: Any) -> list[Any]:
    """The members of a union (``X | None``, ``Union[...]``) without None; else ``[tp]``."""
    if get_origin(tp) in (Union, types.UnionType):
        return [a for a in get_args(tp) if a is not type(None)]
    return [tp]


def _reader_options() -> Any:
    """A union of every registered reader's options model (what ``datasets[].options`` may hold)."""
    models = sorted({READERS.get(name).options_model for name in READERS.list()}, key=lambda m: m.__name__)
    return functools.reduce(operator.or_, models)


def _step(tp: Any, part: str) -> Any:
    """The type reached from ``tp`` by one path part (``name`` or ``name[]``); KeyError if none."""
    name, is_list = part.removesuffix("[]"), part.endswith("[]")
    for alt in _alternatives(tp):
        if isinstance(alt, type) and issubclass(alt, BaseModel):
            if name not in alt.model_fields:
                continue
            if alt is DatasetConfig and name == "options":
                nxt: Any = _reader_options()
            else:
                nxt = alt.model_fields[name].annotation
            if is_list:
                lists = [a for a in _alternatives(nxt) if get_origin(a) is list]
                if not lists:
                    raise KeyError(f"{part!r}: {name} is not a list")
                nxt = get_args(lists[0])[0]
            return nxt
        if get_origin(alt) is dict and not is_list:
            return get_args(alt)[1]  # a free key of a mapping field
    raise KeyError(f"{part!r} is not a key of {tp!r}")


def _resolve(path: str) -> Any:
    tp: Any = Suite
    for part in path.split("."):
        tp = _step(tp, part)
    return tp


def _check_value_keys(tp: Any, value: Any, where: str) -> list[str]:
    """Problems with the keys of a mapping ``value`` written for a field of type ``tp``."""
    if not isinstance(value, dict):
        return []
    bad: list[str] = []
    for k, v in value.items():
        try:
            sub = _step(tp, str(k))
        except KeyError as exc:
            bad.append(f"{where}.{k}: {exc}")
            continue
        bad.extend(_check_value_keys(sub, v, f"{where}.{k}"))
    return bad


def _keys_in(cell: str) -> list[tuple[str, str | None]]:
    """(key path, value text or None) of every backticked span of ``cell`` that is a key."""
    found = []
    for span in SPAN.findall(cell):
        key, colon, value = span.partition(":")
        key = key.strip()
        if KEY_PATH.fullmatch(key) and ("." in key or colon):
            found.append((key, value.strip() if colon else None))
    return found


def _key_problems(cell: str) -> list[str]:
    bad: list[str] = []
    for key, value in _keys_in(cell):
        try:
            tp = _resolve(key)
        except KeyError as exc:
            bad.append(f"{key}: {exc}")
            continue
        if value and value.startswith("{"):
            try:
                parsed = yaml.safe_load(value)
            except yaml.YAMLError as exc:
                bad.append(f"{key}: its value {value!r} is not a YAML mapping ({exc})")
                continue
            bad.extend(_check_value_keys(tp, parsed, key))
    return bad


# -- the tests ----------------------------------------------------------------------------------------

def test_the_page_has_its_tables() -> None:
    sections = {r.section for r in ROWS}
    assert len(sections) >= 5 and len(ROWS) >= 30, (sections, len(ROWS))
    assert all(TEST in r.cells for r in ROWS), "every switch table has a test column"


def test_each_difference_is_listed_once() -> None:
    names = [r.cells[WHAT] for r in ROWS]
    assert len(names) == len(set(names)), sorted(n for n in set(names) if names.count(n) > 1)


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.name)
def test_every_switch_names_a_suite_key_or_says_why_not(row: Row) -> None:
    cell = row.cells[SWITCH]
    assert cell, "empty switch"
    problems = _key_problems(cell)
    assert not problems, problems
    assert _keys_in(cell) or NONE_WITH_REASON.match(cell), f"no suite key and no 'none (why)': {cell!r}"


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.name)
def test_every_row_names_its_tests(row: Row) -> None:
    cell = row.cells[TEST]
    assert cell, "empty test cell"
    spans = SPAN.findall(cell)
    tests = [m for s in spans if (m := TEST_REF.fullmatch(s))]
    for m in tests:
        path = ROOT / m.group(1)
        assert path.is_file(), f"no test file {m.group(1)}"
        if m.group(2):
            assert re.search(rf"^def {m.group(2)}\(", path.read_text(encoding="utf-8"), re.MULTILINE), \
                f"{m.group(1)} has no test {m.group(2)}"
    for s in spans:
        if FIXTURE_REF.fullmatch(s):
            assert (FIXTURES / s).is_file() or (ROOT / s).is_file(), f"no fixture {s}"
    assert tests or NONE_WITH_REASON.match(cell) or cell.lower().startswith("none "), \
        f"no test named and no 'none (why)': {cell!r}"


def test_the_checker_refuses_what_does_not_exist() -> None:
    """The resolution is strict: a misspelt key, a list entered without ``[]``, a key below a
    scalar, an unknown key in a mapping value or a reader option no reader has all fail."""
    good = ("`segmentation.attacks.levels: [1, 2, 3]` `vlm.models[].system_prompt` "
            "`perturbations.types_by_dataset: {omni: [a]}` `datasets[].options.classes: [malignant]` "
            "`segmentation.finetune: {lora_targets: {lora: {'*': x}}, train: {epochs: 20}}` `protocol: reference` "
            "`vlm.models[].api.temperature`")
    assert not _key_problems(good)
    assert len(_keys_in(good)) == 7
    for bad in ("`segmentation.atacks.levels`", "`vlm.models.system_prompt`", "`splits.train.x`",
                "`segmentation.finetune.train: {epoch: 20}`", "`datasets[].options.clases`",
                "`protcol: reference`", "`vlm.record_sample: {n: 1, sed: 2}`"):
        assert _key_problems(bad), bad
    assert not _keys_in("`band_reached` `REFERENCE_API_DEFAULTS` `medrobust_lib/config/vlm.py` `n // 64`")


def test_reader_options_union_is_not_empty() -> None:
    assert len(typing.get_args(_reader_options())) >= 2
