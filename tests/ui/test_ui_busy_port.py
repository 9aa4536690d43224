"""A second UI on a port that is already taken is refused in one line before anything starts (issue
44, finding 12: it used to start its daemon, find no port for its webserver and leave the daemon
running alone)."""

from __future__ import annotations

import socket

import pytest

from medrobust_assets import ui


def test_a_busy_port_is_refused_before_dagster_starts(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    started: list[list[str]] = []
    monkeypatch.setattr(ui, "run", lambda cmd, *a, **k: started.append(list(cmd)) or 0)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        assert ui.port_taken("127.0.0.1", port)
        code = ui.main(["-h", "127.0.0.1", "-p", str(port), "-w", "workspace.yaml"])
    assert code == 2 and started == []
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"127.0.0.1:{port} is already in use" in err[0]
    assert not ui.port_taken("127.0.0.1", port)  # closed now: a free port starts the UI
    assert ui.main(["-h", "127.0.0.1", "-p", str(port), "-w", "workspace.yaml"]) == 0 and len(started) == 1
