"""An OpenAI-compatible endpoint named in the suite YAML is evaluated with no code change: a
local HTTP server on 127.0.0.1 plays the model; failures are counted rows; a re-run makes 0 calls."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from medrobust_lib.config import Suite, load_suite
from medrobust_lib.store import results
from medrobust_lib.store.schema_vlm import VLM_TABLE
from medrobust_lib.tracks.datasets import build_clean_index
from medrobust_lib.tracks.vlm.evaluate import evaluate_clean
from tests.suite_helpers import write_suite


class _Fake(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    hits = 0
    lock = threading.Lock()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass

    def do_POST(self) -> None:  # noqa: N802 - stdlib name
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
        with _Fake.lock:
            _Fake.hits += 1
        content = body["messages"][-1]["content"]
        text = next(p["text"] for p in content if p["type"] == "text") if isinstance(content, list) else content
        status, payload = 200, None
        if text.startswith("A model answered a multiple-choice question"):
            payload = {"choices": [{"index": 0, "finish_reason": "stop",
                                    "message": {"role": "assistant", "content": "C"}}]}
        elif "In which part" in text:  # lesion-location MC: an answer the rules cannot parse
            payload = {"choices": [{"index": 0, "finish_reason": "stop",
                                    "message": {"role": "assistant", "content": "somewhere near the edge"}}]}
        elif text.startswith("Rewrite the following yes/no question"):
            q = text.split("Question: ", 1)[1].strip()
            lines = [f"In this image, {q[0].lower()}{q[1:]}", "What is shown here?", f"Honestly, {q[0].lower()}{q[1:]}"]
            payload = {"choices": [{"index": 0, "finish_reason": "stop",
                                    "message": {"role": "assistant", "content": "\n".join(lines)}}]}
        elif "Which organ" in text:
            status, payload = 500, {"error": "overloaded"}  # every anatomy MC question fails
        elif "yes or no" in text:
            choice: dict[str, Any] = {"index": 0, "finish_reason": "stop",
                                      "message": {"role": "assistant", "content": "Yes"}}
            if body.get("logprobs"):
                top = [{"token": "Yes", "logprob": -0.2}, {"token": "No", "logprob": -1.8}]
                choice["logprobs"] = {"content": [{"token": "Yes", "logprob": -0.2, "top_logprobs": top}]}
            payload = {"choices": [choice]}
        else:
            answer = ("B" if "letter" in text else "[0.1, 0.1, 0.5, 0.5]" if "box" in text
                      else "CT image of the chest showing a small lesion.")
            payload = {"choices": [{"index": 0, "finish_reason": "stop",
                                    "message": {"role": "assistant", "content": answer}}]}
        raw = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)


@pytest.fixture
def endpoint() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Fake)
    httpd.daemon_threads = True
    t = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    finally:
        httpd.shutdown()
        httpd.server_close()
        t.join(timeout=5)


@pytest.fixture
def api_suite(tmp_path: Path, demo_root: Path, endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Suite:
    monkeypatch.setenv("FAKE_VLM_KEY", "sk-test-secret")
    vlm = {"models": [{"id": "fake-gpt", "kind": "api",
                       "api": {"model": "fake-gpt", "base_url": endpoint, "api_key_env": "FAKE_VLM_KEY",
                               "max_retries": 1, "backoff_base_s": 0.01, "backoff_max_s": 0.02,
                               "timeout_s": 5, "concurrency": 4}}],
           "split": "all"}
    suite = load_suite(write_suite(tmp_path, demo_root, modalities=["ct"], vlm=vlm))
    build_clean_index(suite, "ct")
    return suite


def test_api_model_from_yaml(api_suite: Suite) -> None:
    s = api_suite
    _Fake.hits = 0
    out = evaluate_clean(s, "fake-gpt", "ct")
    first = _Fake.hits
    df = results.read_table(s.results_dir, VLM_TABLE)
    assert out.n_rows == len(df) and first > 0
    anatomy = df[df["record_id"].isin(df[df["outcome"] == "error"]["record_id"])]
    assert len(anatomy) > 0 and (anatomy["correct"] == 0.0).all() and anatomy["task"].eq("vqa_mc").all()
    assert anatomy["error"].str.contains("http_error").all()
    yn = df[df["task"] == "vqa_yesno"]
    assert yn["source"].eq("logprobs").all() and yn["parsed"].eq("yes").all()
    assert yn["margin"].round(6).eq(1.6).all()
    mc_ok = df[(df["task"] == "vqa_mc") & (df["outcome"] == "ok")]
    assert mc_ok["parsed"].eq("B").all()
    gr = df[df["task"] == "grounding"]
    assert gr["box_scale"].eq("0-1").all() and gr["outcome"].eq("ok").all()
    unp = df[df["outcome"] == "unparseable"]
    assert len(unp) > 0 and unp["judge_model"].isna().all()  # the judge is off by default
    # the key never reaches a row
    assert not df.astype(str).apply(lambda c: c.str.contains("sk-test-secret")).any().any()
    # a re-run is answered from the cache: 0 HTTP calls for the successes; only failures retry
    n_failed = int((df["outcome"] == "error").sum())
    _Fake.hits = 0
    again = evaluate_clean(s, "fake-gpt", "ct")
    assert again.n_rows == out.n_rows
    assert _Fake.hits == n_failed * 2  # failed requests are not cached: each is retried once again
    df2 = results.read_table(s.results_dir, VLM_TABLE)
    assert df2[df2["outcome"] == "ok"]["cache_hit"].all()


def test_api_paraphraser_feeds_the_taxonomy(api_suite: Suite, monkeypatch: pytest.MonkeyPatch) -> None:
    from medrobust_lib.tracks.taxonomy import evaluate as tx
    from medrobust_lib.tracks.vlm.items import load_items

    s = api_suite.model_copy(update={"taxonomy": {"configs": [{"id": "fake", "model": "fake-gpt"}],
                                                  "min_paraphrases": 8, "api_paraphraser": "fake-gpt"}})
    items = [it for it in load_items(s).items if it.task == "vqa_yesno"][:3]
    _Fake.hits = 0
    variants, audit = tx.paraphrase_sets(s, items)
    assert _Fake.hits == 3
    for it in items:
        vs = variants[it.record_id]
        assert len(vs) - 1 >= 8 and vs[0] == (it.question, 1)
        assert any(t.startswith("In this image,") and p == 1 for t, p in vs)
        assert not any(t == "What is shown here?" for t, _ in vs)  # rejected by the equivalence filter
    reasons = {a["reason"] for a in audit if not a["accepted"]}
    assert "low_overlap" in reasons and sum(a["accepted"] for a in audit) == 2 * 3
    _Fake.hits = 0
    again, _ = tx.paraphrase_sets(s, items)
    assert again == variants and _Fake.hits == 0  # cached


def test_optional_judge_is_recorded_separately(api_suite: Suite) -> None:
    s = api_suite.model_copy(update={"vlm": {**api_suite.vlm, "judge": "fake-gpt"}})  # type: ignore[attr-defined]
    evaluate_clean(s, "fake-gpt", "ct")
    df = results.read_table(s.results_dir, VLM_TABLE)
    unp = df[df["outcome"] == "unparseable"]
    assert len(unp) > 0 and unp["judge_model"].eq("fake-gpt").all() and unp["judge_parsed"].eq("C").all()
    assert unp["correct"].eq(0.0).all()  # the rule-based score is unchanged
    assert set(unp["judge_correct"]) <= {0.0, 1.0}
    assert df[df["outcome"] != "unparseable"]["judge_model"].isna().all()
