"""Per-sample flags and quadrant of the "Consistent but Dangerous" taxonomy.

Definitions follow :mod:`medrobust_lib.store.schema`:

* Variants: the original question first (polarity +1), then its paraphrases: semantically
  equivalent rewordings (polarity +1, same expected answer) and, only where a run keeps them,
  negations (polarity -1, inverse expected answer).
* ``consistent`` (the paper's definition): the answers to the original question and its +1
  paraphrases are all identical; negations never enter it. A sample is *flipped* when it is not
  consistent, and the ``flip_rate`` of a group is the share of its flipped samples (see
  :mod:`medrobust_lib.taxonomy.aggregates`). ``pairwise_disagreement``: share of the K(K-1)/2
  unordered pairs of +1 variants whose answers differ, in [0, 1] (0 for K = 1).
* Negation robustness (separate, only with negations): ``negation_consistent`` is true when every
  negation's answer, inverted ("polarity-normalised"), equals the original question's answer;
  None without negations.
* ``image_reliant``: the prediction on the original question differs with the image removed.
  ``reliance_score``: ``|p_yes_original - p_yes_removed|`` in [0, 1] (from labels: 1.0 if the
  prediction flipped, else 0.0).
* Quadrants: Ideal (consistent, reliant), Fragile (inconsistent, reliant), Dangerous
  (consistent, not reliant), Worst (inconsistent, not reliant).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from medrobust_lib.vlm_tasks.vqa import yes_no_from_logprobs

_LABELS = ("yes", "no")


@dataclass(frozen=True)
class SampleFlags:
    """Taxonomy flags of one (record, condition, image mode); field meanings as in the schema.

    ``margin_*`` (nats), ``p_yes_original`` in [0, 1] and ``entropy_original`` (bits, [0, 1]) are
    None when computed from labels (generation fallback). ``correct_original`` is 1.0/0.0,
    ``accuracy_variants`` (over the +1 variants) and ``pairwise_disagreement`` in [0, 1];
    ``n_negations`` >= 0 and ``negation_consistent`` None when it is 0.
    """

    consistent: bool
    pairwise_disagreement: float
    image_reliant: bool
    reliance_score: float
    quadrant: str
    pred_original: str
    pred_removed: str
    margin_original: float | None
    margin_removed: float | None
    p_yes_original: float | None
    entropy_original: float | None
    correct_original: float
    accuracy_variants: float
    n_negations: int
    negation_consistent: bool | None

    def to_dict(self) -> dict[str, Any]:
        """Plain dict keyed by schema column names."""
        return asdict(self)


def quadrant_of(consistent: bool, image_reliant: bool) -> str:
    """Ideal / Fragile / Dangerous / Worst from the two flags."""
    if image_reliant:
        return "Ideal" if consistent else "Fragile"
    return "Dangerous" if consistent else "Worst"


def invert(label: str) -> str:
    """``yes`` <-> ``no``."""
    return "no" if label == "yes" else "yes"


def _label(value: str, name: str) -> str:
    lab = value.strip().lower()
    if lab not in _LABELS:
        raise ValueError(f"{name} must be 'yes' or 'no', got {value!r}")
    return lab


def _check_polarities(polarities: Sequence[int], n_variants: int) -> None:
    if n_variants < 1:
        raise ValueError("need at least one variant (the original question)")
    if len(polarities) != n_variants:
        raise ValueError(f"got {n_variants} variants but {len(polarities)} polarities")
    if any(p not in (1, -1) for p in polarities):
        raise ValueError(f"polarities must be +1 or -1, got {list(polarities)}")
    if polarities[0] != 1:
        raise ValueError("the original question (first variant) must have polarity +1")


def normalise(labels: Sequence[str], polarities: Sequence[int]) -> list[str]:
    """Polarity-normalised labels: -1 variants inverted, so every entry answers the original."""
    return [lab if pol == 1 else invert(lab) for lab, pol in zip(labels, polarities, strict=True)]


def pairwise_disagreement(labels: Sequence[str]) -> float:
    """Share of unordered pairs of ``labels`` that differ, in [0, 1]; 0.0 for fewer than two."""
    k = len(labels)
    if k < 2:
        return 0.0
    n_yes = sum(1 for lab in labels if lab == "yes")
    return n_yes * (k - n_yes) / (k * (k - 1) / 2)


def _flags(labels: Sequence[str], polarities: Sequence[int], answer: str, removed: str,
           reliance_score: float, margins: tuple[float | None, float | None],
           p_yes: float | None, entropy: float | None) -> SampleFlags:
    same = [lab for lab, pol in zip(labels, polarities, strict=True) if pol == 1]
    negated = [invert(lab) for lab, pol in zip(labels, polarities, strict=True) if pol == -1]
    consistent = len(set(same)) == 1
    reliant = labels[0] != removed
    return SampleFlags(
        consistent=consistent,
        pairwise_disagreement=pairwise_disagreement(same),
        image_reliant=reliant,
        reliance_score=reliance_score,
        quadrant=quadrant_of(consistent, reliant),
        pred_original=labels[0],
        pred_removed=removed,
        margin_original=margins[0],
        margin_removed=margins[1],
        p_yes_original=p_yes,
        entropy_original=entropy,
        correct_original=1.0 if labels[0] == answer else 0.0,
        accuracy_variants=sum(1 for lab in same if lab == answer) / len(same),
        n_negations=len(negated),
        negation_consistent=all(lab == labels[0] for lab in negated) if negated else None,
    )


def _score(lp: Mapping[str, float], name: str) -> tuple[str, float, float, float]:
    try:
        return yes_no_from_logprobs(float(lp["yes"]), float(lp["no"]))
    except KeyError as exc:
        raise ValueError(f"{name} needs 'yes' and 'no' log-probabilities, got keys {sorted(lp)}") from exc


def classify(variant_logprobs: Sequence[Mapping[str, float]], polarities: Sequence[int], answer: str,
             removed_logprobs: Mapping[str, float]) -> SampleFlags:
    """Flags from option scores.

    ``variant_logprobs``: one ``{"yes": lp, "no": lp}`` (finite natural-log probabilities) per
    variant scored with the image, original first. ``polarities``: +1/-1 per variant, the first
    +1; -1 variants (negations) feed only ``negation_consistent``, never ``consistent``. ``answer``: ``yes``/``no``, the expected answer to the original. ``removed_logprobs``: the
    original question scored with the image removed. Labels, margins, p(yes) and entropy come from
    :func:`medrobust_lib.vlm_tasks.vqa.yes_no_from_logprobs` (a tie reads yes). Raises ValueError on
    malformed input.
    """
    _check_polarities(polarities, len(variant_logprobs))
    ans = _label(answer, "answer")
    scored = [_score(lp, f"variant {i}") for i, lp in enumerate(variant_logprobs)]
    removed, margin_removed, p_yes_removed, _ = _score(removed_logprobs, "removed_logprobs")
    _, margin0, p_yes0, entropy0 = scored[0]
    return _flags([s[0] for s in scored], polarities, ans, removed, abs(p_yes0 - p_yes_removed),
                  (margin0, margin_removed), p_yes0, entropy0)


def classify_labels(variant_labels: Sequence[str], polarities: Sequence[int], answer: str,
                    removed_label: str) -> SampleFlags:
    """Flags from parsed yes/no labels (generation fallback for models without logprobs).

    Same arguments as :func:`classify` with labels (``yes``/``no``, case-insensitive) in place of
    log-probabilities. Margins, p(yes) and entropy are None; ``reliance_score`` is 1.0 when the
    original prediction flipped with the image removed, else 0.0. Unparseable answers are an
    ``error`` outcome upstream and raise ValueError here.
    """
    _check_polarities(polarities, len(variant_labels))
    ans = _label(answer, "answer")
    labels = [_label(lab, f"variant {i}") for i, lab in enumerate(variant_labels)]
    removed = _label(removed_label, "removed_label")
    return _flags(labels, polarities, ans, removed, 1.0 if labels[0] != removed else 0.0,
                  (None, None), None, None)


__all__ = ["SampleFlags", "classify", "classify_labels", "invert", "normalise", "pairwise_disagreement",
           "quadrant_of"]
