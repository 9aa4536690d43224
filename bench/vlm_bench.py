"""Local VLM generation benchmark. Run: .venv/bin/python -m bench.vlm_bench [--n 64] [--max-new-tokens 16]

Builds a tiny LLaVA (``medrobust_lib.models.tiny_vlm``: random weights, locally built tokenizer),
saves it with ``save_pretrained`` and loads it through the public adapter
(``HFVisionLanguageModel(folder)``), then times ``generate`` on ``--n`` random 64x64 grayscale
images with one short prompt, batched (``--batch-size``, default 16) and one at a time
(batch size 1), in the same process after one warm-up call. Prints seconds, answers/s and the
batched / one-at-a-time throughput ratio, and checks that both modes give the same answers
(left padding keeps greedy decoding independent of the batch). Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from medrobust_lib.models.hf_vlm import HFVisionLanguageModel
from medrobust_lib.models.tiny_vlm import build_tiny_llava, build_tokenizer, save_tiny
from medrobust_lib.seeding import rng_for

TEXTS = ["Is there a lesion in the left half of the image?", "Which modality is this? A. CT B. MRI",
         "The lesion is small and bright.", "yes", "no"]
PROMPT = "is there a lesion in the left half of the image ?"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--n", type=int, default=64, help="number of images")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    args = ap.parse_args()
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    images = [rng_for("vlm_bench", i).random((64, 64), dtype=np.float32) for i in range(args.n)]
    prompts = [PROMPT] * args.n
    with tempfile.TemporaryDirectory() as tmp:
        tok = build_tokenizer(TEXTS)
        model, proc = build_tiny_llava(tok, seed=1)
        folder = save_tiny(model, proc, Path(tmp) / "tiny_llava")
        vlm = HFVisionLanguageModel(folder)
        vlm.generate(images[:2], prompts[:2], max_new_tokens=args.max_new_tokens, batch_size=2)  # warm-up

        results: dict[str, tuple[float, list[str]]] = {}
        for mode, bs in ((f"batched (batch_size={args.batch_size})", args.batch_size), ("one-at-a-time", 1)):
            t0 = time.perf_counter()
            answers = vlm.generate(images, prompts, max_new_tokens=args.max_new_tokens, batch_size=bs)
            results[mode] = (time.perf_counter() - t0, answers)

    print(f"tiny LLaVA, {args.n} images 64x64, max_new_tokens={args.max_new_tokens}, "
          f"torch threads={torch.get_num_threads()}")
    print(f"{'mode':<28} {'seconds':>8} {'answers/s':>10}")
    rates = []
    for mode, (secs, _) in results.items():
        rates.append(args.n / secs)
        print(f"{mode:<28} {secs:8.2f} {rates[-1]:10.1f}")
    print(f"throughput ratio batched / one-at-a-time: {rates[0] / rates[1]:.2f}x")
    (_, a), (_, b) = results.values()
    n_same = sum(x == y for x, y in zip(a, b, strict=True))
    print(f"identical answers in both modes: {n_same}/{args.n}; "
          f"mean answer length {np.mean([len(x.split()) for x in a]):.1f} words")


if __name__ == "__main__":
    main()
