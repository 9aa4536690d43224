"""One writer per suite: an advisory lock on the suite's results folder.

``medrobust run``, ``medrobust demo`` and every mart build hold :func:`suite_writer_lock` on the
suite's ``results_dir`` while they write: an exclusive ``fcntl.flock`` on
``<results_dir>/.medrobust-writer.lock``, whose text names the holder (pid, host, command, start
time). A second writer is refused at once with :class:`SuiteBusyError` (exit 2 in the CLI, one line
naming the holder) or, with ``wait_s > 0``, waits up to that long after printing one line.

The kernel drops a ``flock`` when its process ends, however it ends, so a lock left by a killed
process (SIGKILL, OOM, power cut of a container) is free: the next writer takes it over and says
whose it was. The lock is re-entrant within a process (the mart build inside ``medrobust run``
does not wait on its own run). It is advisory: a process that does not ask (a Dagster UI run of a
single partition) is not stopped by it; and ``flock`` on some network file systems is local to
one host.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

LOCK_NAME = ".medrobust-writer.lock"
"""File inside the results folder that carries the lock (hidden; never a table folder)."""

_HELD: dict[str, int] = {}
"""Resolved lock path -> nesting depth of this process's holds."""
_HELD_GUARD = threading.Lock()


class SuiteBusyError(OSError):
    """Another process holds the suite's writer lock; the message names it (pid, command)."""


def lock_path(results_dir: str | os.PathLike[str]) -> Path:
    """``<results_dir>/.medrobust-writer.lock``."""
    return Path(results_dir) / LOCK_NAME


def _holder(fd: int) -> dict[str, object]:
    """The holder record written in the lock file (empty when unreadable)."""
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        text = os.read(fd, 4096).decode("utf-8", errors="replace")
        value = json.loads(text) if text.strip() else {}
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _try_lock(fd: int) -> bool:
    """Take the exclusive lock without waiting; False when another process holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise
        return False
    return True


HOLDER_SETTLE_S = 1.0
"""How long a refused writer waits for the holder's record to appear: a holder writes its record
just after taking the lock, so for a moment the file is empty or half-written."""


def _settled_holder(fd: int, settle_s: float = HOLDER_SETTLE_S) -> dict[str, object] | None:
    """The record of the process holding the lock, once it has been written (re-read every 20 ms
    for up to ``settle_s``; after that whatever is there, possibly empty: an unknown process).
    Returns None, holding the lock, when it became free meanwhile."""
    rec = _holder(fd)
    until = time.monotonic() + settle_s
    while not rec.get("pid") and time.monotonic() < until:
        time.sleep(0.02)
        if _try_lock(fd):
            return None
        rec = _holder(fd)
    return rec


def describe_holder(rec: dict[str, object]) -> str:
    """``pid 123 on host (medrobust run --suite x.yaml) since 2026-01-01T00:00:00Z`` or ``an unknown process``."""
    if not rec.get("pid"):
        return "an unknown process"
    text = f"pid {rec.get('pid')}"
    if rec.get("host") and rec.get("host") != socket.gethostname():
        text += f" on {rec.get('host')}"
    if rec.get("command"):
        text += f" ({rec.get('command')})"
    if rec.get("since"):
        text += f" since {rec.get('since')}"
    return text


def default_command() -> str:
    """This process's command line, shortened to 200 characters."""
    cmd = " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]) if sys.argv and sys.argv[0] else "python"
    return cmd if len(cmd) <= 200 else cmd[:197] + "..."


@contextmanager
def suite_writer_lock(results_dir: str | os.PathLike[str], *, command: str | None = None, wait_s: float = 0.0,
                      log: Callable[[str], None] | None = None, poll_s: float = 0.2) -> Iterator[Path]:
    """Hold the writer lock of ``results_dir`` (created if missing) inside the block; yields the
    lock file's path.

    Held already by this process: a no-op (re-entrant). Held by another process: with ``wait_s``
    of 0 raise :class:`SuiteBusyError` at once; otherwise print one line through ``log`` and retry
    every ``poll_s`` seconds until ``wait_s`` has passed (then raise). A lock file whose recorded
    holder is gone is taken over (``log`` says whose it was)."""
    folder = Path(results_dir)
    folder.mkdir(parents=True, exist_ok=True)
    path = lock_path(folder)
    key = str(path.resolve())
    with _HELD_GUARD:
        if key in _HELD:
            _HELD[key] += 1
            nested = True
        else:
            nested = False
    if nested:
        try:
            yield path
        finally:
            with _HELD_GUARD:
                _HELD[key] -= 1
        return

    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + max(0.0, wait_s)
        told = False
        while not _try_lock(fd):
            rec = _settled_holder(fd)
            if rec is None:  # freed while we looked, and now ours
                break
            who = describe_holder(rec)
            if time.monotonic() >= deadline:
                raise SuiteBusyError(errno.EBUSY, f"the results folder {folder} is being written by {who}; "
                                                  "wait for it to finish (or stop it) and run again")
            if not told and log is not None:
                log(f"waiting for the results folder {folder}: it is being written by {who}")
                told = True
            time.sleep(poll_s)
        previous = _holder(fd)
        if previous.get("pid") and log is not None:
            log(f"taking over the writer lock of {folder} left by {describe_holder(previous)} (no longer running)")
        record = {"pid": os.getpid(), "host": socket.gethostname(), "command": command or default_command(),
                  "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode("utf-8"), 0)
        with _HELD_GUARD:
            _HELD[key] = 1
        try:
            yield path
        finally:
            with _HELD_GUARD:
                _HELD.pop(key, None)
            try:
                os.ftruncate(fd, 0)  # released cleanly: no holder to report
            except OSError:
                pass
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
