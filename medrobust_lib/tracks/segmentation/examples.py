"""Worst-case examples of the real models: for each of a model's worst corruption types, the image
where it hurt most, drawn side by side (table ``segmentation_examples``, PNG bytes).

For every segmentation model of the suite with a real architecture (``arch`` is not the demo's
``tiny``), :func:`write_examples` ranks the (type, level) cells of its ``segmentation_results``
perturbation rows by mean IoU drop over the ok rows, takes the ``top`` worst, and in each the row
with the largest IoU drop (ties: the lower dataset / sample id). It regenerates that perturbed
image from its manifest row (bit-exact), predicts clean and perturbed with the model, and stores a
:func:`~medrobust_lib.tracks.segmentation.example_panel.example_panel` PNG with the row's
identifiers and both IoUs (recomputed here; they equal the stored ones, which the row keeps).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from medrobust_lib.config import Suite
from medrobust_lib.hashing import digest
from medrobust_lib.metrics.segmentation import iou
from medrobust_lib.prompts import prompt_boxes
from medrobust_lib.store import results
from medrobust_lib.tracks.segmentation.model import load_model

EXAMPLES_TABLE = "segmentation_examples"
DEFAULT_TOP = 3


def worst_cells(rows: pd.DataFrame, top: int = DEFAULT_TOP) -> pd.DataFrame:
    """The ``top`` (perturbation, level) cells of one model's perturbation rows with the largest mean
    IoU drop over ok rows, each with the row of its largest drop (columns of ``rows`` plus
    ``mean_iou_drop``). Sorted worst first."""
    ok = rows[(rows["condition"] == "perturbation") & (rows["status"] == "ok") & rows["iou_drop"].notna()]
    if ok.empty:
        return ok.assign(mean_iou_drop=pd.Series(dtype=float))
    means = ok.groupby(["perturbation", "level"])["iou_drop"].mean().rename("mean_iou_drop").reset_index()
    means = means.sort_values(["mean_iou_drop", "perturbation", "level"], ascending=[False, True, True]).head(top)
    out = []
    for cell in means.itertuples():
        sub = ok[(ok["perturbation"] == cell.perturbation) & (ok["level"] == cell.level)]
        sub = sub.sort_values(["iou_drop", "dataset", "sample_id"], ascending=[False, True, True])
        out.append(sub.iloc[0].to_dict() | {"mean_iou_drop": float(cell.mean_iou_drop)})  # type: ignore[arg-type]
    return pd.DataFrame(out)


def _example(suite: Suite, model: Any, row: dict[str, Any]) -> dict[str, Any]:
    from medrobust_lib.perturb.regen_cache import regenerate_cached
    from medrobust_lib.tracks.feed import clean_sample
    from medrobust_lib.tracks.perturbed import read_manifest
    from medrobust_lib.tracks.segmentation.example_panel import example_panel, png_bytes

    sc = suite.segmentation
    modality, level = str(row["modality"]), int(row["level"])
    key = (str(row["dataset"]), str(row["sample_id"]))
    man = read_manifest(suite, modality, level)
    rec = man[(man["dataset"] == key[0]) & (man["sample_id"] == key[1]) & (man["perturbation"] == row["perturbation"])]
    if rec.empty:
        raise LookupError(f"no manifest row for {key} {row['perturbation']} level {level}")
    mr = {str(k): v for k, v in rec.iloc[0].to_dict().items()}
    sample = clean_sample(suite, modality, sc.split, key)
    out = regenerate_cached(mr, sample)
    assert sample.mask is not None and out.mask is not None
    boxes = prompt_boxes(sample, sc.prompt)
    pboxes = prompt_boxes(sample, sc.prompt, mask=out.mask)
    clean_p, pert_p = model.predict([sample.image, out.image], [boxes, pboxes])
    clean_pred = clean_p.max(axis=0) > 0.5 if len(clean_p) else np.zeros_like(sample.mask)
    pert_pred = pert_p.max(axis=0) > 0.5 if len(pert_p) else np.zeros_like(out.mask)
    ci, pi = iou(clean_pred, sample.mask), iou(pert_pred, out.mask)
    title = f"{row['model']}: {row['perturbation']} level {level} (mean IoU drop {row['mean_iou_drop']:.3f})"
    sub = (f"{key[0]}/{key[1]} ({modality}), SSIM {float(mr['ssim']):.3f}, precision "
           f"{getattr(model, 'precision', 'fp32')}")
    panel = example_panel(image=sample.image, mask=sample.mask, boxes=boxes, clean_pred=clean_pred, clean_iou=ci,
                          perturbed=out.image, perturbed_mask=out.mask, perturbed_boxes=pboxes,
                          perturbed_pred=pert_pred, perturbed_iou=pi, title=title, subtitle=sub)
    return {"model": row["model"], "perturbation": row["perturbation"], "level": level, "modality": modality,
            "dataset": key[0], "sample_id": key[1], "mean_iou_drop": float(row["mean_iou_drop"]),
            "clean_iou": ci, "iou": pi, "ssim": float(mr["ssim"]), "png": png_bytes(panel)}


def write_examples(suite: Suite, top: int = DEFAULT_TOP) -> pd.DataFrame:
    """Write the ``segmentation_examples`` rows (one chunk per model) of every real-architecture
    model of the suite that has perturbation rows; models without any are left out (their old
    chunk removed). Returns the rows written (without the PNG bytes' content checked)."""
    from medrobust_lib.tracks.segmentation.evaluate import RESULTS_TABLE

    df = results.read_table(suite.results_dir, RESULTS_TABLE)
    written: list[dict[str, Any]] = []
    for m in suite.segmentation.models:
        if m.arch == "tiny" or df.empty:
            continue
        rows = df[df["model"] == m.id]
        cells = worst_cells(rows, top)
        if cells.empty:
            continue
        model = load_model(suite, m)
        written += [_example(suite, model, {str(k): v for k, v in r.items()}) for r in cells.to_dict("records")]
    out = pd.DataFrame(written)
    fp = digest(["examples", [(r["model"], r["perturbation"], r["level"], r["dataset"], r["sample_id"],
                                            r["clean_iou"], r["iou"]) for r in written]])
    results.write_per_key(suite.results_dir, EXAMPLES_TABLE, out, "model", fp, chunk="examples")
    return out
