"""House style of every report figure: journal sizes, a colour-blind-safe palette, vector output,
and a check that no two labels overlap.

- Sizes: :data:`ONE_COLUMN` (3.5 in) and :data:`TWO_COLUMN` (7.2 in) wide, the column widths of
  the usual two-column templates (MICCAI/LNCS, IEEE); fonts 6-8 pt so the figure is legible at
  print size without scaling.
- Colours: the Okabe-Ito palette (:data:`OKABE_ITO`; Okabe & Ito 2008, distinguishable under the
  common colour-vision deficiencies); more categories than colours cycle through
  :data:`LINESTYLES` / :data:`MARKERS` as well, so no two series look alike. Floor-effect series
  are drawn in :data:`FLOOR_GREY`.
- Files: :func:`save_figure` writes ``<stem>.png`` (300 dpi), ``<stem>.pdf`` and ``<stem>.svg``
  (vector, text kept as text in the SVG) with no timestamps, so re-runs are byte-identical.
- Overlap: :func:`overlapping_texts` draws the figure and returns every pair of visible text
  artists whose bounding boxes (in display pixels) intersect; the tests call it on each figure.

matplotlib is imported inside the functions (the Agg backend), never at module import.
"""

from __future__ import annotations

import multiprocessing
import pickle
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from cycler import cycler

ONE_COLUMN = 3.5
"""Width in inches of a one-column figure."""
TWO_COLUMN = 7.2
"""Width in inches of a figure spanning both columns."""
DPI = 300
"""Resolution of the PNG twin (the PDF and SVG are vector)."""
FORMATS: tuple[str, ...] = ("png", "pdf", "svg")

OKABE_ITO: tuple[str, ...] = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442",
                              "#000000")
"""Okabe-Ito: blue, orange, bluish green, vermillion, reddish purple, sky blue, yellow, black."""
MARKERS: tuple[str, ...] = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "h")
LINESTYLES: tuple[str, ...] = ("-", "--", ":", "-.")
RECORD_OVERLAPS = False
"""When True (tests), :func:`save_figure` stores :func:`overlapping_texts` of every figure in
:data:`OVERLAPS` (PNG path -> pairs) before writing it."""
OVERLAPS: dict[str, list[tuple[str, str]]] = {}
FLOOR_GREY = "#BBBBBB"
"""Colour of series whose clean score is at the floor (their drops are not informative)."""

RC: dict[str, Any] = {
    "font.size": 7, "axes.titlesize": 7.5, "axes.labelsize": 7, "xtick.labelsize": 6.5, "ytick.labelsize": 6.5,
    "legend.fontsize": 6, "figure.titlesize": 8, "axes.linewidth": 0.6, "lines.linewidth": 1.0,
    "lines.markersize": 3.5, "xtick.major.width": 0.6, "ytick.major.width": 0.6, "grid.linewidth": 0.4,
    "legend.frameon": False, "svg.fonttype": "none", "svg.hashsalt": "medrobust", "pdf.fonttype": 42,
    "savefig.dpi": DPI, "figure.dpi": 100,
}


def color(i: int) -> str:
    """The ``i``-th palette colour (cycling)."""
    return OKABE_ITO[i % len(OKABE_ITO)]


def series_style(i: int) -> dict[str, Any]:
    """Colour, marker and line style of the ``i``-th series: unique for the first 40 series."""
    n = len(OKABE_ITO)
    return {"color": OKABE_ITO[i % n], "marker": MARKERS[(i // n + i) % len(MARKERS)],
            "linestyle": LINESTYLES[(i // n) % len(LINESTYLES)]}


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


@contextmanager
def paper_style() -> Iterator[Any]:
    """``with paper_style() as plt:`` -- pyplot with :data:`RC` and the Okabe-Ito colour cycle."""
    plt = pyplot()

    with plt.rc_context({**RC, "axes.prop_cycle": cycler(color=list(OKABE_ITO))}):
        yield plt


_METADATA: dict[str, dict[str, None]] = {
    "png": {"Software": None},
    "pdf": {"CreationDate": None, "ModDate": None, "Producer": None, "Creator": None},
    "svg": {"Date": None, "Creator": None},
}
_SAVER: dict[str, Any] = {}
"""While :func:`parallel_saves` is active: ``pool`` (the process pool) and ``pending`` (futures)."""


def _write_formats(fig: Any, png_path: Path) -> None:
    plt = pyplot()
    # the paper style again: colours such as "C0" are resolved against the cycle when drawn
    with plt.rc_context({**RC, "axes.prop_cycle": cycler(color=list(OKABE_ITO))}):
        for i, fmt in enumerate(FORMATS):
            fig.savefig(png_path.with_suffix(f".{fmt}"), dpi=DPI, metadata=_METADATA[fmt], format=fmt)
            if i == 0 and fig.get_layout_engine() is not None:
                # the layout the first file was drawn with (constrained layout solved once) serves
                # its twins too: solving it again per format cost about a quarter of the drawing
                fig.set_layout_engine("none")
    plt.close(fig)


def _write_pickled(data: bytes, png_path: str) -> None:
    """Worker side of :func:`parallel_saves`: unpickle a figure and write its three files. ``data``
    comes only from :func:`save_figure` in the parent process (its own figure, through the pool's
    pipe), never from a file or a user, so pickle is safe here; weights never travel this way."""
    pyplot()
    _write_formats(pickle.loads(data), Path(png_path))  # noqa: S301 - the parent's own figure, see above


@contextmanager
def parallel_saves(workers: int) -> Iterator[None]:
    """Within the block :func:`save_figure` pickles each figure and leaves the drawing of its three
    files (the costly part) to ``workers`` processes (spawned; none when ``workers`` <= 1); on
    exit it waits for every file and re-raises the first error. The files are the same bytes."""
    if workers <= 1 or _SAVER:
        yield
        return
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        _SAVER.update(pool=pool, pending=[])
        try:
            yield
            for fut in _SAVER["pending"]:
                fut.result()
        finally:
            _SAVER.clear()


def save_figure(fig: Any, png_path: Path) -> Path:
    """Write ``fig`` as PNG (300 dpi) plus PDF and SVG twins next to it (same stem), without
    timestamps, close it and return the PNG path (inside :func:`parallel_saves` the files are
    written by a worker process and exist when the block ends). ``bbox_inches="tight"`` is not
    used, so the files keep the figure's designed width (3.5 or 7.2 in)."""
    png_path.parent.mkdir(parents=True, exist_ok=True)
    if RECORD_OVERLAPS:
        OVERLAPS[str(png_path)] = overlapping_texts(fig)
    if _SAVER:
        data = pickle.dumps(fig)
        pyplot().close(fig)
        _SAVER["pending"].append(_SAVER["pool"].submit(_write_pickled, data, str(png_path)))
        return png_path
    _write_formats(fig, png_path)
    return png_path


def twins(png_path: Path) -> list[Path]:
    """The PNG and its vector twins written by :func:`save_figure`."""
    return [png_path.with_suffix(f".{fmt}") for fmt in FORMATS]


def _undrawn_tick_labels(fig: Any) -> set[int]:
    """ids of tick labels whose tick lies outside its axis' view interval (matplotlib keeps them
    visible but does not draw them)."""
    out: set[int] = set()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            lo, hi = sorted(axis.get_view_interval())
            eps = 1e-9 * max(1.0, abs(hi - lo))
            for tick in [*axis.get_major_ticks(), *axis.get_minor_ticks()]:
                loc = tick.get_loc()
                if loc is None or not (lo - eps <= loc <= hi + eps):
                    out |= {id(tick.label1), id(tick.label2)}
    return out


def _texts(fig: Any) -> list[Any]:
    from matplotlib.text import Text

    skip = _undrawn_tick_labels(fig)
    out = []
    for t in fig.findobj(Text):
        if id(t) in skip or not t.get_visible() or not t.get_text().strip():
            continue
        ax = t.axes
        if ax is not None and not ax.get_visible():
            continue
        out.append(t)
    return out


def overlapping_texts(fig: Any, pad: float = 0.0) -> list[tuple[str, str]]:
    """Pairs of visible, non-empty text artists of ``fig`` (titles, axis labels, tick labels,
    legend entries, annotations, cell values) whose display-space bounding boxes intersect by
    more than ``pad`` pixels; also texts that leave the figure. Draws the figure first (Agg)."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    fig_box = fig.bbox
    boxes = []
    for t in _texts(fig):
        bb = t.get_window_extent(renderer)
        if bb.width <= 0 or bb.height <= 0:
            continue
        boxes.append((t.get_text().replace("\n", " "), bb))
    out: list[tuple[str, str]] = []
    for text, bb in boxes:
        if (bb.x0 < fig_box.x0 - 1 or bb.y0 < fig_box.y0 - 1 or bb.x1 > fig_box.x1 + 1
                or bb.y1 > fig_box.y1 + 1):
            out.append((text, "<outside the figure>"))
    for i in range(len(boxes)):
        ti, bi = boxes[i]
        for j in range(i + 1, len(boxes)):
            tj, bj = boxes[j]
            w = min(bi.x1, bj.x1) - max(bi.x0, bj.x0)
            h = min(bi.y1, bj.y1) - max(bi.y0, bj.y0)
            if w > pad and h > pad:
                out.append((ti, tj))
    return out


__all__ = ["DPI", "FLOOR_GREY", "FORMATS", "LINESTYLES", "MARKERS", "OKABE_ITO", "ONE_COLUMN", "RC",
           "TWO_COLUMN", "color", "overlapping_texts", "paper_style", "pyplot", "save_figure", "series_style",
           "twins"]
