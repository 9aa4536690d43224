"""Fixtures shared by the report tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def png_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Figures as PNG only, for the tests that check tables, pages, filters and logging: drawing the
    PDF and SVG twins is about two thirds of a report's time (PDF font subsetting alone a third).
    The twins are checked on test_paper.py's module report (test_html_shows_every_table_and_figure,
    test_figures_are_deterministic)."""
    from medrobust_lib.report.figures import style

    monkeypatch.setattr(style, "FORMATS", ("png",))
