"""Train the demo's tiny models once with the demo's own training code and commit them as package
data (``medrobust_lib/demo/weights/<model id>/`` with ``SHA256SUMS``).

Run from the project root after the demo datasets exist (``medrobust run --suite configs/demo.yaml
--select datasets``)::

    python -m tools.train_demo_weights --step-bound [--suite configs/demo.yaml] [--only tiny-sam ...]

It trains exactly what ``medrobust demo --retrain`` trains (same functions, same suite settings),
then copies each trained folder into the package with the fingerprint of its inputs. The demo
assets copy these folders (sha256-verified) instead of training whenever the fingerprint matches.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from medrobust_lib.config import load_suite
from medrobust_lib.demo import committed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default="configs/demo.yaml")
    ap.add_argument("--only", nargs="*", default=None, help="model ids (default: every trained demo model)")
    ap.add_argument("--step-bound", action="store_true",
                    help="ignore the suites' wall-clock safety nets (time_budget_s) so every run is step-bound "
                         "and reproducible on any machine (the fingerprint leaves them out)")
    args = ap.parse_args(argv)
    suite = load_suite(args.suite)
    if args.step_bound:
        seg, vlm, tax = suite.segmentation, suite.vlm, suite.taxonomy
        suite = suite.model_copy(update={
            "taxonomy": tax.model_copy(update={"train": tax.train.model_copy(update={"time_budget_s": None})}),
            "segmentation": seg.model_copy(update={"train": seg.train.model_copy(update={"time_budget_s": None})}),
            "vlm": vlm.model_copy(update={"train": vlm.train.model_copy(update={"time_budget_s": None}),
                                          "finetune": vlm.finetune.model_copy(update={"time_budget_s": None})})})
    if not suite.demo.enabled:
        raise SystemExit(f"{args.suite}: not a demo suite (demo.enabled is false)")
    want = set(args.only) if args.only else None
    sam_ids = [m.id for m in suite.segmentation.models if m.checkpoint == "trained"]
    vlm_ids = [m.id for m in suite.vlm.models if m.source == "trained"]
    lora_ids = [m.id for m in suite.vlm.models if m.adapter == "finetuned"]
    for mid in sam_ids:
        if want is None or mid in want:
            from medrobust_lib.paths import checkpoint_dir
            from medrobust_lib.tracks.segmentation.model import train_base_checkpoint

            t0 = time.perf_counter()
            r = train_base_checkpoint(suite, mid, log=print)
            dst = committed.publish(checkpoint_dir(suite, mid), mid, committed.sam_fingerprint(suite, mid))
            print(json.dumps({"model": mid, "val_dice": r.val_dice, "test_dice": r.test_dice, "steps": r.steps,
                              "seconds": time.perf_counter() - t0, "published": str(dst)}), flush=True)
    for mid in vlm_ids:
        if want is None or mid in want:
            from medrobust_lib.demo.tiny_llava_train import train_base_vlm

            r2 = train_base_vlm(suite, mid, log=print)
            dst = committed.publish(Path(r2.folder), mid, committed.vlm_fingerprint(suite))
            print(json.dumps({"model": mid, "steps": r2.steps, "best_step": r2.best_step, "seconds": r2.seconds,
                              **r2.heldout, "published": str(dst)}), flush=True)
    for mid in lora_ids:
        if want is None or mid in want:
            from medrobust_lib.tracks.finetune.vlm_adapter import adapter_folder, finetune_adapter

            r3 = finetune_adapter(suite, mid, log=print)
            dst = committed.publish(adapter_folder(suite, mid), mid, committed.adapter_fingerprint(suite))
            print(json.dumps({"model": mid, "steps": r3.steps, "best_val_loss": r3.best_val_loss,
                              "seconds": r3.seconds, "published": str(dst)}), flush=True)
    for entry in suite.taxonomy.configs:  # in order: a LoRA configuration's base comes first
        if entry.demo_training is not None and (want is None or entry.id in want):
            from medrobust_lib.demo.taxonomy_train import train_taxonomy_model

            r4 = train_taxonomy_model(suite, entry.id, log=print)
            dst = committed.publish(Path(r4.folder), entry.id, committed.taxonomy_fingerprint(suite, entry.id))
            print(json.dumps({"model": entry.id, "steps": r4.steps, "seconds": r4.seconds, "published": str(dst)}),
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
