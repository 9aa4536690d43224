"""Known-answer tests of the per-sample taxonomy flags."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from medrobust_lib.store.schema import TAXONOMY_COLUMN_NAMES as COLUMN_NAMES
from medrobust_lib.taxonomy.quadrants import (
    SampleFlags,
    classify,
    classify_labels,
    pairwise_disagreement,
    quadrant_of,
)

YES = {"yes": math.log(0.8), "no": math.log(0.2)}  # p_yes 0.8
NO = {"yes": math.log(0.1), "no": math.log(0.9)}  # p_yes 0.1


def test_all_agree_and_removal_flips_is_ideal() -> None:
    f = classify([YES, YES, YES], [1, 1, 1], "yes", NO)
    assert f.consistent and f.image_reliant
    assert f.quadrant == "Ideal"
    assert f.pairwise_disagreement == 0.0
    assert f.n_negations == 0 and f.negation_consistent is None
    assert (f.pred_original, f.pred_removed) == ("yes", "no")
    assert f.p_yes_original == pytest.approx(0.8)
    assert f.margin_original == pytest.approx(math.log(4.0))
    assert f.margin_removed == pytest.approx(math.log(1 / 9))
    assert f.reliance_score == pytest.approx(0.7)
    expected_h = -(0.8 * math.log2(0.8) + 0.2 * math.log2(0.2))
    assert f.entropy_original == pytest.approx(expected_h)
    assert f.correct_original == 1.0
    assert f.accuracy_variants == 1.0


def test_negations_never_enter_consistency_and_feed_negation_robustness() -> None:
    # Original "yes", negation (-1) "no": the negation agrees once inverted.
    f = classify([YES, YES, NO], [1, 1, -1], "yes", NO)
    assert f.consistent and f.quadrant == "Ideal"
    assert f.n_negations == 1 and f.negation_consistent is True
    assert f.accuracy_variants == 1.0 and f.pairwise_disagreement == 0.0
    # Answering the negation with the same label breaks negation robustness, not consistency.
    g = classify([YES, YES, YES], [1, 1, -1], "yes", NO)
    assert g.consistent and g.quadrant == "Ideal"
    assert g.negation_consistent is False
    assert g.pairwise_disagreement == 0.0 and g.accuracy_variants == 1.0
    # Paraphrases (+1) that differ make the sample inconsistent whatever the negations say.
    h = classify([YES, NO, NO], [1, 1, -1], "yes", NO)
    assert not h.consistent and h.quadrant == "Fragile" and h.negation_consistent is True


def test_pairwise_disagreement_three_variants_one_disagreeing() -> None:
    f = classify([YES, YES, NO], [1, 1, 1], "yes", YES)
    assert f.pairwise_disagreement == pytest.approx(2 / 3)
    assert not f.consistent
    assert f.accuracy_variants == pytest.approx(2 / 3)
    assert pairwise_disagreement(["yes"]) == 0.0
    assert pairwise_disagreement(["yes", "no", "yes", "no"]) == pytest.approx(4 / 6)


@pytest.mark.parametrize(("variants", "removed", "quadrant"), [
    ([YES, YES], NO, "Ideal"),
    ([YES, NO], NO, "Fragile"),
    ([YES, YES], YES, "Dangerous"),
    ([YES, NO], YES, "Worst"),
])
def test_four_quadrants(variants: list[dict[str, float]], removed: dict[str, float], quadrant: str) -> None:
    assert classify(variants, [1, 1], "no", removed).quadrant == quadrant


def test_quadrant_of_table() -> None:
    assert quadrant_of(True, True) == "Ideal"
    assert quadrant_of(False, True) == "Fragile"
    assert quadrant_of(True, False) == "Dangerous"
    assert quadrant_of(False, False) == "Worst"


def test_single_variant_and_wrong_answer() -> None:
    f = classify([NO], [1], "Yes", NO)
    assert f.consistent and not f.image_reliant and f.quadrant == "Dangerous"
    assert f.pairwise_disagreement == 0.0
    assert f.correct_original == 0.0 and f.accuracy_variants == 0.0
    assert f.reliance_score == pytest.approx(0.0)


def test_labels_fallback() -> None:
    f = classify_labels(["Yes", "no", "yes"], [1, -1, 1], "yes", "yes")
    assert f.consistent and not f.image_reliant and f.quadrant == "Dangerous"
    assert f.n_negations == 1 and f.negation_consistent is True
    assert f.reliance_score == 0.0
    assert f.margin_original is None and f.p_yes_original is None and f.entropy_original is None
    g = classify_labels(["yes", "yes"], [1, 1], "no", "no")
    assert g.quadrant == "Ideal" and g.reliance_score == 1.0 and g.correct_original == 0.0


def test_flags_fields_are_schema_columns() -> None:
    f = classify([YES], [1], "yes", NO)
    assert isinstance(f, SampleFlags)
    assert set(f.to_dict()) <= set(COLUMN_NAMES)


@pytest.mark.parametrize("call", [
    lambda: classify([], [], "yes", NO),
    lambda: classify([YES, YES], [1], "yes", NO),
    lambda: classify([YES, YES], [-1, 1], "yes", NO),
    lambda: classify([YES, YES], [1, 2], "yes", NO),
    lambda: classify([YES], [1], "maybe", NO),
    lambda: classify([{"yes": -1.0}], [1], "yes", NO),
    lambda: classify([{"yes": float("nan"), "no": -1.0}], [1], "yes", NO),
    lambda: classify_labels(["unclear"], [1], "yes", "no"),
])
def test_malformed_input_raises(call: Callable[[], object]) -> None:
    with pytest.raises(ValueError):
        call()
