"""Check that the report's LaTeX tables fit the page they are set for, with the real TeX.

Run after ``medrobust report`` (needs ``pdflatex`` with booktabs, xcolor and longtable, e.g. the
Debian packages ``texlive-latex-base texlive-latex-recommended``)::

    python tools/latex_fit.py var/reports/tables

Each ``*.tex`` table is typeset alone in an ``article`` whose text width is the width the table
claims (``table``: one column, 3.5 in; ``table*`` and ``longtable``: both columns, 7.2 in, the
width of a two-column page's text block). A table fits when TeX reports no overfull box. Prints
one line per table (``fits`` or ``overfull by N pt``) and exits 1 when any table does not fit.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ONE_COLUMN_TEXT_IN = 3.5
TWO_COLUMN_TEXT_IN = 7.2
_OVERFULL = re.compile(r"Overfull \\hbox \(([0-9.]+)pt too wide\)")


def text_width_in(tex: str) -> float:
    """The text width a table is set for: one column for ``table``, both columns otherwise."""
    return ONE_COLUMN_TEXT_IN if "\\begin{table}" in tex else TWO_COLUMN_TEXT_IN


def document(tex: str, width_in: float) -> str:
    """A minimal article typesetting ``tex`` at ``width_in`` inches of text width."""
    return "\n".join([
        "\\documentclass{article}", "\\usepackage{booktabs,xcolor,longtable}",
        f"\\setlength{{\\textwidth}}{{{width_in}in}}", "\\setlength{\\oddsidemargin}{0in}",
        "\\setlength{\\paperwidth}{8.5in}", "\\begin{document}", tex, "\\end{document}", ""])


def overfull_pt(tex: str, width_in: float) -> float:
    """The widest overfull box (pt) TeX reports for ``tex`` at ``width_in``; 0 when it fits.
    Raises RuntimeError when pdflatex fails."""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "t.tex"
        src.write_text(document(tex, width_in), encoding="utf-8")
        run = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", src.name], cwd=tmp,
                             capture_output=True, text=True, timeout=120)
        log = (Path(tmp) / "t.log").read_text(encoding="utf-8", errors="replace")
        if run.returncode != 0:
            raise RuntimeError(f"pdflatex failed: {log[-800:]}")
    return max((float(x) for x in _OVERFULL.findall(log)), default=0.0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    args = ap.parse_args(argv)
    bad = 0
    for path in sorted(args.folder.glob("*.tex")):
        tex = path.read_text(encoding="utf-8")
        width = text_width_in(tex)
        over = overfull_pt(tex, width)
        bad += over > 0
        print(f"{path.name}: {'fits' if over == 0 else f'overfull by {over:.1f} pt'} at {width} in")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
