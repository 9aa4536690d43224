"""Faults around the API adapter never lose a paid answer: corrupt cache file, failed cache read
and write (disk full), plus the transport limits (clear-text key, overall deadline, body cap)."""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from medrobust_lib.config.vlm import ApiSettings, is_loopback
from medrobust_lib.models.api_vlm import ApiVLM
from medrobust_lib.models.cache import JOURNAL_MODE_ENV, ResponseCache, cache_key
from tests.http_fakes import completion, prompt_of, read_json, send_bytes, send_json, serving

ENV = "MEDROBUST_TEST_FAULT_KEY"


class _Handler(BaseHTTPRequestHandler):
    hits = 0

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass

    def do_POST(self) -> None:  # noqa: N802 - stdlib name
        prompt = prompt_of(read_json(self))
        type(self).hits += 1
        if prompt.startswith("big"):
            send_json(self, completion("x" * 200_000))
        elif prompt.startswith("drip"):  # headers at once, then the body a byte at a time, slowly
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            for b in json.dumps({"choices": [{"message": {"content": "late"}}]}).encode():
                self.wfile.write(bytes([b]))
                self.wfile.flush()
                time.sleep(0.05)
        elif prompt.startswith("e500"):
            send_bytes(self, b"", 500)
        else:
            send_json(self, completion(f"answer:{prompt}"))


@pytest.fixture()
def url() -> Iterator[str]:
    _Handler.hits = 0
    with serving(_Handler) as base:
        yield base


def _vlm(url: str, **kw: Any) -> ApiVLM:
    cfg = ApiSettings(**{"model": "m", "base_url": url, "api_key_env": None, "timeout_s": 5.0,
                          "max_retries": 0, **kw})
    return ApiVLM(cfg, sleep=lambda s: None)


def _img() -> np.ndarray:
    return np.random.default_rng(0).random((8, 8)).astype(np.float32)


def test_a_corrupt_cache_file_is_moved_aside_and_the_run_goes_on(
        url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    db = tmp_path / "cache" / "m.sqlite"
    db.parent.mkdir()
    db.write_bytes(b"SQLite format 3\x00" + b"\xde\xad\xbe\xef" * 1000)  # a header and garbage pages
    with caplog.at_level(logging.WARNING), _vlm(url, cache_path=str(db)) as vlm:
        res = vlm.generate([_img(), None], ["q1", "q2"])
    assert [r.outcome for r in res] == ["ok", "ok"] and [r.text for r in res] == ["answer:q1", "answer:q2"]
    aside = sorted(db.parent.glob("m.sqlite.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_bytes().endswith(b"\xde\xad\xbe\xef")  # kept for inspection
    assert "corrupt" in caplog.text and "moved aside" in caplog.text
    assert len(ResponseCache(db)) == 2  # the fresh cache holds the new answers
    with _vlm(url, cache_path=str(db)) as vlm:
        again = vlm.generate([_img(), None], ["q1", "q2"])
    assert all(r.cache_hit for r in again) and vlm.http_calls == 0


def test_a_database_failing_quick_check_is_moved_aside(tmp_path: Path) -> None:
    db = tmp_path / "c.sqlite"
    c = ResponseCache(db)
    for i in range(200):
        c.put(f"k{i}", {"v": "y" * 500})
    c.close()
    raw = bytearray(db.read_bytes())
    page = 4096
    raw[2 * page + 100: 2 * page + 400] = b"\xff" * 300  # smash a b-tree page, keep the header
    db.write_bytes(bytes(raw))
    c2 = ResponseCache(db)
    assert c2.moved_aside is not None and len(c2) == 0
    c2.put("k", {"v": 1})
    assert c2.get("k") == {"v": 1}


class _FailingConn:
    """A sqlite3 connection stand-in whose statements fail like a full disk / broken file."""

    def __init__(self, real: sqlite3.Connection, fail_reads: bool, fail_writes: bool) -> None:
        self.real, self.fail_reads, self.fail_writes = real, fail_reads, fail_writes

    def execute(self, sql: str, *a: Any) -> Any:
        if self.fail_writes and sql.startswith("INSERT"):
            raise sqlite3.OperationalError("database or disk is full")
        if self.fail_reads and sql.startswith("SELECT response"):
            raise sqlite3.DatabaseError("database disk image is malformed")
        return self.real.execute(sql, *a)

    def commit(self) -> None:
        self.real.commit()

    def rollback(self) -> None:
        self.real.rollback()

    def close(self) -> None:
        self.real.close()


def test_a_failed_cache_write_after_http_200_keeps_the_answer(
        url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING), _vlm(url, cache_path=str(tmp_path / "c.sqlite")) as vlm:
        cache = vlm._cache
        assert cache is not None
        cache._conn = _FailingConn(cache._conn, fail_reads=False, fail_writes=True)  # type: ignore[assignment]
        res = vlm.generate([_img()], ["paid"])
    assert res[0].outcome == "ok" and res[0].text == "answer:paid"  # never client_error
    assert cache.n_write_errors == 1 and "write failed" in caplog.text and "disk is full" in caplog.text


def test_a_failed_cache_read_is_a_miss_and_http_answers(url: str, tmp_path: Path) -> None:
    with _vlm(url, cache_path=str(tmp_path / "c.sqlite")) as vlm:
        vlm.generate([None], ["q"])
        cache = vlm._cache
        assert cache is not None
        cache._conn = _FailingConn(cache._conn, fail_reads=True, fail_writes=False)  # type: ignore[assignment]
        res = vlm.generate([None], ["q"])
    assert res[0].outcome == "ok" and not res[0].cache_hit and vlm.http_calls == 2
    assert cache.n_read_errors == 1


def test_journal_mode_is_wal_locally_and_delete_when_the_deploy_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def mode(c: ResponseCache) -> str:
        return str(c._conn.execute("PRAGMA journal_mode").fetchone()[0]).upper()

    monkeypatch.delenv(JOURNAL_MODE_ENV, raising=False)
    assert mode(ResponseCache(tmp_path / "a.sqlite")) == "WAL"
    monkeypatch.setenv(JOURNAL_MODE_ENV, "delete")
    c = ResponseCache(tmp_path / "b.sqlite")
    assert mode(c) == "DELETE" and c.journal_mode == "DELETE"
    c.put(cache_key(None, "p", "m", {}), {"ok": 1})
    assert not (tmp_path / "b.sqlite-wal").exists()
    monkeypatch.setenv(JOURNAL_MODE_ENV, "memory")
    with pytest.raises(ValueError, match="WAL, DELETE"):
        ResponseCache(tmp_path / "c.sqlite")


def test_a_key_is_never_sent_over_plain_http_except_to_loopback() -> None:
    with pytest.raises(ValueError, match="clear text"):
        ApiSettings(model="m", base_url="http://api.example.org/v1", api_key_env="K")
    for ok in ("http://127.0.0.1:8000/v1", "http://localhost:8000/v1", "http://[::1]:8000/v1",
               "https://api.example.org/v1"):
        ApiSettings(model="m", base_url=ok, api_key_env="K")
    ApiSettings(model="m", base_url="http://vllm.internal:8000/v1", api_key_env=None)  # no key: allowed
    assert is_loopback("http://127.0.0.2/") and not is_loopback("http://10.0.0.1/")


def test_the_response_size_is_capped(url: str) -> None:
    with _vlm(url, max_response_bytes=4096) as vlm:
        res = vlm.generate([None, None], ["big", "small"])
    assert res[0].outcome == "bad_response" and "max_response_bytes" in (res[0].error or "")
    assert res[1].outcome == "ok"


def test_the_overall_deadline_bounds_a_dripping_body(url: str) -> None:
    with _vlm(url, deadline_s=0.3, timeout_s=5.0) as vlm:
        res = vlm.generate([None], ["drip"])
    assert res[0].outcome == "timeout" and "deadline" in (res[0].error or "")


def test_the_deadline_stops_retries_whose_wait_would_pass_it(url: str) -> None:
    with _vlm(url, deadline_s=0.5, max_retries=5, backoff_base_s=100.0, backoff_max_s=100.0) as vlm:
        res = vlm.generate([None], ["e500"])
    # the first retry's seeded wait (uniform up to 100 s) would pass the 0.5 s deadline: no retry
    assert res[0].outcome == "timeout" and "deadline" in (res[0].error or "") and res[0].attempts == 1
