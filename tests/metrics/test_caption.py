"""Caption metrics against the official toolkit: tokens and scores of pycocoevalcap 1.2 with the Java
PTBTokenizer 3.4.1, committed by ``tools/caption_reference.py`` (fixtures/caption_reference_*.json),
plus properties of the scorers (fixed document frequencies, pre-tokenized input, errors)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pycocoevalcap.bleu.bleu import Bleu
from pycocoevalcap.cider.cider import Cider
from pycocoevalcap.rouge.rouge import Rouge

from medrobust_lib.metrics.caption import (
    DocumentFrequency,
    bleu,
    cider_d,
    ptb_tokenize,
    ptb_tokenize_all,
    rouge_l,
)
from medrobust_lib.metrics.ptb_lexer import tokenize_lines
from medrobust_lib.seeding import rng_for

FIXTURES = Path(__file__).parent / "fixtures"
METRICS = ("bleu_1", "bleu_2", "bleu_3", "bleu_4", "rouge_l", "cider_d")
TOL = 1e-9


def _load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / name).read_text(encoding="utf-8"))
    return data


CORPUS = _load("caption_reference_corpus.json")
SUBSET = _load("caption_reference_subset.json")


def _refs_hyps(data: dict[str, Any]) -> tuple[dict[str, list[str]], dict[str, str]]:
    refs = {s["id"]: s["references"] for s in data["samples"]}
    hyps = {s["id"]: s["prediction"] for s in data["samples"]}
    return refs, hyps


def _our_scores(refs: dict[str, list[str]], hyps: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = dict(bleu(refs, hyps))
    out["rouge_l"] = rouge_l(refs, hyps)
    out["cider_d"] = cider_d(refs, hyps)
    return out


# --- the official fixtures ---------------------------------------------------------------------


def test_fixture_corpus_covers_what_medical_captions_contain() -> None:
    samples = CORPUS["samples"]
    strings = [s["prediction"] for s in samples] + [r for s in samples for r in s["references"]]
    assert len(strings) >= 1000
    assert all(1 <= len(s["references"]) <= 5 for s in samples)
    assert CORPUS["pycocoevalcap"] == "1.2"
    joined = "".join(strings)
    for ch in "()[]{}<>%/&'\"’“”–—µ°±×é\t\n":
        assert ch in joined, ch
    assert sum(1 for s in samples if not s["prediction"].strip()) >= 10  # empty / whitespace-only predictions
    assert {"e.g.", "i.e.", "Dr.", "vs.", "approx.", "H&E-stained", "T1/T2", "0.5cm", "3x3"} <= {
        w.strip("(),;:") for x in strings for w in x.split()
    }


@pytest.mark.parametrize("data", [CORPUS, SUBSET], ids=["corpus", "subset"])
def test_tokens_equal_java_ptbtokenizer_on_every_string(data: dict[str, Any]) -> None:
    samples = data["samples"]
    refs = [r for s in samples for r in s["references"]]
    want_refs = [t for s in samples for t in s["reference_tokens"]]
    hyps = [s["prediction"] for s in samples]
    want_hyps = [s["prediction_tokens"] for s in samples]
    bad = [(x, w, g) for x, w, g in zip(refs, want_refs, ptb_tokenize_all(refs), strict=True) if w != g]
    bad += [(x, w, g) for x, w, g in zip(hyps, want_hyps, ptb_tokenize_all(hyps), strict=True) if w != g]
    assert not bad, f"{len(bad)} strings differ from Java, e.g. {bad[:3]}"


def test_character_classes_equal_the_java_lexers() -> None:
    # Java's output for "x<c>x" on every BMP character where the 2014 lexer's Unicode tables differ
    # from today's (letters/digits added later are deleted there) and on every 37th other character.
    probe = _load("caption_reference_unicode.json")["java_output_of_x_c_x"]
    assert len(probe) > 2000
    got = tokenize_lines([f"x{chr(c)}x" for c, _ in probe])
    bad = [(hex(c), want, g) for (c, want), g in zip(probe, got, strict=True) if want != g]
    assert not bad, f"{len(bad)} characters differ, e.g. {bad[:5]}"


def test_bracket_and_ampersand_tokens_survive_as_in_the_official_scores() -> None:
    # Known answers from the committed Java output (not from memory): -lrb-/-rrb- are not filtered.
    by_text = {s["prediction"]: s["prediction_tokens"] for s in CORPUS["samples"]}
    text = "The H&E-stained section (x40) shows [arrow] {note} <b>tumor</b>."
    assert ptb_tokenize(text) == by_text[text].split(" ")
    assert "-lrb-" in by_text[text].split(" ") and "h&e" in by_text[text].split(" ")


@pytest.mark.parametrize("data", [CORPUS, SUBSET], ids=["corpus", "subset"])
def test_scores_equal_pycocoevalcap_per_sample_and_corpus(data: dict[str, Any]) -> None:
    refs, hyps = _refs_hyps(data)
    ours = _our_scores(refs, hyps)
    for m in METRICS:
        assert abs(ours[m].corpus - data["corpus"][m]) <= TOL, m
        got = np.array([ours[m].per_sample[s["id"]] for s in data["samples"]])
        want = np.array([s[m] for s in data["samples"]])
        np.testing.assert_allclose(got, want, rtol=0, atol=TOL, err_msg=m)


def test_empty_predictions_scored_as_pycocoevalcap_scores_them() -> None:
    empty = [s for s in CORPUS["samples"] if s["prediction_tokens"] == ""]
    assert len(empty) >= 10
    refs, hyps = _refs_hyps(CORPUS)
    ours = _our_scores(refs, hyps)
    for s in empty:
        for m in METRICS:
            assert abs(ours[m].per_sample[s["id"]] - s[m]) <= TOL, (s["id"], m)


# --- properties of the scorers -------------------------------------------------------------------

VOCAB = (
    "the a no there is are small large left right pleural effusion mass nodule lesion chest lung lungs "
    "heart normal enlarged x-ray ct mri 3.5 cm 5mm of in with and opacity consolidation fracture "
    "acute chronic mild severe bilateral lobe upper lower liver kidney brain infarct stable"
).split()
PUNCT = ["", "", "", ".", ",", ";"]


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
    flat = ptb_tokenize_all([r for v in refs.values() for r in v])
    gts: dict[str, list[str]] = {}
    for k, v in refs.items():
        gts[k], flat = flat[: len(v)], flat[len(v) :]
    res = {k: [t] for k, t in zip(hyps, ptb_tokenize_all(list(hyps.values())), strict=True)}
    return gts, res


def test_scorers_equal_pycocoevalcap_scorers_on_our_tokens() -> None:
    refs, hyps = _corpus()
    gts, res = _tok(refs, hyps)
    ids = list(refs)
    ref_bleu, ref_bleu_per = Bleu(4).compute_score(gts, res, verbose=0)
    ours_bleu = bleu(refs, hyps)
    for k in range(4):
        ours = ours_bleu[f"bleu_{k + 1}"]
        assert ours.corpus == pytest.approx(ref_bleu[k], abs=1e-12)
        np.testing.assert_allclose([ours.per_sample[i] for i in ids], ref_bleu_per[k], rtol=0, atol=1e-12)
    ref_cider, ref_cider_per = Cider().compute_score(gts, res)
    assert cider_d(refs, hyps).corpus == pytest.approx(float(ref_cider), abs=1e-12)
    assert cider_d(refs, hyps).corpus > 0.1  # non-trivial corpus (paraphrases score high)
    ref_rouge, _ = Rouge().compute_score(gts, res)
    assert rouge_l(refs, hyps).corpus == pytest.approx(float(ref_rouge), abs=1e-12)


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


def test_identical_caption_scores_one() -> None:
    refs = {"a": ["a small left pleural effusion"]}
    same = bleu(refs, {"a": "A small left pleural effusion."})
    assert same["bleu_4"].corpus == pytest.approx(1.0, abs=1e-6)
    assert rouge_l(refs, {"a": "a small left pleural effusion"}).corpus == pytest.approx(1.0)
    assert rouge_l(refs, {"a": "normal heart"}).corpus == 0.0


def test_line_breaks_inside_a_caption_become_spaces() -> None:
    assert ptb_tokenize("left\nlung") == ptb_tokenize("left lung") == ["left", "lung"]
    assert ptb_tokenize_all(["a\rb", "c"]) == ["a b", "c"]  # pycocoevalcap would shift "c" a line down


def test_mismatched_ids_raise() -> None:
    with pytest.raises(ValueError, match="same ids"):
        bleu({"a": ["x"]}, {"b": "x"})
    with pytest.raises(ValueError, match="non-empty list"):
        cider_d({"a": []}, {"a": "x"})
    with pytest.raises(ValueError, match="at least one"):
        rouge_l({}, {})
