"""The one definition of every results table and mart table: columns, SQL types, meaning.

Every table is a :class:`MartTable` in :data:`MART_TABLES` (name, (column, DuckDB type) pairs, a
description); the mart's DDL is generated from it (:mod:`medrobust_lib.store.marts`), docs/mart-schema.md is checked against it (``tests/store/test_mart_docs.py``), and every Parquet
chunk a table writes carries the Arrow schema derived from it (:func:`conform`, used by
:func:`medrobust_lib.store.results.write_chunk`), so a reader can read a table's folder as one table
(no all-null chunk typed ``null``).

Per-table notes follow.

``vlm``: The ``vlm_results`` row schema, shared by the VLM evaluation, its report and the mart.

One row per (model, checkpoint, task, record, prompt variant, image mode, condition). Partition
folders: ``vlm_results/model=<id>/run=<clean|perturbation>/modality=<m>/level=<0..5>/<dataset>.parquet``.

Columns (SQL types in :data:`VLM_COLUMNS`):

- ``task``: ``vqa_mc``, ``vqa_yesno``, ``caption``, ``grounding``; ``vqa_open`` (the multiple-choice
  question asked alone and scored by ``vlm.protocol.open_vqa_judge``: ``correct`` = judge score
  >= 0.5, the score in ``parsed`` and ``judge_parsed``).
- ``perturbation``: ``clean`` or a registered type; ``level`` 0 for clean, else 1..5;
  ``strength`` and ``ssim`` from the perturbation manifest.
- ``prompt_id``: 0 for the original question, k for the k-th paraphrase; ``image_mode``
  ``image`` (default), or ``none`` / ``blank`` / ``noise`` for image-removal baselines.
- ``prediction``: the raw model text (None when the model produced none); ``parsed``: letter,
  yes/no, or the pixel box as JSON; ``outcome``: model behaviour ``ok``, ``unparseable``,
  ``refused`` (scored, the last two as wrong); infrastructure ``error`` (transport, retries
  exhausted, cache, out of memory, an exception in the runner, an image of the evaluation split
  missing or quarantined since the clean index or manifest was built, a record of an evaluation
  image that its record reader quarantined (``missing: <image path>`` when the image file is gone,
  else ``quarantined:<reason>: <detail>``): no prediction, every score column NULL, outside every
  denominator, counted in ``n_error`` and retried by the next run of the partition); or ``excluded:<reason>`` (the condition cannot be scored, e.g.
  ``excluded:perturbation_error``, ``excluded:not_applicable`` (the type does not apply to the
  image), ``excluded:box_out_of_view``, ``excluded:image_not_indexed``;
  ``correct`` is NULL and the row is outside denominators but counted in ``n_excluded``).
- ``correct``: 1.0 / 0.0 for VQA (and grounding: IoU >= 0.5); NULL for captions.
- Grounding: ``iou`` (0 when unparseable), ``acc_75``, ``box_scale``.
- Yes/no: ``margin`` (log p(yes) - log p(no), nats), ``p_yes``, ``entropy`` (bits), ``source``
  (``logprobs`` or ``generate``).
- Captions: per-sample ``bleu_4``, ``rouge_l``, ``cider_d`` (document frequencies of the clean
  reference set) and BLEU sufficient statistics ``bleu_c1..4``, ``bleu_g1..4``, ``hyp_len``,
  ``ref_len`` (sum them over any group for that group's corpus BLEU); with
  ``vlm.protocol.caption_raw_scores`` also ``bleu_4_raw``, ``rouge_l_raw``, ``cider_raw`` (raw,
  untokenised strings as the reference benchmark scores them; NULL otherwise); with
  ``vlm.protocol.caption_judge`` also ``caption_judge_score``, the judge's score of the caption
  (the reference's rubric, a number from 0 to 1 read as the reference reads it, not clamped; NULL
  when the reply held no number, when no caption judge ran, and for rows written before the column
  existed; ``judge_model`` / ``judge_outcome`` name the judge and how its call went).
- ``latency_s`` (per answer, batch time divided by batch size), ``cache_hit`` (API cache).
- Optional LLM judge (``vlm.judge``, off by default): for multiple-choice answers the rules could
  not parse, ``judge_model``, ``judge_outcome``, ``judge_parsed`` (letter) and ``judge_correct``;
  NULL when no judge ran. ``correct`` is always the rule-based score.
- ``n_options``: the answer options the multiple-choice item offered (its chance level is
  1/``n_options``); NULL for the other tasks (and for rows written before the column existed).
- ``sanitized``: characters of the answer were replaced by U+FFFD before it was stored (lone
  surrogates, NUL, ESC and other control characters an API returned); NULL without an answer
  (and for rows written before the column existed).
- Decoding (``vlm.models[]``): ``system_prompt`` (NULL: none), ``temperature`` (0: greedy),
  ``top_p`` (NULL: not used) and ``decode_seed`` (the seed of a sampling model, NULL when greedy);
  all NULL for rows written before the columns existed.

``taxonomy``: The ``taxonomy_results`` row schema ("Consistent but Dangerous" per-sample taxonomy).

One row per (configuration, yes/no record, condition, image-removal mode). Partition folders:
``taxonomy_results/config=<id>/run=<clean|perturbation>/modality=<m>/level=<0..5>/<dataset>.parquet``.

- ``config``: the model configuration name (e.g. ``demo-image-reliant``); ``checkpoint`` / ``adapter``
  identify its weights.
- ``perturbation`` ``clean`` or a type, ``level`` 0 or 1..5, ``strength``, ``ssim`` from the manifest.
- ``image_mode``: how the image was removed for the reliance test: ``none`` (no image token),
  ``blank`` (a mid-grey image of the same size) or ``noise`` (seeded uniform noise).
- ``n_variants``: question variants scored with the image (original first, negations included when kept); ``answer``: the
  expected answer to the original question.
- ``pred_original`` / ``pred_removed``: yes/no for the original question with / without the
  image; ``margin_*`` = log p(yes) - log p(no) (nats); ``p_yes_original``; ``entropy_original``
  (binary entropy, bits, in [0, 1]); ``correct_original`` 1/0; ``accuracy_variants``: share of the
  original question and its +1 paraphrases answered correctly.
- ``consistent``: the answers to the original question and its semantically equivalent
  paraphrases (polarity +1) are all identical (a sample that is not consistent is *flipped*; the
  ``flip_rate`` of a group is its share of flipped samples); ``pairwise_disagreement``: share of
  pairs of those variants whose answers differ, in [0, 1]; ``n_negations``: negated variants
  (polarity -1) scored, 0 unless ``taxonomy.negations`` keeps them; ``negation_consistent``: every
  inverted negation answer equals the original answer (NULL without negations);
  ``image_reliant``: ``pred_original != pred_removed``; ``reliance_score``:
  ``|p_yes_original - p_yes_removed|`` in [0, 1].
- ``quadrant``: ``Ideal`` (consistent, image-reliant), ``Fragile`` (inconsistent, image-reliant),
  ``Dangerous`` (consistent, not image-reliant), ``Worst`` (inconsistent, not image-reliant).
- ``source``: ``logprobs`` or ``generate`` (API fallback); ``outcome``: ``ok``, ``error``
  (a prediction failed, the image is missing or quarantined since the clean index or manifest
  was built, or the record reader quarantined the record: flags NULL, ``answer`` NULL for the
  latter, counted) or ``excluded:<reason>``; ``error`` text.

``strategy``: Schema of the strategy ranking table (kept apart so the mart imports no pandas/scipy).
It holds two variants of the ranking: ``with_floor`` false leaves the datasets whose clean score is
at the floor out of every mean (the view ``strategy_ranking``), true keeps them (the view
``strategy_ranking_all``); ``levels`` / ``n_datasets`` / ``n_floor_excluded`` say what each row
covers, ``rank`` ranks a row only among the rows of its (model, kind, levels), and ``note`` says why
a row is not ranked or that its group mixes coverages.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import pyarrow as pa

from medrobust_lib.config.taxonomy import DEFAULT_ABSTENTION_TAU  # noqa: F401  (re-exported)
from medrobust_lib.types import IMAGE_MODES, QUADRANTS  # noqa: F401  (the taxonomy's vocabulary, in the core)

# --- vlm ---
VLM_TABLE = "vlm_results"
TASKS: tuple[str, ...] = ("vqa_mc", "vqa_yesno", "caption", "grounding", "vqa_open")

VLM_COLUMNS: tuple[tuple[str, str], ...] = (
    ("model", "VARCHAR"), ("checkpoint", "VARCHAR"), ("adapter", "VARCHAR"), ("task", "VARCHAR"),
    ("dataset", "VARCHAR"), ("modality", "VARCHAR"), ("sample_id", "VARCHAR"), ("record_id", "VARCHAR"),
    ("prompt_id", "INTEGER"), ("image_mode", "VARCHAR"), ("perturbation", "VARCHAR"), ("level", "INTEGER"),
    ("strength", "DOUBLE"), ("ssim", "DOUBLE"), ("prediction", "VARCHAR"), ("parsed", "VARCHAR"),
    ("outcome", "VARCHAR"), ("correct", "DOUBLE"), ("iou", "DOUBLE"), ("acc_75", "DOUBLE"),
    ("box_scale", "VARCHAR"), ("margin", "DOUBLE"), ("p_yes", "DOUBLE"), ("entropy", "DOUBLE"),
    ("source", "VARCHAR"), ("bleu_4", "DOUBLE"), ("rouge_l", "DOUBLE"), ("cider_d", "DOUBLE"),
    ("bleu_c1", "DOUBLE"), ("bleu_c2", "DOUBLE"), ("bleu_c3", "DOUBLE"), ("bleu_c4", "DOUBLE"),
    ("bleu_g1", "DOUBLE"), ("bleu_g2", "DOUBLE"), ("bleu_g3", "DOUBLE"), ("bleu_g4", "DOUBLE"),
    ("hyp_len", "DOUBLE"), ("ref_len", "DOUBLE"), ("latency_s", "DOUBLE"), ("cache_hit", "BOOLEAN"),
    ("error", "VARCHAR"), ("judge_model", "VARCHAR"), ("judge_outcome", "VARCHAR"), ("judge_parsed", "VARCHAR"),
    ("judge_correct", "DOUBLE"), ("n_options", "INTEGER"),
    ("bleu_4_raw", "DOUBLE"), ("rouge_l_raw", "DOUBLE"), ("cider_raw", "DOUBLE"), ("truncated", "BOOLEAN"),
    ("sanitized", "BOOLEAN"), ("system_prompt", "VARCHAR"), ("temperature", "DOUBLE"), ("top_p", "DOUBLE"),
    ("decode_seed", "BIGINT"), ("caption_judge_score", "DOUBLE"),
)
VLM_COLUMN_NAMES: tuple[str, ...] = tuple(c for c, _ in VLM_COLUMNS)
PRIMARY_METRIC: dict[str, str] = {"vqa_mc": "accuracy", "vqa_yesno": "accuracy", "vqa_open": "accuracy",
                                  "caption": "cider_d", "grounding": "acc@0.5"}


# --- taxonomy ---
TAXONOMY_TABLE = "taxonomy_results"

TAXONOMY_COLUMNS: tuple[tuple[str, str], ...] = (
    ("config", "VARCHAR"), ("checkpoint", "VARCHAR"), ("adapter", "VARCHAR"), ("dataset", "VARCHAR"),
    ("modality", "VARCHAR"), ("sample_id", "VARCHAR"), ("record_id", "VARCHAR"), ("perturbation", "VARCHAR"),
    ("level", "INTEGER"), ("strength", "DOUBLE"), ("ssim", "DOUBLE"), ("image_mode", "VARCHAR"),
    ("n_variants", "INTEGER"), ("answer", "VARCHAR"), ("pred_original", "VARCHAR"), ("pred_removed", "VARCHAR"),
    ("margin_original", "DOUBLE"), ("margin_removed", "DOUBLE"), ("p_yes_original", "DOUBLE"),
    ("entropy_original", "DOUBLE"), ("correct_original", "DOUBLE"), ("accuracy_variants", "DOUBLE"),
    ("consistent", "BOOLEAN"), ("pairwise_disagreement", "DOUBLE"), ("n_negations", "INTEGER"),
    ("negation_consistent", "BOOLEAN"), ("image_reliant", "BOOLEAN"), ("reliance_score", "DOUBLE"),
    ("quadrant", "VARCHAR"), ("source", "VARCHAR"), ("outcome", "VARCHAR"), ("error", "VARCHAR"),
)
TAXONOMY_COLUMN_NAMES: tuple[str, ...] = tuple(c for c, _ in TAXONOMY_COLUMNS)


# --- segmentation outcomes ---
SEG_OK = "ok"
SEG_NOT_APPLICABLE = "not_applicable"
"""``segmentation_results`` status of a perturbed row whose type does not apply to the sample (the
manifest row is ``not_applicable``, e.g. an RGB-only type on a grayscale image): not a failure."""
SEG_NO_MASK = "no_mask"
"""``segmentation_results`` status of a sample without a ground-truth mask (nothing to score): not a
failure."""
SEG_NOT_SCORED: tuple[str, ...] = (SEG_NOT_APPLICABLE, SEG_NO_MASK)
"""Statuses that are neither scored nor failures: counted on their own (``n_not_applicable``,
``n_no_mask``), outside every mean and every failure count."""


def seg_failed_sql(col: str = "status") -> str:
    """SQL boolean: a ``segmentation_results`` row failed (any status but ``ok`` and
    :data:`SEG_NOT_SCORED`: ``error``, ``perturbation_error``, ``mask_out_of_view``)."""
    kept = ", ".join(f"'{s}'" for s in (SEG_OK, *SEG_NOT_SCORED))
    return f"coalesce({col} not in ({kept}), true)"


def excluded_outcome(manifest_status: str) -> str:
    """The VLM / taxonomy ``outcome`` of a record whose perturbation manifest row is not ``ok``:
    ``excluded:not_applicable`` when the type does not apply to the image, else
    ``excluded:perturbation_error``. Both are outside every denominator and never failures."""
    return f"excluded:{SEG_NOT_APPLICABLE if manifest_status == SEG_NOT_APPLICABLE else 'perturbation_error'}"


def seg_failed(status: str) -> bool:
    """Python twin of :func:`seg_failed_sql`."""
    return status not in (SEG_OK, *SEG_NOT_SCORED)


# --- strategy ---
RANKING_TABLE = "strategy_ranking_stats"
RANKING_COLUMNS: tuple[tuple[str, str], ...] = (
    ("model", "VARCHAR"), ("strategy", "VARCHAR"), ("evaluated_as", "VARCHAR"), ("checkpoint", "VARCHAR"),
    ("kind", "VARCHAR"), ("n_samples", "INTEGER"), ("n_conditions", "INTEGER"), ("n_rows", "INTEGER"),
    ("n_failed", "INTEGER"), ("n_not_applicable", "INTEGER"), ("n_no_mask", "INTEGER"), ("mean_iou_drop", "DOUBLE"), ("iou_drop_ci_low", "DOUBLE"),
    ("iou_drop_ci_high", "DOUBLE"), ("mean_dice_drop", "DOUBLE"), ("dice_drop_ci_low", "DOUBLE"),
    ("dice_drop_ci_high", "DOUBLE"), ("clean_iou", "DOUBLE"), ("clean_dice", "DOUBLE"),
    ("n_trainable", "BIGINT"), ("rank", "INTEGER"), ("tied", "BOOLEAN"), ("ref_strategy", "VARCHAR"), ("n_pairs", "INTEGER"),
    ("iou_drop_diff", "DOUBLE"), ("iou_drop_diff_ci_low", "DOUBLE"), ("iou_drop_diff_ci_high", "DOUBLE"),
    ("wilcoxon_p", "DOUBLE"), ("wilcoxon_q", "DOUBLE"), ("levels", "VARCHAR"), ("n_datasets", "INTEGER"),
    ("n_floor_excluded", "INTEGER"), ("floor_effect", "BOOLEAN"), ("with_floor", "BOOLEAN"), ("note", "VARCHAR"),
)

RANKING_VIEW = "strategy_ranking"
"""The view of the ranking without floor datasets (``with_floor`` false); ``strategy_ranking_all`` keeps them."""


# --- partition completeness (medrobust_lib.store.completeness) ---
COMPLETENESS_TABLE = "partition_completeness"
COMPLETENESS_COLUMNS: tuple[tuple[str, str], ...] = (
    ("source_table", "VARCHAR"), ("model", "VARCHAR"), ("modality", "VARCHAR"), ("level", "INTEGER"),
    ("n", "BIGINT"), ("n_excluded", "BIGINT"), ("n_attempted", "BIGINT"), ("n_error", "BIGINT"),
    ("error_share", "DOUBLE"), ("max_error_share", "DOUBLE"), ("complete", "BOOLEAN"),
)


@dataclass(frozen=True)
class MartTable:
    """A table loaded from ``<results_dir>/<name>/**/*.parquet``; ``columns`` (name, SQL type)
    fix its schema and order, which are stable and documented in docs/mart-schema.md."""

    name: str
    columns: tuple[tuple[str, str], ...]
    description: str


MART_TABLES: list[MartTable] = [
    MartTable("clean_samples", (
        ("sample_id", "VARCHAR"), ("dataset", "VARCHAR"), ("modality", "VARCHAR"), ("split", "VARCHAR"),
        ("image_path", "VARCHAR"), ("height", "INTEGER"), ("width", "INTEGER"), ("channels", "INTEGER"),
        ("mask_area", "BIGINT"), ("n_boxes", "INTEGER"), ("sha256", "VARCHAR"), ("status", "VARCHAR"),
        ("reason", "VARCHAR"), ("detail", "VARCHAR"), ("synthetic_labels", "BOOLEAN"),
    ), "one row per sample found by a reader; status 'ok' or 'quarantined' with the reason; synthetic_labels: "
       "the dataset's masks were generated with the image (the demo's synthetic lesions; DatasetConfig."
       "synthetic_labels), false for real labels, NULL in an index written before the column existed"),
    MartTable("perturbation_manifest", (
        ("sample_id", "VARCHAR"), ("dataset", "VARCHAR"), ("modality", "VARCHAR"), ("perturbation", "VARCHAR"),
        ("family", "VARCHAR"), ("geometry", "VARCHAR"), ("level", "INTEGER"), ("band_low", "DOUBLE"),
        ("band_high", "DOUBLE"), ("strength", "DOUBLE"), ("dataset_strength", "DOUBLE"), ("ssim", "DOUBLE"),
        ("band_reached", "BOOLEAN"), ("miss_reason", "VARCHAR"), ("n_ssim_evals", "INTEGER"),
        ("seed_key", "VARCHAR"), ("sha256", "VARCHAR"), ("status", "VARCHAR"), ("error", "VARCHAR"),
        ("warning", "VARCHAR"),
    ), "one row per (sample, perturbation, level): calibrated strength, SSIM and band flag; warning (nullable): "
       "set when a noise type's strength (a standard deviation or amplitude on the [0, 1] scale) exceeds the clean "
       "image's own value range (max - min), e.g. a 16-bit image read near-black"),
    MartTable("dataset_info", (
        ("dataset", "VARCHAR"), ("modality", "VARCHAR"), ("format", "VARCHAR"), ("synthetic_labels", "BOOLEAN"),
        ("evaluation_only", "BOOLEAN"), ("description", "VARCHAR"), ("reference_family", "VARCHAR"),
        ("reference_dice", "DOUBLE"), ("reference_n", "INTEGER"), ("reference_source", "VARCHAR"),
    ), "one row per dataset of the suite (per reference family when it has several), written with the clean "
       "index: its reader, whether its labels are synthetic, what it is (description: source, licence, how the "
       "labels were made) and an official inference's clean Dice on the same samples (reference_*: model family, "
       "mean Dice over reference_n samples, what produced it), NULL where none is known"),
    MartTable("segmentation_results", (
        ("model", "VARCHAR"), ("checkpoint", "VARCHAR"), ("strategy", "VARCHAR"), ("dataset", "VARCHAR"),
        ("modality", "VARCHAR"), ("sample_id", "VARCHAR"), ("condition", "VARCHAR"), ("perturbation", "VARCHAR"),
        ("level", "INTEGER"), ("strength", "DOUBLE"), ("ssim", "DOUBLE"), ("epsilon", "DOUBLE"), ("iou", "DOUBLE"),
        ("dice", "DOUBLE"), ("clean_iou", "DOUBLE"), ("clean_dice", "DOUBLE"), ("iou_drop", "DOUBLE"),
        ("dice_drop", "DOUBLE"), ("prompt", "VARCHAR"), ("status", "VARCHAR"), ("error", "VARCHAR"),
        ("empty_gt_policy", "VARCHAR"), ("precision", "VARCHAR"), ("family", "VARCHAR"), ("arch", "VARCHAR"),
        ("n_prompts", "INTEGER"), ("n_instances", "INTEGER"), ("instance_iou", "DOUBLE"), ("instance_dice", "DOUBLE"),
        ("pred_mask_sha256", "VARCHAR"),
    ), "one row per (model, image, condition): IoU/Dice and signed drops vs clean; precision: the model's "
       "arithmetic and what ran it (fp32, bf16-autocast: PyTorch; fp32-onnxruntime, fp32-openvino, "
       "fp32-openvino+onnxruntime (encoder, decoder): the exported graphs, models.onnx_engine); family / arch: the adapter family and architecture (arch 'tiny': "
       "the demo's from-scratch SAM; every other arch is a real architecture). iou / dice: the union of the "
       "masks of the image's box prompts against its whole mask; n_prompts: the box prompts given (one per "
       "instance for a dataset with instances, else one); for a sample with instances (per_component_boxes or "
       "instance labels) n_instances: its targets (those moved out of view by a spatial type get no prompt) and "
       "instance_iou / instance_dice: the mean over its prompted instances of each box's own mask against its "
       "own instance (NULL without instances; per instance: segmentation_instances); pred_mask_sha256: the "
       "stored union prediction (segmentation.store_masks; medrobust export-masks), NULL when not stored"),
    MartTable("segmentation_instances", (
        ("model", "VARCHAR"), ("checkpoint", "VARCHAR"), ("dataset", "VARCHAR"), ("modality", "VARCHAR"),
        ("sample_id", "VARCHAR"), ("condition", "VARCHAR"), ("perturbation", "VARCHAR"), ("level", "INTEGER"),
        ("epsilon", "DOUBLE"), ("prompt", "VARCHAR"), ("instance", "INTEGER"), ("iou", "DOUBLE"), ("dice", "DOUBLE"),
        ("gt_area", "BIGINT"), ("box_x0", "DOUBLE"), ("box_y0", "DOUBLE"), ("box_x1", "DOUBLE"), ("box_y1", "DOUBLE"),
        ("status", "VARCHAR"),
    ), "one row per (model, image with instances, condition, instance): the instance's own box prompt "
       "(pixel XYXY, end exclusive), the IoU / Dice of that box's mask against that instance alone, its "
       "ground-truth area in pixels; status ok, or out_of_view (a spatial perturbation moved it out of the "
       "image: no prompt, no score)"),
    MartTable("segmentation_examples", (
        ("model", "VARCHAR"), ("perturbation", "VARCHAR"), ("level", "INTEGER"), ("modality", "VARCHAR"),
        ("dataset", "VARCHAR"), ("sample_id", "VARCHAR"), ("mean_iou_drop", "DOUBLE"), ("clean_iou", "DOUBLE"),
        ("iou", "DOUBLE"), ("ssim", "DOUBLE"), ("png", "BLOB"),
    ), "per real-architecture model, its worst (type, level) cells by mean IoU drop and in each the image "
       "where it hurt most: clean image, ground truth, clean and perturbed predictions side by side (PNG)"),
    MartTable("segmentation_stats", (
        ("model", "VARCHAR"), ("checkpoint", "VARCHAR"), ("strategy", "VARCHAR"), ("condition", "VARCHAR"),
        ("perturbation", "VARCHAR"), ("level", "INTEGER"), ("n", "INTEGER"), ("iou", "DOUBLE"), ("dice", "DOUBLE"),
        ("iou_drop", "DOUBLE"), ("iou_drop_ci_low", "DOUBLE"), ("iou_drop_ci_high", "DOUBLE"),
        ("dice_drop", "DOUBLE"), ("dice_drop_ci_low", "DOUBLE"), ("dice_drop_ci_high", "DOUBLE"),
        ("wilcoxon_p", "DOUBLE"), ("wilcoxon_q", "DOUBLE"), ("scope", "VARCHAR"),
    ), "per (model, condition, type, level) and scope: bootstrap CIs of the drops, paired Wilcoxon p and BH q; "
       "scope 'all' pools every dataset, 'floor_excluded' leaves out the datasets at the floor (clean IoU or "
       "Dice < 0.1; written only for a model with such datasets, not all of them at the floor); 'in_band' and "
       "'floor_excluded_in_band' the same without off-band outputs (written when some output missed its band)"),
    MartTable(VLM_TABLE, VLM_COLUMNS,
              "one row per (model, checkpoint, task, record, prompt variant, image mode, condition): "
              "parsed answer, outcome (ok/unparseable/refused/error/excluded:<reason>) and scores"),
    MartTable("vlm_stats", (
        ("model", "VARCHAR"), ("checkpoint", "VARCHAR"), ("adapter", "VARCHAR"), ("task", "VARCHAR"),
        ("perturbation", "VARCHAR"), ("level", "INTEGER"), ("metric", "VARCHAR"), ("n_pairs", "INTEGER"),
        ("n_excluded", "INTEGER"), ("n_unmatched", "INTEGER"), ("n_error", "INTEGER"), ("clean_value", "DOUBLE"),
        ("clean_ci_low", "DOUBLE"), ("clean_ci_high", "DOUBLE"), ("perturbed_value", "DOUBLE"),
        ("perturbed_ci_low", "DOUBLE"), ("perturbed_ci_high", "DOUBLE"), ("drop", "DOUBLE"),
        ("drop_ci_low", "DOUBLE"), ("drop_ci_high", "DOUBLE"), ("test", "VARCHAR"), ("p_value", "DOUBLE"),
        ("q_value", "DOUBLE"),
    ), "per (model, checkpoint, adapter, task, type, level): paired clean vs perturbed primary metric, "
       "bootstrap CIs, McNemar (binary) or Wilcoxon (caption) p and BH q over the type x level grid"),
]


TAXONOMY_QUADRANT_STATS_COLUMNS: tuple[tuple[str, str], ...] = (
    ("config", "VARCHAR"), ("dataset", "VARCHAR"), ("perturbation", "VARCHAR"), ("level", "INTEGER"),
    ("image_mode", "VARCHAR"), ("quadrant", "VARCHAR"), ("n", "BIGINT"), ("n_total", "BIGINT"),
    ("share", "DOUBLE"), ("share_ci_low", "DOUBLE"), ("share_ci_high", "DOUBLE"), ("accuracy", "DOUBLE"),
    ("accuracy_ci_low", "DOUBLE"), ("accuracy_ci_high", "DOUBLE"), ("mean_entropy", "DOUBLE"),
    ("mean_pairwise_disagreement", "DOUBLE"), ("n_error", "BIGINT"), ("flip_rate", "DOUBLE"),
    ("text_only_accuracy", "DOUBLE"), ("dangerous_floor", "DOUBLE"), ("share_abstention", "DOUBLE"),
    ("abstention_tau", "DOUBLE"), ("negation_consistency", "DOUBLE"), ("n_negation_samples", "BIGINT"),
    ("band_miss", "BIGINT"),
)
TAXONOMY_CORRELATION_STATS_COLUMNS: tuple[tuple[str, str], ...] = (
    ("scope", "VARCHAR"), ("perturbation", "VARCHAR"), ("level", "INTEGER"), ("image_mode", "VARCHAR"),
    ("n_points", "BIGINT"), ("n_configs", "BIGINT"), ("n_error", "BIGINT"), ("r", "DOUBLE"), ("p_value", "DOUBLE"),
    ("ci_low", "DOUBLE"), ("ci_high", "DOUBLE"), ("ci_method", "VARCHAR"), ("fisher_low", "DOUBLE"),
    ("fisher_high", "DOUBLE"), ("note", "VARCHAR"),
)

MART_TABLES.extend([
    MartTable(TAXONOMY_TABLE, TAXONOMY_COLUMNS,
              "one row per (config, yes/no record, condition, image-removal mode): consistency over question "
              "variants, image reliance and the quadrant (Ideal/Fragile/Dangerous/Worst); outcome ok/error/"
              "excluded:<reason>"),
    MartTable("taxonomy_quadrant_stats", TAXONOMY_QUADRANT_STATS_COLUMNS,
              "per (config, dataset, type, level, image mode, quadrant): count and share of the ok rows with "
              "bootstrap CIs, accuracy with CIs, mean entropy and pairwise disagreement, error count; per group "
              "the flip rate, text-only accuracy, oracle Dangerous floor, abstention sensitivity share, "
              "negation robustness and band_miss (records whose perturbed image missed its SSIM band, left out "
              "of the statistics unless perturbations.include_off_band)"),
    MartTable("taxonomy_correlation_stats", TAXONOMY_CORRELATION_STATS_COLUMNS,
              "Pearson r between flip rate and Dangerous share over (config, dataset) points: headline on clean "
              "points, per perturbed condition, and pooled perturbed points with a cluster bootstrap CI"),
    MartTable("taxonomy_paraphrases", (
        ("config", "VARCHAR"), ("dataset", "VARCHAR"), ("record_id", "VARCHAR"), ("question", "VARCHAR"),
        ("candidate", "VARCHAR"), ("accepted", "BOOLEAN"), ("reason", "VARCHAR"), ("overlap", "DOUBLE"),
        ("source", "VARCHAR"), ("modality", "VARCHAR"),
    ), "audit of every model-written paraphrase candidate: accepted or the equivalence-filter reason"),
])

MART_TABLES.append(MartTable(
    RANKING_TABLE, RANKING_COLUMNS,
    "per (base model, fine-tuning strategy, kind corruption|attack, with_floor): mean IoU / Dice drop over the "
    "test samples (each sample's mean over conditions) with percentile bootstrap 95 % CIs, clean scores, "
    "trainable parameters, coverage (levels, datasets, floor datasets left out) and the rank by mean IoU drop "
    "(1 = most robust) among the strategies of the same levels"))

MART_TABLES.append(MartTable(
    COMPLETENESS_TABLE, COMPLETENESS_COLUMNS,
    "per partition (results table, model or config, modality, level) of vlm_results and taxonomy_results: rows, "
    "excluded, attempted and error rows, error share and whether it is within max_error_share (complete); views "
    "and statistics leave incomplete partitions out until they are re-run"))


_ARROW_TYPES: dict[str, pa.DataType] = {
    "VARCHAR": pa.string(), "DOUBLE": pa.float64(), "FLOAT": pa.float32(), "BIGINT": pa.int64(),
    "INTEGER": pa.int32(), "SMALLINT": pa.int16(), "BOOLEAN": pa.bool_(), "TIMESTAMP": pa.timestamp("us"),
    "DATE": pa.date32(), "BLOB": pa.binary(),
}


# --- results tables that stay out of the mart ---
TAXONOMY_BASELINES_TABLE = "taxonomy_baselines"
RESULTS_ONLY_TABLES: list[MartTable] = [
    MartTable(TAXONOMY_BASELINES_TABLE, (
        ("config", "VARCHAR"), ("checkpoint", "VARCHAR"), ("adapter", "VARCHAR"), ("dataset", "VARCHAR"),
        ("modality", "VARCHAR"), ("sample_id", "VARCHAR"), ("record_id", "VARCHAR"), ("image_mode", "VARCHAR"),
        ("lp_yes", "DOUBLE"), ("lp_no", "DOUBLE"), ("pred", "VARCHAR"), ("source", "VARCHAR"),
        ("outcome", "VARCHAR"), ("error", "VARCHAR"),
    ), "per (config, yes/no record, image-removal mode): the text-only answer (log p(yes), log p(no) in nats, "
       "the parsed yes/no), computed once per config and modality and reused by every condition of the taxonomy "
       "evaluation; Parquet only (partitions config=<id>/modality=<m>), not loaded into the mart"),
]
"""Tables written as Parquet under ``<results_dir>/<name>/`` that the mart does not load: declared here
so their chunks are typed like every other table's (:func:`conform`)."""


def table_columns(name: str) -> tuple[tuple[str, str], ...] | None:
    """The declared (column, DuckDB type) pairs of table ``name`` (a mart table or one of
    :data:`RESULTS_ONLY_TABLES`), or None for an undeclared table."""
    for t in (*MART_TABLES, *RESULTS_ONLY_TABLES):
        if t.name == name:
            return t.columns
    return None


def column_names(name: str, *, without: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The declared column names of table ``name`` in declared order, leaving out ``without`` (e.g.
    the partition columns a writer keeps in folder names). Raises KeyError for an undeclared table:
    every writer takes its columns from here."""
    cols = table_columns(name)
    if cols is None:
        raise KeyError(f"table {name!r} is not declared in medrobust_lib.store.schema")
    return tuple(c for c, _ in cols if c not in without)


def conform(df: pd.DataFrame, name: str) -> tuple[pd.DataFrame, pa.Schema | None]:
    """``df`` with its declared columns of table ``name`` cast to their declared types (integers
    with missing values become nullable integers, an all-null column takes its declared type), and
    the Arrow schema to write it with: declared columns typed as declared, undeclared ones inferred.
    A column whose values cannot take the declared type keeps its inferred type (never an error
    here; the mart's load then casts or fails naming the chunk)."""
    declared = dict(table_columns(name) or ())
    if not declared:
        return df, None
    out = df.copy()
    fields = []
    for c in out.columns:
        decl = declared.get(str(c), "").split("(")[0]
        typ = _ARROW_TYPES.get(decl)
        col = out[c]
        if typ is not None:
            try:
                if pa.types.is_integer(typ):
                    out[c] = col.astype("Int64") if col.isna().any() or col.dtype == object else col
                elif pa.types.is_floating(typ):
                    out[c] = pd.to_numeric(col, errors="raise").astype("float64")
                elif pa.types.is_boolean(typ):
                    out[c] = col.astype("boolean")
                elif pa.types.is_string(typ):
                    out[c] = col.astype(object).where(col.notna(), None)
                    if not all(v is None or isinstance(v, str) for v in out[c]):
                        raise TypeError(f"{c}: not text")
                pa.array(out[c], type=typ, from_pandas=True)  # would the declared type hold it?
                fields.append(pa.field(str(c), typ))
                continue
            except (TypeError, ValueError, pa.ArrowException):
                out[c] = col
        inferred = pa.array(col, from_pandas=True).type
        fields.append(pa.field(str(c), pa.string() if pa.types.is_null(inferred) else inferred))
    return out, pa.schema(fields)


# --- taxonomy confidence screening (medrobust_lib.taxonomy.confidence_screening) ---
TAXONOMY_SCREENING_TABLE = "taxonomy_screening_stats"
TAXONOMY_SCREENING_COLUMNS: tuple[tuple[str, str], ...] = (
    ("config", "VARCHAR"), ("dataset", "VARCHAR"), ("perturbation", "VARCHAR"), ("level", "INTEGER"),
    ("image_mode", "VARCHAR"), ("signal", "VARCHAR"), ("status", "VARCHAR"), ("n", "BIGINT"),
    ("n_dangerous", "BIGINT"), ("n_ideal", "BIGINT"), ("n_no_signal", "BIGINT"), ("auroc", "DOUBLE"),
    ("threshold", "DOUBLE"), ("ideal_kept", "DOUBLE"), ("dangerous_pass", "DOUBLE"), ("pooled_threshold", "DOUBLE"),
    ("dangerous_pass_pooled", "DOUBLE"), ("mean_confidence_dangerous", "DOUBLE"), ("mean_confidence_other", "DOUBLE"),
)
MART_TABLES.append(MartTable(
    TAXONOMY_SCREENING_TABLE, TAXONOMY_SCREENING_COLUMNS,
    "per (config, dataset, type, level, image mode) and confidence signal (max_p, margin, entropy of the original "
    "question's answer): AUROC of the signal's uncertainty for telling Dangerous from the other samples, and the "
    "share of Dangerous samples that pass a screen keeping 95 % of the Ideal ones (the configuration's own, and "
    "those of every configuration of the cell); 'not available' without the signal (an endpoint without "
    "log-probabilities)"))
