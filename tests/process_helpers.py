"""Subprocess helpers for the crash tests: start a process, wait until it reaches a point it marks
with a file, and kill it there with SIGKILL (what a crash, an OOM kill or ``kill -9`` leaves)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path


def kill_at_marker(args: Sequence[str], marker: Path, *, env: Mapping[str, str] | None = None,
                   cwd: Path | None = None, timeout_s: float = 120.0, poll_s: float = 0.1) -> int:
    """Run ``args``, wait until ``marker`` exists (the process writes it where it should die),
    then SIGKILL it. Returns the exit status (``-signal.SIGKILL``). Fails the test when the process
    ends before writing the marker or takes longer than ``timeout_s``; the process never outlives
    the call."""
    proc = subprocess.Popen(list(args), env=dict(env) if env is not None else None, cwd=cwd)
    try:
        deadline = time.monotonic() + timeout_s
        while not marker.exists():
            assert proc.poll() is None, f"the process ended before writing {marker.name}"
            assert time.monotonic() < deadline, f"no {marker.name} after {timeout_s:.0f} s"
            time.sleep(poll_s)
        os.kill(proc.pid, signal.SIGKILL)
        return proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
