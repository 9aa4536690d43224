"""The optional LLM judge: prompt, verdict parsing, failures recorded, text only."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from medrobust_lib.vlm_tasks.judge import judge_mc, judge_prompt, parse_verdict


@dataclass
class _R:
    text: str | None
    outcome: str = "ok"


class _Judge:
    def __init__(self, replies: list[_R]) -> None:
        self.replies, self.seen = replies, []

    def generate(self, images: list[Any], prompts: list[str]) -> list[_R]:
        assert all(im is None for im in images)  # the judge never sees the image
        self.seen.extend(prompts)
        return self.replies


def test_prompt_shows_question_options_and_answer() -> None:
    p = judge_prompt("Which organ?", ["Liver", "Lung"], "it is the lung")
    assert "Question: Which organ?" in p and "A. Liver\nB. Lung" in p and "Model answer: it is the lung" in p


def test_parse_verdict() -> None:
    assert parse_verdict("B", 3).letter == "B"
    assert parse_verdict(" (c). ", 3).letter == "C"
    assert parse_verdict("NONE", 3).outcome == "none"
    assert parse_verdict("D", 3).outcome == "unreadable"  # not a valid option
    assert parse_verdict("B or C", 3).letter is None
    assert parse_verdict(None, 3).outcome == "unreadable"


def test_judge_mc_records_failures() -> None:
    j = _Judge([_R("A"), _R(None, "http_error"), _R("none")])
    v = judge_mc(j, ["q1", "q2", "q3"], [["x", "y"]] * 3, ["a1", "a2", "a3"])
    assert [x.letter for x in v] == ["A", None, None]
    assert [x.outcome for x in v] == ["ok", "api_http_error", "none"]
    assert len(j.seen) == 3 and judge_mc(j, [], [], []) == []
