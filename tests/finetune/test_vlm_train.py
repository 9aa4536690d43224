"""The VLM training loop's per-parameter learning-rate factors (``VLMTrainConfig.lr_scales``)."""

from __future__ import annotations

import copy

import numpy as np
import torch

from medrobust_lib.models.tiny_vlm import build_tiny_llava, build_tokenizer
from medrobust_lib.seeding import rng_for
from medrobust_lib.training.vlm_train import VLMExample, VLMTrainConfig, encode_examples, train_vlm

TEXTS = ["is there a lesion ?", "yes", "no"]


def test_lr_scales_scale_the_update_of_the_matching_parameters() -> None:
    """One AdamW step from the same weights on the same batch: with the tower at factor 0.5 its
    update (decay included) is half the unscaled one, and every other parameter moves exactly as
    without factors."""
    torch.set_num_threads(1)
    model, proc = build_tiny_llava(build_tokenizer(TEXTS), seed=2)
    ex = [VLMExample(f"img{i}", rng_for("lr-scales", i).random((64, 64), dtype=np.float32), TEXTS[0],
                     "yes" if i % 2 else "no") for i in range(4)]
    data = encode_examples(proc, ex)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    moved = {}
    for scales in ((), (("model.vision_tower.", 0.5),)):
        m = copy.deepcopy(model)
        cfg = VLMTrainConfig(max_steps=1, batch_size=4, lr=1e-2, eval_every=1, patience=1, seed=0, lr_scales=scales)
        train_vlm(m, proc, data, data, cfg)
        moved[scales] = {n: p.detach() - start[n] for n, p in m.named_parameters()}
    plain, scaled = moved[()], moved[(("model.vision_tower.", 0.5),)]
    tower = [n for n in plain if n.startswith("model.vision_tower.")]
    assert tower and len(tower) < len(plain)
    assert sum(float(plain[n].abs().max()) > 0 for n in tower) > len(tower) // 2  # unused ones stay
    for n in plain:
        if n in tower:
            torch.testing.assert_close(scaled[n], 0.5 * plain[n], rtol=1e-4, atol=1e-6)  # deltas of float32 weights near 1
        else:
            torch.testing.assert_close(scaled[n], plain[n], rtol=0, atol=0)


def test_without_a_validation_set_every_step_trains_and_the_last_weights_stay() -> None:
    """A suite whose ``splits`` have no validation share (the reference's 80/20): nothing to select
    on, so no early stop and the last step's weights are kept."""
    torch.set_num_threads(1)
    model, proc = build_tiny_llava(build_tokenizer(TEXTS), seed=2)
    ex = [VLMExample(f"img{i}", rng_for("no-val", i).random((64, 64), dtype=np.float32), TEXTS[0],
                     "yes" if i % 2 else "no") for i in range(4)]
    data, empty = encode_examples(proc, ex), encode_examples(proc, [])
    cfg = VLMTrainConfig(max_steps=3, batch_size=4, lr=1e-2, eval_every=1, patience=1, seed=0)
    res = train_vlm(model, proc, data, empty, cfg)
    assert (res.steps, res.best_step, res.stopped_early) == (3, 3, False) and np.isnan(res.best_val_loss)
    assert [h["step"] for h in res.history] == [1, 2, 3] and "val_loss" not in res.history[0]
