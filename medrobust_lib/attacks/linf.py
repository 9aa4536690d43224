"""L-infinity FGSM and PGD against prompt-conditioned segmentation (docs/design.md, section 5).

Threat model and conventions:

* Pixel space: the attack perturbs images (B, 3, H, W) float in [0, 1] *before* the model's own
  preprocessing (resize, normalisation, padding), by calling ``model.forward_logits``; the
  perturbation budget is therefore in display units (epsilon = k/255 is k grey levels).
* Untargeted: maximise ``model.loss(logits, target)`` for the ground-truth masks (B, 1, H, W) in
  {0, 1}; the box prompts (B, 4) pixel XYXY are fixed and never perturbed. A model with several
  box prompts per image (``prompt_owner``: the image index of each of M boxes) takes (M, 4) boxes
  and (M, 1, H, W) targets, one per box (its own instance): the loss sums over them.
* Gradients are taken with ``torch.autograd.grad`` with respect to the image only: parameters get
  no ``.grad`` and their ``requires_grad`` flags are left alone. A model may take that gradient
  itself with ``input_grad(images, boxes, targets)`` (the gradient of the same loss, e.g. summed
  over chunks of images or boxes to bound the memory the autograd graph holds:
  :class:`medrobust_lib.tracks.segmentation.attack_views.AttackChunks`).
* Eval mode: the attacked ``torch.nn.Module`` (the model itself, or its module attributes such as
  ``SamSegmenter.sam``) is put in eval mode for the attack, so dropout and other train-time
  behaviour is never active, and every submodule's training flag is restored afterwards (a model
  in eval mode stays in eval mode; a model that was in train mode goes back to train mode).
* Each step ends with a projection onto the epsilon-ball around the clean image and a clamp to
  [0, 1]. Inputs are never mutated; the result is a new detached tensor on the images' device and
  dtype.
* PGD's random start is uniform in [-epsilon, epsilon] drawn from a caller-supplied
  ``torch.Generator`` (the global RNG is never used); derive it with :func:`torch_generator_for`
  from a key such as ``(seed, dataset, sample_id, "pgd", level)``. PGD returns the last iterate.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

import torch

from medrobust_lib.seeding import key_digest
from medrobust_lib.types import ATTACK_EPSILONS, ATTACK_KINDS, DEFAULT_STEP_SIZE_FACTOR, AttackKind

EPSILONS: dict[int, float] = dict(ATTACK_EPSILONS)
"""L-infinity budget per severity level, in [0, 1] pixel units."""
PGD_STEPS: dict[int, int] = {1: 3, 2: 5, 3: 7, 4: 10, 5: 15}
"""PGD iterations per severity level."""


class DifferentiableSegmenter(Protocol):
    """The part of :class:`medrobust_lib.models.base.SegmentationModel` an attack needs."""

    def forward_logits(self, images: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor: ...

    def loss(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor: ...


def torch_generator_for(*key: object) -> torch.Generator:
    """A CPU ``torch.Generator`` seeded from SHA-256 of the key (:func:`medrobust_lib.seeding.key_digest`),
    e.g. ``torch_generator_for(seed, dataset, sample_id, "pgd", level)``. Same key -> same stream,
    independent of call order and process."""
    seed = int.from_bytes(key_digest(*key)[:8], "little") & ((1 << 63) - 1)
    g = torch.Generator(device="cpu")
    g.manual_seed(seed)
    return g


def _modules(model: object) -> list[torch.nn.Module]:
    if isinstance(model, torch.nn.Module):
        return [model]
    return [v for v in vars(model).values() if isinstance(v, torch.nn.Module)] if hasattr(model, "__dict__") else []


@contextmanager
def eval_mode(model: object) -> Iterator[None]:
    """Put the model's modules in eval mode for the block, then restore every submodule's flag.

    ``model`` is a ``torch.nn.Module`` or an adapter holding modules as attributes
    (``SamSegmenter.sam``)."""
    flags = [(m, m.training) for root in _modules(model) for m in root.modules()]
    for root in _modules(model):
        root.eval()
    try:
        yield
    finally:
        for m, training in flags:
            m.training = training


def _validate(model: object, images: torch.Tensor, boxes: torch.Tensor, targets: torch.Tensor, epsilon: float) -> None:
    """Shapes and ranges of an attack's inputs. One box and target per image, unless the model
    declares ``prompt_owner`` (a (M,) index of the image each of M boxes belongs to: several box
    prompts per image, e.g. one per instance), when boxes are (M, 4) and targets (M, 1, H, W)."""
    if images.ndim != 4 or images.shape[1] not in (1, 3):
        raise ValueError(f"images must be (B, 3, H, W) or (B, 1, H, W) grayscale, got {tuple(images.shape)}")
    if not images.is_floating_point():
        raise ValueError(f"images must be floating point in [0, 1], got {images.dtype}")
    b, _, h, w = images.shape
    owner = getattr(model, "prompt_owner", None)
    m = b if owner is None else int(len(owner))
    if tuple(boxes.shape) != (m, 4):
        raise ValueError(f"boxes must be ({m}, 4) pixel XYXY, got {tuple(boxes.shape)}")
    if tuple(targets.shape) != (m, 1, h, w):
        raise ValueError(f"targets must be ({m}, 1, {h}, {w}), got {tuple(targets.shape)}")
    if not (epsilon >= 0.0 and epsilon < float("inf")):
        raise ValueError(f"epsilon must be finite and >= 0, got {epsilon}")
    if images.numel() and (float(images.min()) < 0.0 or float(images.max()) > 1.0):
        raise ValueError("images must lie in [0, 1] (attacks work in pixel space before preprocessing)")


def _input_grad(model: DifferentiableSegmenter, x_adv: torch.Tensor, boxes: torch.Tensor,
                targets: torch.Tensor) -> torch.Tensor:
    """d loss / d image at ``x_adv`` (B, 3, H, W); parameters' ``.grad`` untouched. The images may
    live on another device than the model (adapters move them); targets follow the logits. A model
    with ``input_grad`` computes it (module docstring)."""
    own = getattr(model, "input_grad", None)
    if own is not None:
        grad: torch.Tensor = own(x_adv.detach(), boxes, targets)
        return grad
    x = x_adv.detach().requires_grad_(True)
    with torch.enable_grad():
        logits = model.forward_logits(x, boxes)
        loss = model.loss(logits, targets.to(logits.device))
    (g,) = torch.autograd.grad(loss, x)
    return g


def _project(x_adv: torch.Tensor, x: torch.Tensor, epsilon: float) -> torch.Tensor:
    """Onto the L-infinity ball of radius epsilon around x, then into [0, 1]."""
    return torch.clamp(x_adv, min=x - epsilon, max=x + epsilon).clamp_(0.0, 1.0)


def fgsm(model: DifferentiableSegmenter, images: torch.Tensor, boxes: torch.Tensor, targets: torch.Tensor,
         epsilon: float) -> torch.Tensor:
    """Fast gradient sign method: ``clip(x + epsilon * sign(grad_x loss))``.

    ``images`` (B, 3, H, W) float in [0, 1]; ``boxes`` (B, 4) pixel XYXY; ``targets`` (B, 1, H, W)
    in {0, 1} (bool or float); ``epsilon`` >= 0 in [0, 1] pixel units. Returns a new tensor like
    ``images`` with ``||adv - images||_inf <= epsilon`` and values in [0, 1]; epsilon = 0 returns
    an unchanged copy without calling the model.
    """
    _validate(model, images, boxes, targets, epsilon)
    x = images.detach()
    if epsilon == 0:
        return x.clone()
    t = targets.detach().to(x.dtype)
    with eval_mode(model):
        grad = _input_grad(model, x, boxes.detach(), t)
    return _project(x + epsilon * grad.sign(), x, epsilon)


def pgd(model: DifferentiableSegmenter, images: torch.Tensor, boxes: torch.Tensor, targets: torch.Tensor,
        epsilon: float, steps: int, step_size: float | None = None, random_start: bool = True,
        generator: torch.Generator | None = None) -> torch.Tensor:
    """Projected gradient descent (ascent on the loss) under an L-infinity budget.

    Shapes and ranges as :func:`fgsm`. ``steps`` >= 1 sign-gradient steps of ``step_size``
    (default ``DEFAULT_STEP_SIZE_FACTOR * epsilon / steps``), each followed by projection onto the
    epsilon-ball and a clamp to [0, 1]. With ``random_start`` the iterate starts at
    ``clip(x + U(-epsilon, epsilon))``, the noise drawn (float32, shape of ``images``) from
    ``generator`` on the generator's device, which is then required. Returns the last iterate.
    Bit-identical for the same generator state on the same device and thread settings.
    """
    _validate(model, images, boxes, targets, epsilon)
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if step_size is None:
        step_size = DEFAULT_STEP_SIZE_FACTOR * epsilon / steps
    if not step_size >= 0:
        raise ValueError(f"step_size must be >= 0, got {step_size}")
    if random_start and generator is None:
        raise ValueError("pgd with random_start needs a torch.Generator (see torch_generator_for)")
    x = images.detach()
    if epsilon == 0:
        return x.clone()
    t = targets.detach().to(x.dtype)
    b = boxes.detach()
    if random_start and generator is not None:
        u = torch.rand(x.shape, generator=generator, device=generator.device, dtype=torch.float32)
        x_adv = _project(x + ((2.0 * u - 1.0) * epsilon).to(device=x.device, dtype=x.dtype), x, epsilon)
    else:
        x_adv = x.clone()
    with eval_mode(model):
        for _ in range(steps):
            grad = _input_grad(model, x_adv, b, t)
            x_adv = _project(x_adv + step_size * grad.sign(), x, epsilon)
    return x_adv


@dataclass(frozen=True)
class AttackSetting:
    """One attack at one level; ``epsilon`` and ``step_size`` in [0, 1] pixel units. The suite's
    ``segmentation.attacks`` (:class:`medrobust_lib.config.segmentation.AttacksConfig`) says which
    kinds run and the PGD step factor; :meth:`for_level` turns that into the setting of a level.

    FGSM has ``steps = 1``, ``step_size = epsilon``, no random start; PGD uses :data:`PGD_STEPS`,
    ``step_size = factor * epsilon / steps`` and a random start.
    """

    kind: AttackKind
    level: int
    epsilon: float
    steps: int
    step_size: float
    random_start: bool

    def __post_init__(self) -> None:
        if self.kind not in ATTACK_KINDS:
            raise ValueError(f"unknown attack kind {self.kind!r}; valid: {', '.join(ATTACK_KINDS)}")
        if not self.epsilon >= 0 or self.steps < 1 or not self.step_size >= 0:
            raise ValueError(f"invalid attack config: epsilon={self.epsilon}, steps={self.steps}, "
                             f"step_size={self.step_size}")

    @classmethod
    def for_level(cls, kind: str, level: int, step_size_factor: float = DEFAULT_STEP_SIZE_FACTOR) -> AttackSetting:
        """The house setting for a severity level 1-5 (:data:`EPSILONS`, :data:`PGD_STEPS`)."""
        if kind not in ATTACK_KINDS:
            raise ValueError(f"unknown attack kind {kind!r}; valid: {', '.join(ATTACK_KINDS)}")
        if level not in EPSILONS:
            raise ValueError(f"unknown attack level {level!r}; valid: {', '.join(map(str, EPSILONS))}")
        eps = EPSILONS[level]
        if kind == "fgsm":
            return cls("fgsm", level, eps, 1, eps, False)
        steps = PGD_STEPS[level]
        return cls("pgd", level, eps, steps, step_size_factor * eps / steps, True)

    @property
    def epsilon_255(self) -> float:
        """Epsilon in 8-bit grey levels (2, 4, ... for the house levels)."""
        return self.epsilon * 255.0

    def run(self, model: DifferentiableSegmenter, images: torch.Tensor, boxes: torch.Tensor,
            targets: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Apply this attack (:func:`fgsm` or :func:`pgd`); ``generator`` is needed for a PGD random start."""
        if self.kind == "fgsm":
            return fgsm(model, images, boxes, targets, self.epsilon)
        return pgd(model, images, boxes, targets, self.epsilon, self.steps, self.step_size, self.random_start,
                   generator)
