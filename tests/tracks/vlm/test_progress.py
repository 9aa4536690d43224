"""Progress of a VLM partition: ``(done, total)`` in ``model answers``, reported per chunk of the
model's batch size, of the prompts the partition sends; chunking changes no answer (a local model's
batches are the same; an endpoint's requests are one per prompt)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pandas as pd
import pytest

from medrobust_lib.config import Suite
from medrobust_lib.config.vlm import ApiSettings, VLMModelConfig
from medrobust_lib.models.api_vlm import ApiVLM
from medrobust_lib.store import results
from medrobust_lib.store.schema import VLM_TABLE
from medrobust_lib.tracks.vlm.evaluate import PROGRESS_WHAT, evaluate_clean, evaluate_perturbed
from medrobust_lib.tracks.vlm.model import Answer, Runner, chunked, progress_chunk
from tests.progress_helpers import Recorder, check_progress
from tests.tracks.unusable_helpers import LEVEL, SPLIT, broken_suite

BATCH = 2


# ---- the runner: one call of N prompts == the same prompts in chunks ------------------------------

class _LocalStub:
    """A local model whose answer names its batch (prompt + batch size): a batch that changed
    would change the answers."""

    def __init__(self) -> None:
        self.batches: list[int] = []

    def generate(self, images: Sequence[Any], prompts: Sequence[str], *, max_new_tokens: int = 8,
                 batch_size: int = 8) -> list[str]:
        self.batches.append(len(prompts))
        return [f"{p}/{len(prompts)}" for p in prompts]

    def score(self, images: Sequence[Any], prompts: Sequence[str], options: Sequence[str], *,
              batch_size: int = 8) -> list[dict[str, float]]:
        self.batches.append(len(prompts))
        return [{"yes": -0.1 * len(p), "no": -0.2 * len(prompts)} for p in prompts]


def _local(batch_size: int) -> tuple[Runner, _LocalStub]:
    r = Runner.__new__(Runner)
    r.m = VLMModelConfig(id="stub", batch_size=batch_size)
    stub = _LocalStub()
    r.api, r.hf = None, stub
    return r, stub


def _api(batch_size: int, concurrency: int) -> Runner:
    settings = ApiSettings(model="m", base_url="http://127.0.0.1:9", api_key_env=None, concurrency=concurrency,
                           max_retries=0)
    api = ApiVLM(settings)

    def post(payload: dict[str, Any], headers: dict[str, str], remaining: float) -> tuple[int, bytes, httpx.Headers]:
        text = payload["messages"][-1]["content"]
        text = text if isinstance(text, str) else json.dumps(text)
        body = {"choices": [{"message": {"content": f"answer {len(text)} {payload['max_tokens']}"},
                             "finish_reason": "stop"}]}
        return 200, json.dumps(body).encode(), httpx.Headers()

    api._post = post  # type: ignore[method-assign]
    r = Runner.__new__(Runner)
    r.m = VLMModelConfig(id="api", kind="api", api=settings, batch_size=batch_size)
    r.api, r.hf = api, None
    return r


def _same(a: Sequence[Answer], b: Sequence[Answer]) -> None:
    assert [(x.text, x.outcome, x.error, x.truncated) for x in a] == [(x.text, x.outcome, x.error, x.truncated)
                                                                      for x in b]


def test_progress_chunk_is_the_batch_size_or_a_multiple_of_the_concurrency() -> None:
    assert progress_chunk(_local(5)[0]) == 5
    assert progress_chunk(_api(3, 4)) == 4 and progress_chunk(_api(16, 8)) == 16 and progress_chunk(_api(9, 4)) == 12


@pytest.mark.parametrize("n", [1, 5, 7, 12])
def test_local_answers_in_chunks_are_those_of_one_call(n: int) -> None:
    images = [np.full((4, 4), i / 20, np.float32) for i in range(n)]
    prompts = [f"q{i}" for i in range(n)]
    whole, stub_w = _local(3)
    parts, stub_p = _local(3)
    ticks: list[int] = []
    one = whole.generate(images, prompts, 8)
    split = chunked(lambda i, p: parts.generate(i, p, 8), images, prompts, progress_chunk(parts), ticks.append)
    _same(one, split)
    assert stub_w.batches == stub_p.batches and ticks == stub_p.batches
    yn_one = whole.yes_no(images, prompts)
    yn_split = chunked(parts.yes_no, images, prompts, progress_chunk(parts), None)
    yn_ticked = chunked(parts.yes_no, images, prompts, progress_chunk(parts), ticks.append)
    assert [lp for lp, _ in yn_one] == [lp for lp, _ in yn_split] == [lp for lp, _ in yn_ticked]
    _same([a for _, a in yn_one], [a for _, a in yn_ticked])
    assert sum(ticks) == 2 * n


@pytest.mark.parametrize("n", [1, 6, 13])
def test_api_answers_in_chunks_are_those_of_one_call(n: int) -> None:
    images: list[np.ndarray | None] = [np.full((4, 4), i / 20, np.float32) if i % 3 else None for i in range(n)]
    prompts = [f"question {'x' * i}" for i in range(n)]
    r = _api(3, 4)
    ticks: list[int] = []
    one = r.generate(images, prompts, 8)
    split = chunked(lambda i, p: r.generate(i, p, 8), images, prompts, progress_chunk(r), ticks.append)
    _same(one, split)
    assert all(a.outcome == "ok" for a in one)
    assert ticks == [min(4, n - s) for s in range(0, n, 4)]
    yn_one = r.yes_no(images, prompts)  # no logprobs: the fallback generation answers
    yn_split = chunked(r.yes_no, images, prompts, progress_chunk(r), ticks.append)
    assert [lp for lp, _ in yn_one] == [lp for lp, _ in yn_split]
    _same([a for _, a in yn_one], [a for _, a in yn_split])


# ---- a partition: the total is the prompts sent, the rows are those without progress ----------------

class CountingRunner:
    """Answers every question with ``A`` (yes/no: ``yes``), counting the prompts it is sent."""

    checkpoint = "fake"
    adapter = None
    n_vision_calls = 0
    box_scale = None

    def __init__(self) -> None:
        self.m = VLMModelConfig(id="fake", batch_size=BATCH)
        self.prompts = 0
        self.calls: list[int] = []

    def generate(self, images: Sequence[np.ndarray | None], prompts: Sequence[str],
                 max_new_tokens: int) -> list[Answer]:
        self.prompts += len(prompts)
        self.calls.append(len(prompts))
        return [Answer(f"A {p[:20]}") for p in prompts]

    def yes_no(self, images: Sequence[np.ndarray | None],
               prompts: Sequence[str]) -> list[tuple[dict[str, float] | None, Answer]]:
        self.prompts += len(prompts)
        self.calls.append(len(prompts))
        return [({"yes": -0.1, "no": -2.0}, Answer("yes")) for _ in prompts]


VLM = {"models": [{"id": "fake"}], "split": SPLIT}


@pytest.fixture(scope="module")
def suites(tmp_path_factory: pytest.TempPathFactory, demo_root: Path) -> tuple[Suite, Suite]:
    return (broken_suite(tmp_path_factory.mktemp("vlm_progress_a"), demo_root, deleted=False, vlm=VLM),
            broken_suite(tmp_path_factory.mktemp("vlm_progress_b"), demo_root, deleted=False, vlm=VLM))


def _rows(suite: Suite, level: int) -> pd.DataFrame:
    df = results.read_partition(suite.results_dir, VLM_TABLE, {
        "model": "fake", "run": "clean" if level == 0 else "perturbation", "modality": "ct", "level": level})
    df = df.drop(columns=[c for c in ("latency_s",) if c in df])
    return df.sort_values(["task", "sample_id", "record_id", "perturbation"]).reset_index(drop=True)


@pytest.mark.parametrize("level", [0, LEVEL])
def test_partition_progress_counts_the_prompts_and_changes_no_row(suites: tuple[Suite, Suite], level: int) -> None:
    plain, watched = suites
    run = (lambda s, r, **kw: evaluate_clean(s, "fake", "ct", r, **kw)) if level == 0 else \
        (lambda s, r, **kw: evaluate_perturbed(s, "fake", "ct", level, r, **kw))
    r0, r1 = CountingRunner(), CountingRunner()
    rec = Recorder()
    run(plain, r0)
    run(watched, r1, progress=rec)
    assert r1.prompts == r0.prompts > 0
    check_progress(rec.calls, r1.prompts, PROGRESS_WHAT)
    assert max(r1.calls) <= BATCH  # sent in chunks of the batch size
    pd.testing.assert_frame_equal(_rows(plain, level), _rows(watched, level))
    rec2 = Recorder()
    r2 = CountingRunner()
    run(watched, r2, progress=rec2)  # a re-run asks only the error rows again: its total says so
    assert rec2.calls[-1][:2] == (r2.prompts, r2.prompts)
