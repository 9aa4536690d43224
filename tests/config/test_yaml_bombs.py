"""Issue 44, finding 6: suite YAML with an alias bomb or a duplicate key is refused in one line.

Before, nine levels of ``*a`` aliases hung every reader (six levels: 42 s, 284 MB), and since every
``configs/*.yaml`` is read for the isolation check, one such file blocked every ``run``; a second
``datasets:`` silently replaced the first."""

from __future__ import annotations

import multiprocessing as mp
import time
from pathlib import Path

import pytest
import yaml

from medrobust_lib.config.suite import load_suite, read_suite_file


def _bomb(levels: int = 9) -> str:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels + 1):
        refs = ", ".join([f"*a{i - 1}"] * 9)
        lines.append(f"a{i}: &a{i} [{refs}]")
    return "name: bomb\n" + "\n".join(lines) + "\n"


def _small_bomb(levels: int = 6, width: int = 4) -> str:
    """Few aliases (levels x width), huge expansion: caught by the size bound, not the count."""
    lines = ["a0: &a0 [1, 2, 3, 4]"]
    for i in range(1, levels + 1):
        lines.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]")
    return "name: bomb\n" + "\n".join(lines) + "\n"


def _read_in_child(path: str, out: mp.Queue) -> None:  # type: ignore[type-arg]
    try:
        read_suite_file(Path(path))
        out.put("read")
    except ValueError as exc:
        out.put(f"ValueError: {exc}")


def _claims_in_child(root: str, out: mp.Queue) -> None:  # type: ignore[type-arg]
    from medrobust_lib.config.isolation import known_claims

    out.put(f"claims: {len(known_claims(Path(root)))}")


def _bounded(target: object, arg: Path, bound_s: float) -> tuple[str | None, float]:
    """``target(arg, queue)`` in a child process, killed after ``bound_s`` (the old reader never ends)."""
    ctx = mp.get_context("fork")
    q: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    t0 = time.monotonic()
    proc = ctx.Process(target=target, args=(str(arg), q), daemon=True)  # type: ignore[arg-type]
    proc.start()
    proc.join(bound_s)
    took = time.monotonic() - t0
    if proc.is_alive():
        proc.kill()
        proc.join(5)
        return None, took
    return (q.get(timeout=5) if not q.empty() else None), took


@pytest.mark.parametrize("text", [_bomb(9), _small_bomb(9, 4)], ids=["nine_levels", "few_aliases_deep"])
def test_an_alias_bomb_is_refused_within_a_second(tmp_path: Path, text: str) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(text)
    got, took = _bounded(_read_in_child, path, 10.0)
    assert got is not None, f"the reader still ran after {took:.1f} s"
    assert took < 3.0, took  # ~1 s is the requirement; the child's start-up is included
    assert got.startswith("ValueError:") and str(path) in got and "alias" in got and "\n" not in got, got


def test_a_bomb_among_the_project_configs_does_not_block_other_suites(tmp_path: Path) -> None:
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "bomb.yaml").write_text(_bomb(9))
    got, took = _bounded(_claims_in_child, tmp_path, 10.0)
    assert got == "claims: 0", f"{got} after {took:.1f} s"  # the bomb is skipped as broken, quickly
    assert took < 3.0, took


@pytest.mark.parametrize("text,key,line", [
    ("name: dup\ndatasets: [a]\nseed: 1\ndatasets: [b]\n", "datasets", 4),
    ("name: dup\nvlm:\n  split: all\n  models: []\n  split: test\n", "split", 5),
    ("name: dup\nitems:\n  - {id: x, id: y}\n", "id", 3),
], ids=["top_level", "nested", "flow_mapping"])
def test_a_key_given_twice_is_refused_naming_the_file_and_line(tmp_path: Path, text: str, key: str,
                                                               line: int) -> None:
    path = tmp_path / "dup.yaml"
    path.write_text(text)
    with pytest.raises(ValueError) as err:
        read_suite_file(path)
    msg = str(err.value)
    assert str(path) in msg and f"line {line}" in msg and repr(key) in msg and "\n" not in msg, msg


def test_anchors_used_a_few_times_still_work(tmp_path: Path) -> None:
    path = tmp_path / "anchors.yaml"
    path.write_text("name: anchors\nbase: &base {a: 1, b: [1, 2]}\none: *base\ntwo:\n  <<: *base\n  b: [3]\n")
    data = read_suite_file(path)
    assert data["one"] == {"a": 1, "b": [1, 2]} and data["two"] == {"a": 1, "b": [3]}


def test_every_shipped_config_still_reads_the_same() -> None:
    root = Path(__file__).resolve().parents[2]
    files = sorted((root / "configs").glob("*.yaml"))
    assert files
    for f in files:
        from medrobust_lib.config.suite import _read_yaml

        assert _read_yaml(f) == (yaml.safe_load(f.read_text()) or {}), f


def test_the_overlay_probe_of_validate_refuses_a_bomb_quickly(tmp_path: Path) -> None:
    from medrobust_lib.tracks.validate import _overlay_base

    path = tmp_path / "overlay.yaml"
    path.write_text(_bomb(9).replace("name: bomb\n", ""))
    t0 = time.monotonic()
    assert _overlay_base(path) is None
    assert time.monotonic() - t0 < 2.0


def test_load_suite_reports_a_duplicate_key(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("name: s\nseed: 1\nseed: 2\n")
    with pytest.raises(ValueError, match=r"line 3: key 'seed' is given twice"):
        load_suite(path)
