"""A recording :data:`medrobust_lib.progress.Progress` callback and the check every partition's
progress must pass (the VLM and taxonomy progress tests)."""

from __future__ import annotations


class Recorder:
    """Records every ``(done, total, what)`` call."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int, str]] = []

    def __call__(self, done: int, total: int, what: str) -> None:
        self.calls.append((done, total, what))


def check_progress(calls: list[tuple[int, int, str]], total: int, what: str) -> None:
    """One unit ``what`` and one ``total`` throughout; ``done`` starts at 0, never falls, ends at
    ``total`` and reaches it only at the end."""
    assert calls and {w for _, _, w in calls} == {what} and {t for _, t, _ in calls} == {total}
    dones = [d for d, _, _ in calls]
    assert dones == sorted(dones) and dones[0] == 0 and dones[-1] == total
    assert all(d < total for d in dones[:-1])
