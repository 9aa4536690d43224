"""Fake OpenAI-compatible endpoints for the API tests: a JSON reply writer and a server on
127.0.0.1 (an ephemeral port) running a test's handler class, shut down when the block ends."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def send_json(handler: BaseHTTPRequestHandler, payload: Any, status: int = 200) -> None:
    """Answer the request with ``payload`` as JSON and its exact Content-Length."""
    raw = json.dumps(payload).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(raw)))
    handler.end_headers()
    handler.wfile.write(raw)


@contextmanager
def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """Serve ``handler`` on 127.0.0.1 for the block; yields the base URL ``http://127.0.0.1:<port>/v1``."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    t = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    finally:
        httpd.shutdown()
        httpd.server_close()
        t.join(timeout=5)
