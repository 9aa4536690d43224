"""The deadline watch of medrobust_lib.models.http_deadline on a socket pair (no HTTP): the
watchdog shuts down a socket whose read would block forever, and a watched operation started
after the deadline raises at once."""

from __future__ import annotations

import socket
import threading

import httpcore
import pytest

from medrobust_lib.models.http_deadline import _WatchedStream, deadline


def test_the_watchdog_wakes_a_read_that_ignores_every_timeout() -> None:
    a, b = socket.socketpair()
    with a, b:
        a.settimeout(None)  # a read that blocks until the peer writes or the socket is shut down
        stream = _WatchedStream(_Raw(a))
        got: list[bytes] = []
        with deadline(0.2) as watch:
            watch.attach(stream)
            reader = threading.Thread(target=lambda: got.append(a.recv(10)), daemon=True)
            reader.start()
            reader.join(timeout=30)
        assert watch.expired
        assert got == [b""]  # shut down: the blocked read returned end-of-stream
        b.settimeout(5)
        assert b.recv(10) == b""  # and the peer sees the connection end


def test_an_operation_after_the_deadline_raises_at_once() -> None:
    a, b = socket.socketpair()
    with a, b:
        stream = _WatchedStream(_Raw(a))
        with deadline(0.05) as watch:
            watch.expire()
            with pytest.raises(httpcore.ReadTimeout):
                stream.read(10, timeout=60)
            with pytest.raises(httpcore.WriteTimeout):
                stream.write(b"x", timeout=60)


class _Raw(httpcore.NetworkStream):
    """The minimum of a network stream over a plain socket."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        self._sock.settimeout(timeout)
        return self._sock.recv(max_bytes)

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._sock.settimeout(timeout)
        self._sock.sendall(buffer)

    def close(self) -> None:
        self._sock.close()

    def get_extra_info(self, info: str) -> object:
        return self._sock if info == "socket" else None
