"""The feed on the device (issue 48, item 2): LiteMedSAM's official preprocessing as a device
operation, and perturbed device batches scored by a model without a host round trip."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from medrobust_lib.data.dataset import DatasetConfig, iter_dataset
from medrobust_lib.data.sample import Sample
from medrobust_lib.demo.manifest import DemoManifest
from medrobust_lib.models.device_preprocess import area_resize_u8, longest_side_size, official_input_device
from medrobust_lib.models.litemedsam import load_litemedsam, official_input, resized_size, to_uint8_rgb
from medrobust_lib.perturb import torch_engine as E
from medrobust_lib.perturb import torch_ops as T
from medrobust_lib.perturb.spec import get_perturbation


@pytest.fixture(scope="module", autouse=True)
def one_thread(one_torch_thread: None) -> None:
    """Every test of this module on one torch thread (tests/conftest.py)."""


@pytest.fixture(scope="module")
def demo_images(demo_root: Path) -> list[Sample]:
    out = []
    for d in DemoManifest.load(demo_root).datasets:
        cfg = DatasetConfig(name=d.name, modality=d.modality, format=d.format, root=d.root, options=d.options)
        out.append(min((s for s in iter_dataset(cfg) if isinstance(s, Sample)), key=lambda s: s.sample_id))
    return out


def _resized(image: np.ndarray, h: int, w: int) -> np.ndarray:
    if image.shape[:2] == (h, w):
        return image
    out = np.clip(cv2.resize(image, (w, h), interpolation=cv2.INTER_CUBIC), 0, 1).astype(np.float32)
    return out.reshape((h, w) + image.shape[2:])


def _rgb_batch(image: np.ndarray) -> torch.Tensor:
    x = T.as_batch([image])
    return x.expand(-1, 3, -1, -1) if x.shape[1] == 1 else x


EXACT_SIZES = [(256, 256), (512, 512), (1024, 1024), (200, 200), (255, 100)]
FRACTIONAL_SIZES = [(300, 300), (333, 150), (700, 1000)]


@pytest.mark.parametrize("size", EXACT_SIZES)
def test_device_preprocessing_equals_the_official_input(demo_images: list[Sample], size: tuple[int, int]) -> None:
    """The quantised device path gives the official script's model input exactly (cv2's uint8
    INTER_AREA output, its roundings and its fixed-point enlarging reproduced) on the demo images
    at their own size, integer shrinking factors and enlarging."""
    images = demo_images if size in ((256, 256), (200, 200)) else demo_images[::3]
    for s in images:
        image = _resized(s.image, *size)
        ref = official_input(to_uint8_rgb(image))[0]
        got = official_input_device(_rgb_batch(image))
        assert got.shape == ref.shape and got.dtype == torch.float32
        torch.testing.assert_close(got, ref, rtol=0, atol=0)


@pytest.mark.parametrize("size", FRACTIONAL_SIZES)
def test_fractional_shrinking_is_within_one_uint8_step(demo_images: list[Sample], size: tuple[int, int]) -> None:
    """A fractional shrink: cv2 sums in float32 and rounds, the device in float64: a resized value
    that lies within float32 rounding of a half step can round the other way (measured: 500 of
    11.8 million model-input values over the demo images at six sizes). Never more than one step."""
    differing = total = 0
    for s in demo_images[::2]:
        u8 = to_uint8_rgb(_resized(s.image, *size))
        nh, nw = resized_size(*size)
        ref = cv2.resize(u8, (nw, nh), interpolation=cv2.INTER_AREA).astype(np.float64)
        got = area_resize_u8(torch.from_numpy(u8.astype(np.float64)).permute(2, 0, 1)[None], (nh, nw))
        diff = np.abs(got[0].permute(1, 2, 0).numpy() - ref)
        assert diff.max() <= 1.0
        differing += int((diff > 0).sum())
        total += diff.size
    assert differing <= 1e-3 * total


@pytest.mark.parametrize("size", EXACT_SIZES[1:] + FRACTIONAL_SIZES)
def test_float_resize_is_within_one_uint8_step_of_cv2(demo_images: list[Sample], size: tuple[int, int]) -> None:
    """Before rounding, the device resize of the quantised image is within 1/255 of cv2's uint8
    output (half a step when shrinking, 0.75 when enlarging: cv2's 11-bit weights)."""
    for s in demo_images[::2]:
        u8 = to_uint8_rgb(_resized(s.image, *size))
        nh, nw = resized_size(*size)
        ref = cv2.resize(u8, (nw, nh), interpolation=cv2.INTER_AREA).astype(np.float64)
        x = torch.from_numpy(u8.astype(np.float64)).permute(2, 0, 1)[None]
        got = area_resize_u8(x, (nh, nw), quantise=False)[0].permute(1, 2, 0).numpy()
        assert np.abs(got - ref).max() <= 1.0


def test_longest_side_rule_is_litemedsams() -> None:
    for h, w in [(256, 256), (1024, 700), (130, 90), (255, 100), (3000, 17)]:
        assert longest_side_size(h, w) == resized_size(h, w)


@pytest.fixture(scope="module")
def litemedsam() -> object:
    return load_litemedsam()


def test_litemedsam_preprocesses_a_device_batch_on_the_device(litemedsam: object, demo_images: list[Sample]) -> None:
    """The hook ``preprocess_exact_device``: a device batch gets the host path's model input."""
    from medrobust_lib.models.sam import SamSegmenter

    assert isinstance(litemedsam, SamSegmenter)
    images = [_resized(s.image, 300, 300) for s in demo_images[:4]]
    for group in (images[:2], images[2:]):
        x = litemedsam._upload([T.as_batch([im])[0] for im in group])
        torch.testing.assert_close(litemedsam.preprocess_exact_device(x), litemedsam.preprocess_exact(group),
                                   rtol=0, atol=1.5 / 255)


def _score_both_ways(model: object, samples: list[Sample], names: tuple[str, ...]) -> None:
    """Score the device engine's outputs as device tensors and as host arrays; assert equal."""
    from medrobust_lib.models.sam import SamSegmenter
    from medrobust_lib.prompts import PromptConfig, prompt_boxes

    assert isinstance(model, SamSegmenter)
    prompt = PromptConfig()
    for name in names:
        spec = get_perturbation(name)
        out = E.perturbed_batch(name, samples, [spec.levels[2]] * len(samples), 0, device=model.device)
        assert out.images.device == model.device and out.masks is not None
        masks = list(out.masks)
        boxes = [prompt_boxes(s, prompt, mask=m.cpu().numpy()) for s, m in zip(samples, masks, strict=True)]
        dev = model.score(zip(list(out.images), boxes, masks, strict=True), batch_size=4)
        host = model.score(zip(T.to_images(out.images), boxes, [m.cpu().numpy() for m in masks], strict=True),
                           batch_size=4)
        np.testing.assert_array_equal(dev.iou, host.iou)
        np.testing.assert_array_equal(dev.dice, host.dice)


def test_device_batches_score_as_their_host_copies_tiny_sam(demo_images: list[Sample]) -> None:
    """The demo's SAM architecture (random weights, default preprocessing): a device batch of
    perturbed images and masks scores exactly as its host copy."""
    from medrobust_lib.models.sam import SamSegmenter, arch_for, build_sam

    model = SamSegmenter(build_sam(arch_for("tiny", "sam"), seed=0), "sam", "tiny-random", "random", device="cpu")
    samples = [s for s in demo_images if s.mask is not None and s.mask.any() and s.n_channels == 1][:2]
    _score_both_ways(model, samples, ("gaussian_noise", "rotation"))


@pytest.mark.slow
def test_perturbed_device_batches_score_as_their_host_copies_litemedsam(litemedsam: object,
                                                                        demo_images: list[Sample]) -> None:
    """LiteMedSAM (``preprocess: exact``): the official steps on the device, the same scores."""
    samples = [s for s in demo_images if s.mask is not None and s.mask.any() and s.n_channels == 1][:2]
    _score_both_ways(litemedsam, samples, ("gaussian_noise", "rotation"))


@pytest.mark.gpu
def test_device_feed_on_cuda(demo_images: list[Sample]) -> None:
    """On a CUDA device: the official preprocessing on the GPU gives the host's model input, and
    LiteMedSAM scores the device engine's batches as their host copies (to a pixel or so: cuDNN)."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    for size in EXACT_SIZES:
        for s in demo_images[::3]:
            image = _resized(s.image, *size)
            got = official_input_device(_rgb_batch(image).cuda()).cpu()
            torch.testing.assert_close(got, official_input(to_uint8_rgb(image))[0], rtol=0, atol=0)
    from medrobust_lib.models.sam import SamSegmenter
    from medrobust_lib.prompts import PromptConfig, prompt_boxes

    model = load_litemedsam(device="cuda")
    assert isinstance(model, SamSegmenter)
    samples = [s for s in demo_images if s.mask is not None and s.mask.any() and s.n_channels == 1][:4]
    for name in ("gaussian_noise", "rotation", "gibbs_ringing"):
        spec = get_perturbation(name)
        out = E.perturbed_batch(name, samples, [spec.levels[2]] * len(samples), 0, device="cuda")
        assert out.images.is_cuda and out.masks is not None and out.masks.is_cuda
        boxes = [prompt_boxes(s, PromptConfig(), mask=m.cpu().numpy()) for s, m in zip(samples, out.masks, strict=True)]
        dev = model.score(zip(list(out.images), boxes, list(out.masks), strict=True), batch_size=4)
        host = model.score(zip(T.to_images(out.images), boxes, [m.cpu().numpy() for m in out.masks], strict=True),
                           batch_size=4)
        np.testing.assert_allclose(dev.iou, host.iou, rtol=0, atol=1e-3)
