"""The segmentation track: base checkpoint, clean / perturbed / attacked evaluation rows."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

import numpy as np
import pandas as pd

from medrobust_lib.config import Suite
from medrobust_lib.config.segmentation import PromptConfig, SegModelConfig
from medrobust_lib.data.sample import Sample
from medrobust_lib.metrics.segmentation import EMPTY_GT_POLICY, dice, iou
from medrobust_lib.paths import suite_paths
from medrobust_lib.perturb.engine import NOT_APPLICABLE
from medrobust_lib.progress import Progress, counted, finish
from medrobust_lib.prompts import PromptTargets, prompt_targets
from medrobust_lib.store import pred_masks
from medrobust_lib.store.schema import SEG_NO_MASK, SEG_NOT_APPLICABLE, SEG_OK, column_names, seg_failed
from medrobust_lib.tracks.partition import (
    Partition,
    PartitionInputs,
    added,
    error_row,
    manifest_hashes,
    sample_hashes,
    unusable_state,
)
from medrobust_lib.tracks.segmentation.attack_views import AttackChunks, GrayView, ImageChunks, MultiBoxView
from medrobust_lib.tracks.segmentation.model import (
    load_model,
    model_config,
    model_precision,
)

RESULTS_TABLE = "segmentation_results"
INSTANCES_TABLE = "segmentation_instances"
RESULT_COLUMNS: tuple[str, ...] = column_names(RESULTS_TABLE)
"""The ``segmentation_results`` columns in declared order (:mod:`medrobust_lib.store.schema`)."""
INSTANCE_COLUMNS: tuple[str, ...] = column_names(INSTANCES_TABLE)
"""The ``segmentation_instances`` columns (one row per box prompt of a sample with instances)."""
Item = tuple[np.ndarray, np.ndarray, np.ndarray, "tuple[np.ndarray, np.ndarray] | None"]
"""(image, boxes (K, 4), bool mask (H, W), (instance map, ids (K,)) or None) as the models score them."""


# ---- evaluation -------------------------------------------------------------------------------

@dataclass
class EvalSummary:
    n_rows: int = 0
    n_failed: int = 0
    """Rows that failed (``error``, ``perturbation_error``, ``mask_out_of_view``); not the two below."""
    n_not_applicable: int = 0
    """Perturbed rows whose type does not apply to the sample (status ``not_applicable``)."""
    n_no_mask: int = 0
    """Rows of samples without a ground-truth mask (status ``no_mask``)."""
    mean_iou: float = float("nan")
    mean_dice: float = float("nan")
    clean_cache_hits: int = 0
    clean_cache_misses: int = 0
    model_seconds: float = 0.0
    total_seconds: float = 0.0
    n_images: int = 0
    reused: bool = False
    """The partition was already written from the same inputs (a resumed run): its rows were read
    back, nothing was scored (:func:`_reuse`)."""


@dataclass
class Scored:
    """One item's scores: IoU and Dice of the union of its box masks against its mask; per box
    (float64 (K,), empty without instances) its own mask against its own instance; the union
    prediction (bool (H, W)) when it was kept."""

    iou: float
    dice: float
    box_iou: np.ndarray
    box_dice: np.ndarray
    mask: np.ndarray | None = None


def _score(prob: np.ndarray, gt: np.ndarray, targets: tuple[np.ndarray, np.ndarray] | None = None,
           keep_mask: bool = False) -> Scored:
    """Host scoring of probabilities (K, H, W) (the path of a model without ``score``)."""
    pred = prob.max(axis=0) > 0.5 if len(prob) else np.zeros_like(gt, bool)
    bi = np.zeros(0, np.float64)
    bd = np.zeros(0, np.float64)
    if targets is not None and len(prob):
        inst, ids = targets
        bi = np.array([iou(prob[k] > 0.5, inst == i) for k, i in enumerate(ids)], np.float64)
        bd = np.array([dice(prob[k] > 0.5, inst == i) for k, i in enumerate(ids)], np.float64)
    return Scored(iou(pred, gt), dice(pred, gt), bi, bd, pred if keep_mask else None)


def _base_row(m: SegModelConfig, ckpt: str, s: Sample, condition: str, prompt: str,
              precision: str = "fp32") -> dict[str, Any]:
    """A result row without scores yet. ``precision``: the model's arithmetic (``fp32``,
    ``bf16-autocast``: :attr:`~medrobust_lib.models.sam.SamSegmenter.precision`)."""
    return {"model": m.id, "checkpoint": ckpt, "strategy": m.strategy, "dataset": s.dataset, "modality": s.modality,
            "sample_id": s.sample_id, "condition": condition, "perturbation": condition, "level": 0,
            "strength": None, "ssim": None, "epsilon": None, "iou": float("nan"), "dice": float("nan"),
            "clean_iou": float("nan"), "clean_dice": float("nan"), "iou_drop": float("nan"),
            "dice_drop": float("nan"), "prompt": prompt, "status": "ok", "error": None,
            "empty_gt_policy": EMPTY_GT_POLICY, "precision": precision, "family": m.family, "arch": m.arch,
            "n_prompts": None, "n_instances": None, "instance_iou": float("nan"), "instance_dice": float("nan"),
            "pred_mask_sha256": None}


def _error_row(m: SegModelConfig, ckpt: str, key: tuple[str, str], modality: str, condition: str, prompt: str,
               reason: str, precision: str = "fp32") -> dict[str, Any]:
    """The ``error`` row of a sample that cannot be used now (missing, quarantined since the clean
    index or manifest was built): no scores, counted in ``n_failed``, ``error`` says why."""
    from medrobust_lib.tracks.datasets import placeholder_sample

    return error_row(_base_row(m, ckpt, placeholder_sample(key, modality), condition, prompt, precision), reason,
                     column="status")


def perturbed_keys(m: SegModelConfig, keys: Iterable[tuple[str, str]]) -> set[tuple[str, str]] | None:
    """The (dataset, sample id) keys of ``keys`` that the perturbed and attack evaluations of ``m``
    cover: the first ``m.max_perturbed_per_dataset`` of each dataset, then the first
    ``m.max_perturbed_per_modality`` of those, in sorted order; None (all) when the model sets no
    cap."""
    cap, per_ds = m.max_perturbed_per_modality, m.max_perturbed_per_dataset
    if cap is None and per_ds is None:
        return None
    kept = sorted(set(keys))
    if per_ds is not None:
        by_ds: dict[str, list[tuple[str, str]]] = {}
        for k in kept:
            by_ds.setdefault(k[0], []).append(k)
        kept = sorted(k for ks in by_ds.values() for k in ks[:per_ds])
    return set(kept if cap is None else kept[:cap])


def _predict_timed(model: Any, images: Sequence[np.ndarray], boxes: Sequence[np.ndarray], summary: EvalSummary,
                   batch_size: int) -> list[np.ndarray]:
    t0 = time.perf_counter()
    out: list[np.ndarray] = model.predict(images, boxes, batch_size=batch_size)
    summary.model_seconds += time.perf_counter() - t0
    summary.n_images += len(images)
    return out


def _targets(t: PromptTargets) -> tuple[np.ndarray, np.ndarray] | None:
    return None if t.instances is None else (t.instances, t.ids)


def _item(s: Sample, prompt: PromptConfig, t: PromptTargets | None = None) -> Item:
    """(image, prompt boxes, mask, instance targets) of a clean sample that has a mask (``t``: its
    prompt targets when already made)."""
    if s.mask is None:
        raise ValueError(f"sample {s.dataset}/{s.sample_id} has no ground-truth mask to score against")
    t = prompt_targets(s, prompt) if t is None else t
    return s.image, t.boxes, s.mask, _targets(t)


def _score_items(model: Any, items: Iterable[Item], summary: EvalSummary, batch_size: int, *,
                 keep_masks: bool = False) -> list[Scored]:
    """:class:`Scored` per (image, boxes, bool mask, targets) item, in order. A model with
    ``score`` (the SAM family) predicts and scores batched on its device, consuming ``items``
    lazily (the feed runs ahead meanwhile); any other SegmentationModel goes through ``predict``
    and the host metrics. Both give :func:`_score`'s numbers."""
    if hasattr(model, "score"):
        res = model.score(items, batch_size=batch_size, keep_masks=keep_masks)
        summary.model_seconds += res.model_seconds
        summary.n_images += len(res.iou)
        n = len(res.iou)
        box_iou = res.box_iou or [np.zeros(0)] * n
        box_dice = res.box_dice or [np.zeros(0)] * n
        masks = res.masks if res.masks is not None else [None] * n
        return [Scored(float(a), float(b), bi, bd, m)
                for a, b, bi, bd, m in zip(res.iou.tolist(), res.dice.tolist(), box_iou, box_dice, masks, strict=True)]
    listed = list(items)
    probs = _predict_timed(model, [x[0] for x in listed], [x[1] for x in listed], summary, batch_size)
    return [_score(p, x[2], x[3] if len(x) > 3 else None, keep_masks) for p, x in zip(probs, listed, strict=True)]


def _fill_scores(r: dict[str, Any], sc: Scored, t: PromptTargets, suite: Suite,
                 inst_rows: list[dict[str, Any]] | None) -> None:
    """Put one item's scores into its row: IoU / Dice (union), the prompt count, the instance
    means, the stored prediction's hash; and one ``segmentation_instances`` row per box."""
    r["iou"], r["dice"] = sc.iou, sc.dice
    r["n_prompts"] = int(len(t.boxes))
    if t.instances is not None:
        r["n_instances"] = int(t.n_instances)
        r["instance_iou"] = float(np.mean(sc.box_iou)) if len(sc.box_iou) else float("nan")
        r["instance_dice"] = float(np.mean(sc.box_dice)) if len(sc.box_dice) else float("nan")
        if inst_rows is not None:
            inst_rows.extend(_instance_rows(r, t, sc))
    if sc.mask is not None:
        r["pred_mask_sha256"] = pred_masks.put(suite_paths(suite).pred_masks, sc.mask)


def _instance_rows(r: dict[str, Any], t: PromptTargets, sc: Scored) -> list[dict[str, Any]]:
    """The ``segmentation_instances`` rows of a scored row: one per box prompt (``ok``), plus one
    per instance no longer in view (``out_of_view``: moved out by a spatial perturbation)."""
    keys = {k: r[k] for k in ("model", "checkpoint", "dataset", "modality", "sample_id", "condition",
                              "perturbation", "level", "epsilon", "prompt")}
    assert t.instances is not None
    areas = np.bincount(t.instances.ravel(), minlength=t.n_instances + 1)
    out = []
    seen = set()
    for k, i in enumerate(t.ids.tolist()):
        seen.add(i)
        x0, y0, x1, y1 = (float(v) for v in t.boxes[k])
        out.append({**keys, "instance": int(i), "iou": float(sc.box_iou[k]), "dice": float(sc.box_dice[k]),
                    "gt_area": int(areas[i]), "box_x0": x0, "box_y0": y0, "box_x1": x1, "box_y1": y1,
                    "status": SEG_OK})
    for i in range(1, t.n_instances + 1):
        if i not in seen:
            out.append({**keys, "instance": i, "iou": float("nan"), "dice": float("nan"), "gt_area": 0,
                        "box_x0": None, "box_y0": None, "box_x1": None, "box_y1": None, "status": "out_of_view"})
    return out


def _keep_masks(suite: Suite) -> bool:
    return bool(getattr(suite.segmentation, "store_masks", False))


def _pipeline(m: SegModelConfig) -> dict[str, Any] | None:
    """The model's preprocessing and mask-selection settings for a result fingerprint; None when
    they are all defaults (so results written before these options existed stay current)."""
    keys = {"preprocess": m.preprocess or "default", "mask_selection": m.mask_selection, "color": m.color,
            "resize": m.resize}
    return None if keys == {"preprocess": "default", "mask_selection": None, "color": None, "resize": None} else keys


# ---- what a partition's rows depend on -----------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class SegInputs(PartitionInputs):
    """What every segmentation partition's rows depend on (:mod:`medrobust_lib.tracks.partition`);
    each run adds its own fields. Build with :func:`clean_inputs`, :func:`perturbed_inputs` or
    :func:`attack_inputs`."""

    checkpoint: str
    """The weights: ``model.checkpoint_hash`` (it fixes the arch: ``medrobust validate`` checks it)."""
    prompt: str
    """The box-prompt protocol (:attr:`PromptConfig.protocol`: margin, jitter, seed)."""
    pipeline: dict[str, Any] | None = added(None)
    """:func:`_pipeline`: preprocessing and mask selection when not all defaults."""
    family: str = added("sam")
    """The family: its pre-processing and mask choice (sam and medsam share checkpoints)."""
    strategy: str = added("pretrained")
    """The ``strategy`` column of every row."""
    store_masks: bool = added(True)
    """Whether rows carry ``pred_mask_sha256`` (``segmentation.store_masks``)."""


@dataclass(frozen=True, kw_only=True)
class SegCleanInputs(SegInputs):
    samples: list[tuple[str, str]]
    """(sample id, content hash) of every usable evaluation sample."""
    precision: str
    """The arithmetic that ran (``model.precision``; a config's ``auto`` resolves per machine)."""
    unusable: list[Any]
    """:func:`~medrobust_lib.tracks.partition.unusable_state`: the samples given ``error`` rows, and why."""


@dataclass(frozen=True, kw_only=True)
class SegPerturbedInputs(SegInputs):
    level: int
    manifest: list[str]
    """The manifest partition's output hashes (every perturbed image, its strength and seed)."""
    perturbations: list[str] | None
    """The type globs evaluated (None: every type of the manifest)."""
    covered: list[tuple[str, str]] | None
    """The samples the model's ``max_perturbed_per_*`` caps keep (None: no cap)."""
    precision: str
    evaluated: list[list[Any]]
    """[[dataset, sample id], content hash] of every covered usable sample (the clean references)."""
    unusable: list[Any]


@dataclass(frozen=True, kw_only=True)
class SegAttackInputs(SegInputs):
    level: int
    attacks: dict[str, Any]
    """``segmentation.attacks`` (kinds, step size factor, sample cap) without its ``levels``: which
    attack partitions exist, not what one holds (``level`` is the input)."""
    samples: list[tuple[str, str]]
    """(sample id, content hash) of every attacked sample."""
    precision: str
    kinds: list[str] | None = added(None)
    """The attacks run when a subset was asked for (fine-tuned checkpoints); None: all configured."""
    unusable: list[Any]
    seed: int = added(0)
    """The suite seed when PGD runs (its random start); 0 otherwise."""


def _seg_head(suite: Suite, m: SegModelConfig, checkpoint: str) -> dict[str, Any]:
    sc = suite.segmentation
    return {"checkpoint": checkpoint, "prompt": sc.prompt.protocol, "pipeline": _pipeline(m), "family": m.family,
            "strategy": m.strategy, "store_masks": _keep_masks(suite)}


def clean_inputs(suite: Suite, m: SegModelConfig, checkpoint: str, precision: str, samples: Iterable[Sample],
                 unusable: Mapping[tuple[str, str], str]) -> SegCleanInputs:
    """The inputs of a clean partition: the usable evaluation ``samples`` and the ``unusable`` ones."""
    return SegCleanInputs(**_seg_head(suite, m, checkpoint), samples=sample_hashes(samples), precision=precision,
                          unusable=unusable_state(unusable))


def perturbed_inputs(suite: Suite, m: SegModelConfig, checkpoint: str, precision: str, level: int,
                     manifest: pd.DataFrame, perturbations: Sequence[str] | None,
                     samples: Mapping[tuple[str, str], Sample],
                     unusable: Mapping[tuple[str, str], str]) -> SegPerturbedInputs:
    """The inputs of a perturbed partition: the (filtered) ``manifest``, the type globs, the usable
    evaluation ``samples`` by key and the ``unusable`` ones (each kept when the model's caps cover it)."""
    covered = perturbed_keys(m, set(samples) | set(unusable))
    evaluated = [[list(k), s.content_hash()] for k, s in sorted(samples.items()) if covered is None or k in covered]
    return SegPerturbedInputs(**_seg_head(suite, m, checkpoint), level=level, manifest=manifest_hashes(manifest),
                              perturbations=sorted(perturbations) if perturbations is not None else None,
                              covered=sorted(covered) if covered is not None else None, precision=precision,
                              evaluated=evaluated, unusable=unusable_state(unusable, covered))


def attacked_samples(suite: Suite, m: SegModelConfig, samples: Sequence[Sample]) -> tuple[list[Sample], bool]:
    """The samples an attack partition attacks, of the split's samples with a non-empty mask:
    the first ``attacks.max_samples``, then those the model's caps keep; and whether any cap applied
    (then the split's unusable samples get no rows)."""
    cap = suite.segmentation.attacks.max_samples
    kept = list(samples) if cap is None else list(samples)[:cap]
    keep = perturbed_keys(m, [(s.dataset, s.sample_id) for s in kept])
    if keep is not None:
        kept = [s for s in kept if (s.dataset, s.sample_id) in keep]
    return kept, cap is not None or keep is not None


def attack_inputs(suite: Suite, m: SegModelConfig, checkpoint: str, precision: str, level: int,
                  samples: Sequence[Sample], kinds: Sequence[str] | None,
                  unusable: Mapping[tuple[str, str], str]) -> SegAttackInputs:
    """The inputs of an attack partition: the attacked ``samples`` (:func:`attacked_samples`), the
    kinds asked for and the ``unusable`` samples given rows."""
    sc = suite.segmentation
    run_kinds = [str(k) for k in sc.attacks.kinds if kinds is None or k in kinds]
    return SegAttackInputs(**_seg_head(suite, m, checkpoint), level=level, attacks=sc.attacks.model_dump(exclude={"levels"}),
                           samples=sample_hashes(samples), precision=precision,
                           kinds=run_kinds if kinds is not None else None, unusable=unusable_state(unusable),
                           seed=suite.seed if "pgd" in run_kinds else 0)


# ---- the partition shell ---------------------------------------------------------------------------

def _partition(suite: Suite, m: SegModelConfig, run: str, modality: str, level: int,
               columns: tuple[str, ...] = RESULT_COLUMNS) -> Partition:
    """A ``segmentation_results`` partition: model / run (clean, perturbation, attack) / modality /
    level; rows sorted by type and sample id. ``run`` is not a result column: an attack partition
    holds both the 'fgsm' and 'pgd' conditions."""
    return Partition(suite.results_dir, RESULTS_TABLE, {"model": m.id, "run": run, "modality": modality, "level": level},
                     columns, lambda r: (str(r["perturbation"]), str(r["sample_id"])))


def _write(part: Partition, rows: list[dict[str, Any]], inputs: SegInputs, instances: list[dict[str, Any]]) -> None:
    """One chunk per dataset of ``rows``; stale chunks are removed. The partition's
    ``segmentation_instances`` rows (per box prompt of samples with instances) are written first
    under the same partition keys, so a results chunk never exists without them."""
    inst = Partition(part.results_dir, INSTANCES_TABLE, part.keys, INSTANCE_COLUMNS,
                     lambda r: (str(r["perturbation"]), str(r["sample_id"]), int(r["instance"])))
    inst.write(instances, inputs.fingerprint)
    part.write(rows, inputs.fingerprint)


def _summarize(rows: list[dict[str, Any]] | pd.DataFrame, s: EvalSummary) -> EvalSummary:
    df = pd.DataFrame(rows)
    s.n_rows = len(df)
    if len(df):
        ok = df[df["status"] == SEG_OK]
        s.n_failed = int(df["status"].map(seg_failed).sum())
        s.n_not_applicable = int((df["status"] == SEG_NOT_APPLICABLE).sum())
        s.n_no_mask = int((df["status"] == SEG_NO_MASK).sum())
        s.mean_iou = float(ok["iou"].mean()) if len(ok) else float("nan")
        s.mean_dice = float(ok["dice"].mean()) if len(ok) else float("nan")
    return s


def _reuse(part: Partition, datasets: set[str], inputs: SegInputs, t0: float, reuse: bool) -> EvalSummary | None:
    """The summary of a partition that a resumed run need not score again: it holds one chunk per
    dataset of ``datasets`` and no other, each written from the same ``inputs``
    (:meth:`Partition.reusable`). None when ``reuse`` is False or the partition must be scored."""
    df = part.reusable(inputs.fingerprint, datasets) if reuse else None
    if df is None:
        return None
    summary = _summarize(df, EvalSummary(reused=True))
    summary.total_seconds = time.perf_counter() - t0
    return summary


def evaluate_clean(suite: Suite, model_id: str | SegModelConfig, modality: str, model: Any | None = None, *,
                   reuse: bool = True, progress: Progress | None = None) -> EvalSummary:
    """Clean predictions of the evaluation split, one row per sample (condition 'clean'); a sample
    of the split that cannot be used now (the clean index lists it as ok) is an ``error`` row.
    ``reuse``: read back a partition written from the same inputs (:func:`_reuse`) instead of
    scoring it again (False: always score, as a benchmark must). ``progress``: called per scored
    batch (:mod:`medrobust_lib.progress`)."""
    from medrobust_lib.tracks.feed import eval_samples

    t0 = time.perf_counter()
    m = model_config(suite, model_id)
    sc = suite.segmentation
    model = model or load_model(suite, m)
    precision = model_precision(model)  # fixed for the run: read once
    summary = EvalSummary()
    ev = eval_samples(suite, modality, sc.split)
    samples = list(ev.samples.values())
    inputs = clean_inputs(suite, m, model.checkpoint_hash, precision, samples, ev.unusable)
    # the sample hash is the clean-prediction cache key; keep it in the chunk
    part = _partition(suite, m, "clean", modality, 0, RESULT_COLUMNS + ("sample_sha256",))
    reused = _reuse(part, {s.dataset for s in samples} | {k[0] for k in ev.unusable}, inputs, t0, reuse)
    if reused is not None:
        return reused
    rows = []
    inst_rows: list[dict[str, Any]] = []
    with_mask = [s for s in samples if s.mask is not None]
    targets = {id(s): prompt_targets(s, sc.prompt) for s in with_mask}
    scores = dict(zip((id(s) for s in with_mask),
                      _score_items(model, counted((_item(s, sc.prompt, targets[id(s)]) for s in with_mask), progress,
                                                  len(with_mask), "clean images", every=m.eval_batch_size), summary,
                                   m.eval_batch_size, keep_masks=_keep_masks(suite)),
                      strict=True))
    finish(progress, len(with_mask), "clean images")
    for s in samples:
        r = _base_row(m, model.checkpoint_hash, s, "clean", sc.prompt.protocol, precision)
        r["sample_sha256"] = s.content_hash()
        if s.mask is None:
            r.update(status=SEG_NO_MASK, error="sample has no ground-truth mask")
        else:
            _fill_scores(r, scores[id(s)], targets[id(s)], suite, inst_rows)
            r["clean_iou"], r["clean_dice"] = r["iou"], r["dice"]
            r["iou_drop"] = r["dice_drop"] = 0.0
        rows.append(r)
    rows += [_error_row(m, model.checkpoint_hash, key, modality, "clean", sc.prompt.protocol, reason, precision)
             for key, reason in sorted(ev.unusable.items())]
    _write(part, rows, inputs, inst_rows)
    summary.clean_cache_misses = len(samples)
    summary.total_seconds = time.perf_counter() - t0
    return _summarize(rows, summary)


class CleanCache:
    """Clean results keyed by (checkpoint hash, sample content hash, prompt protocol), read from
    the clean partition; a miss computes the clean prediction on the spot (and is counted)."""

    def __init__(self, suite: Suite, m: SegModelConfig, modality: str, model: Any, prompt: PromptConfig,
                 summary: EvalSummary) -> None:
        df = _partition(suite, m, "clean", modality, 0).read()
        self.table: dict[tuple[str, str, str], tuple[float, float]] = {}
        if not df.empty and "sample_sha256" in df:
            for r in df[df["sample_sha256"].notna()].itertuples():
                self.table[(str(r.checkpoint), str(r.sample_sha256), str(r.prompt))] = (
                    float(r.iou), float(r.dice))  # type: ignore[arg-type]
        self.model, self.prompt, self.summary, self.batch = model, prompt, summary, m.eval_batch_size
        self._filled: set[tuple[str, str, str]] = set()  # computed by fill(), not yet read

    def _key(self, s: Sample) -> tuple[str, str, str]:
        return (self.model.checkpoint_hash, s.content_hash(), self.prompt.protocol)

    def fill(self, samples: Iterable[Sample]) -> None:
        """Compute every missing clean score of ``samples`` in one batched pass; the first
        :meth:`get` of each counts as the miss it is."""
        todo: dict[tuple[str, str, str], Sample] = {}
        for s in samples:
            key = self._key(s)
            if s.mask is not None and key not in self.table:
                todo.setdefault(key, s)
        if not todo:
            return
        scores = _score_items(self.model, (_item(s, self.prompt) for s in todo.values()), self.summary, self.batch)
        self.table.update(zip(todo, ((x.iou, x.dice) for x in scores), strict=True))
        self._filled |= set(todo)

    def get(self, s: Sample) -> tuple[float, float]:
        key = self._key(s)
        if key in self._filled:
            self._filled.discard(key)
            self.summary.clean_cache_misses += 1
            return self.table[key]
        if key in self.table:
            self.summary.clean_cache_hits += 1
            return self.table[key]
        self.summary.clean_cache_misses += 1
        x = _score_items(self.model, [_item(s, self.prompt)], self.summary, 1)[0]
        self.table[key] = (x.iou, x.dice)
        return self.table[key]


def _with_clean(r: dict[str, Any], clean: tuple[float, float]) -> None:
    r["clean_iou"], r["clean_dice"] = clean
    r["iou_drop"] = clean[0] - r["iou"]
    r["dice_drop"] = clean[1] - r["dice"]


def evaluate_perturbed(suite: Suite, model_id: str | SegModelConfig, modality: str, level: int, model: Any | None = None,
                       perturbations: Sequence[str] | None = None, *, reuse: bool = True,
                       progress: Progress | None = None) -> EvalSummary:
    """Predictions on every perturbed sample of one (modality, level) manifest partition. Images
    are regenerated from the manifest by the feed's worker processes (``feed_workers``, by
    default :func:`~medrobust_lib.tracks.feed.default_workers` for the model's device;
    ``feed_prefetch``; :mod:`medrobust_lib.tracks.feed`) while the model scores the previous
    batches; spatial types use their moved masks and boxes. A manifest row of the evaluation split
    whose sample cannot be used now (missing, quarantined since the manifest was built) is an
    ``error`` row with the reason; only rows of another split are skipped.
    ``perturbations``: glob patterns (``fnmatch``) restricting the types evaluated (None: all).
    ``reuse``, ``progress``: as in :func:`evaluate_clean`."""
    from medrobust_lib.tracks.feed import eval_samples, regenerate_stream, resolve_workers, sample_major
    from medrobust_lib.tracks.perturbed import read_manifest

    t0 = time.perf_counter()
    m = model_config(suite, model_id)
    sc = suite.segmentation
    model = model or load_model(suite, m)
    precision = model_precision(model)  # fixed for the run: read once
    summary = EvalSummary()
    manifest = read_manifest(suite, modality, level)
    if perturbations is not None and len(manifest):

        keep = manifest["perturbation"].map(lambda t: any(fnmatchcase(str(t), p) for p in perturbations))
        manifest = manifest[keep]
    ev = eval_samples(suite, modality, sc.split)
    samples = ev.samples
    covered = perturbed_keys(m, set(samples) | set(ev.unusable))
    rows: list[dict[str, Any]] = []
    todo: list[tuple[dict[str, Any], dict[str, Any], Sample]] = []
    for rec in manifest.to_dict("records"):
        mr = {str(k): v for k, v in rec.items()}
        key = (str(mr["dataset"]), str(mr["sample_id"]))
        if covered is not None and key not in covered:
            continue  # beyond the model's max_perturbed_per_modality
        s = samples.get(key)
        if s is None:
            reason = ev.reason(key)
            if reason is None:
                continue  # the manifest covers another split than this evaluation
            r = _error_row(m, model.checkpoint_hash, key, modality, "perturbation", sc.prompt.protocol, reason, precision)
            r.update(perturbation=mr["perturbation"], level=level, strength=mr["strength"], ssim=mr["ssim"])
            rows.append(r)
            continue
        r = _base_row(m, model.checkpoint_hash, s, "perturbation", sc.prompt.protocol, precision)
        r.update(perturbation=mr["perturbation"], level=level, strength=mr["strength"], ssim=mr["ssim"])
        rows.append(r)
        if mr["status"] == NOT_APPLICABLE:  # the type does not apply to this sample: not a failure
            r.update(status=SEG_NOT_APPLICABLE, error=mr["error"])
        elif mr["status"] != "ok":
            r.update(status="perturbation_error", error=mr["error"])
        elif s.mask is None:
            r.update(status=SEG_NO_MASK, error="sample has no ground-truth mask")
        else:
            todo.append((r, mr, s))
    inputs = perturbed_inputs(suite, m, model.checkpoint_hash, precision, level, manifest, perturbations,
                              samples, ev.unusable)
    part = _partition(suite, m, "perturbation", modality, level)
    reused = _reuse(part, {str(r["dataset"]) for r in rows}, inputs, t0, reuse)
    if reused is not None:
        return reused
    cache = CleanCache(suite, m, modality, model, sc.prompt, summary)  # read the clean partition only when scoring
    # one sample's rows together: a feed worker reads each clean sample once (rows are sorted on write)
    todo = [todo[i] for i in sample_major([mr for _, mr, _ in todo])]
    workers = resolve_workers(sc.feed_workers, getattr(getattr(model, "device", None), "type", "cpu"))
    scored: list[tuple[dict[str, Any], PromptTargets]] = []

    def items() -> Iterator[Item]:
        feed = regenerate_stream(suite, modality, sc.split, [mr for _, mr, _ in todo], workers=workers,
                                 prefetch=sc.feed_prefetch)
        for (r, _mr, s), out in zip(todo, feed, strict=True):
            assert out.mask is not None
            t = prompt_targets(s, sc.prompt, mask=out.mask, instances=out.instances)
            if len(t.boxes) == 0:
                r.update(status="mask_out_of_view", error="the spatial perturbation moved the mask out of the image")
                continue
            scored.append((r, t))
            yield out.image, t.boxes, out.mask, _targets(t)

    cache.fill(s for _, _, s in todo)  # clean scores missing from the clean partition, one batched pass
    inst_rows: list[dict[str, Any]] = []
    results_iter = _score_items(model, counted(items(), progress, len(todo), "perturbed images", every=m.eval_batch_size),
                                summary, m.eval_batch_size, keep_masks=_keep_masks(suite))
    finish(progress, len(todo), "perturbed images")
    for (r, t), x in zip(scored, results_iter, strict=True):
        _fill_scores(r, x, t, suite, inst_rows)
        _with_clean(r, cache.get(samples[(r["dataset"], r["sample_id"])]))
    _write(part, rows, inputs, inst_rows)
    summary.total_seconds = time.perf_counter() - t0
    return _summarize(rows, summary)


def evaluate_attacks(suite: Suite, model_id: str | SegModelConfig, modality: str, level: int, model: Any | None = None,
                     kinds: Sequence[str] | None = None, *, reuse: bool = True,
                     progress: Progress | None = None) -> EvalSummary:
    """FGSM and PGD at the attack level's epsilon (:class:`~medrobust_lib.attacks.linf.AttackSetting`;
    any level 1-5: only the clean images are read, the suite need not perturb that level;
    :meth:`~medrobust_lib.config.suite.Suite.attack_levels_for`) on every evaluation sample (conditions
    'fgsm', 'pgd'; ``kinds``: a subset of the suite's ``attacks.kinds``, None: all of them). Samples with one box
    are attacked ``eval_batch_size`` at a time (one PGD random start per batch, drawn from its first
    sample's key), a sample with instances alone; each gradient is summed over chunks of images and
    boxes that fit a memory budget (:class:`~medrobust_lib.tracks.segmentation.attack_views.AttackChunks`).
    Without ``attacks.max_samples``, a sample of the split that cannot be used now (the clean index
    lists it as ok) is an ``error`` row per attack. ``reuse``, ``progress``: as in :func:`evaluate_clean`."""
    from medrobust_lib.attacks.linf import AttackSetting
    from medrobust_lib.tracks.feed import clean_samples, eval_samples

    t0 = time.perf_counter()
    m = model_config(suite, model_id)
    sc = suite.segmentation
    model = model or load_model(suite, m)
    precision = model_precision(model)  # fixed for the run: read once
    summary = EvalSummary()
    device = getattr(model, "device", "cpu")
    samples, capped = attacked_samples(
        suite, m, [s for s in clean_samples(suite, modality, sc.split).values() if s.mask is not None and s.mask.any()])
    unusable = eval_samples(suite, modality, sc.split).unusable if not capped else {}
    run_kinds = [k for k in sc.attacks.kinds if kinds is None or k in kinds]
    inputs = attack_inputs(suite, m, model.checkpoint_hash, precision, level, samples, kinds, unusable)
    part = _partition(suite, m, "attack", modality, level)
    expected = {s.dataset for s in samples} | {k[0] for k in unusable} if run_kinds else set()
    reused = _reuse(part, expected, inputs, t0, reuse)
    if reused is not None:
        return reused
    cache = CleanCache(suite, m, modality, model, sc.prompt, summary)  # read the clean partition only when scoring
    cache.fill(samples)
    rows: list[dict[str, Any]] = []
    inst_rows: list[dict[str, Any]] = []
    keep_masks = _keep_masks(suite)
    n_attacks, n_attacked = len(samples) * len(run_kinds), 0
    for kind in run_kinds:
        acfg = AttackSetting.for_level(kind, level, step_size_factor=sc.attacks.step_size_factor)
        by_shape: dict[tuple[int, ...], list[Sample]] = {}
        for s in samples:
            by_shape.setdefault(s.image.shape, []).append(s)
        for group in by_shape.values():
            # one box per image batches across images; a sample with instances is attacked alone,
            # with all its box prompts at once (one encoder pass, every instance in the loss)
            union = [s for s in group if s.instances is None]
            batches = [union[i : i + m.eval_batch_size] for i in range(0, len(union), m.eval_batch_size)]
            batches += [[s] for s in group if s.instances is not None]
            for batch in batches:
                t1 = time.perf_counter()
                imgs, tgts = _attack_batch(suite, model, batch, kind, level, acfg, modality, device)
                summary.model_seconds += time.perf_counter() - t1
                items = [(im, t.boxes, np.asarray(s.mask), _targets(t)) for im, t, s in zip(imgs, tgts, batch, strict=True)]
                scores = _score_items(model, items, summary, m.eval_batch_size, keep_masks=keep_masks)
                for s, t, x in zip(batch, tgts, scores, strict=True):
                    r = _base_row(m, model.checkpoint_hash, s, kind, sc.prompt.protocol, precision)
                    r.update(perturbation=kind, level=level, epsilon=acfg.epsilon)
                    _fill_scores(r, x, t, suite, inst_rows)
                    _with_clean(r, cache.get(s))
                    rows.append(r)
                n_attacked += len(batch)
                if progress is not None:
                    progress(min(n_attacked, n_attacks - 1), n_attacks, "attacked images")
        for key, reason in sorted(unusable.items()):
            r = _error_row(m, model.checkpoint_hash, key, modality, kind, sc.prompt.protocol, reason, precision)
            r.update(level=level, epsilon=acfg.epsilon)
            rows.append(r)
    finish(progress, n_attacks, "attacked images")
    _write(part, rows, inputs, inst_rows)
    summary.total_seconds = time.perf_counter() - t0
    return _summarize(rows, summary)


def _attack_batch(suite: Suite, model: Any, batch: list[Sample], kind: str, level: int, acfg: Any, modality: str,
                  device: Any) -> tuple[list[np.ndarray], list[PromptTargets]]:
    """The adversarial images (float32 (H, W) or (H, W, 3) in [0, 1]) of one batch of same-size
    samples and their prompt targets. Either several samples with one box each, or one sample
    with instances (every box prompt of it; the loss takes each box's mask against its own
    instance)."""
    import torch

    from medrobust_lib.attacks.linf import fgsm, pgd, torch_generator_for
    from medrobust_lib.models.sam import to_tensor_batch

    sc = suite.segmentation
    tgts = [prompt_targets(s, sc.prompt) for s in batch]
    x = to_tensor_batch([s.image for s in batch]).to(device)
    gray = batch[0].image.ndim == 2
    target: Any = GrayView(model) if gray else model
    if gray:  # attack the single stored channel, not three diverging copies of it
        x = x[:, :1].contiguous()
    boxes = torch.as_tensor(np.concatenate([t.boxes for t in tgts])).to(device)
    chunks = AttackChunks.for_model(model, *batch[0].image.shape[:2])
    if tgts[0].instances is not None:
        t = tgts[0]
        assert t.instances is not None
        target = MultiBoxView(target, torch.zeros(len(t.ids), dtype=torch.long, device=device), chunks.boxes)
        y_np = (t.instances[None] == t.ids[:, None, None]).astype(np.float32)
    else:
        if len(batch) > chunks.images:
            target = ImageChunks(target, chunks.images)
        y_np = np.stack([np.asarray(s.mask) for s in batch]).astype(np.float32)
    y = torch.from_numpy(y_np)[:, None].to(device)
    if kind == "fgsm":
        adv = fgsm(target, x, boxes, y, acfg.epsilon)
    else:
        gen = torch_generator_for(suite.seed, modality, batch[0].dataset, batch[0].sample_id, "pgd", level)
        adv = pgd(target, x, boxes, y, acfg.epsilon, acfg.steps, acfg.step_size, generator=gen)
    adv_h = adv.detach().cpu()
    imgs = [a[0].numpy().copy() if gray else a.permute(1, 2, 0).numpy().copy() for a in adv_h]
    return imgs, tgts
