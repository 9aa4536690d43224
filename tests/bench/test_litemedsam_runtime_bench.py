"""The runtime table of ``bench/litemedsam_bench.py`` (issue 47) on stand-in models: every engine
timed in every round, paired ratios against PyTorch fp32, logit differences against it, and the
Markdown table (the real run: ``python -m bench.litemedsam_bench``; numbers in docs/performance.md)."""

from __future__ import annotations

from typing import Any, cast

import numpy as np
import pytest
import torch

from bench import litemedsam_bench
from bench.litemedsam_bench import runtime_comparison, runtime_table

CLOCK = [0.0]
"""A clock that only the stand-in models move: the timings are exact whatever the machine does."""


class Stand:
    """Takes ``sec`` of :data:`CLOCK` per image; its logits are PyTorch's plus ``offset``."""

    def __init__(self, sec: float, offset: float) -> None:
        self.sec, self.offset, self.calls, self.cleared = sec, offset, 0, 0

    def clear_embedding_cache(self) -> None:
        self.cleared += 1

    def predict(self, images: list[np.ndarray], boxes: list[np.ndarray], batch_size: int = 8) -> None:
        self.calls += 1
        CLOCK[0] += self.sec * len(images)

    def encode(self, x: torch.Tensor) -> None:
        self.calls += 1
        CLOCK[0] += self.sec * len(x)

    def predict_logits(self, images: list[np.ndarray], boxes: list[np.ndarray], batch_size: int = 8) -> list[np.ndarray]:
        return [np.full((len(b), *im.shape[:2]), -1.0 + self.offset, np.float32) for im, b in zip(images, boxes, strict=True)]


def test_rows_pair_every_engine_with_pytorch_fp32(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(litemedsam_bench.time, "perf_counter", lambda: CLOCK[0])
    models = {"pytorch-fp32": Stand(0.004, 0.0), "onnxruntime": Stand(0.002, 1e-5), "openvino": Stand(0.002, 2.0)}
    rows = runtime_comparison(cast(dict[str, Any], models), [1, 2], rounds=3, size=32, many_prompts=5)
    assert [(r.what, r.batch) for r in rows[::3]] == [("end to end (predict)", 1), ("encoder only", 1),
                                                     ("end to end (predict)", 2), ("encoder only", 2),
                                                     ("end to end, 5 box prompts on one image", 1)]
    assert all(m.calls == 5 * 4 for m in models.values())  # a warm-up and 3 rounds per case, every engine
    assert all(m.cleared == m.calls for m in models.values())  # every call encodes as a new image would
    for r in rows:
        if r.engine == "pytorch-fp32":
            assert r.ratio == 1.0 and r.max_abs_diff == 0.0 and r.mask_diff == 0.0
        else:
            assert r.ratio == pytest.approx(2.0) and r.sec_per_img == pytest.approx(0.002), r
    ort = next(r for r in rows if r.engine == "onnxruntime")
    ov = next(r for r in rows if r.engine == "openvino")
    assert ort.max_abs_diff < 1e-4 and ort.mask_diff == 0.0
    assert ov.max_abs_diff == 2.0 and ov.mask_diff == 1.0  # -1 + 2 > 0: every pixel flips
    lines = runtime_table(rows, {"onnxruntime": 4.2})
    assert lines[1].startswith("| what | batch | engine | ms/img |") and len(lines) == 3 + len(rows) + 1
    assert "onnxruntime: first preparation 4.2 s" in lines[-1]
