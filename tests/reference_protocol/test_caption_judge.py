"""The judge's caption score: the prompt and the reading of the judge's reply equal the reference's
(``DeepSeekEvaluator.evaluate_caption`` / ``_call_api``, run by ``tools/reference_protocol_fixtures.py
--only caption_judge``), and the VLM track writes ``caption_judge_score`` on caption rows."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from medrobust_lib.config.vlm import VLMModelConfig, VLMProtocol
from medrobust_lib.data.sample import Sample
from medrobust_lib.store.schema import VLM_COLUMN_NAMES
from medrobust_lib.tracks.vlm.evaluate import Condition, VLMEvalSummary, ask
from medrobust_lib.tracks.vlm.items import VLMItem
from medrobust_lib.tracks.vlm.model import Answer
from medrobust_lib.vlm_tasks.judge_caption import caption_judge_prompt, judge_captions, read_caption_score

DATA = json.loads((Path(__file__).parent / "fixtures" / "caption_judge_reference.json").read_text())


def test_fixture_is_the_reference_caption_judge() -> None:
    assert DATA["function"] == "DeepSeekEvaluator.evaluate_caption"
    assert DATA["reference"].endswith("93ae840ed1279a011c4f357368e530fa2dd35524")


def test_prompt_equals_the_reference() -> None:
    assert len(DATA["prompts"]) >= 3
    for case in DATA["prompts"]:
        assert caption_judge_prompt(case["prediction"], case["ground_truth"]) == case["prompt"]


def test_score_reading_equals_the_reference() -> None:
    replies = [c["reply"] for c in DATA["scores"]]
    assert any(c["score"] is None for c in DATA["scores"])  # malformed replies are in the fixture
    assert [read_caption_score(r) for r in replies] == [c["score"] for c in DATA["scores"]]


class _Replies:
    """A judge client answering from a list (``None``: a failed call)."""

    def __init__(self, replies: Sequence[str | None]) -> None:
        self.replies = list(replies)
        self.prompts: list[str] = []

    def generate(self, images: Sequence[object], prompts: Sequence[str]) -> list[SimpleNamespace]:
        self.prompts.extend(prompts)
        return [SimpleNamespace(outcome="http_error", text=None) if r is None else SimpleNamespace(outcome="ok", text=r)
                for r in self.replies[:len(prompts)]]


def test_verdicts_follow_the_reference_reading_and_failures_are_failures() -> None:
    replies = [c["reply"] for c in DATA["scores"]] + [None]
    got = judge_captions(_Replies(replies), ["p"] * len(replies), ["t"] * len(replies))
    assert [v.score for v in got] == [c["score"] for c in DATA["scores"]] + [None]
    assert [v.outcome for v in got[:-1]] == ["ok" if c["score"] is not None else "unreadable" for c in DATA["scores"]]
    assert got[-1].outcome == "api_http_error" and got[-1].failed and not got[0].failed


class Model:
    checkpoint = "m"
    adapter = None

    def __init__(self) -> None:
        self.m = VLMModelConfig(id="m")

    def generate(self, images: Sequence[object], prompts: Sequence[str], max_new_tokens: int) -> list[Answer]:
        return [Answer("A CT of the liver.") for _ in prompts]

    def yes_no(self, images: Sequence[object], prompts: Sequence[str]) -> list[tuple[None, Answer]]:
        return []


class Judge:
    """An API judge: 0.8 for the reference 'liver', no number for 'kidney', a failed call for 'boom'."""

    def __init__(self) -> None:
        self.m = VLMModelConfig.model_validate({"id": "judge", "kind": "api", "api": {"model": "judge-model"}})
        self.api = self
        self.prompts: list[str] = []

    def generate(self, images: Sequence[object], prompts: Sequence[str]) -> list[SimpleNamespace]:
        self.prompts.extend(prompts)
        out = []
        for p in prompts:
            truth = p.split("Ground Truth: ")[1].split("\n")[0]
            if "boom" in truth:
                out.append(SimpleNamespace(outcome="timeout", text=None))
            else:
                out.append(SimpleNamespace(outcome="ok", text="Score: 0.8" if "liver" in truth else "n/a"))
        return out


def test_caption_rows_get_the_judge_score() -> None:
    items = [VLMItem("caption", "c1", "d", "s0", "ct", "", references=("CT of the liver.", "another")),
             VLMItem("caption", "c2", "d", "s0", "ct", "", references=("CT of the kidney.",)),
             VLMItem("caption", "c3", "d", "s0", "ct", "", references=("boom",))]
    img = np.zeros((16, 16), np.float32)
    cond = Condition(Sample("s0", "d", "ct", img), img)
    judge = Judge()
    rows = ask({("d", "s0"): items}, [cond], Model(), {}, VLMEvalSummary(),  # type: ignore[arg-type]
               protocol=VLMProtocol(caption_judge="judge"), caption_judge=judge)  # type: ignore[arg-type]
    by = {r["record_id"]: r for r in rows}
    assert set(by) == {"c1", "c2", "c3"} and all(set(r) == set(VLM_COLUMN_NAMES) for r in rows)
    c1, c2, c3 = by["c1"], by["c2"], by["c3"]
    assert (c1["outcome"], c1["caption_judge_score"], c1["judge_model"], c1["judge_outcome"]) == ("ok", 0.8, "judge", "ok")
    assert c1["cider_d"] is not None
    # the judge saw the first reference and the model's caption, in the reference's prompt
    assert caption_judge_prompt("A CT of the liver.", "CT of the liver.") in judge.prompts
    # no number in the reply: no score, as the reference reads it; the caption's other scores stand
    assert (c2["outcome"], c2["caption_judge_score"], c2["judge_outcome"]) == ("ok", None, "unreadable")
    assert c2["bleu_4"] is not None
    # a failed judge call is an infrastructure error: nothing scored, retried by the next run
    assert c3["outcome"] == "error" and c3["caption_judge_score"] is None and c3["cider_d"] is None
    assert c3["error"] == "caption judge: api_timeout" and c3["correct"] is None


def test_no_caption_judge_no_column() -> None:
    items = [VLMItem("caption", "c1", "d", "s0", "ct", "", references=("CT of the liver.",))]
    img = np.zeros((16, 16), np.float32)
    rows = ask({("d", "s0"): items}, [Condition(Sample("s0", "d", "ct", img), img)], Model(),  # type: ignore[arg-type]
               {}, VLMEvalSummary())
    assert rows[0]["caption_judge_score"] is None and rows[0]["judge_model"] is None


def test_an_unset_caption_judge_leaves_the_protocol_dump_as_before() -> None:
    """An added key: the reference overlay's protocol (and so its partitions' fingerprints) is
    dumped as before while ``caption_judge`` is unset."""
    proto = VLMProtocol(caption_prompt="x", caption_raw_scores=True, grounding_parse="reference")
    assert "caption_judge" not in proto.model_dump() and proto.is_default() is False
    assert VLMProtocol().is_default()
    assert VLMProtocol(caption_judge="j").model_dump()["caption_judge"] == "j"
    assert not VLMProtocol(caption_judge="j").is_default()


@pytest.mark.parametrize("reply", ["", "n/a", None])
def test_no_number_is_no_score(reply: str | None) -> None:
    assert read_caption_score(reply) is None
