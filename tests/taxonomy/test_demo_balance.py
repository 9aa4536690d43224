"""The demo's yes/no questions are label-balanced per wording within every split, so any answer that
depends on the wording alone (a text-only answer without the image) is right on about half of them:
the known answer behind the taxonomy's text-only accuracy (0.5 +- 0.1) and its Dangerous floor."""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from medrobust_lib.demo import DemoManifest, DemoSample
from medrobust_lib.demo.records import yesno_records


def _by_split_and_wording(records: Sequence[dict[str, Any]], split_of: dict[tuple[str, str], str]
                          ) -> dict[str, dict[str, Counter[str]]]:
    out: dict[str, dict[str, Counter[str]]] = defaultdict(lambda: defaultdict(Counter))
    for r in records:
        out[split_of[(r["dataset"], r["sample_id"])]][r["question"]][r["answer"]] += 1
    return out


def _wording_only_accuracy_range(counts: dict[str, Counter[str]]) -> tuple[float, float]:
    """(worst, best) accuracy of any answer that is a function of the question text alone."""
    n = sum(sum(c.values()) for c in counts.values())
    best = sum(max(c["yes"], c["no"]) for c in counts.values())
    worst = sum(min(c["yes"], c["no"]) for c in counts.values())
    return worst / n, best / n


@pytest.fixture(scope="module")
def samples(demo_root: Path) -> list[DemoSample]:
    return list(DemoManifest.load(demo_root).samples())


def _population(samples: Sequence[DemoSample], copies: int) -> list[DemoSample]:
    """A larger demo-like population: every sample repeated with new ids and seeded splits (about
    60/15/25 %), the ground truth (modality, location, size, brightness) kept."""
    rng = np.random.default_rng(7)
    out = []
    for k in range(copies):
        for s in samples:
            split = str(rng.choice(["train", "val", "test"], p=[0.6, 0.15, 0.25]))
            out.append(dataclasses.replace(s, sample_id=f"{s.sample_id}_c{k}", split=split))
    return out


def test_demo_records_are_balanced_per_wording_in_every_split(demo_root: Path, samples: list[DemoSample]) -> None:
    import json

    records = [json.loads(x) for x in (demo_root / "records" / "yesno_paraphrases.jsonl").read_text().splitlines()]
    split_of = {(s.dataset, s.sample_id): s.split for s in samples}
    for split, counts in _by_split_and_wording(records, split_of).items():
        imbalance = sum(abs(c["yes"] - c["no"]) for c in counts.values())
        assert imbalance <= 4, (split, imbalance)  # only the few unpairable leftovers
        worst, best = _wording_only_accuracy_range(counts)
        assert 0.4 <= worst <= best <= 0.6, (split, worst, best)
    assert Counter(r["answer"] for r in records)["yes"] == len(records) // 2


@pytest.mark.parametrize("seed", [0, 1])
def test_any_text_only_answer_is_right_on_about_half(samples: list[DemoSample], seed: int) -> None:
    pop = _population(samples, copies=6)  # 240 samples, 480 questions
    records = yesno_records(pop, seed)
    split_of = {(s.dataset, s.sample_id): s.split for s in pop}
    for split, counts in _by_split_and_wording(records, split_of).items():
        worst, best = _wording_only_accuracy_range(counts)
        assert 0.45 <= worst <= best <= 0.55, (split, worst, best)
    # every question is still a true statement about its sample (yes) or a false one (no)
    truth = {(s.dataset, s.sample_id): s for s in pop}
    for r in records:
        s, f = truth[(r["dataset"], r["sample_id"])], r["finding"]
        if f.startswith("modality "):
            expected = f == f"modality {s.modality}"
        elif " half" in f:
            expected = s.horizontal in f or s.vertical in f
        else:
            expected = s.size in f if f.startswith(("small", "large")) else s.brightness in f
        assert r["answer"] == ("yes" if expected else "no"), r
    # five semantically equivalent paraphrases and two negations per question
    assert all(Counter(p["polarity"] for p in r["paraphrases"]) == {1: 5, -1: 2} for r in records)


def test_balanced_plan_is_deterministic(samples: list[DemoSample]) -> None:
    assert yesno_records(samples, 0) == yesno_records(samples, 0)
    assert yesno_records(samples, 0) != yesno_records(samples, 1)
