"""Generate docs/suite.md, the reference of every suite key, from the pydantic config models.

``python -m tools.gen_suite_reference`` rewrites docs/suite.md; ``--check`` only compares and exits 1
when it differs. ``tests/config/test_suite_reference.py`` fails when the file and the models drift.

Every key of :class:`medrobust_lib.config.Suite` is listed with its type, its default and its
meaning, walked recursively through nested sections and lists of sections; ``datasets[]`` entries
are :class:`medrobust_lib.data.dataset.DatasetConfig`, and ``datasets[].options`` are listed per
``format`` from each registered reader's options model. The meaning is the field's
``description``, else the docstring written under the field, else the sentence of the class
docstring that names the field in double back-quotes.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import json
import re
import sys
import textwrap
import types
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "suite.md"


def _type_name(ann: Any) -> str:
    if ann is type(None):
        return "null"
    if isinstance(ann, type) and not typing.get_args(ann):
        return ann.__name__
    origin = typing.get_origin(ann)
    args = typing.get_args(ann)
    if origin is typing.Literal:
        return " \\| ".join(json.dumps(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type_name(a) for a in args)
    if origin is not None:
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join(_type_name(a) for a in args)}]"
    return re.sub(r"\b[\w.]+\.(\w+)", r"\1", str(ann))


def _models_in(ann: Any) -> tuple[type[BaseModel] | None, bool]:
    """The section model inside an annotation (``M``, ``M | None``, ``list[M]``) and whether it is
    a list of them."""
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ann, False
    origin, args = typing.get_origin(ann), typing.get_args(ann)
    if origin in (list, tuple) and args and isinstance(args[0], type) and issubclass(args[0], BaseModel):
        return args[0], True
    if origin in (typing.Union, types.UnionType):
        for a in args:
            m, many = _models_in(a)
            if m is not None:
                return m, many
    return None, False


def _default(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    value = field.default_factory() if field.default_factory is not None else field.default  # type: ignore[call-arg]
    if isinstance(value, BaseModel):
        return "(section)"
    if isinstance(value, list) and value and all(isinstance(v, BaseModel) for v in value):
        return "(list)"
    try:
        text = json.dumps(value, default=str)
    except (TypeError, ValueError):
        text = repr(value)
    return f"`{text}`" if text != '""' else '`""`'


def _attribute_docs(cls: type) -> dict[str, str]:
    """Docstrings written under a class's fields (``x: int = 0`` then ``\"\"\"...\"\"\"``)."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not (isinstance(klass, type) and issubclass(klass, BaseModel)) or klass is BaseModel:
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for a, b in zip(body, body[1:], strict=False):
            if isinstance(a, ast.AnnAssign) and isinstance(a.target, ast.Name) and isinstance(b, ast.Expr) \
                    and isinstance(b.value, ast.Constant) and isinstance(b.value.value, str):
                out[a.target.id] = " ".join(b.value.value.split())
    return out


def _class_mentions(cls: type, name: str) -> str:
    """The sentence of the class docstring (or a base's) that names ``name`` in double back-quotes."""
    for klass in cls.__mro__:
        doc = " ".join((klass.__doc__ or "").split())
        named = re.compile(rf"``[^`]*(?<![\w.]){re.escape(name)}(?![\w(])[^`]*``")
        for sentence in re.split(r"(?<=[.;])\s+(?=``|[A-Z])", doc):
            if named.search(sentence):
                return sentence.replace("``", "`")
    return ""


def _meaning(cls: type, name: str, field: FieldInfo) -> str:
    text = field.description or _attribute_docs(cls).get(name) or _class_mentions(cls, name)
    return " ".join(text.split()).replace("|", "\\|").replace("``", "`")


def _rows(cls: type[BaseModel], prefix: str) -> list[tuple[str, str, str, str]]:
    rows: list[tuple[str, str, str, str]] = []
    nested: list[tuple[type[BaseModel], str]] = []
    for name, field in cls.model_fields.items():
        key = f"{prefix}{name}"
        rows.append((key, _type_name(field.annotation), _default(field), _meaning(cls, name, field)))
        model, many = _models_in(field.annotation)
        if model is not None:
            nested.append((model, f"{key}[]." if many else f"{key}."))
    for model, p in nested:
        rows.extend(_rows(model, p))
    return rows


def _table(rows: list[tuple[str, str, str, str]]) -> list[str]:
    lines = ["| key | type | default | meaning |", "|---|---|---|---|"]
    lines += [f"| `{k}` | {t} | {d} | {m} |" for k, t, d, m in rows]
    return lines


def suite_reference() -> str:
    """The Markdown of docs/suite.md."""
    from medrobust_lib.config import Suite
    from medrobust_lib.data.dataset import DatasetConfig
    from medrobust_lib.data.formats import READERS

    lines = [
        "# Suite reference",
        "",
        "<!-- generated by tools/gen_suite_reference.py from the pydantic config models; do not edit by hand "
        "(tests/config/test_suite_reference.py checks it) -->",
        "",
        "Every key a suite YAML may hold: its type, its default and what it means. Unknown keys are errors at "
        "every level. Relative paths are relative to the project root; `${VAR}` and `${VAR:-default}` name "
        "environment variables (see [own-data.md](own-data.md)). A `(section)` default means the section's own "
        "defaults below.",
        "",
        "## A suite written as changes to another: `extends`",
        "",
        "`extends: demo.yaml` (a path relative to the suite file's folder, or absolute) is read when the file "
        "loads and is not itself a key of the suite: the named suite file is read first (its own `extends` "
        "too), then this file's keys are merged over it as an overlay's are: mappings key by key, lists and "
        "values replace (a list of models is written out whole), and a key written `key?` applies only where "
        "the base has that key. The base's `overlays` stay (found from the base's folder) unless this file "
        "sets its own list; then the `overlays` are merged over the result. `configs/demo_full.yaml` is "
        "written this way over `configs/demo.yaml`. A missing base, a chain that comes back to a file, or "
        "an overlay naming `extends` is an error naming the file.",
        "",
        "## Suite",
        "",
        *_table([r for r in _rows(Suite, "") if not r[0].startswith("datasets")]),
        "",
        "## `datasets[]`: one entry per dataset",
        "",
        *_table(_rows(DatasetConfig, "datasets[].")),
        "",
        "## `datasets[].options`, by `format`",
        "",
        "Each reader validates its own options (unknown keys are errors). Reader paths are relative to the "
        "dataset's `root`.",
    ]
    for name in sorted(READERS.list()):
        reader = READERS.get(name)
        lines += ["", f"### `format: {name}`", "", " ".join((reader.description or "").split())]
        if reader.layout:
            lines += ["", f"Layout: `{reader.layout}`"]
        model = reader.options_model
        if model is not None and model.model_fields:
            lines += ["", *_table(_rows(model, "options."))]
        else:
            lines += ["", "No options."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare only; exit 1 when docs/suite.md differs")
    args = ap.parse_args(argv)
    text = suite_reference()
    if args.check:
        same = OUT.is_file() and OUT.read_text(encoding="utf-8") == text
        print("docs/suite.md is up to date" if same else "docs/suite.md differs: run python -m tools.gen_suite_reference")
        return 0 if same else 1
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
