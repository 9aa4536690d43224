"""Fake OpenAI-compatible endpoints for the API tests and ``bench/api_bench.py``: a base handler
(HTTP/1.1 keep-alive, no request log), the request's JSON body and prompt, a chat-completion reply,
JSON / raw reply writers, and a server on 127.0.0.1 (an ephemeral port) running a handler class,
shut down when the block ends. Each test keeps only its own answering rules."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class FakeEndpoint(BaseHTTPRequestHandler):
    """Base of a fake chat-completions handler: keep-alive HTTP/1.1 (as real servers and the
    adapter's client use it) and no request log on stderr. Subclasses write ``do_POST``."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass


def read_json(handler: BaseHTTPRequestHandler) -> Any:
    """The request's body (``Content-Length`` bytes) parsed as JSON."""
    return json.loads(handler.rfile.read(int(handler.headers.get("Content-Length", "0"))))


def prompt_of(body: Mapping[str, Any]) -> str:
    """The text of a chat request's last message: its string content, or the first text part of a
    multi-part (image + text) content."""
    content = body["messages"][-1]["content"]
    if isinstance(content, str):
        return content
    return str(next(p["text"] for p in content if p.get("type") == "text"))


def completion(text: str | None, *, logprobs: Mapping[str, Any] | None = None,
               finish_reason: str = "stop") -> dict[str, Any]:
    """A ``chat.completion`` body with one assistant choice answering ``text`` (and its
    ``logprobs`` when given)."""
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish_reason,
                              "message": {"role": "assistant", "content": text}}
    if logprobs is not None:
        choice["logprobs"] = dict(logprobs)
    return {"id": "fake", "object": "chat.completion", "choices": [choice]}


def send_bytes(handler: BaseHTTPRequestHandler, raw: bytes, status: int = 200,
               headers: Mapping[str, str] | None = None) -> None:
    """Answer the request with ``raw`` as an ``application/json`` body with its exact Content-Length
    (and ``headers``). A client that already gave up (a timeout test) is not an error of the fake."""
    try:
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(raw)))
        for k, v in (headers or {}).items():
            handler.send_header(k, v)
        handler.end_headers()
        handler.wfile.write(raw)
    except (BrokenPipeError, ConnectionResetError):
        pass


def send_json(handler: BaseHTTPRequestHandler, payload: Any, status: int = 200,
              headers: Mapping[str, str] | None = None) -> None:
    """Answer the request with ``payload`` as JSON (:func:`send_bytes`)."""
    send_bytes(handler, json.dumps(payload).encode(), status, headers)


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
