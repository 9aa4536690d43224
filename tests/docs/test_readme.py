"""The README stays short and true; the perturbation table of docs/perturbations.md is the registry's.

The README is the page a newcomer reads in ten minutes (issue 33): at most 250 lines, "your own data"
within its first 150, no dated timings or commit hashes (those live in docs/performance.md and
CHANGELOG.md), and the real model's headline equal to the table it comes from (docs/litemedsam.md).
"""

from __future__ import annotations

import re
from pathlib import Path

from typer.testing import CliRunner

from medrobust_cli import app

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def test_perturbation_table_matches_registry() -> None:
    text = (ROOT / "docs" / "perturbations.md").read_text()
    start = text.index("<!-- perturbation-table:start")
    start = text.index("\n", start) + 1
    end = text.index("<!-- perturbation-table:end -->")
    res = CliRunner().invoke(app, ["list-perturbations", "--format", "markdown"])
    assert res.exit_code == 0
    assert text[start:end].strip() == res.stdout.strip(), "regenerate: medrobust list-perturbations --format markdown"


def test_readme_names_the_two_commands() -> None:
    text = README.read_text()
    assert "make demo" in text and "make test" in text


def test_readme_is_short_and_reaches_own_data_early() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= 250, f"README has {len(lines)} lines; move detail to docs/"
    own = [i for i, line in enumerate(lines) if line.startswith("## ") and "own data" in line.lower()]
    assert own, "README has no '## ... own data ...' section"
    assert own[0] < 150, f"'your own data' starts at line {own[0] + 1}; it must be within the first 150"


def test_readme_has_no_dated_timings_or_commit_hashes() -> None:
    text = README.read_text()
    assert not re.findall(r"\b20\d\d-\d\d-\d\d\b", text), "dates belong in CHANGELOG.md"
    assert not re.findall(r"\b\d\d:\d\d UTC\b", text), "dated timings belong in docs/performance.md"
    assert not re.findall(r"`[0-9a-f]{7,40}`", text), "commit hashes belong in CHANGELOG.md"


def _litemedsam_dice() -> dict[str, tuple[int, float]]:
    """modality -> (images, Dice) from docs/litemedsam.md's clean Dice table."""
    page = (ROOT / "docs" / "litemedsam.md").read_text()
    rows = re.findall(r"^\| ([A-Za-z-]+) \| (\d+) \| (0\.\d{3}) \|$", page, re.M)
    assert rows, "docs/litemedsam.md lost its per-modality Dice table"
    return {name: (int(n), float(d)) for name, n, d in rows}


def test_readme_real_model_headline_is_the_documented_one() -> None:
    table = _litemedsam_dice()
    n_all, dice_all = table.pop("all")
    assert sum(n for n, _ in table.values()) == n_all
    low = min(table.items(), key=lambda kv: kv[1][1])
    high = max(table.items(), key=lambda kv: kv[1][1])
    text = " ".join(README.read_text().split())  # line breaks do not matter
    assert f"clean Dice of **{dice_all:.3f}** over the {n_all} test images" in text
    assert f"from {low[1][1]:.2f} on {low[0]} to {high[1][1]:.2f} on {high[0]}" in text
