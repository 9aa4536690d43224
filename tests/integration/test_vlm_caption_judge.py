"""The judge's caption score end to end: an OpenAI-compatible server on 127.0.0.1 plays both the
evaluated model and the caption judge (``vlm.protocol.caption_judge``, a second ``kind: api`` model
of the suite). Caption rows get ``caption_judge_score``; a reply without a number leaves it NULL
(the reference's reading); a failed judge call is a counted ``error`` row, retried by the next
run; judge answers are cached like the model's."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from medrobust_lib.config import Suite, load_suite
from medrobust_lib.store import results
from medrobust_lib.store.schema import VLM_TABLE
from medrobust_lib.tracks.datasets import build_clean_index
from medrobust_lib.tracks.vlm.evaluate import evaluate_clean
from medrobust_lib.tracks.vlm.items import load_items
from medrobust_lib.vlm_tasks.judge_caption import caption_judge_prompt
from tests.http_fakes import FakeEndpoint, completion, prompt_of, read_json, send_json, serving
from tests.suite_helpers import write_suite

CAPTION = "CT image of the chest showing a small lesion."


def _kind(truth: str) -> int:
    """Which judge behaviour a reference caption gets: 0 a score, 1 no number, 2 a failed call."""
    return sum(map(ord, truth)) % 3


class _Fake(FakeEndpoint):
    judge_fails = True
    model_hits = 0
    judge_hits = 0
    judge_prompts: list[str] = []
    lock = threading.Lock()

    def do_POST(self) -> None:  # noqa: N802 - stdlib name
        body = read_json(self)
        text = prompt_of(body)
        if body["model"] == "judge-model":
            with _Fake.lock:
                _Fake.judge_hits += 1
                _Fake.judge_prompts.append(text)
            truth = text.split("Ground Truth: ", 1)[1].split("\nPrediction: ", 1)[0]
            kind = _kind(truth)
            if kind == 2 and _Fake.judge_fails:
                send_json(self, {"error": "overloaded"}, 500)
            else:
                send_json(self, completion({0: "0.7", 1: "I cannot rate this."}.get(kind, "Score: 0.4")))
            return
        with _Fake.lock:
            _Fake.model_hits += 1
        if "yes or no" in text:
            send_json(self, completion("Yes"))
        else:
            send_json(self, completion("B" if "letter" in text else "[0.1, 0.1, 0.5, 0.5]" if "box" in text
                                       else CAPTION))


@pytest.fixture
def endpoint() -> Iterator[str]:
    with serving(_Fake) as url:
        yield url


def _api(model_id: str, model: str, url: str) -> dict[str, object]:
    return {"id": model_id, "kind": "api",
            "api": {"model": model, "base_url": url, "api_key_env": "FAKE_VLM_KEY", "max_retries": 1,
                    "backoff_base_s": 0.01, "backoff_max_s": 0.02, "timeout_s": 5, "concurrency": 4}}


@pytest.fixture
def judged_suite(tmp_path: Path, demo_root: Path, endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Suite:
    monkeypatch.setenv("FAKE_VLM_KEY", "sk-test-secret")
    vlm = {"models": [_api("fake-gpt", "fake-gpt", endpoint), _api("deepseek-judge", "judge-model", endpoint)],
           "split": "all", "protocol": {"caption_judge": "deepseek-judge"}}
    suite = load_suite(write_suite(tmp_path, demo_root, modalities=["ct"], vlm=vlm))
    build_clean_index(suite, "ct")
    return suite


def test_caption_rows_get_the_judge_score(judged_suite: Suite) -> None:
    s = judged_suite
    _Fake.judge_fails, _Fake.judge_hits, _Fake.model_hits, _Fake.judge_prompts = True, 0, 0, []
    out = evaluate_clean(s, "fake-gpt", "ct")
    df = results.read_table(s.results_dir, VLM_TABLE)
    cap = df[df["task"] == "caption"].set_index("record_id")
    every = {it.record_id: it.references[0] for it in load_items(s).items if it.task == "caption"}
    truths = {r: every[r] for r in cap.index}
    kinds = {rid: _kind(t) for rid, t in truths.items()}
    assert set(kinds.values()) == {0, 1, 2}, "the demo's CT captions should exercise every judge behaviour"
    # the judge was asked with the reference's prompt: the model's caption against the record's caption
    assert {caption_judge_prompt(CAPTION, truths[r]) for r in truths} == set(_Fake.judge_prompts)
    scored = cap[[kinds[r] == 0 for r in cap.index]]
    assert len(scored) and scored["caption_judge_score"].eq(0.7).all() and scored["outcome"].eq("ok").all()
    assert scored["judge_model"].eq("deepseek-judge").all() and scored["cider_d"].notna().all()
    unread = cap[[kinds[r] == 1 for r in cap.index]]  # no number: NULL, as the reference reads it
    assert len(unread) and unread["caption_judge_score"].isna().all() and unread["outcome"].eq("ok").all()
    assert unread["judge_outcome"].eq("unreadable").all() and unread["bleu_4"].notna().all()
    failed = cap[[kinds[r] == 2 for r in cap.index]]  # a failed judge call: an error, never a score
    assert len(failed) and failed["outcome"].eq("error").all() and failed["caption_judge_score"].isna().all()
    assert failed["cider_d"].isna().all() and failed["error"].str.startswith("caption judge: api_").all()
    assert out.outcomes["error"] == len(failed)
    assert _Fake.judge_hits == len(scored) + len(unread) + 2 * len(failed)  # the failures were retried once
    # other tasks are not judged
    assert df.loc[df["task"] != "caption", "caption_judge_score"].isna().all()
    assert out.metrics["caption_judge_score"] == pytest.approx(0.7)

    # the judge is back: the re-run asks only the failed rows again (the caption from the model's
    # cache), and the judge scores them
    _Fake.judge_fails, _Fake.judge_hits, _Fake.model_hits = False, 0, 0
    again = evaluate_clean(s, "fake-gpt", "ct")
    assert _Fake.model_hits == 0 and _Fake.judge_hits == len(failed)
    assert again.n_reused == len(df) - len(failed)
    df2 = results.read_table(s.results_dir, VLM_TABLE)
    cap2 = df2[df2["task"] == "caption"].set_index("record_id")
    retried = cap2.loc[failed.index]
    assert retried["outcome"].eq("ok").all() and retried["caption_judge_score"].eq(0.4).all()
    assert (df2["outcome"] != "error").all()

    # judge answers are cached: scoring the partition from scratch sends no request at all
    shutil.rmtree(Path(s.results_dir) / VLM_TABLE)
    _Fake.judge_hits, _Fake.model_hits = 0, 0
    evaluate_clean(s, "fake-gpt", "ct")
    assert (_Fake.judge_hits, _Fake.model_hits) == (0, 0)
    df3 = results.read_table(s.results_dir, VLM_TABLE)
    cap3 = df3[df3["task"] == "caption"].set_index("record_id").sort_index()
    assert cap3["caption_judge_score"].equals(cap2.sort_index()["caption_judge_score"])
