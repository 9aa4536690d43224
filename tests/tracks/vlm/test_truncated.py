"""Token caps never cut an answer silently: each generated task asks with its own configured cap,
an answer that reached it carries ``truncated`` (kept and scored as it is), and every VLM view
counts the truncated answers behind its numbers."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from medrobust_lib.config import Suite, load_suite
from medrobust_lib.config.vlm import VLMModelConfig
from medrobust_lib.store import results
from medrobust_lib.store.marts import build_mart, connect_readonly
from medrobust_lib.store.schema import VLM_TABLE
from medrobust_lib.tracks.datasets import build_clean_index
from medrobust_lib.tracks.vlm.evaluate import evaluate_clean
from medrobust_lib.tracks.vlm.model import Answer
from medrobust_lib.tracks.vlm.stats import vlm_task_drops_wide
from tests.suite_helpers import write_suite

CAPS = {"max_new_tokens": 7, "caption_max_new_tokens": 300, "grounding_max_new_tokens": 50}


class CappedRunner:
    """Answers every generated prompt with ``cut`` tokens when its cap is below 100 (the
    multiple-choice and grounding caps above), else with a finished answer; yes/no by logprobs."""

    checkpoint = "capped"
    adapter = None
    n_vision_calls = 0
    box_scale = "0-1"

    def __init__(self) -> None:
        self.m = VLMModelConfig(id="capped", **CAPS)
        self.caps: list[int] = []

    def generate(self, images: Sequence[np.ndarray | None], prompts: Sequence[str],
                 max_new_tokens: int) -> list[Answer]:
        self.caps.append(max_new_tokens)
        cut = max_new_tokens < 100
        return [Answer("A [0.1, 0.1" if cut else "A lesion.", truncated=cut) for _ in prompts]

    def yes_no(self, images: Sequence[np.ndarray | None],
               prompts: Sequence[str]) -> list[tuple[dict[str, float] | None, Answer]]:
        return [({"yes": -0.1, "no": -2.4}, Answer("yes", truncated=True)) for _ in prompts]


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory, demo_root: Path) -> Suite:
    root = tmp_path_factory.mktemp("truncated")
    s = load_suite(write_suite(root, demo_root, modalities=["ct"],
                               vlm={"models": [{"id": "capped", **CAPS}], "split": "all"}))
    build_clean_index(s, "ct")
    return s


def test_the_defaults_leave_room_for_verbose_models() -> None:
    m = VLMModelConfig(id="any")
    assert (m.max_new_tokens, m.caption_max_new_tokens, m.grounding_max_new_tokens) == (64, 512, 128)
    with pytest.raises(ValueError):
        VLMModelConfig(id="any", grounding_max_new_tokens=0)


def test_each_task_uses_its_cap_and_cut_answers_are_flagged_and_counted(suite: Suite) -> None:
    runner = CappedRunner()
    summary = evaluate_clean(suite, "capped", "ct", runner)  # type: ignore[arg-type]
    assert sorted(set(runner.caps)) == sorted(CAPS.values())  # MC, grounding and caption caps, as configured
    df = results.read_table(suite.results_dir, VLM_TABLE)
    answered = df[df["outcome"].isin(["ok", "unparseable", "refused"])]
    by_task = answered.groupby("task")["truncated"].agg(lambda v: set(v.astype(object)))
    assert by_task["vqa_mc"] == {True} and by_task["grounding"] == {True} and by_task["caption"] == {False}
    # a yes/no answer read from log-probabilities is not generated text: never truncated
    assert answered.loc[answered["task"] == "vqa_yesno", "truncated"].isna().all()
    # a cut grounding answer is kept and scored as it is (here: no whole box, unparseable)
    assert set(answered.loc[answered["task"] == "grounding", "outcome"]) == {"unparseable"}
    n_cut = int(answered["truncated"].eq(True).sum())
    assert n_cut > 0 and summary.n_truncated == n_cut

    build_mart(suite.results_dir, suite.mart_path, max_error_share=1.0)
    con = connect_readonly(suite.mart_path)
    try:
        by_level = con.execute("select task, sum(n_truncated) from vlm_by_level where model = 'capped' "
                               "group by task").fetchall()
        drops = con.execute("select task, n_truncated from vlm_task_drops where model = 'capped' "
                            "and column_name = 'Clean'").fetchall()
        wide = vlm_task_drops_wide(con)
    finally:
        con.close()
    expected = {t: int(g["truncated"].eq(True).sum()) for t, g in df.groupby("task")}
    assert {t: int(n) for t, n in by_level} == expected
    assert {t: int(n) for t, n in drops} == expected
    assert dict(zip(wide["task"], wide["n_truncated"], strict=True)) == expected

