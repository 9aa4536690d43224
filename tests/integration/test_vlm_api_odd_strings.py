"""Issue 44, finding 7: a partition survives any string an API returns.

Before, one answer ``"a\\udcff"`` (a lone surrogate, legal in JSON) made every cache write fail
(SQLite cannot encode it), then the result chunk's write raised ``UnicodeEncodeError``: exit 2,
and a rerun paid every request again and failed again. Now the answer is cached as the server
sent it (JSON-escaped) before anything else can fail, the stored text has lone surrogates, NUL,
ESC and other control characters replaced by U+FFFD (line breaks and tabs kept), and the row's
``sanitized`` flag records that it was changed. A real HTTP server on 127.0.0.1 answers every
request with such strings; the partition completes, and a rerun with the partition's rows deleted makes
zero requests (every answer a cache hit)."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from medrobust_lib.config import Suite, load_suite
from medrobust_lib.store import results
from medrobust_lib.store.marts import build_mart, connect_readonly
from medrobust_lib.store.schema import VLM_TABLE
from medrobust_lib.tracks.datasets import build_clean_index
from medrobust_lib.tracks.vlm.evaluate import evaluate_clean
from tests.http_fakes import FakeEndpoint, completion, read_json, send_json, serving
from tests.suite_helpers import write_suite

ODD = ["a\udcff", "B\x00", "\x1b[31mYes\x1b[0m", "C\ud800\udc00x", "\x07\x08 box \u2028[0.1, 0.1, 0.5, 0.5]",
       "plain\nline\ttab", "\ufffe\uffff lesion"]
"""Answers served in turn: lone surrogates (one, and a surrogate pair JSON allows but UTF-8 does
not), NUL, ANSI escapes, BEL/BS, a line separator, noncharacters; one clean answer with a line
break and a tab (kept as they are)."""


class _Odd(FakeEndpoint):
    hits = 0
    lock = threading.Lock()

    def do_POST(self) -> None:  # noqa: N802 - stdlib name
        read_json(self)
        with _Odd.lock:
            n = _Odd.hits
            _Odd.hits += 1
        # json.dumps escapes lone surrogates as \udcff: the body is valid JSON of an invalid string
        send_json(self, completion(ODD[n % len(ODD)]))


@pytest.fixture
def odd_endpoint() -> Iterator[str]:
    with serving(_Odd) as url:
        yield url


@pytest.fixture
def odd_suite(tmp_path: Path, demo_root: Path, odd_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Suite:
    monkeypatch.setenv("ODD_VLM_KEY", "sk-test-odd-strings-key")
    vlm = {"models": [{"id": "odd-gpt", "kind": "api",
                       "api": {"model": "odd-gpt", "base_url": odd_endpoint, "api_key_env": "ODD_VLM_KEY",
                               "max_retries": 0, "timeout_s": 5, "concurrency": 2,
                               "request_logprobs": False}}],
           "split": "all"}
    suite = load_suite(write_suite(tmp_path, demo_root, modalities=["ct"], vlm=vlm))
    build_clean_index(suite, "ct")
    return suite


def _bad_chars(text: str) -> list[str]:
    return [c for c in text if (0xD800 <= ord(c) <= 0xDFFF) or (ord(c) < 0x20 and c not in "\n\t")
            or c in "\x7f\u2028\u2029"]


def test_a_partition_survives_any_string_an_api_returns_and_a_rerun_pays_nothing(odd_suite: Suite) -> None:
    s = odd_suite
    _Odd.hits = 0
    out = evaluate_clean(s, "odd-gpt", "ct")  # before: UnicodeEncodeError writing the chunk
    paid = _Odd.hits
    assert paid > 0 and out.n_rows > 0
    df = results.read_table(s.results_dir, VLM_TABLE)
    assert len(df) == out.n_rows
    answered = df[df["prediction"].notna()]
    assert len(answered) > 0 and not answered["outcome"].eq("error").any()
    for text in answered["prediction"]:
        assert not _bad_chars(text), repr(text)
        text.encode("utf-8")  # valid UTF-8
    changed = answered[answered["prediction"].str.contains("\ufffd", regex=False)]
    assert len(changed) > 0 and changed["sanitized"].eq(True).all()
    kept = answered[answered["prediction"] == "plain\nline\ttab"]
    assert kept["sanitized"].eq(False).all()  # ordinary line breaks and tabs are not sanitizing
    build_mart(s.results_dir, s.mart_path, s.max_error_share)
    con = connect_readonly(s.mart_path)
    try:
        n = con.execute("select count(*) from vlm_results where sanitized").fetchall()[0][0]
    finally:
        con.close()
    assert n == int(answered["sanitized"].eq(True).sum())

    # every paid answer was cached: a rerun with the rows gone sends nothing
    shutil.rmtree(Path(s.results_dir) / VLM_TABLE)
    _Odd.hits = 0
    again = evaluate_clean(s, "odd-gpt", "ct")
    assert _Odd.hits == 0, f"{_Odd.hits} requests paid again of {paid}"
    df2 = results.read_table(s.results_dir, VLM_TABLE)
    assert again.n_rows == out.n_rows and len(df2) == len(df)
    key = ["task", "record_id", "prompt_id", "image_mode"]
    a = df.sort_values(key)[["prediction", "sanitized"]].reset_index(drop=True)
    b = df2.sort_values(key)[["prediction", "sanitized"]].reset_index(drop=True)
    assert a.equals(b)
