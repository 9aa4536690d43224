"""Per-family fidelity switches against transcriptions of the published inference code.

* MedSAM ``preprocess="exact"``: bowang-lab/MedSAM ``MedSAM_Inference.py`` (image preprocessing
  at module level and ``medsam_inference``), transcribed step by step below.
* SAM-Med2D ``mask_selection="best_iou"``: OpenGVLab/SAM-Med2D
  ``segment_anything/predictor_sammed.py`` (``SammedPredictor.set_image``, ``predict_torch`` with
  its default ``multimask_output=True`` and ``postprocess_masks``), transcribed below; the BGR
  channel order is what the project's ``cv2.imread`` loaders hand it.

The transcriptions call the segment-anything modules directly (``image_encoder``,
``prompt_encoder``, ``mask_decoder.forward``), never the adapter under test. The published code
uses 1024 px (MedSAM) and 256 px (SAM-Med2D); the tiny random models here use 128 px, so the
transcriptions take the model's ``img_size`` where the scripts hard-code theirs.
"""

from __future__ import annotations

from dataclasses import replace

import cv2
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from skimage import transform

from medrobust_lib.models.sam import ARCHS, SamSegmenter, build_sam, default_mask_selection

ARCH = replace(ARCHS["vit_b"], encoder_embed_dim=64, encoder_depth=2, encoder_num_heads=2,
               encoder_global_attn_indexes=(1,), image_size=128, window_size=4, prompt_embed_dim=64,
               decoder_mlp_dim=128, decoder_num_heads=2, iou_head_hidden_dim=32, mask_in_chans=8)


def _image(shape: tuple[int, ...], seed: int) -> np.ndarray:
    """A float32 [0, 1] image holding 8-bit values (as read from a PNG) with a bright blob."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0 : shape[0], 0 : shape[1]]
    blob = ((yy - shape[0] * 0.4) ** 2 + (xx - shape[1] * 0.55) ** 2 < (min(shape[:2]) * 0.2) ** 2)
    base = 60 + 120 * blob + rng.integers(0, 60, shape[:2])
    u8 = np.clip(base[..., None] * np.array([1.0, 0.8, 0.6]) if len(shape) == 3 else base, 0, 255).astype(np.uint8)
    return (u8 / 255.0).astype(np.float32)


@torch.no_grad()
def medsam_inference_transcribed(sam: torch.nn.Module, image: np.ndarray, box: np.ndarray) -> np.ndarray:
    """MedSAM_Inference.py: returns ``low_res_pred`` (H, W) probabilities (before ``> 0.5``)."""
    s = int(sam.image_encoder.img_size)  # the script's 1024
    img_np = np.rint(image.astype(np.float64) * 255).astype(np.uint8)  # io.imread of the 8-bit file
    img_3c = np.repeat(img_np[:, :, None], 3, axis=-1) if len(img_np.shape) == 2 else img_np
    H, W, _ = img_3c.shape  # noqa: N806 - the script's names
    img_1024 = transform.resize(img_3c, (s, s), order=3, preserve_range=True, anti_aliasing=True).astype(np.uint8)
    img_1024 = (img_1024 - img_1024.min()) / np.clip(img_1024.max() - img_1024.min(), a_min=1e-8, a_max=None)
    img_1024_tensor = torch.tensor(img_1024).float().permute(2, 0, 1).unsqueeze(0)
    box_np = np.array([box])
    box_1024 = box_np / np.array([W, H, W, H]) * s
    image_embedding = sam.image_encoder(img_1024_tensor)
    # medsam_inference(medsam_model, img_embed, box_1024, H, W)
    box_torch = torch.as_tensor(box_1024, dtype=torch.float, device=image_embedding.device)
    if len(box_torch.shape) == 2:
        box_torch = box_torch[:, None, :]
    sparse_embeddings, dense_embeddings = sam.prompt_encoder(points=None, boxes=box_torch, masks=None)
    low_res_logits, _ = sam.mask_decoder(image_embeddings=image_embedding, image_pe=sam.prompt_encoder.get_dense_pe(),
                                         sparse_prompt_embeddings=sparse_embeddings,
                                         dense_prompt_embeddings=dense_embeddings, multimask_output=False)
    low_res_pred = torch.sigmoid(low_res_logits)
    low_res_pred = F.interpolate(low_res_pred, size=(H, W), mode="bilinear", align_corners=False)
    return low_res_pred.squeeze().cpu().numpy()


@torch.no_grad()
def sammed_predict_transcribed(sam: torch.nn.Module, image: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """SammedPredictor.set_image + predict_torch(boxes=(K, 4), return_logits=True), then the
    sigmoid its ``return_logits=False`` applies before ``> 0.5``: probabilities (K, H, W)."""
    s = int(sam.image_encoder.img_size)
    image_bgr = (image.astype(np.float64) * 255.0)[..., ::-1]  # cv2.imread -> BGR; set_image's "RGB" = model's
    pixel_mean, pixel_std = sam.pixel_mean.squeeze().numpy(), sam.pixel_std.squeeze().numpy()
    input_image = (image_bgr - pixel_mean) / pixel_std
    ori_h, ori_w, _ = input_image.shape
    resized = cv2.resize(input_image, (s, s), interpolation=cv2.INTER_NEAREST)  # A.Resize(INTER_NEAREST)
    features = sam.image_encoder(torch.from_numpy(resized.transpose(2, 0, 1).copy()).float()[None])
    # apply_boxes: coords * (new / old) in float
    b = boxes.reshape(-1, 2, 2).astype(float)
    b[..., 0] = b[..., 0] * (s / ori_w)
    b[..., 1] = b[..., 1] * (s / ori_h)
    # predict_torch with (K, 4) boxes, K > 1: its per-box loop (each box keeps its own best mask)
    box_torch = torch.as_tensor(b.reshape(-1, 4), dtype=torch.float)
    mask_list = []
    for i in range(box_torch.shape[0]):
        pre_boxes = box_torch[i : i + 1, ...]
        sparse_embeddings, dense_embeddings = sam.prompt_encoder(points=None, boxes=pre_boxes, masks=None)
        low_res_masks, iou_predictions = sam.mask_decoder(
            image_embeddings=features, image_pe=sam.prompt_encoder.get_dense_pe(),
            sparse_prompt_embeddings=sparse_embeddings, dense_prompt_embeddings=dense_embeddings,
            multimask_output=True)
        max_values, max_indexs = torch.max(iou_predictions, dim=1)
        low_res_masks = low_res_masks[:, max_indexs]
        masks = F.interpolate(low_res_masks, (s, s), mode="bilinear", align_corners=False)
        masks = F.interpolate(masks, (ori_h, ori_w), mode="bilinear", align_corners=False)
        mask_list.append(masks)
    return torch.sigmoid(torch.cat(mask_list, dim=0))[:, 0].numpy()


@pytest.mark.parametrize("shape", [(90, 120, 3), (100, 70)])
def test_medsam_exact_preprocess_follows_medsam_inference(shape: tuple[int, ...]) -> None:
    sam = build_sam(ARCH, seed=3)
    image = _image(shape, seed=1)
    box = np.array([20, 15, 60, 70], np.float32)
    want = medsam_inference_transcribed(sam, image, box)
    exact = SamSegmenter(sam, "medsam", "m", "0", preprocess="exact")
    got = exact.predict([image], [box[None]])[0]
    assert got.shape == (1, *shape[:2])
    np.testing.assert_allclose(got[0], want, atol=1e-5)
    assert np.array_equal(got[0] > 0.5, want > 0.5)
    # the switch matters: the default (differentiable, bilinear) pipeline gives other probabilities
    default = SamSegmenter(sam, "medsam", "m", "0").predict([image], [box[None]])[0]
    assert float(np.abs(default[0] - want).max()) > 1e-4


def test_exact_preprocess_is_medsam_only() -> None:
    with pytest.raises(ValueError, match="litemedsam and medsam"):
        SamSegmenter(build_sam(ARCH), "sam", "m", "0", preprocess="exact")
    with pytest.raises(ValueError, match="valid: default, exact"):
        SamSegmenter(build_sam(ARCH), "medsam", "m", "0", preprocess="skimage")


def test_sam_med2d_best_iou_follows_sammed_predictor() -> None:
    sam = build_sam(replace(ARCH, adapter=True), seed=5)
    image = _image((110, 90, 3), seed=2)
    boxes = np.array([[10, 12, 60, 80], [30, 5, 85, 50], [0, 0, 90, 110]], np.float32)
    seg = SamSegmenter(sam, "sam_med2d", "m", "0")
    assert seg.mask_selection == "best_iou" == default_mask_selection("sam_med2d")
    want = sammed_predict_transcribed(sam, image, boxes)
    got = seg.predict([image], [boxes])[0]
    np.testing.assert_allclose(got, want, atol=1e-5)
    # with these boxes the predicted-IoU winner is not always the single-mask token
    single = SamSegmenter(sam, "sam_med2d", "m", "0", mask_selection="single").predict([image], [boxes])[0]
    assert float(np.abs(single - want).max()) > 1e-4


def test_mask_selection_defaults_and_validation() -> None:
    assert default_mask_selection("sam") == default_mask_selection("medsam") == "single"
    with pytest.raises(ValueError, match="valid: single, best_iou"):
        SamSegmenter(build_sam(ARCH), "sam", "m", "0", mask_selection="best")
