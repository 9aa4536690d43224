"""Issue 44, finding 1: an API key never leaks, in any form a library can print it.

* A key with a control character or whitespace at an end (a CRLF ``.env`` file, ``kubectl
  --from-file`` leaves ``\\r`` / ``\\n``) is refused when the adapter is built, in one line that
  names the environment variable and holds no part of the key. Before, h11 refused the header as
  ``Illegal header value b'Bearer sk-...\\r'``: the escaped key reached ``error``, the log and
  stderr.
* The scrubber removes the key raw, repr'd / escaped (``\\r``, ``\\\\r``, ``\\x..``), as a bytes
  repr (``b'...'``), URL-encoded, split across lines, and any 12+ character piece of it, from
  every body, error and log record. A real HTTP server on 127.0.0.1 echoes the key in each of
  these forms; no result, cache row, log record or captured stderr holds any of them.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from medrobust_lib.config.vlm import ApiSettings
from medrobust_lib.models.api_vlm import ApiVLM
from tests.http_fakes import FakeEndpoint, completion, read_json, send_json, serving

KEY = "sk-proj-Hq7Wz2Rk9XLm4Vb8Nt3Cy6Jd"
ENV = "MEDROBUST_TEST_FORMS_KEY"
MIN_PIECE = 12


def _forms(key: str) -> set[str]:
    """Every printed form of ``key`` the test looks for (the scrubber's own list is not trusted)."""
    out = {key, json.dumps(key)[1:-1], repr(key)[1:-1], repr(key.encode())[2:-1],
           repr(repr(key)[1:-1])[1:-1], urllib.parse.quote(key, safe=""), urllib.parse.quote_plus(key)}
    return {f for f in out if f}


def _leaks(text: str, key: str = KEY) -> list[str]:
    """Pieces of ``key`` (any form) of ``MIN_PIECE``+ characters found in ``text``."""
    found = []
    flat = text.replace("\r", "").replace("\n", "")
    for form in _forms(key):
        n = min(MIN_PIECE, len(form))
        for i in range(len(form) - n + 1):
            piece = form[i:i + n]
            if piece in text or piece in flat:
                found.append(piece)
    return found


def _echo_bodies(key: str) -> dict[str, str]:
    half = len(key) // 2
    return {
        "raw": f"bad key {key}",
        "repr": f"bad key {key!r}",
        "bytes": f"Illegal header value {('Bearer ' + key).encode()!r}",
        "double": repr(f"wrapped {key!r}"),
        "url": f"/v1?key={urllib.parse.quote(key, safe='')}&k2={urllib.parse.quote_plus(key)}",
        "split": f"key starts {key[:half]}\r\n{key[half:]} and ends",
        "prefix": f"your key {key[:MIN_PIECE]}... is invalid",
        "infix": f"mismatch at ...{key[5:5 + MIN_PIECE + 3]}...",
    }


class _Echo(FakeEndpoint):
    key = KEY

    def do_POST(self) -> None:  # noqa: N802 - stdlib name
        body = read_json(self)
        status, _, form = str(body["messages"][-1]["content"]).partition(":")
        text = _echo_bodies(self.key)[form]
        send_json(self, completion(text) if status == "200" else {"error": {"message": text}}, int(status))


@pytest.fixture
def echo_url() -> Iterator[str]:
    with serving(_Echo) as url:
        yield url


def _make(url: str, **kw: Any) -> ApiVLM:
    cfg = ApiSettings(**{"model": "forms-vlm", "base_url": url, "api_key_env": ENV, "timeout_s": 5.0,
                          "max_retries": 0, "concurrency": 4, **kw})
    return ApiVLM(cfg)


@pytest.mark.parametrize("suffix", ["\r", "\n", "\r\n", " ", "\t", "\x1b", "\x7f", "\u0085"])
def test_a_key_with_a_control_character_or_edge_whitespace_is_refused_in_one_line(
        echo_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        capfd: pytest.CaptureFixture[str], suffix: str) -> None:
    caplog.set_level(logging.DEBUG)
    for bad in (KEY + suffix, suffix + KEY, KEY[:10] + suffix + KEY[10:]):
        if suffix in " \t" and bad == KEY[:10] + suffix + KEY[10:]:
            continue  # whitespace inside a key is the server's business; only the ends are trimmed away
        monkeypatch.setenv(ENV, bad)
        with pytest.raises(ValueError) as err:
            _make(echo_url)
        msg = str(err.value)
        assert "\n" not in msg and ENV in msg, msg
        assert not _leaks(msg) and not _leaks(repr(err.value)), msg
    out, errout = capfd.readouterr()
    assert not _leaks(caplog.text + out + errout)


def test_the_h11_header_error_for_a_key_is_scrubbed(echo_url: str) -> None:
    """The exact message h11 prints for a header holding the key with a trailing ``\\r`` (the
    original leak) is scrubbed whole, as is its repr."""
    bad = KEY + "\r"
    with httpx.Client(trust_env=False) as client, pytest.raises(httpx.LocalProtocolError) as err:
        client.post(echo_url + "/chat/completions", headers={"Authorization": f"Bearer {bad}"}, json={})
    printed = f"{type(err.value).__name__}: {err.value} {err.value!r}"
    from medrobust_lib.models.secret_scrub import SecretScrubber

    assert _leaks(printed, bad)  # the message does hold the key (escaped): the test is real
    scrub = SecretScrubber(bad)
    assert not _leaks(scrub.text(printed), bad), scrub.text(printed)


@pytest.mark.parametrize("status", [200, 400, 500])
def test_an_echoed_key_in_any_printed_form_never_reaches_a_row_log_or_stderr(
        echo_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        capfd: pytest.CaptureFixture[str], tmp_path: Path, status: int) -> None:
    monkeypatch.setenv(ENV, KEY)
    caplog.set_level(logging.DEBUG)
    forms = list(_echo_bodies(KEY))
    cache = tmp_path / "cache.sqlite"
    with _make(echo_url, cache_path=str(cache)) as vlm:
        res = vlm.generate([None] * len(forms), [f"{status}:{f}" for f in forms])
    assert [r.outcome for r in res] == ["ok" if status == 200 else "http_error"] * len(forms)
    stored = [json.dumps(r.to_dict(), ensure_ascii=False) + repr(r) for r in res]
    with sqlite3.connect(cache) as db:
        stored += [str(row) for row in db.execute("SELECT * FROM responses")]
    out, errout = capfd.readouterr()
    stored += [caplog.text, out, errout]
    stored += [logging.Formatter().format(rec) for rec in caplog.records]
    leaks = {i: _leaks(s) for i, s in enumerate(stored) if _leaks(s)}
    assert not leaks, {i: (stored[i][:300], leaks[i][:3]) for i in list(leaks)[:3]}
    shown = [r.text if status == 200 else r.error for r in res]
    assert all(s and "***" in s for s in shown), shown  # the key's place stays visible


def test_key_forms_cover_the_escaped_encodings() -> None:
    from medrobust_lib.models.secret_scrub import key_forms

    key = "sk-\u00e9'\\x"
    forms = key_forms(key)
    for f in _forms(key):
        assert f in forms


def test_the_scrubber_leaves_text_without_the_key_alone() -> None:
    from medrobust_lib.models.secret_scrub import SecretScrubber

    scrub = SecretScrubber(KEY)
    text = "ordinary answer: sk-proj is a prefix but too short; Hq7W alone is fine"
    assert scrub.text(text) == text
    assert scrub.bytes_(text.encode()) == text.encode()
