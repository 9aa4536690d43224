"""The UI guard (issue 44, finding 4): what a web page can make a browser send to the Dagster UI on
127.0.0.1 is refused before it reaches the webserver; what the UI itself sends passes, under the
webserver's secret path prefix. Exercised against a recording HTTP server on 127.0.0.1."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import dagster as dg
import httpx
import pytest

from medrobust_assets import resources, ui_guard
from medrobust_assets.ui_guard import Guard, decide, new_prefix, split_target
from tests.ui import HOST, free_port

PORT = 3000
PREFIX = "/ui-" + "A" * 22
OK_HEADERS = {"host": f"127.0.0.1:{PORT}"}
MUTATION = "/graphql?query=mutation%7BlaunchRun(executionParams:%7B%7D)%7B__typename%7D%7D"


@pytest.mark.parametrize(("method", "target", "headers", "status"), [
    ("GET", MUTATION, {}, 405),  # the finding: a mutation in a URL (an <img> tag)
    ("GET", MUTATION, {"sec-fetch-site": "cross-site", "sec-fetch-mode": "no-cors"}, 403),
    ("GET", MUTATION, {"sec-fetch-site": "cross-site", "sec-fetch-mode": "navigate"}, 403),
    ("GET", PREFIX + MUTATION, {}, 405),
    ("POST", "/graphql", {"content-type": "application/json", "origin": "https://evil.example"}, 403),
    ("POST", "/graphql", {"content-type": "application/json", "origin": "null"}, 403),
    ("POST", "/graphql", {"content-type": "text/plain"}, 415),  # a cross-site form's body
    ("POST", "/graphql", {"content-type": "application/x-www-form-urlencoded"}, 415),
    ("POST", "/graphql", {"content-type": "application/json", "sec-fetch-site": "same-site"}, 403),
    ("POST", "/report_asset_materialization/x", {"content-type": "application/json",
                                                  "origin": "http://127.0.0.1:3001"}, 403),
    ("PUT", "/graphql", {"content-type": "application/json"}, 405),
    ("DELETE", "/", {}, 405),
])
def test_what_a_foreign_page_can_send_is_refused(method: str, target: str, headers: dict[str, str],
                                                 status: int) -> None:
    refusal = decide(method, target, {**OK_HEADERS, **headers}, PORT, PREFIX)
    assert refusal is not None and refusal.status == status, refusal


@pytest.mark.parametrize("host", ["evil.example:3000", "127.0.0.1:3001", "127.0.0.1", "", "10.0.0.5:3000"])
def test_a_rebinding_host_is_refused(host: str) -> None:
    refusal = decide("POST", "/graphql", {"host": host, "content-type": "application/json"}, PORT, PREFIX)
    assert refusal is not None and refusal.status == 403 and "Host" in refusal.reason


@pytest.mark.parametrize(("method", "target", "headers"), [
    ("POST", "/graphql", {"content-type": "application/json"}),  # scripts, tests: no Origin
    ("POST", "/graphql", {"content-type": "application/json; charset=utf-8", "origin": "http://127.0.0.1:3000",
                          "sec-fetch-site": "same-origin"}),  # the UI itself
    ("POST", PREFIX + "/graphql", {"content-type": "application/json", "origin": "http://localhost:3000"}),
    ("GET", "/graphql", {"upgrade": "websocket", "origin": "http://127.0.0.1:3000"}),  # subscriptions
    ("GET", PREFIX + "/assets/x?partition=ct", {"sec-fetch-site": "same-origin"}),
    ("GET", "/runs", {"sec-fetch-site": "cross-site", "sec-fetch-mode": "navigate"}),  # a link to the UI
    ("GET", "/server_info", {"sec-fetch-site": "none"}),
    ("HEAD", "/", {}),
])
def test_what_the_ui_sends_passes(method: str, target: str, headers: dict[str, str]) -> None:
    assert decide(method, target, {**OK_HEADERS, **headers}, PORT, PREFIX) is None


def test_split_target_recognises_the_prefix_and_a_stale_one() -> None:
    stale = "/ui-" + "b" * 22
    assert split_target(PREFIX + "/graphql?x=1", PREFIX) == ("/graphql", "x=1", True)
    assert split_target(stale + "/assets/a", PREFIX) == ("/assets/a", "", True)
    assert split_target("/graphql", PREFIX) == ("/graphql", "", False)
    assert split_target(PREFIX, PREFIX) == ("/", "", True)
    assert split_target("/ui-short/graphql", PREFIX) == ("/ui-short/graphql", "", False)
    p = new_prefix()
    assert ui_guard.PREFIX_RE.match(p) and p != new_prefix()


class _Recorder(BaseHTTPRequestHandler):
    seen: list[tuple[str, str, dict[str, str], bytes]] = []

    def _record(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.seen.append((self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body))
        if self.path.endswith("/moved"):
            self.send_response(307)
            self.send_header("Location", f"http://127.0.0.1:{self.server.server_port}{PREFIX}/elsewhere")  # type: ignore[attr-defined]
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        payload = b'{"data":{"ok":true}}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    do_GET = do_POST = do_HEAD = _record

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def guarded() -> Iterator[tuple[Guard, list[tuple[str, str, dict[str, str], bytes]]]]:
    seen: list[tuple[str, str, dict[str, str], bytes]] = []
    handler = type("Rec", (_Recorder,), {"seen": seen})
    upstream = ThreadingHTTPServer((HOST, 0), handler)
    thread = threading.Thread(target=upstream.serve_forever, daemon=True)
    thread.start()
    guard = Guard(HOST, free_port(), upstream.server_address[1], PREFIX)
    guard.start()
    try:
        yield guard, seen
    finally:
        guard.close()
        upstream.shutdown()
        upstream.server_close()


def test_the_guard_forwards_under_the_prefix_and_stops_a_get_mutation(
        guarded: tuple[Guard, list[tuple[str, str, dict[str, str], bytes]]]) -> None:
    guard, seen = guarded
    base = f"http://{HOST}:{guard.port}"
    with httpx.Client(timeout=10.0) as http:
        r = http.post(f"{base}/graphql", json={"query": "{ __typename }"})
        assert r.status_code == 200 and r.json() == {"data": {"ok": True}}
        assert r.headers["x-frame-options"] == "DENY"
        assert "frame-ancestors 'none'" in r.headers["content-security-policy"]
        assert r.headers["cross-origin-resource-policy"] == "same-origin"
        method, path, headers, body = seen[-1]
        assert (method, path, body) == ("POST", PREFIX + "/graphql", b'{"query":"{ __typename }"}')
        assert headers["connection"] == "close"

        n = len(seen)
        r = http.get(base + MUTATION)
        assert r.status_code == 405 and "POST application/json" in r.text
        r = http.post(f"{base}/graphql", content=b"query=mutation", headers={
            "content-type": "application/x-www-form-urlencoded", "origin": "https://evil.example"})
        assert r.status_code == 403
        r = http.post(f"{base}/graphql", json={"query": "{ x }"}, headers={"host": "evil.example:80"})
        assert r.status_code == 403
        assert len(seen) == n and guard.refused == 3  # nothing refused reached the webserver

        # a page navigation without the prefix is redirected to it (the UI's router needs it)
        r = http.get(f"{base}/assets?x=1", headers={"sec-fetch-mode": "navigate", "sec-fetch-site": "none"})
        assert r.status_code == 307 and r.headers["location"] == PREFIX + "/assets?x=1"
        stale = "/ui-" + "z" * 22
        r = http.get(f"{base}{stale}/runs", headers={"accept": "text/html"})
        assert r.status_code == 307 and r.headers["location"] == PREFIX + "/runs"
        # the webserver's own redirects never name its private port
        r = http.get(f"{base}{PREFIX}/moved")
        assert r.status_code == 307 and r.headers["location"] == PREFIX + "/elsewhere"


def test_a_chunked_or_oversized_body_and_a_huge_head_are_refused(
        guarded: tuple[Guard, list[tuple[str, str, dict[str, str], bytes]]]) -> None:
    guard, seen = guarded

    def raw(data: bytes) -> bytes:
        with socket.create_connection((HOST, guard.port), timeout=10) as s:
            s.sendall(data)
            out = b""
            while chunk := s.recv(65536):
                out += chunk
            return out

    host = f"Host: 127.0.0.1:{guard.port}\r\n".encode()
    json_ct = b"Content-Type: application/json\r\n"
    assert raw(b"POST /graphql HTTP/1.1\r\n" + host + json_ct + b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
               ).startswith(b"HTTP/1.1 411")
    big = str(ui_guard.MAX_BODY_BYTES + 1).encode()
    assert raw(b"POST /graphql HTTP/1.1\r\n" + host + json_ct + b"Content-Length: " + big + b"\r\n\r\n"
               ).startswith(b"HTTP/1.1 413")
    assert raw(b"GET / HTTP/1.1\r\n" + host + b"X: " + b"a" * (ui_guard.MAX_HEAD_BYTES + 10) + b"\r\n\r\n"
               ).startswith(b"HTTP/1.1 431")
    assert raw(b"GET / HTTP/1.1\r\n" + host + host + b"\r\n").startswith(b"HTTP/1.1 400")  # two Hosts
    assert raw(b"GET http://evil.example/graphql HTTP/1.1\r\n" + host + b"\r\n").startswith(b"HTTP/1.1 400")
    assert seen == []


def test_a_websocket_upgrade_is_piped_both_ways_only_from_the_ui_origin() -> None:
    """A fake upstream that answers 101 and echoes bytes: the guard pipes it after the checks."""
    listener = socket.socket()
    listener.bind((HOST, 0))
    listener.listen(1)

    def echo() -> None:
        conn, _ = listener.accept()
        with conn:
            head = b""
            while b"\r\n\r\n" not in head:
                head += conn.recv(4096)
            assert head.startswith(f"GET {PREFIX}/graphql HTTP/1.1".encode())
            conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
            while data := conn.recv(4096):
                conn.sendall(data.upper())

    thread = threading.Thread(target=echo, daemon=True)
    thread.start()
    guard = Guard(HOST, free_port(), listener.getsockname()[1], PREFIX)
    guard.start()
    try:
        req = (f"GET /graphql HTTP/1.1\r\nHost: 127.0.0.1:{guard.port}\r\nUpgrade: websocket\r\n"
               "Connection: Upgrade\r\nSec-WebSocket-Key: x\r\nSec-WebSocket-Version: 13\r\n")
        with socket.create_connection((HOST, guard.port), timeout=10) as s:  # another site's page
            s.sendall((req + "Origin: https://evil.example\r\n\r\n").encode())
            assert s.recv(4096).startswith(b"HTTP/1.1 403")
        with socket.create_connection((HOST, guard.port), timeout=10) as s:
            s.sendall((req + f"Origin: http://127.0.0.1:{guard.port}\r\n\r\n").encode())
            head = b""
            while b"\r\n\r\n" not in head:
                head += s.recv(4096)
            assert head.startswith(b"HTTP/1.1 101") and b"Connection: Upgrade" in head
            s.sendall(b"frame")
            assert s.recv(4096) == b"FRAME"
    finally:
        guard.close()
        listener.close()


def test_the_ui_refuses_a_non_loopback_host(capsys: pytest.CaptureFixture[str]) -> None:
    from medrobust_assets import ui

    assert ui.main(["-h", "0.0.0.0", "-p", str(free_port())]) == 2
    assert "loopback only" in capsys.readouterr().err


def test_the_ui_runs_dagster_on_a_private_port_under_a_secret_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    from medrobust_assets import ui

    calls: list[tuple[list[str], dict[str, str]]] = []

    def fake_run(cmd: list[str], grace_s: float = 0.0, env: dict[str, str] | None = None) -> int:
        calls.append((list(cmd), dict(env or {})))
        return 0

    monkeypatch.setattr(ui, "run", fake_run)
    port = free_port()
    assert ui.main(["-h", "127.0.0.1", "-p", str(port), "-w", "workspace.yaml"]) == 0
    [(cmd, env)] = calls
    private = int(cmd[cmd.index("-p") + 1])
    assert private != port and cmd.count("-p") == 1 and cmd[cmd.index("-h") + 1] == "127.0.0.1"
    assert ui_guard.PREFIX_RE.match(env["DAGSTER_WEBSERVER_PATH_PREFIX"])
    assert not ui.port_taken("127.0.0.1", port)  # the guard stopped with the UI


# -- resource config from a launch is pinned ------------------------------------------------------

def test_launch_config_cannot_move_the_suite_or_the_mlflow_store(tmp_path: Path) -> None:
    suite = tmp_path / "suite.yaml"
    suite.write_text("name: pinned\n")
    other = tmp_path / "other.yaml"
    other.write_text("name: other\n")
    resources.pin_location(suite, tmp_path / "mlruns")
    try:
        job_resources = {"suite": resources.SuiteResource(suite_path=str(suite))}
        evil = {"resources": {"suite": {"config": {"suite_path": str(other)}}}}
        with pytest.raises(ValueError, match="pins it to"):
            resources.SuiteResource(suite_path=str(other)).load()
        with pytest.raises(ValueError, match="pins it to"):
            with resources.TrackingResource(mlruns_dir=str(tmp_path / "elsewhere")).run(
                    None, None, "x"):  # type: ignore[arg-type]
                pass
        # through Dagster: the launch's resource config reaches the resource and is refused there
        @dg.asset
        def loads(suite: resources.SuiteResource) -> None:
            suite.load()

        result = dg.materialize([loads], resources=job_resources, run_config=evil, raise_on_error=False)
        assert not result.success
        failure = next(e for e in result.all_events if e.is_step_failure)
        assert "pins it to" in str(failure.step_failure_data.error)
    finally:
        resources.unpin()


def test_the_code_location_modules_pin() -> None:
    from medrobust_assets.location_files import location_source

    assert "definitions_for_file(SUITE, pin=True)" in location_source(Path("/x/s.yaml"))
    text = (Path(__file__).resolve().parents[2] / "medrobust_assets" / "location.py").read_text()
    assert "pin=True" in text
