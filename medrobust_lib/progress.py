"""Progress of a long loop (a partition scoring images, calibrating chunks): a callback type and a
rate-limited text sink. Plain Python, no dependency: the library's loops call a
:data:`Progress` callback; whoever runs them (the Dagster assets, a notebook) decides where the
lines go and how often.

- :data:`Progress`: ``progress(done, total, what)``: ``done`` of ``total`` units (images, chunks)
  of the loop named ``what`` (``"perturbed images"``) are finished; called often (once per batch),
  cheap to call.
- :class:`ProgressLine`: turns the calls into text lines with the count, the share, the time
  spent and the time left (linear in the rate so far), silent for the first ``quiet_s`` seconds
  (a loop that ends sooner prints nothing), then at most one line per ``interval_s``; the last
  call (``done == total``) prints a closing line when anything was printed before. ``live``: one
  line rewritten in place (a terminal; the writer gets text without a newline).
- :func:`fan_out`: one callback calling several; :func:`counted`: an iterator that reports its
  items as they are taken (a batched consumer takes a batch, scores it, takes the next);
  :func:`finish`: the closing call.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import Protocol, TypeVar

T = TypeVar("T")


class Progress(Protocol):
    """``(done, total, what)``: ``done`` of ``total`` units of the loop ``what`` are finished."""

    def __call__(self, done: int, total: int, what: str) -> None: ...


def duration(seconds: float) -> str:
    """``42 s``, ``3m05s``, ``1h02m``: a duration for a progress line."""
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def progress_text(done: int, total: int, what: str, elapsed: float, label: str = "") -> str:
    """``[label] what done/total (pct %), T elapsed, ~T left`` (``left`` from the mean rate so far;
    ``?`` before the first unit is done)."""
    pct = f" ({100.0 * done / total:.0f} %)" if total > 0 else ""
    if done >= total > 0:
        tail = f"done in {duration(elapsed)}"
    else:
        left = duration(elapsed / done * (total - done)) if done > 0 else "?"
        tail = f"{duration(elapsed)} elapsed, ~{left} left"
    head = f"[{label}] " if label else ""
    return f"{head}{what} {done}/{total}{pct}, {tail}"


class ProgressLine:
    """A rate-limited text sink for :data:`Progress` calls (see the module docstring).

    ``write``: receives each line (without a trailing newline). ``label``: prefix of every line (the
    partition). ``interval_s``: least seconds between two lines. ``quiet_s``: nothing is written
    before this many seconds have passed since the first call. ``live``: every line replaces the
    previous one (``write`` gets ``\\r`` + the line + an erase-to-end-of-line sequence, and a
    newline at the end); ``clock``: seconds (tests pass a fake one)."""

    def __init__(self, write: Callable[[str], None], *, label: str = "", interval_s: float = 15.0,
                 quiet_s: float = 5.0, live: bool = False, clock: Callable[[], float] = time.monotonic) -> None:
        self.write, self.label, self.interval_s, self.quiet_s = write, label, interval_s, quiet_s
        self.live, self.clock = live, clock
        self._t0: float | None = None
        self._last: float | None = None
        self.lines = 0
        """Lines written so far."""
        self._open = False  # live: a line is on screen without its newline

    def __call__(self, done: int, total: int, what: str) -> None:
        if total <= 0:
            return
        now = self.clock()
        if self._t0 is None:
            self._t0 = now
        elapsed = now - self._t0
        final = total > 0 and done >= total
        if final:
            if self.lines:
                self._emit(progress_text(done, total, what, elapsed, self.label))
            self.close()
            self._t0 = self._last = None  # a next loop (another ``what``) starts its own clock
            return
        if elapsed < self.quiet_s or (self._last is not None and now - self._last < self.interval_s):
            return
        self._last = now
        self._emit(progress_text(done, total, what, elapsed, self.label))

    def _emit(self, text: str) -> None:
        self.lines += 1
        if self.live:
            self.write("\r" + text + "\x1b[K")
            self._open = True
        else:
            self.write(text)

    def close(self) -> None:
        """End a live line (a newline after it); nothing otherwise."""
        if self._open:
            self.write("\n")
            self._open = False


def fan_out(*sinks: Progress | None) -> Progress:
    """One :data:`Progress` calling each of ``sinks`` (None entries skipped)."""
    live = [s for s in sinks if s is not None]

    def call(done: int, total: int, what: str) -> None:
        for s in live:
            s(done, total, what)

    return call


def counted(items: Iterable[T], progress: Progress | None, total: int, what: str, *,
            every: int = 1) -> Iterator[T]:
    """``items``, reporting ``progress(n, total, what)`` before every ``every``-th item is handed
    out (a batched consumer that takes ``every`` items at a time has then finished the ``n``
    before). The closing call (``done == total``) is the caller's, once the consumer has finished
    the last batch. ``progress`` None: the items unchanged."""
    if progress is None:
        yield from items
        return
    n = 0
    progress(0, total, what)
    for x in items:
        if n and every > 0 and n % every == 0:
            progress(min(n, total - 1) if total > 0 else n, total, what)
        n += 1
        yield x


def finish(progress: Progress | None, total: int, what: str) -> None:
    """The closing call of a loop: ``progress(total, total, what)`` (nothing when None; a loop of
    no units reports ``(0, 0)``, which a :class:`ProgressLine` ignores)."""
    if progress is not None:
        progress(total, total, what)
