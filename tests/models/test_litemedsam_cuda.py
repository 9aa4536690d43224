"""LiteMedSAM on a CUDA device against the official inference script's CPU outputs (fixtures by
``tools/litemedsam_official_fixtures.py``): fp32 and the suite's ``precision: bf16``. Marked
``gpu``: run by ``bench/gpu_session.sh`` on a CUDA machine, skipped elsewhere.

On CUDA, cuDNN convolutions may use TF32 and kernels differ from the CPU's, so masks are compared
by pixel agreement and Dice rather than bit equality (the CPU test asserts identity)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from medrobust_lib.metrics.segmentation import dice
from medrobust_lib.models.litemedsam import LiteMedSamSegmenter, load_litemedsam
from tests.models.litemedsam_inputs import Item, official_mask

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _masks(model: LiteMedSamSegmenter, items: list[Item]) -> list[np.ndarray]:
    logits = model.predict_logits([it.image for it in items], [it.boxes for it in items])
    return [torch.sigmoid(torch.from_numpy(lg.max(axis=0))).numpy() > 0.5 for lg in logits]


@pytest.mark.parametrize(("precision", "min_agree", "max_dice_gap"), [("fp32", 0.999, 0.005), ("bf16", 0.995, 0.02)])
def test_cuda_masks_agree_with_the_official_script(items: list[Item], official: dict[str, np.ndarray],
                                                   precision: str, min_agree: float, max_dice_gap: float) -> None:
    """Every one of the 66 items: pixel agreement with the official mask >= ``min_agree``; the mean
    Dice against the ground truth per modality within ``max_dice_gap`` of the official one."""
    model = load_litemedsam(device="cuda", precision=precision)
    masks = _masks(model, items)
    agree = []
    by_mod: dict[str, list[tuple[float, float]]] = {}
    for k, (it, m) in enumerate(zip(items, masks, strict=True)):
        ref = official_mask(official, k)
        agree.append(float((m == ref).mean()))
        if not it.name.startswith("odd/"):
            by_mod.setdefault(it.modality, []).append((dice(m, it.mask), dice(ref, it.mask)))
    gaps = {mod: abs(float(np.mean([a for a, _ in v])) - float(np.mean([b for _, b in v]))) for mod, v in by_mod.items()}
    print(f"\nLiteMedSAM cuda {precision}: min pixel agreement {min(agree):.5f}, mean {np.mean(agree):.5f}; "
          f"largest per-modality Dice gap {max(gaps.values()):.4f} ({len(gaps)} modalities)")
    assert min(agree) >= min_agree
    assert max(gaps.values()) <= max_dice_gap
