"""The VLM track under ``vlm.protocol`` (reference options): the caption prompt sent, raw caption
columns beside the PTB ones, the reference grounding parse; defaults unchanged."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from medrobust_lib.config.vlm import REFERENCE_CAPTION_PROMPT, VLMModelConfig, VLMProtocol
from medrobust_lib.data.sample import Sample
from medrobust_lib.metrics.caption_raw import raw_caption_scores
from medrobust_lib.tracks.vlm.evaluate import Condition, VLMEvalSummary, ask
from medrobust_lib.tracks.vlm.items import CAPTION_PROMPT, VLMItem
from medrobust_lib.tracks.vlm.model import Answer

CAPTIONS = json.loads((Path(__file__).parent / "fixtures" / "caption_raw_reference.json").read_text())


class ScriptedRunner:
    """Answers captions from a script (by prompt order) and grounding with a fixed text; records prompts."""

    checkpoint = "scripted"
    adapter = None

    def __init__(self, captions: Sequence[str], box_text: str) -> None:
        self.m = VLMModelConfig(id="scripted")
        self.box_scale = self.m.box_scale  # what Runner resolves (declared scale, or the adapter's taught one)
        self.captions, self.box_text = list(captions), box_text
        self.prompts: list[str] = []

    def generate(self, images: Sequence[np.ndarray | None], prompts: Sequence[str],
                 max_new_tokens: int) -> list[Answer]:
        self.prompts.extend(prompts)
        if prompts and "Describe" in prompts[0]:
            return [Answer(self.captions[i]) for i in range(len(prompts))]
        return [Answer(self.box_text) for _ in prompts]

    def yes_no(self, images: Sequence[np.ndarray | None], prompts: Sequence[str]) -> list[tuple[None, Answer]]:
        return [(None, Answer("yes")) for _ in prompts]


def _setup(n: int) -> tuple[dict[tuple[str, str], list[VLMItem]], list[Condition], list[dict[str, object]]]:
    samples = CAPTIONS["samples"][:n]
    by: dict[tuple[str, str], list[VLMItem]] = {}
    conds = []
    for i, s in enumerate(samples):
        sid = f"s{i}"
        items = [VLMItem("caption", f"c{i}", "roco", sid, "xray", CAPTION_PROMPT, references=tuple(s["references"]))]
        if i == 0:
            items.append(VLMItem("grounding", "g0", "roco", sid, "xray", "Where is the lesion?",
                                 box=(20.0, 10.0, 60.0, 50.0)))
        by[("roco", sid)] = items
        img = np.zeros((100, 100), np.float32)
        conds.append(Condition(Sample(sid, "roco", "xray", img), img,
                               boxes={"g0": np.array([[20.0, 10.0, 60.0, 50.0]], np.float32)} if i == 0 else {}))
    return by, conds, samples


def test_reference_protocol_rows() -> None:
    by, conds, samples = _setup(40)
    runner = ScriptedRunner([s["prediction"] for s in samples], "[0.2, 0.1, 0.59, 0.49]")
    proto = VLMProtocol(caption_prompt=REFERENCE_CAPTION_PROMPT, caption_raw_scores=True, grounding_parse="reference")
    rows = ask(by, conds, runner, {}, VLMEvalSummary(), protocol=proto)  # type: ignore[arg-type]
    assert REFERENCE_CAPTION_PROMPT in runner.prompts and CAPTION_PROMPT not in runner.prompts
    cap = [r for r in rows if r["task"] == "caption"]
    assert len(cap) == 40 and all(r["cider_d"] is not None and r["cider_raw"] is not None for r in cap)
    # every record of the condition scored: the mean of the per-row raw CIDEr / ROUGE-L is the
    # reference code's corpus score (fixture group first_40)
    ref = CAPTIONS["groups"]["first_40"]["unrounded"]
    assert np.mean([r["cider_raw"] for r in cap]) == pytest.approx(ref["CIDEr"], abs=1e-9)
    assert np.mean([r["rouge_l_raw"] for r in cap]) == pytest.approx(ref["ROUGE-L"], abs=1e-9)
    own = raw_caption_scores([s["prediction"] for s in samples], [s["references"] for s in samples])
    assert [r["bleu_4_raw"] for r in cap] == pytest.approx(list(own.per_sample["bleu_4"].values()), abs=1e-12)
    (g,) = [r for r in rows if r["task"] == "grounding"]
    assert g["outcome"] == "ok" and g["iou"] == pytest.approx(1.0) and g["box_scale"] == "0-1"


def test_defaults_leave_the_house_protocol() -> None:
    by, conds, samples = _setup(5)
    runner = ScriptedRunner([s["prediction"] for s in samples], "[0.2, 0.1, 0.59, 0.49]")
    runner.captions = [s["prediction"] for s in samples]
    rows = ask(by, conds, runner, {}, VLMEvalSummary())  # type: ignore[arg-type]
    assert all(r["cider_raw"] is None and r["bleu_4_raw"] is None for r in rows)
    assert CAPTION_PROMPT in runner.prompts
    (g,) = [r for r in rows if r["task"] == "grounding"]
    assert g["box_scale"] == "0-1" and g["iou"] == pytest.approx(1.0, abs=0.1)  # house parse: pixel IoU
