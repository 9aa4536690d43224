"""The progress reporter (medrobust_lib/progress.py): counts, share, time left; silent for short
loops; rate-limited lines into a file, one live line on a TTY; the batched iterator."""

from __future__ import annotations

from medrobust_lib.progress import ProgressLine, counted, duration, fan_out, finish, progress_text


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_text_has_count_share_and_time_left() -> None:
    assert progress_text(25, 100, "perturbed images", 30.0, "m/perturbed_predictions[ct|2]") == (
        "[m/perturbed_predictions[ct|2]] perturbed images 25/100 (25 %), 30 s elapsed, ~1m30s left")
    assert progress_text(0, 10, "x", 1.0).endswith("~? left")
    assert progress_text(10, 10, "x", 125.0) == "x 10/10 (100 %), done in 2m05s"
    assert duration(3725) == "1h02m"


def test_a_short_loop_prints_nothing() -> None:
    lines: list[str] = []
    clock = Clock()
    sink = ProgressLine(lines.append, quiet_s=5.0, interval_s=15.0, clock=clock)
    for i in range(10):
        clock.t = i * 0.4
        sink(i, 10, "images")
    sink(10, 10, "images")
    assert lines == []


def test_into_a_file_at_most_one_line_per_interval_and_a_closing_line() -> None:
    lines: list[str] = []
    clock = Clock()
    sink = ProgressLine(lines.append, label="a[ct]", quiet_s=5.0, interval_s=15.0, clock=clock)
    for i in range(600):  # one image per 0.1 s for a minute
        clock.t = i * 0.1
        sink(i, 600, "images")
    clock.t = 60.0
    sink(600, 600, "images")
    # after 5 s, then every 15 s: 5, 20, 35, 50 (+ the closing line)
    assert len(lines) == 5, lines
    assert lines[0] == "[a[ct]] images 50/600 (8 %), 5 s elapsed, ~55 s left"
    assert lines[-1] == "[a[ct]] images 600/600 (100 %), done in 1m00s"
    assert sink.lines == 5


def test_live_line_is_rewritten_in_place_and_ended() -> None:
    out: list[str] = []
    clock = Clock()
    sink = ProgressLine(out.append, quiet_s=0.0, interval_s=0.5, live=True, clock=clock)
    for i in range(5):
        clock.t = float(i)
        sink(i, 5, "images")
    sink(5, 5, "images")
    assert all(o.startswith("\r") and o.endswith("\x1b[K") for o in out[:-1]) and out[-1] == "\n"
    assert "\n" not in "".join(out[:-1])


def test_counted_reports_per_batch_and_finish_closes() -> None:
    calls: list[tuple[int, int, str]] = []
    items = list(counted(range(10), lambda d, t, w: calls.append((d, t, w)), 10, "images", every=4))
    finish(lambda d, t, w: calls.append((d, t, w)), 10, "images")
    assert items == list(range(10))
    assert [c[0] for c in calls] == [0, 4, 8, 10] and {c[1] for c in calls} == {10}
    assert list(counted(iter([1, 2]), None, 2, "x")) == [1, 2]
    both: list[int] = []
    fan_out(lambda d, t, w: both.append(d), None, lambda d, t, w: both.append(-d))(3, 4, "x")
    assert both == [3, -3]
