"""LiteMedSAM's clean Dice on the demo's real dataset (docs/litemedsam-speed-and-real-data.md).

Reads pydicom-data's MR-SIEMENS-DICOM-WithOverlays.dcm through the ``dicom`` reader with
``overlay_mask`` (native 484 x 484, and resized to 256 as the demo does), runs the packaged
LiteMedSAM (official inference, fp32, CPU) with the tight box of the mask, prints Dice and IoU, and
writes a side-by-side crop (image | ground-truth outline green, prediction red) to ``--out``.

Run: ``.venv/bin/python -m tools.litemedsam_real_overlay_figure [--out FILE.png]``.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

import cv2
import numpy as np
import numpy.typing as npt

from medrobust_lib.data.dataset import DatasetConfig, index_dataset, load_sample
from medrobust_lib.demo.real import REAL_FILES, installed_file
from medrobust_lib.metrics.segmentation import dice, iou
from medrobust_lib.models.litemedsam import load_litemedsam


def _edge(m: np.ndarray) -> np.ndarray:
    return m ^ cv2.erode(m.astype(np.uint8), np.ones((3, 3), np.uint8)).astype(bool)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("docs/img/litemedsam-real-overlay.png"))
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp())
    (root / "dicom").mkdir()
    shutil.copyfile(installed_file(REAL_FILES[0]), root / "dicom" / "mr.dcm")
    seg = load_litemedsam()
    for size in (None, 256):
        cfg = DatasetConfig(name="real", modality="mri", format="dicom", root=str(root), size=size,
                            options={"image_dir": "dicom", "overlay_mask": True})
        s = load_sample(cfg, index_dataset(cfg)[0][0])
        assert s.mask is not None and s.boxes is not None
        pred: npt.NDArray[np.bool_] = np.asarray((seg.predict([s.image], [s.boxes])[0] > 0.5).any(axis=0), dtype=bool)
        print(f"size {s.image.shape}: box {s.boxes.tolist()}, mask {int(s.mask.sum())} px, prediction "
              f"{int(pred.sum())} px, Dice {dice(pred, s.mask):.4f}, IoU {iou(pred, s.mask):.4f}")
        if size is None:
            img = (np.dstack([s.image] * 3) * 255).astype(np.uint8)
            out = img.copy()
            out[_edge(s.mask)] = [0, 255, 0]
            out[_edge(pred)] = [255, 0, 0]
            crop = (slice(200, 320), slice(10, 130))
            big = cv2.resize(np.hstack([img[crop], out[crop]]), None, fx=3, fy=3, interpolation=cv2.INTER_NEAREST)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            cv2.imwrite(str(args.out), big[..., ::-1])
    shutil.rmtree(root)


if __name__ == "__main__":
    main()
