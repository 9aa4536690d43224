"""Failures inside the VLM runner become ``error`` answers, never exceptions; an out-of-memory
batch is split until it fits (stub models, no weights)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from medrobust_lib.config.vlm import VLMModelConfig
from medrobust_lib.tracks.vlm.model import Runner, guarded_batch, is_out_of_memory


class OutOfMemoryError(RuntimeError):
    """Named like ``torch.cuda.OutOfMemoryError``."""


class _Stub:
    """A local model that runs out of memory above ``fits`` prompts per call, fails outright on
    prompts containing ``broken`` and records every call's batch size."""

    def __init__(self, fits: int) -> None:
        self.fits = fits
        self.calls: list[int] = []

    def _check(self, prompts: Sequence[str]) -> None:
        self.calls.append(len(prompts))
        if len(prompts) > self.fits:
            raise OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        if any("broken" in p for p in prompts):
            raise ValueError("tokenizer failed")

    def generate(self, images: Sequence[Any], prompts: Sequence[str], *, max_new_tokens: int = 8,
                 batch_size: int = 8) -> list[str]:
        self._check(prompts)
        return [f"answer to {p}" for p in prompts]

    def score(self, images: Sequence[Any], prompts: Sequence[str], options: Sequence[str], *,
              batch_size: int = 8) -> list[dict[str, float]]:
        self._check(prompts)
        return [{"yes": -0.1, "no": -2.0} for _ in prompts]


def _runner(stub: _Stub, batch_size: int) -> Runner:
    r = Runner.__new__(Runner)
    r.m = VLMModelConfig(id="stub", batch_size=batch_size)
    r.api, r.hf = None, stub
    return r


def test_out_of_memory_is_recognised() -> None:
    assert is_out_of_memory(OutOfMemoryError("x")) and is_out_of_memory(RuntimeError("CUDA out of memory."))
    assert is_out_of_memory(MemoryError()) and not is_out_of_memory(ValueError("bad shape"))


def test_oom_batches_are_split_until_they_fit() -> None:
    stub = _Stub(fits=2)
    prompts = [f"q{i}" for i in range(8)]
    out = _runner(stub, batch_size=8).generate([np.zeros((2, 2), np.float32)] * 8, prompts, 4)
    assert [a.outcome for a in out] == ["ok"] * 8
    assert [a.text for a in out] == [f"answer to q{i}" for i in range(8)]  # order kept
    assert stub.calls == [8, 4, 2, 2, 4, 2, 2]


def test_a_single_prompt_that_does_not_fit_is_an_error_row() -> None:
    stub = _Stub(fits=0)
    out = _runner(stub, batch_size=4).yes_no([None] * 3, ["a", "b", "c"])
    assert [a.outcome for _, a in out] == ["error"] * 3 and all(lp is None for lp, _ in out)
    assert all("out of memory" in str(a.error) for _, a in out)


def test_other_exceptions_fail_their_batch_only() -> None:
    stub = _Stub(fits=10)
    out = _runner(stub, batch_size=2).generate([None] * 4, ["a", "broken", "c", "d"], 4)
    assert [a.outcome for a in out] == ["error", "error", "ok", "ok"]
    assert out[0].error == "ValueError: tokenizer failed" and out[0].text is None


def test_wrong_result_length_is_an_error() -> None:
    got = guarded_batch(lambda i, p: ["only one"], [None, None], ["a", "b"])
    assert [e is not None for _, _, e in got] == [True, True]
    assert "1 results for 2 prompts" in str(got[0][2])


def test_torch_cuda_oom_class_is_recognised() -> None:
    torch = pytest.importorskip("torch")
    assert is_out_of_memory(torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB"))
