"""docs/cli.md's CLI reference is the CLI's own --help text (tools/gen_cli_reference.py)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from tests.tools.tool_loader import load_tool

ROOT = Path(__file__).resolve().parents[2]


def _generator() -> ModuleType:
    return load_tool("gen_cli_reference")


def test_docs_cli_reference_matches_the_cli() -> None:
    gen = _generator()
    section = gen.page_section((ROOT / "docs" / "cli.md").read_text(encoding="utf-8"))
    assert section == gen.cli_reference(), "docs/cli.md drifted from the CLI: run python -m tools.gen_cli_reference"


def test_reference_covers_every_command_and_option() -> None:
    gen = _generator()
    ref = gen.cli_reference()
    for cmd in ("demo", "query", "report", "list-perturbations", "perturb", "score", "check"):
        assert f"#### `medrobust {cmd}`" in ref
    for opt in ("--workers", "--mlruns", "--results-dir", "--suite", "--details", "--window-center",
                "--window-width", "--include-floor"):
        assert opt in ref
    assert "…" not in ref
