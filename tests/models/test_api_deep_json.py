"""A response body nested a million levels deep is a counted ``bad_response`` after its HTTP attempt,
not an adapter fault (``client_error`` with attempts 0), and the run goes on (issue 44, finding 12)."""

from __future__ import annotations

from http.server import BaseHTTPRequestHandler

import pytest

from medrobust_lib.config.vlm import ApiSettings
from medrobust_lib.models.api_vlm import ApiVLM
from tests.http_fakes import send_bytes, serving

ENV = "MEDROBUST_TEST_DEEP_KEY"
DEPTH = 1_000_000


class _Deep(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        send_bytes(self, b"[" * DEPTH + b"]" * DEPTH)


def test_a_body_nested_too_deep_is_a_bad_response_after_one_attempt(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "sk-deep-json-test-key")
    with serving(_Deep) as url:
        vlm = ApiVLM(ApiSettings(model="deep", base_url=url, api_key_env=ENV, timeout_s=10.0, max_retries=0,
                                 concurrency=1, request_logprobs=False))
        (res,) = vlm.generate([None], ["Is there a lesion?"])
    assert res.outcome == "bad_response" and res.attempts == 1, res
    assert res.text is None and "not valid JSON" in (res.error or "")
