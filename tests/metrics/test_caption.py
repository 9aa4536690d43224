"""Caption metrics: tokenizer parity fixtures and conformance with pycocoevalcap 1.2 (pure-Python scorers)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from pycocoevalcap.bleu.bleu import Bleu
from pycocoevalcap.cider.cider import Cider
from pycocoevalcap.rouge.rouge import Rouge

from medrobust_lib.metrics.caption import DocumentFrequency, bleu, cider_d, ptb_tokenize, rouge_l
from medrobust_lib.seeding import rng_for

FIXTURES = json.loads((Path(__file__).parent / "fixtures" / "ptb_tokenizer_cases.json").read_text())
VOCAB = (
    "the a no there is are small large left right pleural effusion mass nodule lesion chest lung lungs "
    "heart normal enlarged x-ray ct mri 3.5 cm 5mm of in with and opacity consolidation fracture "
    "acute chronic mild severe bilateral lobe upper lower liver kidney brain infarct stable"
).split()
PUNCT = ["", "", "", ".", ",", ";"]


@pytest.mark.parametrize("case", FIXTURES["cases"], ids=lambda c: c["input"][:30] or "<empty>")
def test_ptb_tokenize_matches_stanford_fixture(case: dict) -> None:
    assert ptb_tokenize(case["input"]) == case["expected"]


def test_fixture_count() -> None:
    assert len(FIXTURES["cases"]) >= 30


def _sentence(rng: np.random.Generator, lo: int, hi: int) -> str:
    words = [str(rng.choice(VOCAB)) + str(rng.choice(PUNCT)) for _ in range(int(rng.integers(lo, hi)))]
    s = " ".join(words)
    return s[:1].upper() + s[1:] + "."


def _corpus(n: int = 120, salt: str = "caption-conformance") -> tuple[dict[str, list[str]], dict[str, str]]:
    refs: dict[str, list[str]] = {}
    hyps: dict[str, str] = {}
    for i in range(n):
        rng = rng_for(0, salt, i)
        refs[f"s{i}"] = [_sentence(rng, 3, 14) for _ in range(int(rng.integers(1, 4)))]
        if rng.random() < 0.3:  # paraphrase of a reference: high-overlap pairs
            words = refs[f"s{i}"][0].split()
            words[int(rng.integers(len(words)))] = str(rng.choice(VOCAB))
            hyps[f"s{i}"] = " ".join(words)
        else:
            hyps[f"s{i}"] = _sentence(rng, 1, 16)
    return refs, hyps


def _tok(refs: dict[str, list[str]], hyps: dict[str, str]) -> tuple[dict, dict]:
    gts = {k: [" ".join(ptb_tokenize(r)) for r in v] for k, v in refs.items()}
    res = {k: [" ".join(ptb_tokenize(v))] for k, v in hyps.items()}
    return gts, res


def test_conformance_with_pycocoevalcap() -> None:
    refs, hyps = _corpus()
    assert len(refs) >= 100
    gts, res = _tok(refs, hyps)
    ids = list(refs)

    ref_bleu, ref_bleu_per = Bleu(4).compute_score(gts, res, verbose=0)
    ours_bleu = bleu(refs, hyps)
    for k in range(4):
        ours = ours_bleu[f"bleu_{k + 1}"]
        assert ours.corpus == pytest.approx(ref_bleu[k], abs=1e-9)
        np.testing.assert_allclose([ours.per_sample[i] for i in ids], ref_bleu_per[k], rtol=0, atol=1e-9)

    ref_cider, ref_cider_per = Cider().compute_score(gts, res)
    ours_cider = cider_d(refs, hyps)
    assert ours_cider.corpus == pytest.approx(float(ref_cider), abs=1e-9)
    np.testing.assert_allclose([ours_cider.per_sample[i] for i in ids], ref_cider_per, rtol=0, atol=1e-9)
    assert ours_cider.corpus > 0.1  # non-trivial corpus (paraphrases score high)

    ref_rouge, ref_rouge_per = Rouge().compute_score(gts, res)
    ours_rouge = rouge_l(refs, hyps)
    assert ours_rouge.corpus == pytest.approx(float(ref_rouge), abs=1e-9)
    np.testing.assert_allclose([ours_rouge.per_sample[i] for i in ids], ref_rouge_per, rtol=0, atol=1e-9)


def test_tokenize_false_scores_pretokenised_strings() -> None:
    refs, hyps = _corpus(20, "pretok")
    gts, res = _tok(refs, hyps)
    flat_h = {k: v[0] for k, v in res.items()}
    assert cider_d(gts, flat_h, tokenize=False) == cider_d(refs, hyps)
    assert bleu(gts, flat_h, tokenize=False) == bleu(refs, hyps)


def test_fixed_df_cider_on_subgroup() -> None:
    refs, hyps = _corpus()
    df = DocumentFrequency.from_references(refs)
    assert df.n_docs == len(refs)
    # Full set: fixed table built from the same references == pycocoevalcap's per-call table.
    gts, res = _tok(refs, hyps)
    assert cider_d(refs, hyps, df).corpus == pytest.approx(float(Cider().compute_score(gts, res)[0]), abs=1e-12)
    # Subgroup: pycocoevalcap recomputes df on the subgroup alone (the published defect); fixed df differs.
    sub = [k for k in refs if int(k[1:]) % 4 == 0]
    sref, shyp = {k: refs[k] for k in sub}, {k: hyps[k] for k in sub}
    sg, sr = _tok(sref, shyp)
    per_group = float(Cider().compute_score(sg, sr)[0])
    assert cider_d(sref, shyp).corpus == pytest.approx(per_group, abs=1e-9)
    fixed = cider_d(sref, shyp, df)
    assert abs(fixed.corpus - per_group) > 1e-3
    # Fixed-df per-sample scores are independent of which other samples are scored with them.
    full = cider_d(refs, hyps, df)
    for k in sub:
        assert fixed.per_sample[k] == pytest.approx(full.per_sample[k], abs=1e-12)


def test_known_values() -> None:
    refs = {"a": ["a small left pleural effusion"]}
    same = bleu(refs, {"a": "A small left pleural effusion."})
    assert same["bleu_4"].corpus == pytest.approx(1.0, abs=1e-6)
    assert rouge_l(refs, {"a": "a small left pleural effusion"}).corpus == pytest.approx(1.0)
    assert rouge_l(refs, {"a": "normal heart"}).corpus == 0.0


def test_mismatched_ids_raise() -> None:
    with pytest.raises(ValueError, match="same ids"):
        bleu({"a": ["x"]}, {"b": "x"})
    with pytest.raises(ValueError, match="non-empty list"):
        cider_d({"a": []}, {"a": "x"})
    with pytest.raises(ValueError, match="at least one"):
        rouge_l({}, {})
