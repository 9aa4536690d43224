"""Generate the CLI reference (docs/cli.md) from the CLI itself.

``python -m tools.gen_cli_reference`` rewrites the part of docs/cli.md between the markers
``<!-- cli-reference:start -->`` and ``<!-- cli-reference:end -->`` with the ``--help`` text of
every ``medrobust`` command (plain click formatting, 100 columns); ``--check`` only compares and
exits 1 when they differ. ``tests/cli/test_cli_reference.py`` fails when docs/cli.md and the CLI drift.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import typer.main

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "cli.md"
START = "<!-- cli-reference:start -->"
END = "<!-- cli-reference:end -->"
WIDTH = 100


def _ctx(cmd: Any, name: str, parent: Any = None) -> Any:
    """A click context for ``cmd`` at :data:`WIDTH` columns (typer ships its own click: the
    command's ``context_class`` is used, not ``click.Context``)."""
    return cmd.context_class(cmd, info_name=name, parent=parent, terminal_width=WIDTH, max_content_width=WIDTH)


def _help(cmd: Any, name: str, parent: Any) -> str:
    return str(cmd.get_help(_ctx(cmd, name, parent))).rstrip()


def cli_reference() -> str:
    """The Markdown of the reference: the group's help, then one ``####`` block per command."""
    from medrobust_cli import app

    group: Any = typer.main.get_command(app)  # a click Group (typer's vendored click)
    root_ctx = _ctx(group, "medrobust")
    parts = ["Generated from the CLI by `python -m tools.gen_cli_reference` (a test fails when this "
             "section and the CLI drift).", "", "```text", _help(group, "medrobust", None), "```"]
    for name in group.list_commands(root_ctx):
        cmd = group.get_command(root_ctx, name)
        assert cmd is not None
        parts += ["", f"#### `medrobust {name}`", "", "```text", _help(cmd, name, root_ctx), "```"]
    return "\n".join(parts)


def page_section(text: str) -> str:
    """The text between the markers (without them); ValueError when they are missing."""
    if text.count(START) != 1 or text.count(END) != 1:
        raise ValueError(f"{PAGE.name} needs exactly one {START} and one {END}")
    return text.split(START, 1)[1].split(END, 1)[0].strip("\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare only; exit 1 on drift")
    a = ap.parse_args()
    text = PAGE.read_text(encoding="utf-8")
    new = cli_reference()
    if page_section(text) == new:
        print("docs/cli.md is up to date")
        return 0
    if a.check:
        print("docs/cli.md differs from the CLI: run python -m tools.gen_cli_reference")
        return 1
    head, rest = text.split(START, 1)
    tail = rest.split(END, 1)[1]
    PAGE.write_text(f"{head}{START}\n{new}\n{END}{tail}", encoding="utf-8")
    print(f"rewrote the CLI reference in {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
