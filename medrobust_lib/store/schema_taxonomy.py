"""The ``taxonomy_results`` row schema ("Consistent but Dangerous" per-sample taxonomy).

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
  (a prediction failed: flags NULL, counted) or ``excluded:<reason>``; ``error`` text.
"""

from __future__ import annotations

from medrobust_lib.config.taxonomy import DEFAULT_ABSTENTION_TAU  # noqa: F401  (re-exported)

TAXONOMY_TABLE = "taxonomy_results"
QUADRANTS: tuple[str, ...] = ("Ideal", "Fragile", "Dangerous", "Worst")
IMAGE_MODES: tuple[str, ...] = ("none", "blank", "noise")

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
COLUMN_NAMES: tuple[str, ...] = tuple(c for c, _ in TAXONOMY_COLUMNS)
