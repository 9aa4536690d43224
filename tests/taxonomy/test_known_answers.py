"""The demo's known-answer checks on quadrant statistics of scripted models with known behaviour."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from medrobust_lib.taxonomy.aggregates import quadrant_stats
from medrobust_lib.taxonomy.known_answers import clean_summary, demo_checks
from medrobust_lib.taxonomy.quadrants import classify


def _lp(label: str, confidence: float = 0.9) -> dict[str, float]:
    p = confidence if label == "yes" else 1 - confidence
    return {"yes": math.log(p), "no": math.log(1 - p)}


def _rows(config: str, dataset: str, image_answer: str, n: int = 40, errors: int = 0) -> list[dict[str, object]]:
    """``n`` label-balanced records; the text-only answer is yes on even records (a wording cue with
    no information: right on half). ``image_answer``: ``label`` (an accurate image-reliant model),
    ``text`` (a shortcut: answers as without the image) or ``yes`` (constant)."""
    out: list[dict[str, object]] = []
    for i in range(n):
        label = "yes" if (i // 2) % 2 == 0 else "no"
        text = "yes" if i % 2 == 0 else "no"
        ans = {"label": label, "text": text, "yes": "yes"}[image_answer]
        flags = classify([_lp(ans)] * 6, [1] * 6, label, _lp(text, 0.8))
        out.append({"config": config, "dataset": dataset, "perturbation": "clean", "level": 0, "image_mode": "none",
                    "record_id": f"{dataset}-{i}", "answer": label, "outcome": "ok", **flags.to_dict()})
    out += [{"config": config, "dataset": dataset, "perturbation": "clean", "level": 0, "image_mode": "none",
             "record_id": f"{dataset}-e{i}", "answer": "yes", "outcome": "error"} for i in range(errors)]
    return out


def _stats(*parts: list[dict[str, object]]) -> pd.DataFrame:
    return quadrant_stats(pd.DataFrame([r for p in parts for r in p]), n_boot=20)


def test_accurate_reliant_model_and_shortcut_pass() -> None:
    stats = _stats(_rows("demo-image-reliant", "a", "label"), _rows("demo-image-reliant", "b", "label", errors=5),
                   _rows("demo-shortcut", "a", "text"), _rows("demo-shortcut", "b", "text"))
    checks = demo_checks(stats)
    assert all(c.passed for c in checks), [c.text() for c in checks]
    by = {(c.config, c.name): c for c in checks}
    assert by[("demo-image-reliant", "text_only_accuracy")].value == 0.5
    assert by[("demo-image-reliant", "image_reliant_share")].value == 0.5  # exactly 1 - text-only accuracy
    assert by[("demo-image-reliant", "image_reliant_share")].bound == pytest.approx(0.45)
    assert by[("demo-image-reliant", "image_reliant_share")].n == 80  # error rows are in no denominator
    assert by[("demo-shortcut", "dangerous_share")].value == 1.0
    assert by[("demo-shortcut", "image_reliant_share")].value == 0.0
    summary = clean_summary(stats).set_index("config")
    assert summary.loc["demo-image-reliant", "n_error"] == 5
    assert summary.loc["demo-image-reliant", "dangerous_floor"] == 0.5
    assert summary.loc["demo-image-reliant", "Dangerous"] == 0.5  # an accurate model sits on the floor


def test_checks_fail_where_the_known_answer_is_missed() -> None:
    stats = _stats(_rows("demo-image-reliant", "a", "text"), _rows("demo-shortcut", "a", "label"))
    failed = {(c.config, c.name) for c in demo_checks(stats) if not c.passed}
    assert failed == {("demo-image-reliant", "image_reliant_share"), ("demo-shortcut", "dangerous_share"),
                      ("demo-shortcut", "image_reliant_share")}
    # a wording that gives the answer away: text-only accuracy 1.0 is outside 0.5 +- 0.1
    leaky = _stats([{**r, "pred_removed": r["answer"]} for r in _rows("other", "a", "label")])
    assert [(c.name, c.passed) for c in demo_checks(leaky)] == [("text_only_accuracy", False)]


def test_modes_are_validated_and_filtered() -> None:
    stats = _stats(_rows("demo-shortcut", "a", "text"))
    assert demo_checks(stats, ("blank",)) == []
    with pytest.raises(ValueError, match="image modes"):
        demo_checks(stats, ("grey",))
