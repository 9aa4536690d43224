"""The static report page: every table as an HTML table and every figure as a relative ``<img>``.

Self-contained apart from the PNGs: inline CSS, no scripts, no external resources. Text is
escaped with :func:`html.escape`.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from medrobust_lib.report.table import ReportTable, display_rows, numeric_alignment

_CSS = """
body { font-family: -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif; margin: 2em auto; max-width: 1200px;
       padding: 0 1em; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; font-size: 0.8em; margin: 0.5em 0; }
th, td { padding: 2px 8px; border-bottom: 1px solid #e4e4e4; white-space: nowrap; }
th { border-bottom: 2px solid #444; text-align: left; } td.num, th.num { text-align: right; }
.scroll { overflow-x: auto; max-height: 36em; overflow-y: auto; }
.note { font-size: 0.85em; color: #555; max-width: 60em; } .links { font-size: 0.85em; }
figure { margin: 1.5em 0; } img { max-width: 100%; border: 1px solid #eee; }
figcaption { font-size: 0.85em; color: #444; } tr.floor td { color: #999; }
dl.meta { display: grid; grid-template-columns: minmax(9em, 18em) minmax(0, 1fr); column-gap: 1em; row-gap: 0.2em; }
dl.meta dt { font-weight: bold; } dl.meta dd { margin: 0; overflow-wrap: anywhere; }
"""
"""``dl.meta`` is a two-column grid: a long label (e.g. "Left out ...") wraps inside its cell and its
row grows, so nothing below it (the "Contents" heading) is overlapped, as a floated label did."""


@dataclass(frozen=True)
class Figure:
    """A PNG shown on the page: ``src`` relative to the page, ``caption`` under it. ``section``: the
    name of the table it belongs under (None: the Figures section at the end); ``vector``: PDF and
    SVG twins exist beside the PNG."""

    src: str
    caption: str
    section: str | None = None
    vector: bool = True


def _figure_html(f: Figure) -> str:
    esc = html.escape
    stem = f.src.rsplit(".", 1)[0]
    vector = (f' <span class="links">(<a href="{esc(stem)}.pdf">PDF</a>, <a href="{esc(stem)}.svg">SVG</a>)</span>'
              if f.vector else "")
    return (f'<figure><img src="{esc(f.src)}" alt="{esc(f.caption)}">'
            f"<figcaption>{esc(f.caption)}{vector}</figcaption></figure>")


def table_html(table: ReportTable) -> str:
    """``<table>`` with a header row and one ``<tr>`` per data row (numbers right-aligned)."""
    num = numeric_alignment(table)
    cls = [' class="num"' if n else "" for n in num]
    head = "".join(f"<th{c}>{html.escape(h)}</th>" for h, c in zip(table.headers, cls, strict=True))
    body = "\n".join(
        ('<tr class="floor">' if grey else "<tr>")
        + "".join(f"<td{c}>{html.escape(v)}</td>" for v, c in zip(row, cls, strict=True)) + "</tr>"
        for row, grey in zip(display_rows(table), table.greyed(), strict=True))
    return f"<table>\n<thead><tr>{head}</tr></thead>\n<tbody>\n{body}\n</tbody>\n</table>"


def render_page(title: str, meta: Mapping[str, str], tables: Sequence[ReportTable],
                table_links: Mapping[str, Sequence[str]], figures: Sequence[Figure],
                skipped: Mapping[str, str]) -> str:
    """The whole page: ``title``, a definition list of ``meta`` (mart, generated, models, ...), a
    section per table (caption, links to its files from ``table_links[name]``, the table, its note),
    the figures, and a list of what was not produced with the reason (``skipped``: name -> reason)."""
    esc = html.escape
    parts = ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
             f"<title>{esc(title)}</title>", f"<style>{_CSS}</style>", "</head>", "<body>", f"<h1>{esc(title)}</h1>",
             '<dl class="meta">']
    parts += [f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in meta.items()]
    parts.append("</dl>")
    if tables:
        parts.append("<h2>Contents</h2><ul>")
        parts += [f'<li><a href="#{esc(t.name)}">{esc(t.title)}</a></li>' for t in tables]
        if any(f.section not in {t.name for t in tables} for f in figures):
            parts.append('<li><a href="#figures">Figures</a></li>')
        parts.append("</ul>")
    for t in tables:
        links = " · ".join(f'<a href="{esc(p)}">{esc(p.rsplit(".", 1)[-1].upper())}</a>'
                           for p in table_links.get(t.name, ()))
        parts += [f'<h2 id="{esc(t.name)}">{esc(t.title)}</h2>', f'<p class="links">{links}</p>',
                  f'<div class="scroll">{table_html(t)}</div>']
        if t.note:
            parts.append(f'<p class="note">{esc(t.note)}</p>')
        parts += [_figure_html(f) for f in figures if f.section == t.name]
    placed = {t.name for t in tables}
    rest = [f for f in figures if f.section not in placed]
    if rest:
        parts.append('<h2 id="figures">Figures</h2>')
        parts += [_figure_html(f) for f in rest]
    if skipped:
        parts.append('<h2 id="skipped">Not produced</h2><ul>')
        parts += [f"<li><b>{esc(k)}</b>: {esc(v)}</li>" for k, v in skipped.items()]
        parts.append("</ul>")
    parts += ["</body>", "</html>"]
    return "\n".join(parts) + "\n"
