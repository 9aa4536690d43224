"""The per-sample safety taxonomy ("Consistent but Dangerous"): paraphrase consistency x image
reliance for yes/no questions, clean and under every perturbation and level.

Per configuration (a VLM plus a name) and yes/no record:

1. ``text-only baselines``: the original question with the image removed (modes ``none``,
   ``blank``, ``noise``). They do not depend on the perturbation, so they are computed once per
   modality and reused by every condition (table ``taxonomy_baselines``).
2. ``paraphrase predictions``: every variant (original + semantically equivalent paraphrases;
   negations only with ``negations: true``, for the separate negation-robustness statistic)
   scored with the (clean or perturbed) image. The vision tower runs once per image and
   its output is reused for every variant (``HFVisionLanguageModel.score_variants``).
3. flags and quadrant per sample (:func:`medrobust_lib.taxonomy.quadrants.classify`), one
   ``taxonomy_results`` row per (record, condition, image mode).

Suite YAML::

    taxonomy:
      configs:
        - {id: llava-med, model: llava-med}                  # a VLM id from vlm.models
        - {id: llava-med-consistency, lora_of: llava-med, recipe: consistency}  # + a consistency LoRA
        - {id: demo-image-reliant, demo_training: image_reliant}   # demo: trained by its taxonomy_model asset
      image_modes: [none, blank, noise]
      min_paraphrases: 5        # semantically equivalent paraphrases; records with fewer get templates
      negations: false          # true: also score negated variants, for negation_consistent only
      abstention_tau: 0.6931    # sensitivity column only: |text-only margin| < tau counts as changed
      split: test
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from medrobust_lib.config import Suite
from medrobust_lib.config.common import by_id
from medrobust_lib.config.taxonomy import TaxonomyConfigEntry
from medrobust_lib.config.vlm import VLMModelConfig, vlm_model
from medrobust_lib.data.sample import Sample
from medrobust_lib.model_table import list_models, model_entry
from medrobust_lib.paths import checkpoint_dir
from medrobust_lib.progress import Progress, counted, finish
from medrobust_lib.seeding import rng_for
from medrobust_lib.store import rerun
from medrobust_lib.store.completeness import ERROR_OUTCOME
from medrobust_lib.store.schema import (
    TAXONOMY_BASELINES_TABLE,
    TAXONOMY_TABLE,
    column_names,
    excluded_outcome,
)
from medrobust_lib.store.schema import TAXONOMY_COLUMN_NAMES as COLUMN_NAMES
from medrobust_lib.taxonomy.paraphrase import api_paraphrases, template_paraphrases
from medrobust_lib.taxonomy.quadrants import classify, classify_labels
from medrobust_lib.tracks.partition import (
    Condition,
    Partition,
    PartitionInputs,
    added,
    error_row,
    manifest_hashes,
    outcome_counts,
)
from medrobust_lib.tracks.upstream import MissingUpstream
from medrobust_lib.tracks.vlm.items import YESNO_SUFFIX, DroppedRecord, LoadedItems, VLMItem, load_items
from medrobust_lib.vlm_tasks.vqa import extract_yes_no

BASELINE_TABLE = TAXONOMY_BASELINES_TABLE
BASELINE_COLUMNS: tuple[str, ...] = column_names(BASELINE_TABLE)
ROW_KEY: tuple[str, ...] = ("dataset", "record_id", "perturbation", "image_mode")
"""Identifies a ``taxonomy_results`` row within its partition (config, modality, level)."""
PROGRESS_WHAT = "samples"
"""The unit of a taxonomy partition's progress: images (samples) scored, every variant of every
yes/no record of the image with it."""


def config_entry(suite: Suite, config_id: str) -> TaxonomyConfigEntry:
    return by_id(suite.taxonomy.configs, config_id, "taxonomy configuration")


RECIPE_FILE = "medrobust_recipe.json"
"""Written last in a consistency LoRA's adapter folder (:mod:`medrobust_lib.tracks.taxonomy.lora`):
the recipe fingerprint and what the adapter was trained on; removed before the adapter is trained
again, so a folder without it holds no finished adapter."""


def lora_folder(suite: Suite, config_id: str) -> Path:
    """Where the consistency LoRA of taxonomy configuration ``config_id`` is saved."""
    return checkpoint_dir(suite, config_id) / "adapter"


def recipe_record(folder: Path) -> dict[str, Any] | None:
    """The record in an adapter folder's :data:`RECIPE_FILE` (None: none, or unreadable)."""
    try:
        rec = json.loads((folder / RECIPE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) else None


def _recorded_recipe(folder: Path) -> Any:
    """The recipe settings recorded in an adapter folder's :data:`RECIPE_FILE` (None: none)."""
    rec = recipe_record(folder)
    inputs = rec.get("inputs") if rec is not None else None
    return inputs.get("recipe") if isinstance(inputs, dict) else None


def model_for(suite: Suite, entry: TaxonomyConfigEntry) -> VLMModelConfig:
    """The VLM behind a configuration: a configured ``vlm.models`` entry; a ``lora_of`` one's
    weights plus the consistency LoRA under ``var/checkpoints/<config>/adapter``
    (:mod:`medrobust_lib.tracks.taxonomy.lora`); or the demo-trained weights under
    ``var/checkpoints/<config>/`` (plus ``adapter/`` for consistency_lora)."""
    if entry.model is not None:
        return vlm_model(suite, entry.model)
    if entry.lora_of is not None:
        folder = lora_folder(suite, entry.id)
        if not (folder / "adapter_config.json").is_file():
            raise MissingUpstream(f"no consistency LoRA for taxonomy config {entry.id!r} at {folder}: materialize "
                                  f"'{entry.id}/taxonomy_model' first", f"{entry.id}/taxonomy_model")
        # an interrupted retraining leaves the previous adapter without its record, and an edited recipe
        # leaves the old one: neither is this configuration's adapter
        want = json.loads(json.dumps(entry.recipe.model_dump() if entry.recipe is not None else None))
        if _recorded_recipe(folder) != want:
            raise MissingUpstream(f"the consistency LoRA at {folder} was not trained by taxonomy config {entry.id!r}'s "
                                  f"current recipe (or its training did not finish): materialize "
                                  f"'{entry.id}/taxonomy_model' first", f"{entry.id}/taxonomy_model")
        return vlm_model(suite, entry.lora_of).model_copy(update={"id": entry.id, "adapter": str(folder)})
    owner = entry.base if entry.base is not None else entry.id
    folder = checkpoint_dir(suite, owner)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"no trained model for taxonomy config {owner!r} at {folder}: materialize "
                                f"'{owner}/taxonomy_model' first")
    adapter = str(lora_folder(suite, entry.id)) if entry.base is not None else None
    return VLMModelConfig(id=entry.id, source=str(folder), adapter=adapter, batch_size=64)


def variants_of(item: VLMItem, min_paraphrases: int, negations: bool = False) -> tuple[tuple[str, int], ...]:
    """The record's question variants, original first: its semantically equivalent paraphrases
    (polarity +1), topped up with template ones when it has fewer than ``min_paraphrases``, then,
    only with ``negations``, its negated variants (polarity -1; the template negations when the
    record has none)."""

    vs = tuple(item.variants or ((item.question, 1),))
    same = [v for v in vs if v[1] == 1]
    negated = [v for v in vs[1:] if v[1] == -1]
    known = {t for t, _ in vs}
    templates = [v for v in template_paraphrases(vs[0][0]) if v[0] not in known]
    need = min_paraphrases - (len(same) - 1)
    if need > 0:
        same += [v for v in templates if v[1] == 1][:need]
    if negations and not negated:
        negated = [v for v in templates if v[1] == -1]
    return tuple(same) + (tuple(negated) if negations else ())


PARAPHRASE_TABLE = "taxonomy_paraphrases"
PARAPHRASE_COLUMNS: tuple[str, ...] = column_names(PARAPHRASE_TABLE, without=("modality",))
"""The declared ``taxonomy_paraphrases`` columns but ``modality``, which the partition folder holds."""


def item_variants(suite: Suite, items: Sequence[VLMItem], *, negations: bool | None = None,
                  min_paraphrases: int | None = None) -> tuple[list[tuple[VLMItem, tuple[tuple[str, int], ...]]],
                                                               list[dict[str, Any]]]:
    """Every item with its variants (original first), and the audit of every model-written
    candidate: the one paraphrase builder of the taxonomy, for its evaluation
    (:func:`paraphrase_sets`) and its consistency LoRA's training examples
    (:mod:`medrobust_lib.tracks.taxonomy.lora`).

    Records with fewer than ``min_paraphrases`` (None: ``taxonomy.min_paraphrases``) paraphrases
    get accepted API paraphrases first (when ``api_paraphraser`` is set), then template
    paraphrases; negated variants only with ``negations`` (None: ``taxonomy.negations``)."""

    tc = suite.taxonomy
    want = tc.min_paraphrases if min_paraphrases is None else min_paraphrases
    negate = tc.negations if negations is None else negations
    api = None
    if tc.api_paraphraser is not None:
        from medrobust_lib.tracks.vlm.model import Runner

        m = vlm_model(suite, tc.api_paraphraser)
        if not model_entry(m.kind, "vlm").is_endpoint:
            raise ValueError(f"api_paraphraser {m.id!r} must be an endpoint model (kind: "
                             f"{' or '.join(list_models('vlm', is_endpoint=True))})")
        api = Runner(suite, m).api
    out: list[tuple[VLMItem, tuple[tuple[str, int], ...]]] = []
    audit: list[dict[str, Any]] = []
    try:
        for it in items:
            vs = tuple(it.variants or ((it.question, 1),))
            need = want - (sum(1 for _, p in vs if p == 1) - 1)
            if need > 0 and api is not None:
                accepted, records = api_paraphrases(api, vs[0][0], n=need)
                known = {t for t, _ in vs}
                vs = vs + tuple(a for a in accepted if a[0] not in known)
                audit.extend({"dataset": it.dataset, "record_id": it.record_id, "question": vs[0][0],
                              "source": tc.api_paraphraser, **r} for r in records)
            out.append((it, variants_of(dataclasses.replace(it, variants=vs), want, negate)))
    finally:
        if api is not None:
            api.close()
    return out, audit


def paraphrase_sets(suite: Suite, items: Sequence[VLMItem]) -> tuple[dict[str, tuple[tuple[str, int], ...]],
                                                                    list[dict[str, Any]]]:
    """Variants per record id (original first) and the audit of every model-written candidate
    (:func:`item_variants` with the taxonomy's own ``min_paraphrases`` and ``negations``)."""
    pairs, audit = item_variants(suite, items)
    return {it.record_id: vs for it, vs in pairs}, audit


def removed_image(mode: str, like: np.ndarray, key: tuple[str, ...], seed: int) -> np.ndarray | None:
    """The stand-in for a removed image: None (no image token), mid-grey, or seeded uniform noise
    of the same shape (float32 in [0, 1])."""
    if mode == "none":
        return None
    if mode == "blank":
        return np.full(like.shape, 0.5, np.float32)
    if mode == "noise":
        return rng_for(seed, "taxonomy-noise", *key).random(like.shape, dtype=np.float32)
    raise ValueError(f"unknown image mode {mode!r}; valid: none, blank, noise")


@dataclass(frozen=True, kw_only=True)
class TaxonomyInputs(PartitionInputs):
    """What a taxonomy partition's rows depend on (:mod:`medrobust_lib.tracks.partition`). Build with
    :func:`taxonomy_inputs` (``taxonomy_results``) or :func:`baseline_inputs` (``taxonomy_baselines``)."""

    checkpoint: str
    """The configuration's base weights (``Runner.checkpoint``)."""
    adapter: str | None
    """Its LoRA adapter's hash (None: none)."""
    taxonomy: dict[str, Any]
    """The whole ``taxonomy`` section (configurations, image modes, paraphrases, negations, split, ...)."""
    level: int | None = added(None)
    """The partition's level (None: the baselines, computed once per modality)."""
    images: list[Any] | None = added(None)
    """Clean: ((dataset, sample id), content hash) of every usable evaluation sample; perturbed:
    [the manifest partition's output hashes]."""
    n_rows: int | None = added(None)
    """The baselines: their row count."""
    model: dict[str, Any] | None = added(None)
    """The configured ``vlm.models`` entry of a configuration that names one (``model``, or the
    ``lora_of`` model its consistency LoRA goes on: token caps, API settings, ...); None for the
    demo-trained ones (their weights are all there is)."""
    records: dict[str, Any] = added({})
    """``vlm.records`` as configured (the yes/no files), when set."""
    seed: int = added(0)
    """The suite seed where it is read (the ``noise`` image mode's pixels, an endpoint model's
    requests); 0 otherwise."""


def _tax_head(suite: Suite, config_id: str, checkpoint: str, adapter: str | None) -> dict[str, Any]:
    entry = config_entry(suite, config_id)
    named_id = entry.model if entry.model is not None else entry.lora_of
    named = vlm_model(suite, named_id) if named_id is not None else None
    seeded = "noise" in suite.taxonomy.image_modes or (named is not None
                                                       and model_entry(named.kind, "vlm").is_endpoint)
    return {"checkpoint": checkpoint, "adapter": adapter, "taxonomy": suite.taxonomy.model_dump(),
            "model": named.model_dump() if named is not None else None,
            "records": {k: v for k, v in suite.vlm.records.model_dump().items() if v is not None},
            "seed": suite.seed if seeded else 0}


def taxonomy_inputs(suite: Suite, config_id: str, checkpoint: str, adapter: str | None, level: int,
                    samples: Mapping[tuple[str, str], Sample], manifest: pd.DataFrame | None) -> TaxonomyInputs:
    """The inputs of a ``taxonomy_results`` partition: clean (``manifest`` None; ``samples``: the
    usable evaluation samples by key) or perturbed (``level`` and its ``manifest``)."""
    images: list[Any] = (sorted((k, s.content_hash()) for k, s in samples.items()) if manifest is None
                         else [manifest_hashes(manifest)])
    return TaxonomyInputs(**_tax_head(suite, config_id, checkpoint, adapter), level=level, images=images, n_rows=None)


def baseline_inputs(suite: Suite, config_id: str, checkpoint: str, adapter: str | None, n_rows: int) -> TaxonomyInputs:
    """The inputs recorded with a ``taxonomy_baselines`` partition (always computed again)."""
    return TaxonomyInputs(**_tax_head(suite, config_id, checkpoint, adapter), level=None, images=None, n_rows=n_rows)


@dataclass
class TaxonomySummary:
    n_rows: int = 0
    n_images: int = 0
    n_vision_calls: int = 0
    seconds: float = 0.0
    quadrants: dict[str, int] = field(default_factory=dict)
    outcomes: dict[str, int] = field(default_factory=dict)


class _Scorer:
    """yes/no log-probabilities for one configuration's model (local: vision once per image)."""

    def __init__(self, suite: Suite, entry: TaxonomyConfigEntry) -> None:
        from medrobust_lib.tracks.vlm.model import Runner

        self.runner = Runner(suite, model_for(suite, entry))
        self.entry = entry

    @property
    def vision_calls(self) -> int:
        return self.runner.n_vision_calls

    def variants(self, image: np.ndarray | None, prompts: Sequence[str]) -> tuple[list[dict[str, float] | None], str]:
        """(log-probabilities per prompt or None where unavailable, source)."""
        if self.runner.hf is not None:
            return list(self.runner.hf.score_variants(image, prompts, ["yes", "no"])), "logprobs"
        res = self.runner.yes_no([image] * len(prompts), prompts)
        return [lp for lp, _ in res], "logprobs" if all(lp is not None for lp, _ in res) else "generate"

    def labels(self, image: np.ndarray | None, prompts: Sequence[str]) -> list[str | None]:
        """Generation + rules, for API answers without log-probabilities."""

        return [extract_yes_no(a.text) if a.text else None for _, a in self.runner.yes_no([image] * len(prompts),
                                                                                          prompts)]


def _yes_no_items(loaded: LoadedItems, samples: Collection[tuple[str, str]]) -> list[VLMItem]:
    """The readable yes/no records whose image is one of ``samples`` ((dataset, sample_id) keys)."""
    return [it for it in loaded.items if it.task == "vqa_yesno" and (it.dataset, it.sample_id) in samples]


def compute_baselines(suite: Suite, config_id: str, modality: str, log: Callable[[str], None] | None = None,
                      progress: Progress | None = None) -> int:
    """Text-only (and blank / noise image) answers to every original question of the modality's
    usable evaluation samples, for every configured image mode; returns the row count. (A sample
    that cannot be used now has none: :func:`evaluate` writes its ``error`` rows.) ``progress``:
    told of the yes/no records answered (``records``), one at a time."""
    from medrobust_lib.tracks.datasets import load_eval_samples

    tc = suite.taxonomy
    entry = config_entry(suite, config_id)
    scorer = _Scorer(suite, entry)
    samples = load_eval_samples(suite, modality, tc.split).samples
    rows: list[dict[str, Any]] = []
    items = _yes_no_items(load_items(suite), samples)
    for it in counted(items, progress, len(items), "records"):
        s = samples[(it.dataset, it.sample_id)]
        for mode in tc.image_modes:
            img = removed_image(mode, s.image, (it.dataset, it.sample_id), suite.seed)
            r = {"config": config_id, "checkpoint": scorer.runner.checkpoint, "adapter": scorer.runner.adapter,
                 "dataset": it.dataset, "modality": modality, "sample_id": it.sample_id, "record_id": it.record_id,
                 "image_mode": mode, "lp_yes": None, "lp_no": None, "pred": None, "source": None, "outcome": "ok",
                 "error": None}
            try:
                lps, source = scorer.variants(img, [it.question + YESNO_SUFFIX])
                lp = lps[0]
                if lp is not None:
                    r.update(lp_yes=lp["yes"], lp_no=lp["no"], pred="yes" if lp["yes"] >= lp["no"] else "no",
                             source=source)
                else:
                    label = scorer.labels(img, [it.question + YESNO_SUFFIX])[0]
                    r.update(pred=label, source="generate", outcome="ok" if label else "error",
                             error=None if label else "no yes/no answer")
            except Exception as exc:  # counted, never fatal
                r.update(outcome="error", error=f"{type(exc).__name__}: {exc}"[:300])
            rows.append(r)
    finish(progress, len(items), "records")
    part = {"config": config_id, "modality": modality}
    fp = baseline_inputs(suite, config_id, scorer.runner.checkpoint, scorer.runner.adapter, len(rows)).fingerprint
    _partition(suite, BASELINE_TABLE, part, BASELINE_COLUMNS).write(rows, fp)
    _, audit = paraphrase_sets(suite, items)
    for a in audit:
        a.update(config=config_id, accepted=bool(a.get("accepted")))
    _partition(suite, PARAPHRASE_TABLE, part, PARAPHRASE_COLUMNS).write(audit, fp)  # none: stale chunks removed
    return len(rows)


def _partition(suite: Suite, table: str, keys: Mapping[str, object], columns: Sequence[str]) -> Partition:
    """A partition of a taxonomy table; rows sorted by type, record, image mode and candidate."""
    return Partition(suite.results_dir, table, keys, columns,
                     lambda r: (str(r.get("perturbation", "")), str(r["record_id"]), str(r.get("image_mode", "")),
                                str(r.get("candidate", ""))))


def _baselines(suite: Suite, config_id: str, modality: str) -> dict[tuple[str, str], dict[str, Any]]:
    df = _partition(suite, BASELINE_TABLE, {"config": config_id, "modality": modality}, BASELINE_COLUMNS).read()
    if df.empty:
        raise FileNotFoundError(f"no text-only baselines for {config_id!r} / {modality}: materialize "
                                f"'{config_id}/text_only_baselines' first")
    return {(str(r["record_id"]), str(r["image_mode"])): {str(k): v for k, v in r.items()}
            for r in df.to_dict("records")}


def _unasked_rows(suite: Suite, scorer: _Scorer, items: list[VLMItem], cond: Condition, reason: str,
                  outcome: str = ERROR_OUTCOME) -> list[dict[str, Any]]:
    """Unscored rows (every image mode) for the items of an image that was not asked about:
    ``error`` for a sample that cannot be used now (flags NULL, counted, retried by the next run),
    or another outcome such as ``excluded:perturbation_error``; the ``error`` column holds
    ``reason``."""
    rows: list[dict[str, Any]] = []
    for it in items:
        for mode in suite.taxonomy.image_modes:
            r: dict[str, Any] = dict.fromkeys(COLUMN_NAMES)
            r.update(config=scorer.entry.id, checkpoint=scorer.runner.checkpoint, adapter=scorer.runner.adapter,
                     dataset=it.dataset, modality=cond.sample.modality, sample_id=it.sample_id,
                     record_id=it.record_id, perturbation=cond.perturbation, level=cond.level,
                     strength=cond.strength, ssim=cond.ssim, image_mode=mode, answer=it.answer or None)
            rows.append(error_row(r, reason, outcome=outcome))
    return rows


def _dropped_rows(suite: Suite, scorer: _Scorer, dropped: Sequence[DroppedRecord], cond: Condition
                  ) -> list[dict[str, Any]]:
    """``error`` rows (every image mode; ``answer`` NULL) for the yes/no records of ``cond``'s image
    that their reader quarantined, each with its own reason (:attr:`DroppedRecord.error`)."""
    return [r for d in dropped for r in _unasked_rows(suite, scorer, [d.as_item()], cond, d.error)]


def _items_by_sample(items: Sequence[VLMItem], keys: Collection[tuple[str, str]]
                     ) -> dict[tuple[str, str], list[VLMItem]]:
    """The ``items`` whose image is one of ``keys``, by image."""
    by: dict[tuple[str, str], list[VLMItem]] = {}
    for it in items:
        if (it.dataset, it.sample_id) in keys:
            by.setdefault((it.dataset, it.sample_id), []).append(it)
    return by


def _classify_rows(suite: Suite, entry: TaxonomyConfigEntry, scorer: _Scorer, items: list[VLMItem],
                   cond: Condition, base: dict[tuple[str, str], dict[str, Any]],
                   variants: dict[str, tuple[tuple[str, int], ...]]) -> list[dict[str, Any]]:
    """Rows for every yes/no item of one (possibly perturbed) image: all variants of all items
    are scored in one vision-once call."""

    tc = suite.taxonomy
    per_item = [(it, variants[it.record_id]) for it in items]
    prompts = [t + YESNO_SUFFIX for _, vs in per_item for t, _ in vs]
    error: str | None = None
    lps: list[dict[str, float] | None] = [None] * len(prompts)
    source = "logprobs"
    try:
        lps, source = scorer.variants(cond.image, prompts)
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"[:300]
    rows: list[dict[str, Any]] = []
    k = 0
    for it, vs in per_item:
        mine = lps[k : k + len(vs)]
        k += len(vs)
        for mode in tc.image_modes:
            r: dict[str, Any] = dict.fromkeys(COLUMN_NAMES)
            r.update(config=entry.id, checkpoint=scorer.runner.checkpoint, adapter=scorer.runner.adapter,
                     dataset=it.dataset, modality=cond.sample.modality, sample_id=it.sample_id,
                     record_id=it.record_id, perturbation=cond.perturbation, level=cond.level,
                     strength=cond.strength, ssim=cond.ssim, image_mode=mode, n_variants=len(vs), answer=it.answer,
                     source=source, outcome="ok")
            b = base.get((it.record_id, mode))
            if error is not None or b is None or b["outcome"] != "ok":
                r.update(outcome="error", error=error or (b["error"] if b else "no baseline for this record"))
                rows.append(r)
                continue
            pols = [p for _, p in vs]
            if all(lp is not None for lp in mine) and b["lp_yes"] is not None:
                flags = classify([lp for lp in mine if lp is not None], pols, it.answer,
                                 {"yes": float(b["lp_yes"]), "no": float(b["lp_no"])})
            else:
                labels = scorer.labels(cond.image, [t + YESNO_SUFFIX for t, _ in vs])
                if any(lab is None for lab in labels):
                    r.update(outcome="error", error="an answer could not be parsed as yes/no", source="generate")
                    rows.append(r)
                    continue
                flags = classify_labels([str(lab) for lab in labels], pols, it.answer, str(b["pred"]))
                r["source"] = "generate"
            r.update({f.name: getattr(flags, f.name) for f in dataclasses.fields(flags)})
            rows.append(r)
    return rows


def evaluate(suite: Suite, config_id: str, modality: str, level: int,
             log: Callable[[str], None] | None = None, progress: Progress | None = None) -> TaxonomySummary:
    """``taxonomy_results`` rows for one modality: clean (``level`` 0) or every perturbed image
    of the (modality, level) manifest partition. A sample of the evaluation split that cannot be
    used now (missing, unreadable, quarantined since the clean index or manifest was built) gives
    ``error`` rows with the reason; only samples of another split are skipped. A yes/no record of
    an evaluation image that its reader quarantined (image file gone, malformed entry) gives
    ``error`` rows with its own reason (``missing: <image path>``, ``quarantined:<reason>: ...``).
    ``progress``: told of the images scored (:data:`PROGRESS_WHAT`, every variant of every yes/no
    record of the image), one at a time, of the partition's total."""
    from medrobust_lib.perturb.regen_cache import regenerate_cached
    from medrobust_lib.tracks.datasets import load_eval_samples, placeholder_sample
    from medrobust_lib.tracks.perturbed import manifest_keys, read_manifest

    t0 = time.perf_counter()
    tc = suite.taxonomy
    entry = config_entry(suite, config_id)
    scorer = _Scorer(suite, entry)
    ev = load_eval_samples(suite, modality, tc.split)
    samples = ev.samples
    # Re-runs keep the stored non-error rows of the same inputs and score only the images that
    # still have a missing or error row (medrobust_lib.store.rerun).
    manifest = read_manifest(suite, modality, level) if level != 0 else None
    unusable = ev.unusable if manifest is None else ev.reasons_for(manifest_keys(manifest))
    loaded = load_items(suite)
    yes_no = _yes_no_items(loaded, samples.keys() | unusable.keys())
    by, by_unusable = _items_by_sample(yes_no, samples.keys()), _items_by_sample(yes_no, unusable.keys())
    lost = loaded.dropped_by_sample(samples.keys() | unusable.keys(), "vqa_yesno")
    base = _baselines(suite, config_id, modality)
    variants, _ = paraphrase_sets(suite, [it for v in by.values() for it in v])
    v0 = scorer.vision_calls
    rows: list[dict[str, Any]] = []
    n_images = 0
    fp = taxonomy_inputs(suite, config_id, scorer.runner.checkpoint, scorer.runner.adapter, level, samples,
                         manifest).fingerprint
    part = _partition(suite, TAXONOMY_TABLE, {"config": config_id, "run": "clean" if level == 0 else "perturbation",
                                              "modality": modality, "level": level}, COLUMN_NAMES)
    kept = part.kept_rows(fp, ROW_KEY)

    def done(items: list[VLMItem], perturbation: str) -> bool:
        return all((it.dataset, it.record_id, perturbation, mode) in kept for it in items for mode in tc.image_modes)

    def scored(mr: Mapping[str, Any]) -> bool:
        """The manifest row's image is scored below (the last branch of the loop over the manifest)."""
        key = (str(mr["dataset"]), str(mr["sample_id"]))
        return (key not in unusable and bool(by.get(key)) and not done(by[key], str(mr["perturbation"]))
                and mr["status"] == "ok")

    if manifest is None:
        todo = [(key, items) for key, items in sorted(by.items()) if not done(items, "clean")]
        total = len(todo)
        for key, items in counted(todo, progress, total, PROGRESS_WHAT):
            rows.extend(_classify_rows(suite, entry, scorer, items, Condition(samples[key], samples[key].image), base,
                                       variants))
            n_images += 1
        for key, items in sorted(by_unusable.items()):
            if not done(items, "clean"):
                stand_in = placeholder_sample(key, modality)
                rows.extend(_unasked_rows(suite, scorer, items, Condition(stand_in, stand_in.image), unusable[key]))
        for key, dropped in sorted(lost.items()):
            stand_in = placeholder_sample(key, modality)
            rows.extend(_dropped_rows(suite, scorer, [d for d in dropped if not done([d.as_item()], "clean")],
                                      Condition(stand_in, stand_in.image)))
    else:
        records = [{str(k): v for k, v in rec.items()} for rec in manifest.to_dict("records")]
        total = sum(1 for mr in records if scored(mr))
        if progress is not None:
            progress(0, total, PROGRESS_WHAT)
        for mr in records:
            key = (str(mr["dataset"]), str(mr["sample_id"]))
            perturbation = str(mr["perturbation"])
            items = by.get(key) or by_unusable.get(key, [])
            dropped = [d for d in lost.get(key, []) if not done([d.as_item()], perturbation)]
            if not items and not dropped:
                continue  # another split, or no yes/no record asks about this image
            s = samples.get(key) or placeholder_sample(key, modality)
            cond = Condition(s, s.image, perturbation, level, mr.get("strength"), mr.get("ssim"))
            rows.extend(_dropped_rows(suite, scorer, dropped, cond))
            if not items or done(items, perturbation):
                continue  # no readable yes/no record, or every row is kept from the last run
            if key in unusable:
                rows.extend(_unasked_rows(suite, scorer, items, cond, unusable[key]))
                continue
            if mr["status"] != "ok":
                rows.extend(_unasked_rows(suite, scorer, items, cond, str(mr.get("error")),
                                          outcome=excluded_outcome(str(mr["status"]))))
                continue
            cond = dataclasses.replace(cond, image=regenerate_cached(mr, s).image)
            rows.extend(_classify_rows(suite, entry, scorer, by[key], cond, base, variants))
            n_images += 1
            if progress is not None and n_images < total:
                progress(n_images, total, PROGRESS_WHAT)
    finish(progress, total, PROGRESS_WHAT)
    rows = rerun.merge_rows(kept, rows, ROW_KEY)
    part.write(rows, fp)
    df = pd.DataFrame(rows)
    out = TaxonomySummary(n_rows=len(rows), n_images=n_images, n_vision_calls=scorer.vision_calls - v0,
                          seconds=time.perf_counter() - t0)
    if len(df):
        out.outcomes = outcome_counts(df)
        out.quadrants = outcome_counts(df[df["outcome"] == "ok"], "quadrant")
    return out
