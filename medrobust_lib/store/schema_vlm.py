"""The ``vlm_results`` row schema, shared by the VLM evaluation, its report and the mart.

One row per (model, checkpoint, task, record, prompt variant, image mode, condition). Partition
folders: ``vlm_results/model=<id>/run=<clean|perturbation>/modality=<m>/level=<0..5>/<dataset>.parquet``.

Columns (SQL types in :data:`VLM_COLUMNS`):

- ``task``: ``vqa_mc``, ``vqa_yesno``, ``caption``, ``grounding``.
- ``perturbation``: ``clean`` or a registered type; ``level`` 0 for clean, else 1..5;
  ``strength`` and ``ssim`` from the perturbation manifest.
- ``prompt_id``: 0 for the original question, k for the k-th paraphrase; ``image_mode``
  ``image`` (default), or ``none`` / ``blank`` / ``noise`` for image-removal baselines.
- ``prediction``: the raw model text (None when the model produced none); ``parsed``: letter,
  yes/no, or the pixel box as JSON; ``outcome``: model behaviour ``ok``, ``unparseable``,
  ``refused`` (scored, the last two as wrong); infrastructure ``error`` (transport, retries
  exhausted, cache, out of memory, an exception in the runner: no prediction, every score column
  NULL, outside every denominator, counted in ``n_error`` and retried by the next run of the
  partition); or ``excluded:<reason>`` (the condition cannot be scored, e.g.
  ``excluded:perturbation_error``, ``excluded:box_out_of_view``, ``excluded:image_not_indexed``;
  ``correct`` is NULL and the row is outside denominators but counted in ``n_excluded``).
- ``correct``: 1.0 / 0.0 for VQA (and grounding: IoU >= 0.5); NULL for captions.
- Grounding: ``iou`` (0 when unparseable), ``acc_75``, ``box_scale``.
- Yes/no: ``margin`` (log p(yes) - log p(no), nats), ``p_yes``, ``entropy`` (bits), ``source``
  (``logprobs`` or ``generate``).
- Captions: per-sample ``bleu_4``, ``rouge_l``, ``cider_d`` (document frequencies of the clean
  reference set) and BLEU sufficient statistics ``bleu_c1..4``, ``bleu_g1..4``, ``hyp_len``,
  ``ref_len`` (sum them over any group for that group's corpus BLEU).
- ``latency_s`` (per answer, batch time divided by batch size), ``cache_hit`` (API cache).
- Optional LLM judge (``vlm.judge``, off by default): for multiple-choice answers the rules could
  not parse, ``judge_model``, ``judge_outcome``, ``judge_parsed`` (letter) and ``judge_correct``;
  NULL when no judge ran. ``correct`` is always the rule-based score.
"""

from __future__ import annotations

VLM_TABLE = "vlm_results"
TASKS: tuple[str, ...] = ("vqa_mc", "vqa_yesno", "caption", "grounding")

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
    ("judge_correct", "DOUBLE"),
)
COLUMN_NAMES: tuple[str, ...] = tuple(c for c, _ in VLM_COLUMNS)
PRIMARY_METRIC: dict[str, str] = {"vqa_mc": "accuracy", "vqa_yesno": "accuracy", "caption": "cider_d",
                                  "grounding": "acc@0.5"}
