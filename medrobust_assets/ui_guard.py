"""The guard in front of the Dagster webserver that ``make ui`` / ``medrobust ui`` start (issue 44,
finding 4).

Binding to 127.0.0.1 stops other machines, not other web sites: any page the user opens can make
the browser send requests to ``http://127.0.0.1:3000``. Dagster's webserver runs GraphQL mutations
sent by GET (``<img src=".../graphql?query=mutation{launchRun(...)}">``) and does not check
``Origin``, so a page could launch runs with config of its choosing. The supervisor
(:mod:`medrobust_assets.ui`) therefore runs ``dagster dev`` on a private port under a secret path
prefix (:func:`new_prefix`, 128 random bits, never printed) and serves the user's port through
:class:`Guard`, which forwards a request only when :func:`decide` lets it through:

- ``Host`` must name the loopback address and the guard's own port (``127.0.0.1:P``,
  ``localhost:P``, ``[::1]:P``): a DNS-rebinding page has its own host name there;
- ``Origin``, when sent, must be that same origin (browsers send it on every cross-origin request,
  on every POST and on WebSocket handshakes);
- ``Sec-Fetch-Site``, when sent, must be ``same-origin`` or ``none``; the one cross-site request let
  through is a top-level page navigation (GET, ``Sec-Fetch-Mode: navigate``) to a UI page, so a link
  to the UI still opens it; never to ``/graphql`` or the ``report_asset_*`` endpoints;
- GraphQL over GET with a query string is refused (the UI itself only POSTs), so a mutation cannot
  ride in a URL;
- POST bodies must be ``application/json`` (a cross-site HTML form cannot send that without a CORS
  preflight, which Dagster does not answer), with a ``Content-Length`` of at most
  :data:`MAX_BODY_BYTES` (no chunked request bodies);
- only GET, HEAD and POST.

Each connection carries one request (``Connection: close`` both ways; WebSocket upgrades are piped
both ways after the checks). Responses get ``X-Frame-Options: DENY``, ``Content-Security-Policy:
frame-ancestors 'none'`` (no clickjacking from a framing page) and ``Cross-Origin-Resource-Policy:
same-origin``; a ``Location`` naming the private port is rewritten to the guard's.

The private port is reachable by pages too, but every route there lives under the secret prefix
(the root only redirects to the UI page, a GET), so a page that does not know the prefix reaches
nothing that acts. Processes of the same user are trusted: they can write the project's files
directly (docs/security.md, "The Dagster UI").

Plain standard library (asyncio in one thread); importing this module starts nothing.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import threading
from collections.abc import Mapping
from dataclasses import dataclass

ALLOWED_METHODS = frozenset({"GET", "HEAD", "POST"})
MAX_HEAD_BYTES = 64 * 1024
"""Largest request or response head (request line + headers) the guard reads."""
MAX_BODY_BYTES = 32 * 1024 * 1024
"""Largest request body forwarded (GraphQL documents and run configs are far smaller)."""
PREFIX_RE = re.compile(r"^/ui-[A-Za-z0-9_-]{22}$")
"""The form of a secret path prefix (:func:`new_prefix`): a stale one (an earlier start's, from a
bookmark) is recognised and replaced by the current one."""
API_PATHS = ("/graphql", "/report_asset_materialization/", "/report_asset_check/",
             "/report_asset_observation/")
"""Webserver routes that act (GraphQL and the REST reporting endpoints), relative to the prefix."""
SAFE_SITES = frozenset({"same-origin", "none"})
SECURITY_HEADERS = (("X-Frame-Options", "DENY"),
                    ("Content-Security-Policy", "frame-ancestors 'none'"),
                    ("Cross-Origin-Resource-Policy", "same-origin"))
_SECURITY_NAMES = frozenset(k.lower() for k, _ in SECURITY_HEADERS)
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-connection", "te", "trailer", "upgrade",
                        "transfer-encoding", "proxy-authorization", "proxy-authenticate"})


def new_prefix() -> str:
    """A fresh secret path prefix, ``/ui-`` + 22 URL-safe characters (128 random bits)."""
    return "/ui-" + secrets.token_urlsafe(16)


@dataclass(frozen=True)
class Refusal:
    """Why a request is not forwarded: an HTTP status and one line for the client."""

    status: int
    reason: str


def _loopback_hosts(port: int) -> frozenset[str]:
    return frozenset({f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}"})


def split_target(target: str, prefix: str) -> tuple[str, str, bool]:
    """``(inner path, query, had_prefix)`` of a request target: the path relative to the secret
    prefix (a stale prefix counts as the prefix), the query string without ``?``."""
    path, _, query = target.partition("?")
    for p in (prefix, _stale_prefix(path)):
        if p and (path == p or path.startswith(p + "/")):
            return path[len(p):] or "/", query, True
    return path or "/", query, False


def _stale_prefix(path: str) -> str:
    first = "/" + path.lstrip("/").split("/", 1)[0]
    return first if PREFIX_RE.match(first) else ""


def _is_api(inner: str) -> bool:
    return inner == "/graphql" or inner.startswith(API_PATHS[1:])


def decide(method: str, target: str, headers: Mapping[str, str], port: int, prefix: str) -> Refusal | None:
    """None when the request may be forwarded, else the :class:`Refusal`. ``headers``: lower-case
    names to values (a repeated Host/Origin/Sec-Fetch-* header is refused before this is called);
    ``port``: the guard's own port; ``prefix``: the webserver's secret path prefix."""
    if method not in ALLOWED_METHODS:
        return Refusal(405, f"method {method} refused by the UI guard (GET, HEAD and POST only)")
    host = headers.get("host", "").lower()
    if host not in _loopback_hosts(port):
        return Refusal(403, f"Host {host!r} refused: the UI answers only to 127.0.0.1:{port} or localhost:{port}")
    origin = headers.get("origin")
    if origin is not None and origin.lower() not in {f"http://{h}" for h in _loopback_hosts(port)}:
        return Refusal(403, f"cross-site request refused (Origin {origin!r})")
    inner, query, _ = split_target(target, prefix)
    api = _is_api(inner)
    site = headers.get("sec-fetch-site")
    if site is not None and site.lower() not in SAFE_SITES:
        navigation = method in ("GET", "HEAD") and headers.get("sec-fetch-mode", "").lower() == "navigate"
        if api or not navigation:
            return Refusal(403, f"cross-site request refused (Sec-Fetch-Site {site!r})")
    if api and method in ("GET", "HEAD") and query:
        return Refusal(405, "GraphQL over GET with a query string is refused: POST application/json")
    if method == "POST":
        ctype = headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if ctype != "application/json":
            return Refusal(415, f"POST with Content-Type {ctype or 'none'!r} refused: application/json only")
    return None


@dataclass
class _Request:
    method: str
    target: str
    version: str
    headers: list[tuple[str, str]]


class _BadRequest(Exception):
    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.reason)
        self.refusal = refusal


def _parse_head(head: bytes) -> tuple[str, list[tuple[str, str]]]:
    try:
        text = head.decode("latin-1")
    except UnicodeDecodeError as e:  # pragma: no cover - latin-1 decodes every byte
        raise _BadRequest(Refusal(400, "undecodable request head")) from e
    lines = text.split("\r\n")
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip() or any(c in name for c in " \t"):
            raise _BadRequest(Refusal(400, "malformed header line"))
        headers.append((name, value.strip()))
    return lines[0], headers


def parse_request(head: bytes) -> _Request:
    """The request line and headers of ``head`` (bytes up to and including the blank line); a
    malformed line or a repeated security-relevant header raises :class:`_BadRequest`."""
    first, headers = _parse_head(head)
    parts = first.split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise _BadRequest(Refusal(400, "malformed request line"))
    req = _Request(parts[0], parts[1], parts[2], headers)
    for name in ("host", "origin", "sec-fetch-site", "sec-fetch-mode", "content-length", "content-type"):
        if sum(1 for k, _ in headers if k.lower() == name) > 1:
            raise _BadRequest(Refusal(400, f"repeated {name} header refused"))
    if not req.target.startswith("/"):
        raise _BadRequest(Refusal(400, "absolute-form request targets are refused"))
    return req


def _response(refusal: Refusal) -> bytes:
    body = (refusal.reason + "\n").encode("utf-8", "replace")
    head = [f"HTTP/1.1 {refusal.status} Refused",
            "Content-Type: text/plain; charset=utf-8", f"Content-Length: {len(body)}", "Connection: close",
            *(f"{k}: {v}" for k, v in SECURITY_HEADERS)]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


def _redirect(location: str) -> bytes:
    head = ["HTTP/1.1 307 Temporary Redirect", f"Location: {location}", "Content-Length: 0", "Connection: close",
            *(f"{k}: {v}" for k, v in SECURITY_HEADERS)]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1")


class Guard:
    """The guard's TCP server on ``host:port`` forwarding to ``127.0.0.1:upstream_port`` under
    ``prefix``, run by an asyncio loop in a daemon thread (:meth:`start`, :meth:`close`)."""

    def __init__(self, host: str, port: int, upstream_port: int, prefix: str) -> None:
        self.host, self.port, self.upstream_port, self.prefix = host, port, upstream_port, prefix
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.refused = 0
        """Requests refused so far (read by tests)."""

    def start(self) -> None:
        """Start listening; returns once the port is bound (raises OSError when it cannot be)."""
        self._thread = threading.Thread(target=self._run, name="medrobust-ui-guard", daemon=True)
        self._thread.start()
        self._started.wait()
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        """Stop listening and drop open connections; returns when the thread has ended."""
        if self._loop is not None and self._stop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(timeout=5.0)

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._serve())
        except BaseException as e:  # bind failures reach start()
            self._error = e
            self._started.set()
        finally:
            loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._handle, self.host, self.port, limit=MAX_HEAD_BYTES,
                                            reuse_address=True)
        self._started.set()
        async with server:
            await self._stop.wait()
            server.close()
            for task in list(self._tasks):  # open connections (a WebSocket, a long poll) end with the guard
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        try:
            await self._forward(reader, writer)
        except _BadRequest as e:
            self.refused += 1
            await _send(writer, _response(e.refusal))
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            pass
        finally:
            writer.close()

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError as e:
            raise _BadRequest(Refusal(431, "request head too large")) from e
        req = parse_request(head)
        lower = {k.lower(): v for k, v in req.headers}
        refusal = decide(req.method, req.target, lower, self.port, self.prefix)
        if refusal is not None:
            raise _BadRequest(refusal)
        inner, query, had_prefix = split_target(req.target, self.prefix)
        target = self.prefix + inner + (f"?{query}" if query else "")
        navigation = lower.get("sec-fetch-mode", "").lower() == "navigate" or (
            "text/html" in lower.get("accept", "") and req.method == "GET")
        if not (had_prefix and req.target.startswith(self.prefix)) and navigation and not _is_api(inner):
            await _send(writer, _redirect(target))  # the UI's own router needs the prefix in the URL
            return
        upgrade = lower.get("upgrade", "").lower() == "websocket"
        body = b""
        if "transfer-encoding" in lower:
            raise _BadRequest(Refusal(411, "chunked request bodies are refused: send Content-Length"))
        length_text = lower.get("content-length", "0")
        if not length_text.isdigit():
            raise _BadRequest(Refusal(400, "bad Content-Length"))
        length = int(length_text)
        if length > MAX_BODY_BYTES:
            raise _BadRequest(Refusal(413, f"request body over {MAX_BODY_BYTES} bytes refused"))
        if length:
            body = await reader.readexactly(length)
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port, limit=MAX_HEAD_BYTES)
        try:
            headers = [(k, v) for k, v in req.headers if upgrade or k.lower() not in HOP_BY_HOP]
            if not upgrade:
                headers.append(("Connection", "close"))
            out = f"{req.method} {target} {req.version}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers)
            up_writer.write(out.encode("latin-1") + b"\r\n" + body)
            await up_writer.drain()
            resp_head = await up_reader.readuntil(b"\r\n\r\n")
            writer.write(self._rewrite_response(resp_head, upgrade))
            await writer.drain()
            if upgrade:
                await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
            else:
                await _pipe(up_reader, writer)
        finally:
            up_writer.close()

    def _rewrite_response(self, head: bytes, upgrade: bool) -> bytes:
        first, headers = _parse_head(head)
        private = f"http://127.0.0.1:{self.upstream_port}"
        out: list[tuple[str, str]] = []
        for k, v in headers:
            name = k.lower()
            if name in _SECURITY_NAMES:
                continue
            if name == "location" and v.startswith(private):
                v = v[len(private):] or "/"
            if name == "connection" and not upgrade:
                continue
            out.append((k, v))
        if not upgrade:
            out.append(("Connection", "close"))
        out.extend(SECURITY_HEADERS)
        return (first + "\r\n" + "".join(f"{k}: {v}\r\n" for k, v in out) + "\r\n").encode("latin-1")


async def _send(writer: asyncio.StreamWriter, data: bytes) -> None:
    try:
        writer.write(data)
        await writer.drain()
    except (ConnectionError, OSError):
        pass


async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    try:
        while chunk := await src.read(65536):
            dst.write(chunk)
            await dst.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        if dst.can_write_eof():
            try:
                dst.write_eof()
            except (ConnectionError, OSError):
                pass
