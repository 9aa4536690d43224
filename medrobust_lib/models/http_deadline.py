"""An httpx transport whose requests end at a deadline, from connect through the last body byte.

httpx's timeouts are per phase and per socket operation: a server that sends one header byte
every few seconds never trips a read timeout, so a request can live forever. This module bounds
a request's whole life instead:

* :func:`deadline` opens a *watch* for the calling thread: every socket operation the transport
  makes for that thread (connect, TLS handshake, each read and write) gets its timeout cut to the
  time left, and an operation starting after the deadline raises a timeout at once;
* a watchdog timer fires just after the deadline (:data:`WATCHDOG_GRACE_S`) and shuts down
  (``shutdown(SHUT_RDWR)``) every socket the watched thread is using, so even an operation
  blocked in the kernel returns.

Either way the request raises an ``httpx.TimeoutException``, or, when the watchdog's shutdown is
seen first, ``httpx.TransportError`` or even a clean end of a close-delimited body: a caller
checks :attr:`Watch.expired` after the last byte. The socket is closed: httpcore drops a
connection whose response failed, so nothing of it returns to the pool. Not bounded: the DNS
lookup inside ``connect`` (``getaddrinfo`` ignores socket timeouts).

The transport never reads proxy settings from the environment (the client that mounts it must
pass ``trust_env=False`` too): a request goes straight to its URL's host.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

import httpcore
import httpx
from httpcore._backends.base import SOCKET_OPTION  # the backend interface's own type

_local = threading.local()

WATCHDOG_GRACE_S = 0.25
"""Seconds after the deadline at which the watchdog shuts the request's sockets down."""


class Watch:
    """The deadline of one request on one thread; :attr:`expired` once the watchdog fired.

    ``deadline`` is a :func:`time.monotonic` instant (seconds)."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.expired = False
        self._lock = threading.Lock()
        self._streams: set[_WatchedStream] = set()

    def remaining(self) -> float:
        """Seconds left (negative once passed)."""
        return self.deadline - time.monotonic()

    def cut(self, timeout: float | None, error: type[httpcore.TimeoutException] = httpcore.ReadTimeout) -> float:
        """``timeout`` cut to the time left; raises ``error`` when none is left."""
        left = self.remaining()
        if left <= 0 or self.expired:
            raise error("request deadline passed")
        return left if timeout is None else min(timeout, left)

    def attach(self, stream: _WatchedStream) -> None:
        with self._lock:
            self._streams.add(stream)

    def expire(self) -> None:
        """The watchdog: mark expired and shut down every socket the request uses."""
        with self._lock:
            self.expired = True
            streams = list(self._streams)
        for stream in streams:
            stream.shutdown()


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[Watch]:
    """Bound every socket operation of :class:`DeadlineTransport` on this thread to ``seconds``
    from now (> 0) until the block ends; a watchdog shuts the sockets down when the time is up."""
    watch = Watch(time.monotonic() + seconds)
    previous = getattr(_local, "watch", None)
    _local.watch = watch
    # The cut timeouts end a request at the deadline; the watchdog is the backstop for an
    # operation that does not return by itself, WATCHDOG_GRACE_S later.
    timer = threading.Timer(max(0.0, seconds) + WATCHDOG_GRACE_S, watch.expire)
    timer.daemon = True
    timer.start()
    try:
        yield watch
    finally:
        timer.cancel()
        _local.watch = previous


def _current() -> Watch | None:
    return getattr(_local, "watch", None)


class _WatchedStream(httpcore.NetworkStream):
    """A socket stream whose operations obey the calling thread's :class:`Watch`."""

    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def _watch(self, timeout: float | None,
               error: type[httpcore.TimeoutException] = httpcore.ReadTimeout) -> float | None:
        watch = _current()
        if watch is None:
            return timeout
        watch.attach(self)
        return watch.cut(timeout, error)

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, self._watch(timeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, self._watch(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:
        return _WatchedStream(self._inner.start_tls(ssl_context, server_hostname, self._watch(timeout)))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)

    def shutdown(self) -> None:
        """Shut the connection down in both directions (wakes a read blocked in the kernel).
        Calls the plain socket's ``shutdown`` (on a TLS socket too, leaving its TLS state alone);
        a socket already closed has no descriptor any more and is skipped."""
        sock = self._inner.get_extra_info("socket")
        if isinstance(sock, socket.socket):
            with contextlib.suppress(OSError):
                socket.socket.shutdown(sock, socket.SHUT_RDWR)


class _WatchedBackend(httpcore.NetworkBackend):
    def __init__(self) -> None:
        self._inner = httpcore.SyncBackend()

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options: Iterable[SOCKET_OPTION] | None = None) -> httpcore.NetworkStream:
        watch = _current()
        if watch is not None:
            timeout = watch.cut(timeout, httpcore.ConnectTimeout)
        stream = _WatchedStream(self._inner.connect_tcp(host, port, timeout, local_address, socket_options))
        if watch is not None:
            watch.attach(stream)
            if watch.expired:  # the watchdog fired while connecting
                stream.close()
                raise httpcore.ConnectTimeout("request deadline passed while connecting")
        return stream

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Iterable[SOCKET_OPTION] | None = None) -> httpcore.NetworkStream:
        raise httpcore.ConnectError("unix sockets are not used by this transport")

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


class DeadlineTransport(httpx.HTTPTransport):
    """``httpx.HTTPTransport`` (HTTP/1.1, certificate checks on, no proxy) whose socket I/O obeys
    :func:`deadline`. ``limits`` as for httpx."""

    def __init__(self, limits: httpx.Limits) -> None:
        super().__init__(limits=limits, trust_env=False)
        # Same pool httpx builds for a proxy-less transport, with the watched network backend.
        self._pool = httpcore.ConnectionPool(
            ssl_context=httpx.create_ssl_context(),
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            http1=True,
            http2=False,
            network_backend=_WatchedBackend(),
        )
