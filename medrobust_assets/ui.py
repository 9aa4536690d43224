"""``make ui``: ``dagster dev`` under a supervisor that stops it on the first Ctrl-C or SIGTERM.

``dagster dev`` answers SIGINT / SIGTERM by asking its webserver and daemon to shut down and then
waits up to 60 s for each (``dagster._cli.dev``), so one Ctrl-C could take two minutes, longer
while the daemon is busy. This supervisor starts ``dagster dev`` (arguments passed through) in a
process group of its own (webserver, daemon, code server and every run worker they start belong
to it) and, on the first SIGINT or SIGTERM:

1. forwards SIGTERM to the whole group (Dagster's graceful shutdown starts);
2. waits up to :data:`GRACE_S` seconds for the group to be gone;
3. SIGKILLs whatever is left of the group, reaps ``dagster dev`` and exits.

So the UI stops within ``GRACE_S`` + ``KILL_WAIT_S`` (8 s) at most, whatever Dagster is doing. A run killed this
way is marked failed by Dagster's run monitoring at the next start (``run_monitoring`` in
dagster.yaml); its results are idempotent, so re-materialising it loses nothing. When ``dagster
dev`` exits by itself, the supervisor exits with its return code (after stopping any process it
left in the group).

The webserver itself listens on a private loopback port under a secret path prefix; the user's
port is served by the UI guard (:mod:`medrobust_assets.ui_guard`), which refuses cross-site
requests, DNS-rebinding hosts and GraphQL sent by GET (issue 44, finding 4).

Usage (the Makefile's ``ui`` target)::

    python -m medrobust_assets.ui -h 127.0.0.1 -p 3000 -w workspace.yaml

Plain standard library: importing this module starts nothing and imports no Dagster.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType

from medrobust_assets.ui_guard import Guard, new_prefix

GRACE_S = 5.0
"""Seconds the ``dagster dev`` group gets after the forwarded SIGTERM before it is killed."""
POLL_S = 0.1
KILL_WAIT_S = 3.0
"""Seconds to wait after SIGKILL for the killed processes to be gone."""


def dagster_command(args: Sequence[str]) -> list[str]:
    """``dagster dev <args>`` with the ``dagster`` executable of this interpreter's environment."""
    exe = Path(sys.executable).with_name("dagster")
    return [str(exe) if exe.is_file() else "dagster", "dev", *args]


def _group_alive(pgid: int) -> bool:
    """Whether a live (not zombie) process of group ``pgid`` exists: read from /proc on Linux (a
    zombie waiting for its reaper answers signals but runs nothing), else ``killpg(pgid, 0)``."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop(proc: subprocess.Popen[bytes], grace_s: float = GRACE_S) -> None:
    """SIGTERM the process group led by ``proc``; after ``grace_s`` seconds SIGKILL what is left of
    it; reap ``proc``. Returns when no live process of the group is left (at most
    :data:`KILL_WAIT_S` after the SIGKILL)."""
    pgid = proc.pid
    _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        proc.poll()
        if proc.returncode is not None and not _group_alive(pgid):
            break
        time.sleep(POLL_S)
    else:
        _signal_group(pgid, signal.SIGKILL)
    _signal_group(pgid, signal.SIGKILL)  # stragglers of a leader that exited first
    proc.wait()
    deadline = time.monotonic() + KILL_WAIT_S  # a killed process needs a moment to be gone
    while _group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(POLL_S)


class _Stop(Exception):
    """Raised in the main thread by the first SIGINT / SIGTERM."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def run(cmd: Sequence[str], grace_s: float = GRACE_S, env: Mapping[str, str] | None = None) -> int:
    """Run ``cmd`` (with environment ``env``, default this process's) in a new session (its own
    process group) until it exits or this process gets SIGINT / SIGTERM; then stop the group
    (:func:`stop`). Returns the exit status: the command's own, or 128 + the signal number when a
    signal stopped it."""

    def _handler(signum: int, _frame: FrameType | None) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the first signal decides; repeats change nothing
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise _Stop(signum)

    old = {s: signal.signal(s, _handler) for s in (signal.SIGINT, signal.SIGTERM)}
    proc: subprocess.Popen[bytes] | None = None
    try:
        proc = subprocess.Popen(list(cmd), start_new_session=True, env=None if env is None else dict(env))
        code = proc.wait()
        stop(proc, grace_s=0.0)  # whatever it left behind in its group
        return code
    except _Stop as sig:
        if proc is not None:
            print(f"medrobust ui: stopping dagster dev (signal {sig.signum}; at most {grace_s:.0f} s)",
                  file=sys.stderr, flush=True)
            stop(proc, grace_s=grace_s)
        return 128 + sig.signum
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def port_taken(host: str, port: int) -> bool:
    """Whether something already listens on ``host:port`` (a second UI would start its daemon and then
    find no port for its webserver, leaving the daemon running alone: issue 44, finding 12)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.settimeout(0.5)
        return probe.connect_ex((host, port)) == 0


def _option(args: Sequence[str], short: str, long: str, default: str) -> str:
    for i, a in enumerate(args):
        if a in (short, long) and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(long + "="):
            return a.split("=", 1)[1]
    return default


def _without(args: Sequence[str], options: Sequence[str]) -> list[str]:
    """``args`` without the ``options`` (``-x VALUE`` or ``--xx=VALUE`` forms) and their values."""
    out: list[str] = []
    skip = False
    for a in args:
        if skip:
            skip = False
        elif a in options:
            skip = True
        elif not any(a.startswith(o + "=") for o in options if o.startswith("--")):
            out.append(a)
    return out


def free_loopback_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the OS picks it): the webserver's private port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


LOOPBACK = ("127.0.0.1", "localhost")
HOST_OPTIONS = ("-h", "--host", "--dagit-host")
PORT_OPTIONS = ("-p", "--port", "--dagit-port")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m medrobust_assets.ui [dagster dev options]``: ``dagster dev`` on a private port
    under a secret path prefix, behind the UI guard (:mod:`medrobust_assets.ui_guard`) on the
    requested ``-h``/``-p`` (loopback only). A port already in use, or a host other than the
    loopback, is refused in one line (exit 2) before anything starts."""
    args = list(sys.argv[1:] if argv is None else argv)
    host, port = _option(args, "-h", "--host", "127.0.0.1"), _option(args, "-p", "--port", "3000")
    if host not in LOOPBACK:
        print(f"error: the UI binds to the loopback only (127.0.0.1), not {host!r}; see docs/security.md",
              file=sys.stderr)
        return 2
    if not port.isdigit() or not 0 < int(port) < 65536:
        print(f"error: bad port {port!r}", file=sys.stderr)
        return 2
    if port_taken("127.0.0.1", int(port)):
        print(f"error: {host}:{port} is already in use (another UI?); stop it or choose another port",
              file=sys.stderr)
        return 2
    upstream, prefix = free_loopback_port(), new_prefix()
    guard = Guard("127.0.0.1", int(port), upstream, prefix)
    try:
        guard.start()
    except OSError as e:
        print(f"error: cannot listen on 127.0.0.1:{port}: {e.strerror or e}", file=sys.stderr)
        return 2
    print(f"medrobust ui: open http://127.0.0.1:{port} (the Dagster webserver's own port is private; "
          "docs/security.md)", file=sys.stderr, flush=True)
    dagster_args = [*_without(args, (*HOST_OPTIONS, *PORT_OPTIONS)), "-h", "127.0.0.1", "-p", str(upstream)]
    env = {**os.environ, "DAGSTER_WEBSERVER_PATH_PREFIX": prefix}
    try:
        return run(dagster_command(dagster_args), env=env)
    finally:
        guard.close()


if __name__ == "__main__":
    sys.exit(main())
