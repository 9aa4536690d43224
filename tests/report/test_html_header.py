"""The HTML report's header: a long metadata label (``Left out (...)``) wraps inside its own grid
cell instead of a floated box that spilled over the "Contents" heading below it."""

from __future__ import annotations

import re

from medrobust_lib.report.html import _CSS, render_page
from medrobust_lib.report.table import Column, ReportTable

LONG = "Left out (error share above max_error_share; re-run them)"


def _rule(selector: str) -> str:
    m = re.search(re.escape(selector) + r"\s*\{([^}]*)\}", _CSS)
    assert m, selector
    return m.group(1)


def test_meta_labels_are_grid_cells_not_floats() -> None:
    assert "float" not in _CSS  # a floated label taller than its value overlapped what followed the list
    assert "display: grid" in _rule("dl.meta")
    assert "margin: 0" in _rule("dl.meta dd")


def test_the_header_renders_every_label_before_the_contents() -> None:
    import pandas as pd

    t = ReportTable("t", "A table", pd.DataFrame({"x": [1]}), (Column("X", "x", "int"),))
    page = render_page("Report", {"Mart": "var/demo/marts.duckdb", LONG: "vlm_results tiny-llava ct 2"}, [t],
                       {}, [], {})
    head = page[: page.index("<h2>Contents</h2>")]
    assert f"<dt>{LONG}</dt><dd>vlm_results tiny-llava ct 2</dd>" in head and head.rstrip().endswith("</dl>")
