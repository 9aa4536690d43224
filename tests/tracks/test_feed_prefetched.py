"""medrobust_lib.tracks.feed.prefetched: results in task order, at most ``prefetch`` started ahead,
``fresh`` for results that came from a future, pending futures cancelled when the consumer stops."""

from __future__ import annotations

from concurrent.futures import Future

from medrobust_lib.tracks.feed import prefetched


def test_order_bound_fresh_flags_and_cancellation() -> None:
    started: list[int] = []
    futures: dict[int, Future[int]] = {}

    def start(t: int) -> int | Future[int]:
        started.append(t)
        if t % 2:  # odd tasks are "already done"
            return 10 * t
        fut: Future[int] = Future()
        futures[t] = fut
        if t < 6:  # 6 and 8 never finish
            fut.set_result(10 * t)
        return fut

    gen = prefetched(list(range(9)), start, prefetch=3)
    got = [next(gen) for _ in range(5)]
    assert got == [(t, 10 * t, t % 2 == 0) for t in range(5)]
    assert started == list(range(7))  # 5 handed out, 2 more in flight (3 with the one handed out), no more
    gen.close()
    assert futures[6].cancelled() and not futures[4].cancelled()
