"""Probe what a tiny LLaVA learns to see: train the attribute-naming stage alone and print the
validation accuracy of each attribute (modality, side, height, size, brightness).

Run from the project root after the demo datasets exist (``medrobust run --suite
configs/demo.yaml --select datasets``)::

    python -m tools.vlm_attribute_probe [--lr 5e-4] [--steps 1500] [--image-size 64] [--patch-size 16]
                                        [--hidden 64] [--corpus N] [--position-std S] [--tower-steps N] [--threads 2]

``--corpus N`` adds the synthetic corpus of N images per modality (:mod:`medrobust_lib.demo.corpus`)
to the training images; ``--position-std`` and ``--tower-steps`` apply the demo recipe's position
init and supervised tower stage (:mod:`medrobust_lib.demo.vision_pretrain`). Side and height
questions are counted separately. A constant answer scores about 0.5 on side, height and size:
that is what the tiny LLaVA does without the tower stage (see docs/vlm.md).
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

from medrobust_lib.config import load_suite
from medrobust_lib.demo.alignment import ATTRIBUTE_QUESTIONS, attribute_examples, demo_truth
from medrobust_lib.demo.corpus import load_corpus
from medrobust_lib.training.vlm_train import VLMExample


def attribute_of(example: VLMExample) -> str:
    """The attribute an example asks about (side and height told apart by their answers)."""
    if example.answer in ("left", "right"):
        return "horizontal"
    if example.answer in ("upper", "lower"):
        return "vertical"
    for attr, template in ATTRIBUTE_QUESTIONS.items():
        if example.question.endswith(template.rsplit(" ", 1)[-1]):
            return attr
    return "other"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default="configs/demo.yaml")
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--patch-size", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--corpus", type=int, default=0, help="images per modality of an extra synthetic corpus")
    ap.add_argument("--position-std", type=float, default=None, help="std of the tower's initial position embeddings")
    ap.add_argument("--tower-steps", type=int, default=0, help="supervised tower pretraining steps first")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)

    import torch

    from medrobust_lib.demo.alignment import train_stage
    from medrobust_lib.models.hf_vlm import HFVisionLanguageModel
    from medrobust_lib.models.tiny_vlm import build_tiny_llava, build_tokenizer, save_tiny
    from medrobust_lib.tracks.finetune.vlm_adapter import samples_by_split as _samples_by_split
    from medrobust_lib.training.vlm_train import VLMTrainConfig

    torch.set_num_threads(args.threads)
    suite = load_suite(args.suite)
    by_split = _samples_by_split(suite)
    truth = demo_truth(suite)
    if args.corpus > 0:
        corpus = load_corpus(suite, args.corpus)
        by_split["train"] = by_split["train"] | corpus.samples
        truth = truth | corpus.truth
    train = attribute_examples(by_split["train"], truth)
    splits = {"train": attribute_examples(by_split["train"], truth, flips=("",)),
              "val": attribute_examples(by_split["val"], truth, flips=("",))}
    tok = build_tokenizer([f"{e.question} {e.answer}" for e in train])
    model, proc = build_tiny_llava(tok, image_size=args.image_size, patch_size=args.patch_size,
                                   text_hidden=args.hidden, vision_hidden=args.hidden, seed=suite.seed,
                                   position_std=args.position_std)
    if args.tower_steps > 0:
        from medrobust_lib.demo.vision_pretrain import pretrain_tower

        pretrain_tower(model, proc, by_split["train"], by_split["val"], truth, steps=args.tower_steps, lr=1e-3,
                       batch_size=32, seed=suite.seed, log=print)
    cfg = VLMTrainConfig(max_steps=args.steps, batch_size=32, lr=args.lr, eval_every=max(1, args.steps // 10),
                         seed=suite.seed, select_on="first_token_accuracy")
    with torch.random.fork_rng(devices=[]):
        summary = train_stage(model, proc, train, splits["val"], args.steps, cfg, log=print)
    folder = save_tiny(model, proc, Path(suite.demo.root).parent / "probe-model")
    vlm = HFVisionLanguageModel(str(folder))
    print(f"trained {summary['steps']} steps on {len(train)} examples (best step {summary['best_step']})")
    for split, examples in splits.items():
        answers = vlm.generate([e.image for e in examples], [e.question for e in examples], max_new_tokens=2,
                               batch_size=64)
        right: Counter[str] = Counter()
        total: Counter[str] = Counter()
        said: dict[str, Counter[str]] = {}
        for text, e in zip(answers, examples, strict=True):
            attr = attribute_of(e)
            word = (text.strip().split() or [""])[0]
            total[attr] += 1
            right[attr] += word == e.answer
            said.setdefault(attr, Counter())[word] += 1
        for attr in total:
            print(f"{split:5s} {attr:10s} accuracy {right[attr] / total[attr]:.3f}  n {total[attr]:4d}  "
                  f"answers {dict(said[attr].most_common(3))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
