"""MedSAM ``preprocess: hf_processor`` and SAM-Med2D ``color: rgb`` / ``resize: bilinear`` equal the
reference benchmark's wrappers (``model_zoo.py``: ``MedSAMModel.forward`` through Hugging Face
``SamProcessor``, ``SAMMed2DModel.forward``), run by ``tools/reference_protocol_fixtures.py`` with a
stand-in for the weights that records the model input."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from medrobust_lib.models.sam import SamSegmenter, arch_for, build_sam

FIX = np.load(Path(__file__).parent / "fixtures" / "preprocessing_reference.npz")
NAMES = sorted(k.split("__")[1] for k in FIX.files if k.startswith("image__"))


def _image(name: str) -> np.ndarray:
    return FIX[f"image__{name}"].astype(np.float32) / np.float32(255)


def _upload(img: np.ndarray) -> torch.Tensor:
    chw = np.repeat(img[None], 3, axis=0) if img.ndim == 2 else img.transpose(2, 0, 1)
    return torch.from_numpy(np.ascontiguousarray(chw))[None]


MEDSAM_CASES = sorted((k.split("__")[1], int(k.split("__")[2])) for k in FIX.files
                      if k.startswith("medsam_pixel_values__"))


def _medsam(size: int) -> SamSegmenter:
    sam = build_sam(replace(arch_for("tiny", "medsam"), image_size=size), seed=0)
    return SamSegmenter(sam, "medsam", "medsam-hf", "0", preprocess="hf_processor")


@pytest.fixture(scope="module")
def sammed2d() -> SamSegmenter:
    sam = build_sam(replace(arch_for("tiny", "sam_med2d"), image_size=256), seed=0)
    return SamSegmenter(sam, "sam_med2d", "sammed2d-ref", "0", color="rgb", resize="bilinear",
                        mask_selection="single")


def test_fixtures_cover_the_published_size() -> None:
    assert ("gray_tall", 1024) in MEDSAM_CASES and len(MEDSAM_CASES) == len(NAMES) + 1


@pytest.mark.parametrize(("name", "size"), MEDSAM_CASES)
def test_medsam_hf_processor_equals_samprocessor(name: str, size: int) -> None:
    medsam = _medsam(size)
    img = _image(name)
    got = medsam.preprocess_hf([img]).numpy()
    want = FIX[f"medsam_pixel_values__{name}__{size}"]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)
    h, w = img.shape[:2]
    box = torch.as_tensor(FIX[f"box__{name}"], dtype=torch.float32)[None]
    np.testing.assert_allclose(medsam.transform_boxes(box, h, w).numpy().reshape(-1),
                               FIX[f"medsam_input_boxes__{name}__{size}"].reshape(-1), atol=1e-4, rtol=0)
    # the differentiable path (attacks, fine-tuning) differs only by the uint8 round trip
    diff = medsam.preprocess(_upload(img)).detach().numpy() - want
    assert np.abs(diff).max() < 0.1 and np.abs(diff).mean() < 0.01


@pytest.mark.parametrize("name", NAMES)
def test_sammed2d_rgb_bilinear_equals_the_reference_wrapper(sammed2d: SamSegmenter, name: str) -> None:
    got = sammed2d.preprocess(_upload(_image(name))).numpy()
    want = FIX[f"sammed2d_pixel_values__{name}"]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)


def test_published_sammed2d_pipeline_is_still_the_default() -> None:
    sam = build_sam(replace(arch_for("tiny", "sam_med2d"), image_size=256), seed=0)
    seg = SamSegmenter(sam, "sam_med2d", "sammed2d", "0")
    assert (seg.color, seg.resize_mode, seg.mask_selection) == ("bgr", "nearest", "best_iou")
    img = _image("rgb_wide")
    assert not np.allclose(seg.preprocess(_upload(img)).numpy(), FIX["sammed2d_pixel_values__rgb_wide"], atol=1e-3)


def test_options_refused_outside_their_family() -> None:
    sam = build_sam(arch_for("tiny", "sam"), seed=0)
    with pytest.raises(ValueError, match="MedSAM"):
        SamSegmenter(sam, "sam", "x", "0", preprocess="hf_processor")
    with pytest.raises(ValueError, match="SAM-Med2D"):
        SamSegmenter(sam, "sam", "x", "0", color="rgb")


def test_hf_processor_and_bilinear_models_predict_at_the_input_size() -> None:
    for family, kw in (("medsam", {"preprocess": "hf_processor"}), ("sam_med2d", {"color": "rgb", "resize": "bilinear"})):
        seg = SamSegmenter(build_sam(arch_for("tiny", family), seed=0), family, "m", "0", **kw)  # type: ignore[arg-type]
        img = _image("rgb_wide")
        (probs,) = seg.predict([img], [np.array([[10.0, 10.0, 60.0, 40.0]], np.float32)])
        assert probs.shape == (1, *img.shape[:2]) and np.isfinite(probs).all()
        logits = seg.forward_logits(_upload(img), torch.tensor([[10.0, 10.0, 60.0, 40.0]]))
        assert logits.shape == (1, 1, *img.shape[:2])


def test_pipeline_options_enter_the_result_fingerprint() -> None:
    from medrobust_lib.config.segmentation import SegModelConfig
    from medrobust_lib.tracks.segmentation.evaluate import _pipeline

    assert _pipeline(SegModelConfig(id="a", family="medsam")) is None  # defaults: earlier results stay current
    assert _pipeline(SegModelConfig(id="a", family="medsam", preprocess="hf_processor")) is not None
    assert _pipeline(SegModelConfig(id="b", family="sam_med2d", color="rgb")) != _pipeline(
        SegModelConfig(id="b", family="sam_med2d", resize="bilinear"))
