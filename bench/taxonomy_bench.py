"""Taxonomy scoring benchmark. Run: .venv/bin/python -m bench.taxonomy_bench [--n 40] [--paraphrases 5]

For ``--n`` random images with one yes/no question and ``--paraphrases`` paraphrases each, scores
every (image, variant) pair three ways with a tiny LLaVA loaded through the public adapter:

- naive loop: ``score`` one variant at a time (the vision tower runs for every variant);
- batched per image: ``score`` all variants of an image in one batch (the tower still runs per variant);
- vision once: ``score_variants`` (image features computed once per image and reused).

Prints vision-encoder calls, seconds, and ratios against the naive loop in the same process, and
the largest log-probability difference between the methods (they must agree).
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np
import torch

from medrobust_lib.models.hf_vlm import HFVisionLanguageModel
from medrobust_lib.models.tiny_vlm import build_tiny_llava, build_tokenizer, save_tiny
from medrobust_lib.seeding import rng_for
from medrobust_lib.taxonomy.paraphrase import template_paraphrases

QUESTION = "Is the lesion located in the left half of the image?"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument("--paraphrases", type=int, default=5)
    ap.add_argument("--image-size", type=int, default=224, help="vision tower input (px); 224 is CLIP's")
    args = ap.parse_args()
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    variants = [QUESTION] + [t for t, _ in template_paraphrases(QUESTION)][: args.paraphrases]
    prompts = [v + " Answer with yes or no." for v in variants]
    images = [rng_for(0, "taxbench", i).random((256, 256), dtype=np.float32) for i in range(args.n)]
    with tempfile.TemporaryDirectory() as tmp:
        tok = build_tokenizer(prompts + ["yes no"])
        model, proc = build_tiny_llava(tok, image_size=args.image_size, patch_size=16, text_hidden=64,
                                       vision_hidden=64, layers=2)
        vlm = HFVisionLanguageModel(save_tiny(model, proc, tmp))
        vlm.score_variants(images[0], prompts, ["yes", "no"])  # warm-up
        rows = []
        outs = {}
        for name in ("naive loop", "batched per image", "vision once"):
            vlm.n_vision_calls = 0
            t0 = time.perf_counter()
            res = []
            for img in images:
                if name == "naive loop":
                    res += [vlm.score([img], [p], ["yes", "no"])[0] for p in prompts]
                elif name == "batched per image":
                    res += vlm.score([img] * len(prompts), prompts, ["yes", "no"], batch_size=len(prompts))
                else:
                    res += vlm.score_variants(img, prompts, ["yes", "no"])
            rows.append((name, vlm.n_vision_calls, time.perf_counter() - t0))
            outs[name] = np.array([[r["yes"], r["no"]] for r in res])
    base = rows[0][2]
    print(f"tiny LLaVA, {args.n} images x {len(prompts)} variants (original + {args.paraphrases} paraphrases), "
          f"vision input {args.image_size} px, torch threads {torch.get_num_threads()}")
    print(f"{'method':<20}{'vision calls':>14}{'seconds':>10}{'speed-up':>10}{'max |dlogp|':>13}")
    for name, calls, sec in rows:
        diff = float(np.abs(outs[name] - outs["naive loop"]).max())
        print(f"{name:<20}{calls:>14}{sec:>10.2f}{base / sec:>10.2f}{diff:>13.2e}")


if __name__ == "__main__":
    main()
