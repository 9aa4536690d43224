"""API adapter benchmark. Run from the repository root: .venv/bin/python -m bench.api_bench [--n 200] [--delay-ms 20]

Starts a local OpenAI-compatible stub (127.0.0.1, port 0; the tests' fake endpoint,
:mod:`tests.http_fakes`) that answers every chat completion after
``--delay-ms`` (a stand-in for model latency), then prints requests/s of ``ApiVLM.generate`` at
concurrency 1 and 8 (64x64 RGB images, so PNG encoding is included), and the number of HTTP calls
the server saw during a second identical run with the response cache on (expected: 0).
No network beyond loopback.
"""

from __future__ import annotations

import argparse
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from medrobust_lib.config.vlm import ApiSettings
from medrobust_lib.models.api_vlm import ApiVLM
from medrobust_lib.seeding import rng_for
from tests.http_fakes import FakeEndpoint, completion, prompt_of, read_json, send_json, serving


class _Counter:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.hits = 0


@contextmanager
def stub_server(delay_s: float = 0.02) -> Iterator[tuple[str, _Counter]]:
    """A local chat-completions stub; yields (base_url, hit counter) and stops it on exit."""
    counter = _Counter()

    class Handler(FakeEndpoint):
        def setup(self) -> None:
            super().setup()
            # http.server writes headers and body separately; without NODELAY, Nagle plus delayed
            # ACK adds ~40 ms per keep-alive response (real servers such as uvicorn set it too)
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def do_POST(self) -> None:  # noqa: N802 - stdlib name
            body = read_json(self)
            with counter.lock:
                counter.hits += 1
            time.sleep(delay_s)
            send_json(self, completion(f"answer:{prompt_of(body)}"))

    with serving(Handler) as url:
        yield url, counter


def _inputs(n: int) -> tuple[list[np.ndarray | None], list[str]]:
    images: list[np.ndarray | None] = [rng_for("api_bench", i).random((64, 64, 3), dtype=np.float32)
                                       for i in range(n)]
    return images, [f"q{i}" for i in range(n)]


def bench_requests_per_second(server_url: str, n: int, concurrency: int,
                              cache_path: str | None = None) -> float:
    """Requests per second of one ``ApiVLM.generate`` over ``n`` image+prompt inputs against
    ``server_url`` (an OpenAI-compatible base URL; no API key sent). Raises ``RuntimeError`` if
    any request did not succeed."""
    images, prompts = _inputs(n)
    cfg = ApiSettings(model="bench", base_url=server_url, api_key_env=None, concurrency=concurrency,
                       timeout_s=30.0, max_retries=0, cache_path=cache_path)
    with ApiVLM(cfg) as vlm:
        t0 = time.perf_counter()
        res = vlm.generate(images, prompts)
        dt = time.perf_counter() - t0
    bad = [r.outcome for r in res if not r.ok]
    if bad:
        raise RuntimeError(f"{len(bad)} of {n} requests failed: {sorted(set(bad))}")
    return n / dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--delay-ms", type=float, default=20.0)
    args = ap.parse_args()
    with stub_server(args.delay_ms / 1000) as (url, counter):
        print(f"stub server delay {args.delay_ms:.0f} ms, n={args.n}")
        for c in (1, 8):
            rps = bench_requests_per_second(url, args.n, c)
            print(f"concurrency {c:2d}: {rps:8.1f} requests/s")
        with tempfile.TemporaryDirectory() as tmp:
            db = str(Path(tmp) / "cache.sqlite")
            before = counter.hits
            rps1 = bench_requests_per_second(url, args.n, 8, cache_path=db)
            first = counter.hits - before
            before = counter.hits
            rps2 = bench_requests_per_second(url, args.n, 8, cache_path=db)
            second = counter.hits - before
        print(f"cached, first run : {first:4d} HTTP calls ({rps1:8.1f} requests/s)")
        print(f"cached, second run: {second:4d} HTTP calls ({rps2:8.1f} requests/s)")


if __name__ == "__main__":
    main()
