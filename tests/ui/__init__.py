"""The UIs (``dagster dev``, ``mlflow ui``) started as real servers on 127.0.0.1.

Helpers shared by the UI tests: a free loopback port, a server in its own process group (so the
whole tree, webserver, daemon and code server included, answers one signal), HTTP polling with the
server's log in the failure message, and a stop that proves no process of the group survives.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx

HOST = "127.0.0.1"


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the OS picks it): the UI supervisor's own finder."""
    from medrobust_assets.ui import free_loopback_port

    return free_loopback_port()


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of process group ``pgid``, read from /proc."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # fields after the parenthesised command: state ppid pgrp ...
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            pids.append(int(entry.name))
    return pids


def stop_group(proc: subprocess.Popen[bytes], grace_s: float = 15.0) -> list[int]:
    """SIGTERM the process group led by ``proc``, SIGKILL what is left after ``grace_s``, reap the
    leader. Returns the pids of the group still alive afterwards (empty when it is gone)."""
    pgid = proc.pid  # start_new_session=True: the leader's pid is the group id
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if proc.poll() is not None and not group_members(pgid):
                break
            time.sleep(0.2)
        if proc.poll() is not None and not group_members(pgid):
            break
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    return group_members(pgid)


@contextmanager
def server(cmd: Sequence[str], env: Mapping[str, str], cwd: Path, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``cmd`` in a new session (its own process group) with output to ``log``; on exit the
    whole group is stopped whatever happened in the body."""
    with log.open("wb") as out:
        proc = subprocess.Popen(list(cmd), env=dict(env), cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            yield proc
        finally:
            stop_group(proc)


def log_tail(log: Path, n: int = 4000) -> str:
    """The last ``n`` characters of a server log (for failure messages)."""
    return log.read_text(errors="replace")[-n:] if log.is_file() else "(no log)"


def client() -> httpx.Client:
    """An HTTP client for loopback only: no proxies from the environment."""
    return httpx.Client(trust_env=False, timeout=30.0)


def wait_until(check: Callable[[], bool], proc: subprocess.Popen[bytes], log: Path, timeout_s: float,
               what: str, interval_s: float = 1.0) -> None:
    """Poll ``check`` (connection errors count as 'not yet') until it is true; fail early with the
    log if the server exits, or after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"server exited with {proc.returncode} before {what}:\n{log_tail(log)}")
        try:
            if check():
                return
        except (httpx.HTTPError, KeyError, TypeError, ValueError) as exc:
            last = f"{type(exc).__name__}: {exc}"
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what} ({last}):\n{log_tail(log)}")


def non_loopback_ip() -> str:
    """An IPv4 address of this machine that is not loopback, or '' when there is none."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1; connect() on UDP sends nothing
            ip = str(s.getsockname()[0])
        except OSError:
            return ""
    return "" if ip.startswith("127.") else ip
