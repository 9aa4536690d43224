"""An interrupted fine-tuning run resumes from its state file and ends with exactly the weights,
optimizer state and history of an uninterrupted run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from medrobust_lib.config.common import LoraSettings
from medrobust_lib.data.sample import Sample
from medrobust_lib.models.sam import SamSegmenter, arch_for, build_sam
from medrobust_lib.seeding import scoped_torch_seed
from medrobust_lib.training.strategies import StrategyConfig, apply_strategy
from medrobust_lib.training.train import TrainConfig, TrainResult, train_segmenter


class Interrupt(Exception):
    pass


def _samples(n: int = 6) -> list[Sample]:
    g = np.random.default_rng(3)
    out = []
    for i in range(n):
        img = g.random((64, 64, 3), dtype=np.float32)
        mask = np.zeros((64, 64), bool)
        y0, x0 = 8 + 4 * i, 10 + 3 * i
        mask[y0 : y0 + 20, x0 : x0 + 18] = True
        img[mask] = np.clip(img[mask] + 0.5, 0, 1)
        out.append(Sample(f"s{i}", "synthetic", "ct", img, mask=mask))
    return out


CFG = TrainConfig(max_steps=8, batch_size=2, lr=1e-3, warmup_steps=2, eval_every=2, patience=10, augment=True)


def _run(state: Path | None, stop_at: int | None = None, cfg: TrainConfig = CFG, strategy: str = "decoder_only",
         logs: list[str] | None = None) -> tuple[SamSegmenter, TrainResult]:
    seg = SamSegmenter(build_sam(arch_for("tiny", "sam"), seed=0), "sam", "tiny", "0")  # type: ignore[arg-type]
    rep = apply_strategy(seg, StrategyConfig(strategy, lora=LoraSettings(dropout=0.3)))
    data = _samples()

    def log(msg: str) -> None:
        if logs is not None:
            logs.append(msg)
        if stop_at is not None and msg.startswith(f"step {stop_at} "):
            raise Interrupt(msg)

    with scoped_torch_seed(0, "resume-test"):  # LoRA dropout draws from the global generator
        return seg, train_segmenter(seg, data[:4], data[4:], cfg, trainable=rep.is_trainable, log=log,
                                    state_path=state)


@pytest.mark.parametrize("strategy", ["decoder_only", "lora"])
def test_resume_reproduces_the_uninterrupted_run(tmp_path: Path, strategy: str) -> None:
    ref_seg, ref = _run(tmp_path / "ref.pt", strategy=strategy)
    state = tmp_path / "state.pt"
    with pytest.raises(Interrupt):
        _run(state, stop_at=6, strategy=strategy)  # killed in the evaluation at step 6: last save at step 4
    saved = torch.load(state, weights_only=True)
    assert saved["step"] == 4 and saved["epoch"] == 2 and saved["batch_pos"] == 0
    assert saved["optimizer"]["state"] and saved["scheduler"]["last_epoch"] == 4
    logs: list[str] = []
    seg, res = _run(state, logs=logs, strategy=strategy)
    assert any(m.startswith("resumed from") and "step 4" in m for m in logs)
    assert res.steps == ref.steps == 8 and res.history == ref.history
    assert (res.best_val_dice, res.best_step) == (ref.best_val_dice, ref.best_step)
    a, b = seg.sam.state_dict(), ref_seg.sam.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_resume_mid_epoch(tmp_path: Path) -> None:
    """Two batches per epoch with eval every 3 steps: the save lands inside an epoch."""
    cfg = TrainConfig(max_steps=7, batch_size=2, lr=1e-3, warmup_steps=2, eval_every=3, patience=10)
    ref_seg, ref = _run(None, cfg=cfg)
    state = tmp_path / "state.pt"
    with pytest.raises(Interrupt):
        _run(state, stop_at=6, cfg=cfg)
    saved = torch.load(state, weights_only=True)
    assert (saved["step"], saved["epoch"], saved["batch_pos"]) == (3, 1, 1)
    seg, res = _run(state, cfg=cfg)
    assert res.history == ref.history
    assert all(torch.equal(v, ref_seg.sam.state_dict()[k]) for k, v in seg.sam.state_dict().items())


def test_state_from_another_configuration_is_ignored(tmp_path: Path) -> None:
    state = tmp_path / "state.pt"
    with pytest.raises(Interrupt):
        _run(state, stop_at=4)
    logs: list[str] = []
    other = TrainConfig(max_steps=4, batch_size=2, lr=5e-4, warmup_steps=2, eval_every=2, patience=10)
    _, res = _run(state, cfg=other, logs=logs)
    assert any(m.startswith("ignoring") for m in logs) and not any(m.startswith("resumed") for m in logs)
    assert res.steps == 4 and [h["step"] for h in res.history] == [2, 4]
