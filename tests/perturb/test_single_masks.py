"""``medrobust perturb --mask``: the moved mask is written for spatial types only (an intensity type
leaves the mask as the input's, so a copy of it would only look like a result)."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np

from medrobust_lib.perturb.single import perturb_file


def test_masks_are_written_for_spatial_types_only(tmp_path: Path) -> None:
    img = np.full((48, 48), 80, np.uint8)
    img[10:30, 12:36] = 200
    mask = np.zeros((48, 48), np.uint8)
    mask[10:30, 12:36] = 255
    cv2.imwrite(str(tmp_path / "img.png"), img)
    cv2.imwrite(str(tmp_path / "mask.png"), mask)
    recs = {r["perturbation"]: r for t in ("gaussian_noise", "rotation")
            for r in perturb_file(tmp_path / "img.png", t, "2", mask_path=tmp_path / "mask.png",
                                  output_dir=tmp_path / "out")}
    assert "mask_path" in recs["rotation"] and Path(recs["rotation"]["mask_path"]).is_file()
    assert "mask_path" not in recs["gaussian_noise"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "img_png__gaussian_noise__L2.png", "img_png__rotation__L2.png", "img_png__rotation__L2_mask.png"]
