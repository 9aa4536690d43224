"""docs/suite.md is generated from the pydantic config models (tools/gen_suite_reference.py): the test
regenerates it and compares, and checks that every key of every section is there with a meaning."""

from __future__ import annotations

import re
from pathlib import Path
from types import ModuleType

from pydantic import BaseModel

from tests.tools.tool_loader import load_tool

ROOT = Path(__file__).resolve().parents[2]


def _generator() -> ModuleType:
    return load_tool("gen_suite_reference")


def test_docs_suite_md_matches_the_config_models() -> None:
    text = (ROOT / "docs" / "suite.md").read_text(encoding="utf-8")
    assert text == _generator().suite_reference(), "docs/suite.md drifted: run python -m tools.gen_suite_reference"


def _keys(cls: type[BaseModel], prefix: str, gen: ModuleType) -> set[str]:
    out = set()
    for name, field in cls.model_fields.items():
        out.add(prefix + name)
        model, many = gen._models_in(field.annotation)
        if model is not None:
            out |= _keys(model, f"{prefix}{name}{'[].' if many else '.'}", gen)
    return out


def test_every_suite_key_has_a_type_a_default_and_a_meaning() -> None:
    from medrobust_lib.config import Suite
    from medrobust_lib.data.dataset import DatasetConfig

    gen = _generator()
    ref = gen.suite_reference()
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `([^`]+)` \| (.*) \|$", ref, re.M)}
    wanted = {k for k in _keys(Suite, "", gen) if not k.startswith("datasets")} | _keys(DatasetConfig, "datasets[].", gen)
    assert wanted <= set(rows), sorted(wanted - set(rows))
    for key, rest in rows.items():
        typ, default, meaning = (c.strip() for c in re.split(r"(?<!\\)\|", rest))
        assert typ and default and meaning, key
    assert "`extends: demo.yaml`" in ref  # the file key that is not a Suite field
    assert "`datasets[].root`" in ref and "### `format: folder`" in ref and "`options.mask_suffix`" in ref
    assert re.search(r"\| `results_dir` \| str \| `\"\"` \| .*var/<name>/results", ref)
