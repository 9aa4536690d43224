"""The fine-tuning recipe switches: linear LR decay, keeping the last weights (a split without
validation), the reference's augmentation, fp16 AMP (on CUDA)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from medrobust_lib.data.sample import Sample
from medrobust_lib.models.sam import SamSegmenter, arch_for, build_sam
from medrobust_lib.seeding import rng_for
from medrobust_lib.training.schedule import linear_with_warmup
from medrobust_lib.training.train import TrainConfig, augment_reference, lr_at, train_segmenter


@pytest.mark.parametrize("warmup,total", [(0, 10), (3, 20), (5, 5), (1, 1)])
def test_linear_schedule_is_transformers(warmup: int, total: int) -> None:
    from transformers import get_linear_schedule_with_warmup

    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = get_linear_schedule_with_warmup(opt, warmup, total)
    theirs = [float(sched.lr_lambdas[0](s)) for s in range(total + 3)]
    assert [linear_with_warmup(s, warmup, total) for s in range(total + 3)] == pytest.approx(theirs, abs=1e-12)
    cfg = TrainConfig(lr=2.0, max_steps=total, warmup_steps=warmup, lr_schedule="linear")
    assert [lr_at(s, cfg) for s in range(total + 3)] == pytest.approx([2 * t for t in theirs], abs=1e-12)


def test_vlm_linear_schedule() -> None:
    from medrobust_lib.config.vlm import VLMFinetuneSettings
    from medrobust_lib.training.vlm_train import _lr_at, adapter_train_config

    cfg = adapter_train_config(VLMFinetuneSettings(lr_schedule="linear", max_steps=40, warmup_steps=4), 100, 0)
    assert cfg.lr_schedule == "linear"
    assert [_lr_at(s, cfg) for s in range(41)] == pytest.approx([cfg.lr * linear_with_warmup(s, 4, 40)
                                                                  for s in range(41)])
    assert adapter_train_config(VLMFinetuneSettings(), 100, 0).lr_schedule == "cosine"


def _samples(n: int) -> list[Sample]:
    out = []
    for i in range(n):
        g = rng_for(0, "recipe-switch", i)
        img = g.random((64, 64), dtype=np.float32)
        mask = np.zeros((64, 64), bool)
        y, x = int(g.integers(8, 30)), int(g.integers(8, 30))
        mask[y:y + 20, x:x + 24] = True
        img[mask] = np.clip(img[mask] + 0.5, 0, 1)
        out.append(Sample(f"s{i}", "synthetic", "ct", img, mask))
    return out


def _model() -> SamSegmenter:
    torch.set_num_threads(1)
    return SamSegmenter(build_sam(arch_for("tiny", "sam"), seed=0), "sam", "tiny", "0")


def test_select_last_keeps_the_final_weights_without_validation() -> None:
    train = _samples(4)
    cfg = TrainConfig(max_steps=3, batch_size=2, warmup_steps=1, eval_every=2, select="last", augment=False)
    a, b = _model(), _model()
    res = train_segmenter(a, train, [], cfg)
    assert (res.best_step, res.steps) == (3, 3) and np.isnan(res.best_val_dice)
    res_b = train_segmenter(b, train, train[:1], cfg)  # with a validation set: the same final weights
    assert res_b.best_step == 3 and not np.isnan(res_b.best_val_dice)
    sa, sb = a.sam.state_dict(), b.sam.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    with pytest.raises(ValueError, match="select: last"):
        train_segmenter(_model(), train, [], cfg.model_copy(update={"select": "best_val"}))


def test_the_reference_augmentation_trains() -> None:
    train = _samples(4)
    cfg = TrainConfig(max_steps=2, batch_size=2, warmup_steps=0, eval_every=2, augment_set="reference", box_jitter=0.0)
    res = train_segmenter(_model(), train, train[:1], cfg)
    assert res.steps == 2


def test_augment_reference_moves_image_and_mask_together() -> None:
    s = _samples(1)[0]
    seen = set()
    for i in range(40):
        out = augment_reference(s, rng_for(0, "aug", i))
        assert out.mask is not None and out.mask.sum() == s.mask.sum()  # type: ignore[union-attr]
        flips = next(((h, v) for h in (0, 1) for v in (0, 1)
                      if np.array_equal(out.mask, s.mask[::(-1 if v else 1), ::(-1 if h else 1)])), None)  # type: ignore[index]
        assert flips is not None
        seen.add(flips)
        moved = s.image[::(-1 if flips[1] else 1), ::(-1 if flips[0] else 1)]
        if not np.array_equal(out.image, moved):  # a brightness / contrast change: alpha x + beta
            inside = (out.image > 1e-3) & (out.image < 1 - 1e-3)  # not clipped
            alpha, beta = np.polyfit(moved[inside], out.image[inside], 1)
            assert 0.8 - 1e-3 <= alpha <= 1.2 + 1e-3 and abs(beta) <= 20 / 255 + 1e-3
        assert out.image.dtype == np.float32 and 0 <= out.image.min() and out.image.max() <= 1
    assert len(seen) == 4


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="fp16 AMP trains on CUDA only")
def test_fp16_amp_with_a_gradient_scaler_trains_on_cuda() -> None:
    train = _samples(4)
    for amp in ("fp16", "bf16", "off"):
        model = SamSegmenter(build_sam(arch_for("tiny", "sam"), seed=0), "sam", "tiny", "0", "cuda")
        before = {k: v.detach().clone() for k, v in model.sam.state_dict().items()}
        cfg = TrainConfig(max_steps=4, batch_size=2, warmup_steps=0, eval_every=2, amp=amp, augment=False)  # type: ignore[arg-type]
        res = train_segmenter(model, train, train[:1], cfg)
        after = model.sam.state_dict()
        assert res.steps == 4 and np.isfinite(res.best_val_dice)
        assert any(not torch.equal(before[k], after[k]) for k in before), amp
        assert all(torch.isfinite(v).all() for v in after.values() if v.is_floating_point()), amp
