"""``make ui`` stops on the first Ctrl-C or SIGTERM within 10 s: the supervisor
(:mod:`medrobust_assets.ui`) forwards the signal to the ``dagster dev`` process group and kills
what is left after its grace period, even a child that ignores both signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.ui import HOST, client, free_port, group_members, log_tail, stop_group, wait_until
from tests.ui.test_dagster_dev import ROOT, STARTUP_TIMEOUT_S, _instance_yaml

STOP_WITHIN_S = 10.0

# A stand-in for dagster dev that ignores SIGINT and SIGTERM and has a grandchild doing the same.
STUBBORN = textwrap.dedent("""
    import signal, subprocess, sys, time
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, signal.SIG_IGN)
    child = subprocess.Popen([sys.executable, "-c",
        "import signal, time\\nfor s in (signal.SIGINT, signal.SIGTERM): signal.signal(s, signal.SIG_IGN)\\n"
        "time.sleep(600)"])
    open(sys.argv[1], "w").write(f"{child.pid}")
    time.sleep(600)
""")


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_the_first_signal_stops_a_group_that_ignores_it(tmp_path: Path, sig: int) -> None:
    ready = tmp_path / "grandchild.pid"
    stub = tmp_path / "stub.py"
    stub.write_text(STUBBORN)
    code = ("import sys\nfrom medrobust_assets.ui import run\n"
            f"sys.exit(run([sys.executable, {str(stub)!r}, {str(ready)!r}], grace_s=1.0))")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    sup = subprocess.Popen([sys.executable, "-c", code], env=env, start_new_session=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not (ready.is_file() and ready.read_text()) and time.monotonic() < deadline:
            assert sup.poll() is None, sup.stdout.read() if sup.stdout else ""
            time.sleep(0.1)
        grandchild = int(ready.read_text())
        stub_pids = [p for p in group_members(_group_of(grandchild)) if p != grandchild]
        os.kill(sup.pid, sig)  # one signal, to the supervisor only (what make or systemd sends)
        try:
            rc = sup.wait(timeout=STOP_WITHIN_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the supervisor did not exit within {STOP_WITHIN_S:.0f} s of one {signal.Signals(sig).name}")
        assert rc == 128 + sig
        assert not _alive(grandchild) and not any(_alive(p) for p in stub_pids)
    finally:
        stop_group(sup)


def _group_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[2])


def test_dagster_dev_returns_its_own_exit_code(tmp_path: Path) -> None:
    from medrobust_assets.ui import run

    assert run([sys.executable, "-c", "import sys; sys.exit(3)"]) == 3


@pytest.mark.slow
def test_make_ui_command_stops_within_10_s_of_sigterm(tmp_path: Path) -> None:
    """The Makefile's command (``python -m medrobust_assets.ui`` + the ``dagster dev`` options) on a
    free loopback port with an instance under ``tmp_path``: once the UI answers, one SIGTERM to the
    supervisor stops it and every process of the dagster dev group within 10 s. Slow: ``dagster
    dev`` takes well over 30 s to load the project's definitions on a small machine."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    _instance_yaml(home)
    port = free_port()
    env = {**os.environ, "DAGSTER_HOME": str(home),
           "MLFLOW_DISABLE_TELEMETRY": "true", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(ROOT)}
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    log = tmp_path / "ui.log"
    cmd = [sys.executable, "-m", "medrobust_assets.ui", "-h", HOST, "-p", str(port), "-w", str(ROOT / "workspace.yaml")]
    with log.open("wb") as out:
        sup = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                               start_new_session=True)
    try:
        with client() as http:
            wait_until(lambda: http.get(f"http://{HOST}:{port}/server_info").status_code == 200,
                       sup, log, 3 * STARTUP_TIMEOUT_S, "/server_info")
        # dagster dev runs in a session of its own: its pid is its process group's id
        dev_groups = {int(d.name) for d in Path("/proc").iterdir() if d.name.isdigit() and _parent(int(d.name)) == sup.pid}
        assert dev_groups and all(_group_of(g) == g for g in dev_groups), "no dagster dev group under the supervisor"
        assert len(group_members(next(iter(dev_groups)))) >= 3  # dagster dev, its webserver and daemon
        t0 = time.monotonic()
        os.kill(sup.pid, signal.SIGTERM)
        try:
            sup.wait(timeout=STOP_WITHIN_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"make ui's command did not stop within {STOP_WITHIN_S:.0f} s of SIGTERM:\n{log_tail(log)}")
        left = [p for g in dev_groups for p in group_members(g)]
        assert left == [], f"processes of the dagster dev group still alive: {left}\n{log_tail(log)}"
        print(f"stopped in {time.monotonic() - t0:.1f} s")
    finally:
        stop_group(sup)


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return -1
