"""Contract and effect tests for the L-infinity FGSM / PGD attacks on a briefly trained tiny SAM."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest
import torch

from medrobust_lib.attacks import (
    EPSILONS,
    PGD_STEPS,
    AttackSetting,
    DifferentiableSegmenter,
    fgsm,
    pgd,
    torch_generator_for,
)
from medrobust_lib.metrics.segmentation import binarize, iou_batch
from tests.attacks.conftest import BlobBatch, TrainedTiny

EPS = EPSILONS[4]  # 8/255


def _iou(model: DifferentiableSegmenter, images: torch.Tensor, data: BlobBatch) -> np.ndarray:
    with torch.no_grad():
        prob = torch.sigmoid(model.forward_logits(images, data.boxes))
    return iou_batch(binarize(prob[:, 0].numpy()), data.masks[:, 0].numpy() > 0.5)


def _head(data: BlobBatch, n: int) -> BlobBatch:
    return BlobBatch(data.images[:n], data.boxes[:n], data.masks[:n])


@contextmanager
def _record_training_flags(module: torch.nn.Module) -> Iterator[list[bool]]:
    seen: list[bool] = []
    handles = [m.register_forward_pre_hook(lambda mod, _args: seen.append(mod.training)) for m in module.modules()]
    try:
        yield seen
    finally:
        for h in handles:
            h.remove()


def test_fixture_model_is_trained_and_in_eval_mode(trained_tiny: TrainedTiny) -> None:
    assert trained_tiny.clean_dice > 0.6
    assert not trained_tiny.model.sam.training
    assert all(p.grad is None for p in trained_tiny.model.sam.parameters())


@pytest.mark.parametrize("kind", ["fgsm", "pgd"])
def test_budget_range_and_no_mutation(trained_tiny: TrainedTiny, kind: str) -> None:
    data = _head(trained_tiny.heldout, 2)
    images, boxes, masks = data.images.clone(), data.boxes.clone(), data.masks.clone()
    cfg = AttackSetting.for_level(kind, 5)
    adv = cfg.run(trained_tiny.model, images, boxes, masks, torch_generator_for(0, "synthetic", "s", kind, 5))
    assert adv.shape == images.shape and adv.dtype == images.dtype
    assert float((adv - images).abs().max()) <= cfg.epsilon + 1e-6
    assert float(adv.min()) >= 0.0 and float(adv.max()) <= 1.0
    assert not torch.equal(adv, images)
    assert torch.equal(images, data.images) and torch.equal(boxes, data.boxes) and torch.equal(masks, data.masks)
    assert not adv.requires_grad


def test_attacks_lower_iou_and_pgd_is_stronger(trained_tiny: TrainedTiny) -> None:
    model, data = trained_tiny.model, trained_tiny.heldout
    clean = _iou(model, data.images, data)
    adv_f = fgsm(model, data.images, data.boxes, data.masks, EPS)
    adv_p = pgd(model, data.images, data.boxes, data.masks, EPS, PGD_STEPS[4],
                generator=torch_generator_for(0, "synthetic", "heldout", "pgd", 4))
    iou_f, iou_p = _iou(model, adv_f, data), _iou(model, adv_p, data)
    assert iou_f.mean() < clean.mean()
    assert iou_p.mean() < clean.mean()
    assert iou_p.mean() <= iou_f.mean() + 1e-9


def test_pgd_is_deterministic_under_the_same_generator(trained_tiny: TrainedTiny) -> None:
    data = _head(trained_tiny.heldout, 2)
    key = (0, "synthetic", "s0", "pgd", 2)
    a = pgd(trained_tiny.model, data.images, data.boxes, data.masks, EPSILONS[2], 2, generator=torch_generator_for(*key))
    b = pgd(trained_tiny.model, data.images, data.boxes, data.masks, EPSILONS[2], 2, generator=torch_generator_for(*key))
    assert torch.equal(a, b)


def test_random_start_is_uniform_in_the_ball_and_follows_the_generator(trained_tiny: TrainedTiny) -> None:
    data = _head(trained_tiny.heldout, 1)
    # step_size 0 exposes the random start itself.
    def start(*key: object) -> torch.Tensor:
        return pgd(trained_tiny.model, data.images, data.boxes, data.masks, EPS, 1, step_size=0.0,
                   generator=torch_generator_for(*key)) - data.images

    d1, d1_again, d2 = start(0, "a", "pgd", 4), start(0, "a", "pgd", 4), start(0, "b", "pgd", 4)
    assert torch.equal(d1, d1_again)
    assert not torch.equal(d1, d2)
    inner = (data.images > EPS) & (data.images < 1 - EPS)  # unaffected by the [0, 1] clamp
    u = (d1[inner] / EPS).numpy()
    assert u.min() >= -1 - 1e-5 and u.max() <= 1 + 1e-5
    assert abs(u.mean()) < 0.02 and u.std() == pytest.approx(1 / np.sqrt(3), rel=0.05)


def test_eval_mode_kept_and_restored_and_no_parameter_grads(trained_tiny: TrainedTiny) -> None:
    model, data = trained_tiny.model, _head(trained_tiny.heldout, 1)
    flags = [p.requires_grad for p in model.sam.parameters()]
    with _record_training_flags(model.sam) as seen:
        pgd(model, data.images, data.boxes, data.masks, EPS, 2, generator=torch_generator_for(1))
        fgsm(model, data.images, data.boxes, data.masks, EPS)
    assert seen and not any(seen)
    assert not model.sam.training and not any(m.training for m in model.sam.modules())
    assert all(p.grad is None for p in model.sam.parameters())
    assert [p.requires_grad for p in model.sam.parameters()] == flags
    # A model left in train mode is attacked in eval mode and handed back in train mode.
    model.sam.train()
    try:
        with _record_training_flags(model.sam) as seen:
            fgsm(model, data.images, data.boxes, data.masks, EPS)
        assert seen and not any(seen)
        assert all(m.training for m in model.sam.modules())
    finally:
        model.sam.eval()


class _DropoutSegmenter(torch.nn.Module):
    """A toy nn.Module segmenter with dropout: the attack must switch it off."""

    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 1, 3, padding=1)
        with torch.no_grad():
            self.conv.weight.copy_(torch.randn(self.conv.weight.shape, generator=gen))
        self.drop = torch.nn.Dropout(0.5)

    def forward_logits(self, images: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
        return self.conv(self.drop(images))

    def loss(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.binary_cross_entropy_with_logits(logits, target)


def test_dropout_is_off_during_the_attack_for_a_module_model() -> None:
    model = _DropoutSegmenter().train()
    x = torch.rand(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    boxes = torch.tensor([[2.0, 2.0, 10.0, 10.0]] * 2)
    t = (x[:, :1] > 0.5).float()
    a, b = fgsm(model, x, boxes, t, EPS), fgsm(model, x, boxes, t, EPS)
    assert torch.equal(a, b)  # dropout active would make two gradients differ
    assert model.training and model.drop.training
    assert model.conv.weight.grad is None


def test_epsilon_zero_returns_the_input_unchanged(trained_tiny: TrainedTiny) -> None:
    data = _head(trained_tiny.heldout, 1)
    for adv in (fgsm(trained_tiny.model, data.images, data.boxes, data.masks, 0.0),
                pgd(trained_tiny.model, data.images, data.boxes, data.masks, 0.0, 3, generator=torch_generator_for(2))):
        assert torch.equal(adv, data.images)
        assert adv.data_ptr() != data.images.data_ptr()


def test_works_inside_a_callers_no_grad_block(trained_tiny: TrainedTiny) -> None:
    data = _head(trained_tiny.heldout, 1)
    with torch.no_grad():
        adv = fgsm(trained_tiny.model, data.images, data.boxes, data.masks.bool(), EPS)
    assert float((adv - data.images).abs().max()) == pytest.approx(EPS, abs=1e-6)


def test_attack_config_for_level() -> None:
    assert EPSILONS == {1: 2 / 255, 2: 4 / 255, 3: 6 / 255, 4: 8 / 255, 5: 10 / 255}
    assert PGD_STEPS == {1: 3, 2: 5, 3: 7, 4: 10, 5: 15}
    f = AttackSetting.for_level("fgsm", 3)
    assert (f.kind, f.level, f.steps, f.random_start) == ("fgsm", 3, 1, False)
    assert f.epsilon == f.step_size == 6 / 255 and f.epsilon_255 == pytest.approx(6.0)
    p = AttackSetting.for_level("pgd", 4)
    assert (p.steps, p.random_start) == (10, True) and p.step_size == pytest.approx(2.5 * (8 / 255) / 10)
    assert AttackSetting.for_level("pgd", 2, step_size_factor=1.0).step_size == pytest.approx((4 / 255) / 5)
    with pytest.raises(ValueError, match="valid: fgsm, pgd"):
        AttackSetting.for_level("cw", 1)
    with pytest.raises(ValueError, match="valid: 1, 2, 3, 4, 5"):
        AttackSetting.for_level("pgd", 6)
    with pytest.raises(AttributeError):
        p.epsilon = 1.0  # type: ignore[misc]


def test_torch_generator_for_is_keyed() -> None:
    def draw(*key: object) -> torch.Tensor:
        return torch.rand(4, generator=torch_generator_for(*key))

    assert torch.equal(draw(0, "ds", "s1", "pgd", 3), draw(0, "ds", "s1", "pgd", 3))
    assert not torch.equal(draw(0, "ds", "s1", "pgd", 3), draw(0, "ds", "s1", "pgd", 4))


def test_input_validation() -> None:
    model = _DropoutSegmenter().eval()
    x = torch.rand(1, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    boxes, t = torch.zeros(1, 4), torch.zeros(1, 1, 8, 8)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        fgsm(model, x + 1.0, boxes, t, EPS)
    with pytest.raises(ValueError, match="boxes"):
        fgsm(model, x, torch.zeros(2, 4), t, EPS)
    with pytest.raises(ValueError, match="targets"):
        fgsm(model, x, boxes, torch.zeros(1, 1, 4, 4), EPS)
    with pytest.raises(ValueError, match="epsilon"):
        fgsm(model, x, boxes, t, -0.1)
    with pytest.raises(ValueError, match="Generator"):
        pgd(model, x, boxes, t, EPS, 3)
    with pytest.raises(ValueError, match="steps"):
        pgd(model, x, boxes, t, EPS, 0, generator=torch_generator_for(0))
