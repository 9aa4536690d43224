"""Progress of a running partition, for the asset bodies (:func:`reporter`): a
:data:`medrobust_lib.progress.Progress` that writes rate-limited lines into the Dagster run's log
(``context.log.info``, at most one per :data:`LOG_INTERVAL_S`) and, while ``medrobust run`` /
``medrobust demo`` runs the step in its own process (:func:`terminal`), onto the terminal: one
live line on a TTY, else at most one line per :data:`FILE_INTERVAL_S` (a ``make demo > log``
file). A partition that ends within :data:`QUIET_S` seconds prints nothing."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import dagster as dg

from medrobust_lib.progress import Progress, ProgressLine, fan_out

QUIET_S = 5.0
"""A loop that ends sooner prints no progress line."""
LOG_INTERVAL_S = 30.0
"""Least seconds between two progress lines in the Dagster run's log."""
FILE_INTERVAL_S = 15.0
"""Least seconds between two progress lines on a terminal that is not a TTY (a file, a pipe)."""
LIVE_INTERVAL_S = 0.5
"""Least seconds between two rewrites of the live line on a TTY."""


class Terminal:
    """Where the runner's progress lines go: ``log`` (one line per call, as the runner's step lines)
    or, ``live``, ``write`` (raw text: the live line is rewritten in place)."""

    def __init__(self, log: Callable[[str], None], *, live: bool = False,
                 write: Callable[[str], None] | None = None) -> None:
        self.log, self.live, self.write = log, live, write
        self._lines: list[ProgressLine] = []

    def line(self, label: str) -> ProgressLine:
        if self.live and self.write is not None:
            sink = ProgressLine(self.write, label=label, interval_s=LIVE_INTERVAL_S, quiet_s=QUIET_S, live=True)
        else:
            sink = ProgressLine(lambda text: self.log("    " + text), label=label, interval_s=FILE_INTERVAL_S,
                                quiet_s=QUIET_S)
        self._lines.append(sink)
        return sink

    def close(self) -> None:
        """End any live line left open (a step that failed mid-way), before the next log line."""
        for sink in self._lines:
            sink.close()
        self._lines.clear()


_TERMINAL: list[Terminal] = []
"""The terminal of the runner executing steps in this process (a plain list, not a context
variable: Dagster may run an in-process step on another thread)."""


@contextmanager
def terminal(term: Terminal) -> Iterator[Terminal]:
    """While inside, :func:`reporter` also writes to ``term``."""
    _TERMINAL.append(term)
    try:
        yield term
    finally:
        _TERMINAL.remove(term)
        term.close()


def label_of(context: dg.AssetExecutionContext) -> str:
    """``asset[partition]`` of the running step."""
    name = context.asset_key.to_user_string()
    return f"{name}[{context.partition_key}]" if context.has_partition_key else name


def reporter(context: dg.AssetExecutionContext) -> Progress:
    """The progress callback of one asset body: the Dagster run's log, and the runner's terminal
    when there is one (:func:`terminal`)."""
    label = label_of(context)
    to_log = ProgressLine(context.log.info, label=label, interval_s=LOG_INTERVAL_S, quiet_s=QUIET_S)
    return fan_out(to_log, _TERMINAL[-1].line(label) if _TERMINAL else None)
