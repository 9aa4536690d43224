"""Judge-scored open VQA: the prompt and the reading of the judge's reply equal the reference's
(``DeepSeekEvaluator.evaluate_vqa`` / ``_call_api``, run by ``tools/reference_protocol_fixtures.py``),
and the VLM track writes ``vqa_open`` rows beside the lettered ones."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from medrobust_lib.config.vlm import VLMModelConfig, VLMProtocol
from medrobust_lib.data.sample import Sample
from medrobust_lib.tracks.vlm.evaluate import Condition, VLMEvalSummary, ask
from medrobust_lib.tracks.vlm.items import VLMItem
from medrobust_lib.tracks.vlm.model import Answer
from medrobust_lib.vlm_tasks.judge_open import open_judge_prompt, parse_score

DATA = json.loads((Path(__file__).parent / "fixtures" / "judge_reference.json").read_text())


def test_prompt_equals_the_reference() -> None:
    for case in DATA["prompts"]:
        assert open_judge_prompt(case["question"], case["prediction"], case["ground_truth"]) == case["prompt"]


def test_score_reading_equals_the_reference() -> None:
    assert [parse_score(c["reply"]) for c in DATA["scores"]] == [c["score"] for c in DATA["scores"]]


class Model:
    checkpoint = "m"
    adapter = None

    def __init__(self) -> None:
        self.m = VLMModelConfig(id="m")
        self.calls: list[tuple[list[str], int]] = []

    def generate(self, images: Sequence[object], prompts: Sequence[str], max_new_tokens: int) -> list[Answer]:
        self.calls.append((list(prompts), max_new_tokens))
        return [Answer("B") if "A." in p else Answer("It is the liver" if "organ" in p else "no idea") for p in prompts]

    def yes_no(self, images: Sequence[object], prompts: Sequence[str]) -> list[tuple[None, Answer]]:
        return []


class Judge:
    """An API judge: scores 1 for an answer naming the truth, 0.5 for 'no idea', fails on 'boom'."""

    def __init__(self) -> None:
        self.m = VLMModelConfig(id="judge", kind="api", api={"model": "judge-model"})
        self.api = self

    def generate(self, images: Sequence[object], prompts: Sequence[str]) -> list[SimpleNamespace]:
        out = []
        for p in prompts:
            truth = p.split("Ground Truth: ")[1].split("\n")[0]
            pred = p.split("Prediction: ")[1].split("\n")[0]
            if truth == "boom":
                out.append(SimpleNamespace(outcome="timeout", text=None))
            else:
                out.append(SimpleNamespace(outcome="ok", text="1" if truth.lower() in pred.lower() else "0.5"))
        return out


def test_open_rows_beside_the_lettered_ones() -> None:
    items = [VLMItem("vqa_mc", "q1", "d", "s0", "ct", "Which organ is shown?", "B", ("Spleen", "Liver")),
             VLMItem("vqa_mc", "q2", "d", "s0", "ct", "Which side?", "A", ("Left", "Right")),
             VLMItem("vqa_mc", "q3", "d", "s0", "ct", "Which stage?", "A", ("boom", "late"))]
    img = np.zeros((16, 16), np.float32)
    cond = Condition(Sample("s0", "d", "ct", img), img)
    model, judge = Model(), Judge()
    rows = ask({("d", "s0"): items}, [cond], model, {}, VLMEvalSummary(),  # type: ignore[arg-type]
               protocol=VLMProtocol(open_vqa_judge="judge", open_vqa_max_new_tokens=512), open_judge=judge)  # type: ignore[arg-type]
    by = {(r["task"], r["record_id"]): r for r in rows}
    assert {t for t, _ in by} == {"vqa_mc", "vqa_open"} and len(rows) == 6
    assert by[("vqa_mc", "q1")]["correct"] == 1.0  # lettered: "B"
    o1, o2, o3 = by[("vqa_open", "q1")], by[("vqa_open", "q2")], by[("vqa_open", "q3")]
    assert (o1["outcome"], o1["correct"], o1["parsed"], o1["judge_model"]) == ("ok", 1.0, "1", "judge")
    assert (o2["outcome"], o2["correct"], o2["parsed"]) == ("ok", 1.0, "0.5")  # 0.5 counts as correct
    assert o3["outcome"] == "error" and o3["correct"] is None and "api_timeout" in o3["error"]
    assert o1["n_options"] is None and o1["prediction"] == "It is the liver"
    assert (["Which organ is shown?", "Which side?", "Which stage?"], 512) in model.calls


@pytest.mark.parametrize("reply", ["", "n/a", None])
def test_no_number_is_no_score(reply: str | None) -> None:
    assert parse_score(reply) is None
