"""docs/cli.md's CLI reference is the CLI's own --help text (tools/gen_cli_reference.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_cli_reference", ROOT / "tools" / "gen_cli_reference.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_docs_cli_reference_matches_the_cli() -> None:
    gen = _generator()
    section = gen.page_section((ROOT / "docs" / "cli.md").read_text(encoding="utf-8"))
    assert section == gen.cli_reference(), "docs/cli.md drifted from the CLI: run python tools/gen_cli_reference.py"


def test_reference_covers_every_command_and_option() -> None:
    gen = _generator()
    ref = gen.cli_reference()
    for cmd in ("demo", "query", "report", "list-perturbations", "perturb", "score", "check"):
        assert f"#### `medrobust {cmd}`" in ref
    for opt in ("--workers", "--mlruns", "--results-dir", "--suite", "--details", "--window-center",
                "--window-width", "--include-floor"):
        assert opt in ref
    assert "…" not in ref
