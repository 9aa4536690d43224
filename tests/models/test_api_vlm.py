"""ApiVLM against a real local HTTP server (127.0.0.1, port 0) scripted by the prompt.

Prompt ``<kind>:<tag>`` selects the server's behaviour for that request:
``ok`` answers ``answer:<tag>`` after a short delay (so concurrent requests overlap);
``r429`` answers 429 with ``Retry-After: 2`` the first time a tag is seen, then ok;
``r503date`` the same with 503 and an HTTP-date ``Retry-After``; ``e500`` always 500; ``e400``
always 400; ``slow`` sleeps past the client timeout; ``garbage`` returns invalid JSON;
``nochoices`` returns a JSON object without choices; ``refuse`` returns a refusal; ``echokey``
answers 500 with the Authorization header in the body; ``lp`` answers with top_logprobs; ``nolp``
answers without logprobs; ``cut`` answers with ``finish_reason: length`` (the token cap).
"""

from __future__ import annotations

import email.utils
import json
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from medrobust_lib.config.vlm import ApiSettings
from medrobust_lib.models.api_vlm import (
    ApiVLM,
    backoff_wait,
    option_logprobs,
    parse_retry_after,
)
from medrobust_lib.models.cache import ResponseCache
from medrobust_lib.seeding import rng_for
from tests.http_fakes import FakeEndpoint, completion, prompt_of, read_json, send_bytes, serving

SECRET = "sk-test-SECRET-do-not-leak-1234567890"
ENV = "MEDROBUST_TEST_API_KEY"


class _State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.hits = 0
        self.inflight = 0
        self.max_inflight = 0
        self.seen: dict[str, int] = {}
        self.requests: list[dict[str, Any]] = []
        self.auth: list[str | None] = []
        self.paths: list[str] = []


class _Handler(FakeEndpoint):
    state: _State

    def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        send_bytes(self, body, status, headers)  # a client that gave up (timeout test) is ignored there

    def do_POST(self) -> None:  # noqa: N802 - stdlib name
        st = self.state
        body = read_json(self)
        prompt = prompt_of(body)
        kind, _, tag = prompt.partition(":")
        with st.lock:
            st.hits += 1
            st.inflight += 1
            st.max_inflight = max(st.max_inflight, st.inflight)
            st.requests.append(body)
            st.auth.append(self.headers.get("Authorization"))
            st.paths.append(self.path)
            n_seen = st.seen.get(prompt, 0)
            st.seen[prompt] = n_seen + 1
        try:
            self._respond(kind, tag, n_seen)
        finally:
            with st.lock:
                st.inflight -= 1

    def _respond(self, kind: str, tag: str, n_seen: int) -> None:
        ok = json.dumps(completion(f"answer:{tag}")).encode()
        if kind == "ok":
            time.sleep(0.03)
            self._send(200, ok)
        elif kind == "r429":
            if n_seen == 0:
                self._send(429, b'{"error": "rate limited"}', {"Retry-After": "2"})
            else:
                self._send(200, ok)
        elif kind == "r503date":
            if n_seen == 0:
                when = email.utils.formatdate(time.time() + 30, usegmt=True)
                self._send(503, b'{"error": "busy"}', {"Retry-After": when})
            else:
                self._send(200, ok)
        elif kind == "e500":
            self._send(500, b'{"error": "boom"}')
        elif kind == "e400":
            self._send(400, b'{"error": "bad request"}')
        elif kind == "echokey":
            self._send(500, json.dumps({"error": f"got {self.headers.get('Authorization')}"}).encode())
        elif kind == "slow":
            time.sleep(0.6)
            self._send(200, ok)
        elif kind == "garbage":
            self._send(200, b"{not json at all")
        elif kind == "nochoices":
            self._send(200, b'{"id": "x", "object": "chat.completion"}')
        elif kind == "refuse":
            body = {"choices": [{"index": 0, "finish_reason": "stop", "message": {
                "role": "assistant", "content": None, "refusal": "I can't help with that."}}]}
            self._send(200, json.dumps(body).encode())
        elif kind == "lp":
            top = [{"token": "Yes", "logprob": -0.1}, {"token": " yes", "logprob": -3.0},
                   {"token": "No", "logprob": -2.5}, {"token": "Maybe", "logprob": -6.0}]
            lp = {"content": [{"token": "Yes", "logprob": -0.1, "top_logprobs": top}]}
            self._send(200, json.dumps(completion("Yes", logprobs=lp)).encode())
        elif kind == "nolp":
            self._send(200, json.dumps(completion("Yes")).encode())
        elif kind == "cut":  # the answer stopped at max_tokens
            self._send(200, json.dumps(completion("The finding is a", finish_reason="length")).encode())
        else:
            self._send(404, b'{"error": "unknown script"}')


@pytest.fixture
def server() -> Iterator[tuple[str, _State]]:
    state = _State()
    with serving(type("H", (_Handler,), {"state": state})) as url:
        yield url, state


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, SECRET)


class Sleeps:
    """Records requested waits instead of sleeping."""

    def __init__(self) -> None:
        self.waits: list[float] = []
        self._lock = threading.Lock()

    def __call__(self, s: float) -> None:
        with self._lock:
            self.waits.append(s)


def make(url: str, sleeps: Sleeps | None = None, **kw: Any) -> ApiVLM:
    cfg = ApiSettings(**{"model": "test-vlm", "base_url": url, "api_key_env": ENV, "timeout_s": 5.0,
                          "max_retries": 3, "backoff_base_s": 0.5, "backoff_max_s": 4.0,
                          "concurrency": 4, **kw})
    return ApiVLM(cfg, sleep=sleeps if sleeps is not None else Sleeps())


def _img(seed: int, rgb: bool = True) -> np.ndarray:
    shape = (8, 8, 3) if rgb else (8, 8)
    return rng_for("test_api_vlm", seed).random(shape, dtype=np.float32)


def test_normal_answers_map_to_inputs_and_image_format(server: tuple[str, _State]) -> None:
    url, st = server
    with make(url) as vlm:
        res = vlm.generate([_img(0), _img(1, rgb=False), None], ["ok:a", "ok:b", "ok:c"])
    assert [r.text for r in res] == ["answer:a", "answer:b", "answer:c"]
    assert all(r.outcome == "ok" and r.status_code == 200 and r.attempts == 1 and not r.cache_hit for r in res)
    assert set(st.paths) == {"/v1/chat/completions"}
    by_prompt = {prompt_of(b): b for b in st.requests}
    parts = by_prompt["ok:a"]["messages"][0]["content"]
    assert parts[0]["type"] == "image_url"
    assert parts[0]["image_url"]["url"].startswith("data:image/png;base64,")
    assert parts[1] == {"type": "text", "text": "ok:a"}
    assert by_prompt["ok:a"]["model"] == "test-vlm" and by_prompt["ok:a"]["temperature"] == 0.0
    # text-only: no image part anywhere
    text_only = by_prompt["ok:c"]["messages"]
    assert text_only == [{"role": "user", "content": "ok:c"}]
    assert "image_url" not in json.dumps(text_only)


def test_png_roundtrip_preserves_pixels(server: tuple[str, _State]) -> None:
    import base64
    import io

    from PIL import Image

    url, st = server
    img = _img(3)
    with make(url) as vlm:
        vlm.generate([img], ["ok:x"])
    data = st.requests[0]["messages"][0]["content"][0]["image_url"]["url"].split(",", 1)[1]
    decoded = np.asarray(Image.open(io.BytesIO(base64.b64decode(data))))
    np.testing.assert_array_equal(decoded, np.rint(img * 255).astype(np.uint8))


def test_retry_after_429_is_honoured(server: tuple[str, _State]) -> None:
    url, st = server
    sleeps = Sleeps()
    with make(url, sleeps) as vlm:
        (res,) = vlm.generate([None], ["r429:a"])
    assert res.outcome == "ok" and res.text == "answer:a" and res.attempts == 2
    assert sleeps.waits == [2.0] and res.waits_s == (2.0,)
    assert st.hits == 2


def test_retry_after_http_date_on_503(server: tuple[str, _State]) -> None:
    url, _ = server
    sleeps = Sleeps()
    with make(url, sleeps) as vlm:
        (res,) = vlm.generate([None], ["r503date:a"])
    assert res.outcome == "ok" and res.attempts == 2
    assert len(sleeps.waits) == 1 and 27.0 <= sleeps.waits[0] <= 30.0


def test_persistent_500_gives_http_error_after_all_retries(server: tuple[str, _State]) -> None:
    url, st = server
    sleeps = Sleeps()
    with make(url, sleeps, max_retries=3) as vlm:
        (res,) = vlm.generate([None], ["e500:a"])
        key = vlm._prepare([None], ["e500:a"], {"temperature": 0.0, "max_tokens": 256})[0].key
    assert res.outcome == "http_error" and res.status_code == 500 and res.text is None
    assert res.attempts == 4 and st.hits == 4
    # full-jitter exponential backoff, deterministic per request key
    rng = rng_for("api_vlm", 0, key)
    expected = [backoff_wait(k, 0.5, 4.0, rng) for k in (1, 2, 3)]
    assert sleeps.waits == pytest.approx(expected)
    assert all(0 <= w <= min(4.0, 0.5 * 2 ** k) for k, w in enumerate(sleeps.waits))


def test_other_4xx_is_not_retried(server: tuple[str, _State]) -> None:
    url, st = server
    sleeps = Sleeps()
    with make(url, sleeps) as vlm:
        (res,) = vlm.generate([None], ["e400:a"])
    assert res.outcome == "http_error" and res.status_code == 400 and res.attempts == 1
    assert sleeps.waits == [] and st.hits == 1


def test_timeout_is_counted(server: tuple[str, _State]) -> None:
    url, st = server
    with make(url, timeout_s=0.2, max_retries=1) as vlm:
        (res,) = vlm.generate([None], ["slow:a"])
    assert res.outcome == "timeout" and res.attempts == 2 and res.text is None
    assert res.status_code is None


def test_connection_error_is_counted() -> None:
    # a port nobody listens on (bound then closed) -> connection refused, retried, counted
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with make(f"http://127.0.0.1:{port}/v1", max_retries=1) as vlm:
        (res,) = vlm.generate([None], ["ok:a"])
    assert res.outcome == "connection_error" and res.attempts == 2


@pytest.mark.parametrize(("prompt", "outcome"), [
    ("garbage:a", "bad_response"), ("nochoices:a", "bad_response"), ("refuse:a", "refused")])
def test_bad_bodies(server: tuple[str, _State], prompt: str, outcome: str) -> None:
    url, st = server
    with make(url) as vlm:
        (res,) = vlm.generate([None], [prompt])
    assert res.outcome == outcome and res.attempts == 1 and st.hits == 1
    assert res.error
    if outcome == "refused":
        assert res.text == "I can't help with that."
    else:
        assert res.text is None


def test_mixed_batch_exact_count_order_and_concurrency(server: tuple[str, _State]) -> None:
    url, st = server
    kinds = ["ok", "ok", "r429", "e500", "garbage", "ok", "nochoices", "e400", "ok", "refuse"]
    prompts = [f"{kinds[i % len(kinds)]}:{i}" for i in range(20)]
    images = [_img(i) if i % 3 else None for i in range(20)]
    with make(url, max_retries=2, concurrency=3) as vlm:
        res = vlm.generate(images, prompts)
    assert len(res) == 20
    expected = {"ok": "ok", "r429": "ok", "e500": "http_error", "garbage": "bad_response",
                "nochoices": "bad_response", "e400": "http_error", "refuse": "refused"}
    for p, r in zip(prompts, res, strict=True):
        kind, _, tag = p.partition(":")
        assert r.outcome == expected[kind], p
        if r.outcome == "ok":
            assert r.text == f"answer:{tag}"
    assert 2 <= st.max_inflight <= 3
    assert st.hits == sum(r.attempts for r in res)
    assert vlm.http_calls == st.hits


def test_key_in_header_never_leaks(server: tuple[str, _State], caplog: pytest.LogCaptureFixture) -> None:
    url, st = server
    caplog.set_level(logging.DEBUG)
    with make(url, max_retries=1) as vlm:
        res = vlm.generate([None] * 4, ["ok:a", "echokey:b", "e500:c", "r429:d"])
        text = repr(vlm) + repr(vlm.config)
    assert st.auth and all(a == f"Bearer {SECRET}" for a in st.auth)
    assert res[1].outcome == "http_error" and res[1].error and "***" in res[1].error
    for r in res:
        text += repr(r) + json.dumps(r.to_dict()) + str(r.error)
    text += caplog.text
    assert SECRET not in text
    assert "Bearer ***" in caplog.text  # the echoed header was logged, scrubbed


def test_missing_key_env_raises_without_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV)
    with pytest.raises(ValueError, match=ENV):
        make("http://127.0.0.1:9/v1")


def test_no_key_env_sends_no_auth(server: tuple[str, _State]) -> None:
    url, st = server
    with make(url, api_key_env=None) as vlm:
        (res,) = vlm.generate([None], ["ok:a"])
    assert res.ok and st.auth == [None]


def test_cache_second_run_makes_no_http_calls(server: tuple[str, _State], tmp_path: Path) -> None:
    url, st = server
    db = str(tmp_path / "cache" / "resp.sqlite")
    images = [_img(i) for i in range(5)] + [None]
    prompts = [f"ok:{i}" for i in range(5)] + ["e500:x"]
    with make(url, cache_path=db, max_retries=0) as vlm:
        first = vlm.generate(images, prompts)
    hits_first = st.hits
    assert hits_first == 6 and not any(r.cache_hit for r in first)
    assert len(ResponseCache(db)) == 5  # the failed one is not cached
    with make(url, cache_path=db, max_retries=0) as vlm:
        second = vlm.generate(images[:5], prompts[:5])
        assert vlm.http_calls == 0
    assert st.hits == hits_first
    assert all(r.cache_hit and r.attempts == 0 for r in second)
    assert [r.text for r in second] == [r.text for r in first[:5]]
    # a changed setting or image misses the cache
    with make(url, cache_path=db, max_retries=0, max_tokens=7) as vlm:
        (r,) = vlm.generate(images[:1], prompts[:1])
    assert not r.cache_hit and st.hits == hits_first + 1
    with make(url, cache_path=db, max_retries=0) as vlm:
        (r,) = vlm.generate([_img(99)], prompts[:1])
    assert not r.cache_hit


def test_score_parses_top_logprobs(server: tuple[str, _State]) -> None:
    url, st = server
    with make(url) as vlm:
        out = vlm.score([_img(0), None, None], ["lp:a", "nolp:b", "e400:c"], ["yes", "no", "unsure"])
    sc = out[0]
    assert sc is not None
    assert sc["yes"] == pytest.approx(np.logaddexp(-0.1, -3.0))
    assert sc["no"] == pytest.approx(-2.5)
    assert sc["unsure"] is None
    assert out[1] is None and out[2] is None  # no logprobs / failed -> caller falls back
    req = st.requests[0]
    assert req["logprobs"] is True and req["top_logprobs"] == 20 and req["max_tokens"] == 1


def test_generate_request_logprobs(server: tuple[str, _State]) -> None:
    url, st = server
    with make(url, request_logprobs=True) as vlm:
        (res,) = vlm.generate([None], ["lp:a"])
    assert res.logprobs is not None and res.logprobs["No"] == -2.5
    assert st.requests[0]["logprobs"] is True


def test_input_validation() -> None:
    with make("http://127.0.0.1:9/v1") as vlm:
        with pytest.raises(ValueError, match="length"):
            vlm.generate([None], ["a", "b"])
        with pytest.raises(ValueError, match=r"\(H, W\)"):
            vlm.generate([np.zeros((2, 2, 4), np.float32)], ["a"])
        assert vlm.generate([], []) == []
    with pytest.raises(ValueError, match="concurrency"):
        ApiSettings(model="m", concurrency=0)


def test_helpers() -> None:
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after("nonsense") is None
    assert parse_retry_after(None) is None
    date = email.utils.formatdate(1_000_010, usegmt=True)
    assert parse_retry_after(date, now=1_000_000) == pytest.approx(10.0)
    assert parse_retry_after(date, now=2_000_000) == 0.0
    assert option_logprobs({"A": -1.0}, ["a", "B"]) == {"a": -1.0, "B": None}


def test_an_answer_cut_at_max_tokens_is_flagged_truncated(server: tuple[str, _State], tmp_path: Path) -> None:
    url, _ = server
    with make(url, cache_path=str(tmp_path / "c.sqlite")) as vlm:
        first = vlm.generate([None, None, None], ["cut:1", "ok:2", "e400:3"])
        again = vlm.generate([None], ["cut:1"])  # from the cache: the flag survives
    assert [r.truncated for r in first] == [True, False, None]  # no answer: unknown
    assert first[0].text == "The finding is a" and first[0].outcome == "ok"
    assert again[0].cache_hit and again[0].truncated is True
