"""Caption metrics without Java (docs/design.md, section 5): PTB-style tokenizer, BLEU-1..4, ROUGE-L, CIDEr-D.

The scores reproduce pycocoevalcap 1.2 (``Bleu(4)``, ``Rouge()``, ``Cider()``) on the same token
strings, to floating-point round-off; the implementation is our own, written against the formulas
of ``bleu_scorer.py``, ``rouge.py`` and ``cider_scorer.py``:

- BLEU: corpus-level modified n-gram precision (clipped by the maximum count over references),
  geometric mean of the precisions 1..n, ``tiny=1e-15`` / ``small=1e-9`` guards instead of
  smoothing, brevity penalty ``exp(1 - r/c)`` when ``c < r`` with ``r`` the *closest* reference
  length (ties -> the shorter reference). Per-sample BLEU uses the same formula on one sample.
- ROUGE-L: longest common subsequence, max precision and max recall over references,
  F-measure with ``beta = 1.2``; the corpus score is the mean of the per-sample scores.
- CIDEr-D: tf-idf n-gram vectors (n = 1..4) with ``idf = log(N_docs) - log(max(1, df))``,
  clipped numerator ``min(hyp, ref) * ref``, Gaussian length penalty ``exp(-delta^2 / (2 sigma^2))``
  with ``sigma = 6``, mean over n and references, times 10. This is what pycocoevalcap 1.2 calls
  ``Cider``; it is the CIDEr-D formula. Like pycocoevalcap, ``delta`` is the difference of the
  *bigram* counts (``len - 1`` for non-empty captions), which equals the length difference except
  when exactly one caption is empty.

The one intended difference: document frequencies. pycocoevalcap recomputes them from whatever
references are scored in one call, so a subgroup, or a condition that lost rows to errors or
exclusions, is scored against a different idf table (a perturbation alone does not change it: it
changes the predictions, not the references). :class:`DocumentFrequency` is built once (``from_references`` on the clean
reference set) and passed to :func:`cider_d` for every condition and subgroup. With ``df=None``
the table is built from the references being scored, which is exactly pycocoevalcap's ``Cider``.

Inputs are raw strings; by default they are tokenized as pycocoevalcap's ``PTBTokenizer`` does
(:func:`ptb_tokenize_all`: the Java PTBTokenizer 3.4.1, ported to Python, on all references as one
document and all hypotheses as another, then its punctuation filter), so tokens and scores equal
the official toolkit's (checked on the committed ``tests/metrics/fixtures/caption_reference_*.json``,
made by ``tools/caption_reference.py``). ``tokenize=False`` scores already tokenised strings.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from medrobust_lib.metrics.ptb_lexer import tokenize_lines

PUNCTUATIONS: frozenset[str] = frozenset(
    ["''", "'", "``", "`", "-LRB-", "-RRB-", "-LCB-", "-RCB-", ".", "?", "!", ",", ":", "-", "--", "...", ";"]
)
"""Tokens pycocoevalcap drops after Stanford tokenisation (``tokenizer/ptbtokenizer.py``)."""

BLEU_N = 4
CIDER_N = 4
CIDER_SIGMA = 6.0
ROUGE_BETA = 1.2
_BLEU_TINY = 1e-15
_BLEU_SMALL = 1e-9

# --- tokenizer -------------------------------------------------------------------------------------

_LINE_BREAKS = re.compile(r"[\n\r\x0b\x0c\x85\u2028\u2029]")


def ptb_tokenize_all(texts: Sequence[str]) -> list[str]:
    """pycocoevalcap's ``PTBTokenizer.tokenize`` for a list of captions, without Java: one
    space-joined token string per caption (``""`` when nothing is left), exactly as it hands them to
    the scorers.

    As there, each caption's ``\\n`` becomes a space, the captions are joined by ``\\n`` into one
    document, the document is tokenized by Stanford PTBTokenizer 3.4.1 with ``-preserveLines
    -lowerCase`` (ported in :mod:`medrobust_lib.metrics.ptb_lexer`) and the tokens in
    :data:`PUNCTUATIONS` are dropped. That list holds upper-case ``-LRB-``/``-RRB-``/``-LCB-``/
    ``-RCB-`` while ``-lowerCase`` emits ``-lrb-`` etc., so bracket tokens are kept, as in the
    official scores. A caption's tokens can depend on the start of the next caption (the lexer's
    trailing context), so the order of ``texts`` matters, as it does in pycocoevalcap.
    The one deliberate difference: other line breaks (``\\r``, U+000B, U+000C, U+0085, U+2028,
    U+2029) also become spaces; pycocoevalcap leaves them, and then Java starts a new line and every
    later caption receives the tokens of the caption before it.
    """
    lines = tokenize_lines([_LINE_BREAKS.sub(" ", t) for t in texts])
    return [" ".join(w for w in line.rstrip().split(" ") if w not in PUNCTUATIONS) for line in lines]


def ptb_tokenize(text: str) -> list[str]:
    """Tokens of one caption tokenized on its own (see :func:`ptb_tokenize_all`); a possibly empty
    list of str. Tokens never contain a space (a few, such as ``3\\u00a01/2``, contain U+00A0)."""
    s = ptb_tokenize_all([text])[0]
    return s.split(" ") if s else []


def _tokenized_all(texts: Sequence[str], tokenize: bool) -> list[str]:
    return ptb_tokenize_all(texts) if tokenize else list(texts)


# --- shared helpers --------------------------------------------------------------------------------


@dataclass(frozen=True)
class CaptionScore:
    """A corpus score plus the per-sample scores it came from (keys = caption ids, input order)."""

    corpus: float
    per_sample: dict[Hashable, float]


def _prepare(
    refs: Mapping[Hashable, Sequence[str]], hyps: Mapping[Hashable, str], tokenize: bool
) -> tuple[list[Hashable], list[list[str]], list[str]]:
    """Ids in ``refs`` order, their tokenized references and hypotheses. Tokenized as pycocoevalcap
    does: all references as one document (id order, then reference order), all hypotheses as another."""
    if set(refs.keys()) != set(hyps.keys()):
        missing = set(refs) ^ set(hyps)
        raise ValueError(f"refs and hyps must have the same ids; differing ids: {sorted(map(str, missing))[:5]}")
    if not refs:
        raise ValueError("need at least one caption to score")
    ids = list(refs.keys())
    for i in ids:
        rr = refs[i]
        if isinstance(rr, str) or len(rr) == 0:
            raise ValueError(f"refs[{i!r}] must be a non-empty list of strings")
    return ids, _group_tokenized([refs[i] for i in ids], tokenize), _tokenized_all([hyps[i] for i in ids], tokenize)


def _group_tokenized(groups: Sequence[Sequence[str]], tokenize: bool) -> list[list[str]]:
    flat = _tokenized_all([x for g in groups for x in g], tokenize)
    out: list[list[str]] = []
    k = 0
    for g in groups:
        out.append(flat[k : k + len(g)])
        k += len(g)
    return out


def _ngrams(words: Sequence[str], n: int) -> Counter[tuple[str, ...]]:
    counts: Counter[tuple[str, ...]] = Counter()
    for k in range(1, n + 1):
        for i in range(len(words) - k + 1):
            counts[tuple(words[i : i + k])] += 1
    return counts


# --- BLEU ------------------------------------------------------------------------------------------


def bleu(
    refs: Mapping[Hashable, Sequence[str]], hyps: Mapping[Hashable, str], *, tokenize: bool = True
) -> dict[str, CaptionScore]:
    """BLEU-1..4 as pycocoevalcap ``Bleu(4).compute_score`` (closest reference length).

    ``refs``: id -> one or more reference captions; ``hyps``: id -> one hypothesis caption (same
    ids). Returns ``{"bleu_1": ..., "bleu_4": ...}``, each a :class:`CaptionScore` in [0, 1]
    whose ``corpus`` is the corpus-level BLEU (not the mean of per-sample scores).
    """
    stats = bleu_stats_all(refs, hyps, tokenize=tokenize)
    n = BLEU_N
    per = {
        f"bleu_{k}": {i: bleu_from_stats(st.correct, st.guess, st.hyp_len, st.ref_len, n=k) for i, st in stats.items()}
        for k in range(1, n + 1)
    }
    correct = [sum(st.correct[k] for st in stats.values()) for k in range(n)]
    guess = [sum(st.guess[k] for st in stats.values()) for k in range(n)]
    hyp_len = sum(st.hyp_len for st in stats.values())
    ref_len = sum(st.ref_len for st in stats.values())
    return {
        f"bleu_{k}": CaptionScore(bleu_from_stats(correct, guess, hyp_len, ref_len, n=k), per[f"bleu_{k}"])
        for k in range(1, n + 1)
    }


@dataclass(frozen=True)
class BleuStats:
    """BLEU sufficient statistics of one caption: clipped n-gram matches ``correct[k]`` and
    hypothesis n-gram counts ``guess[k]`` for n = k + 1, the hypothesis length and the closest
    reference length (pycocoevalcap's ``closest`` rule)."""

    correct: tuple[int, ...]
    guess: tuple[int, ...]
    hyp_len: int
    ref_len: int


def _bleu_stats_tokenized(ref_list: Sequence[str], hyp: str) -> BleuStats:
    # pycocoevalcap's precook/cook_refs/cook_test: words = s.split() (any whitespace, U+00A0 included)
    ref_words = [x.split() for x in ref_list]
    hw = hyp.split()
    maxcounts: dict[tuple[str, ...], int] = {}
    for rw in ref_words:
        for g, c in _ngrams(rw, BLEU_N).items():
            maxcounts[g] = max(maxcounts.get(g, 0), c)
    correct = [0] * BLEU_N
    for g, c in _ngrams(hw, BLEU_N).items():
        correct[len(g) - 1] += min(maxcounts.get(g, 0), c)
    reflen = min((abs(len(rw) - len(hw)), len(rw)) for rw in ref_words)[1]
    return BleuStats(tuple(correct), tuple(max(0, len(hw) - k) for k in range(BLEU_N)), len(hw), reflen)


def bleu_stats_all(
    refs: Mapping[Hashable, Sequence[str]], hyps: Mapping[Hashable, str], *, tokenize: bool = True
) -> dict[Hashable, BleuStats]:
    """:class:`BleuStats` of every id (``refs`` order), tokenized as one corpus like :func:`bleu`;
    summing them over any subset and applying :func:`bleu_from_stats` gives that subset's corpus BLEU."""
    ids, r, h = _prepare(refs, hyps, tokenize)
    return {i: _bleu_stats_tokenized(rr, hh) for i, rr, hh in zip(ids, r, h, strict=True)}


def bleu_stats(refs: Sequence[str], hyp: str, *, tokenize: bool = True) -> BleuStats:
    """Sufficient statistics for one hypothesis against its references, tokenized on their own."""
    if isinstance(refs, str) or not refs:
        raise ValueError("need at least one reference")
    return bleu_stats_all({0: refs}, {0: hyp}, tokenize=tokenize)[0]


def bleu_from_stats(correct: Sequence[float], guess: Sequence[float], hyp_len: float, ref_len: float,
                    n: int = BLEU_N) -> float:
    """Corpus BLEU-n from summed statistics, exactly as pycocoevalcap (same smoothing constants)."""
    prod = 1.0
    for k in range(n):
        prod *= (float(correct[k]) + _BLEU_TINY) / (float(guess[k]) + _BLEU_SMALL)
    score = prod ** (1.0 / n)
    ratio = (hyp_len + _BLEU_TINY) / (ref_len + _BLEU_SMALL)
    return score * math.exp(1 - 1 / ratio) if ratio < 1 else score


# --- ROUGE-L ---------------------------------------------------------------------------------------


def _lcs(a: Sequence[str], b: Sequence[str]) -> int:
    if len(a) < len(b):
        a, b = b, a
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0] * (len(b) + 1)
        for j, y in enumerate(b, 1):
            cur[j] = prev[j - 1] + 1 if x == y else max(prev[j], cur[j - 1])
        prev = cur
    return prev[-1]


def rouge_l(
    refs: Mapping[Hashable, Sequence[str]], hyps: Mapping[Hashable, str], *, tokenize: bool = True
) -> CaptionScore:
    """ROUGE-L F (beta 1.2) as pycocoevalcap ``Rouge().compute_score``: per sample in [0, 1],
    corpus = mean of the per-sample scores. Tokens are split on single spaces, as there."""
    ids, r, h = _prepare(refs, hyps, tokenize)
    beta2 = ROUGE_BETA**2
    per: list[float] = []
    for ref_list, hyp in zip(r, h, strict=True):
        tc = hyp.split(" ")
        prec, rec = [], []
        for ref in ref_list:
            tr = ref.split(" ")
            lcs = _lcs(tr, tc)
            prec.append(lcs / float(len(tc)))
            rec.append(lcs / float(len(tr)))
        p, q = max(prec), max(rec)
        per.append(((1 + beta2) * p * q) / float(q + beta2 * p) if p != 0 and q != 0 else 0.0)
    return CaptionScore(float(np.mean(np.array(per))), dict(zip(ids, per, strict=True)))


# --- CIDEr-D ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DocumentFrequency:
    """CIDEr document frequencies: for each n-gram (n = 1..4), the number of *images* (caption
    groups) whose reference set contains it, and ``n_docs``, the number of images. Build it once
    on the clean reference set and reuse it for every condition and subgroup."""

    counts: Mapping[tuple[str, ...], int]
    n_docs: int

    @classmethod
    def from_references(
        cls, refs: Mapping[Hashable, Sequence[str]] | Iterable[Sequence[str]], *, tokenize: bool = True
    ) -> DocumentFrequency:
        """From ``refs`` (id -> reference captions, or an iterable of reference lists)."""
        groups = list(refs.values()) if isinstance(refs, Mapping) else list(refs)
        if not groups:
            raise ValueError("need at least one reference group to compute document frequencies")
        counts: Counter[tuple[str, ...]] = Counter()
        for group in _group_tokenized(groups, tokenize):
            seen: set[tuple[str, ...]] = set()
            for ref in group:
                seen.update(_ngrams(ref.split(), CIDER_N))
            counts.update(seen)
        return cls(counts=dict(counts), n_docs=len(groups))


def cider_d(
    refs: Mapping[Hashable, Sequence[str]],
    hyps: Mapping[Hashable, str],
    df: DocumentFrequency | None = None,
    *,
    tokenize: bool = True,
    sigma: float = CIDER_SIGMA,
) -> CaptionScore:
    """CIDEr-D (pycocoevalcap 1.2 ``Cider``) per sample (>= 0, typically 0..10) and corpus mean.

    ``df``: the fixed document-frequency table (:meth:`DocumentFrequency.from_references` on the
    clean references, built with the same ``tokenize`` setting). ``None`` recomputes it from
    ``refs``, which equals pycocoevalcap's ``Cider().compute_score`` exactly.
    """
    ids, r, h = _prepare(refs, hyps, tokenize)
    if df is None:
        df = DocumentFrequency.from_references(r, tokenize=False)
    n = CIDER_N
    log_n_docs = float(np.log(float(df.n_docs)))
    dfc = df.counts

    def vec(words: list[str]) -> tuple[list[dict[tuple[str, ...], float]], list[float], int]:
        v: list[dict[tuple[str, ...], float]] = [{} for _ in range(n)]
        norm = [0.0] * n
        length = 0
        for g, tf in _ngrams(words, n).items():
            k = len(g) - 1
            w = float(tf) * (log_n_docs - float(np.log(max(1.0, float(dfc.get(g, 0))))))
            v[k][g] = w
            norm[k] += w**2
            if k == 1:  # pycocoevalcap's "length" counts bigrams; kept for parity
                length += tf
        return v, [float(np.sqrt(x)) for x in norm], length

    per: list[float] = []
    for ref_list, hyp in zip(r, h, strict=True):
        vh, nh, lh = vec(hyp.split())
        total = np.zeros(n)
        for ref in ref_list:
            vr, nr, lr = vec(ref.split())
            delta = float(lh - lr)
            val = np.zeros(n)
            for k in range(n):
                for g, w in vh[k].items():
                    wr = vr[k].get(g, 0.0)
                    val[k] += min(w, wr) * wr
                if nh[k] != 0 and nr[k] != 0:
                    val[k] /= nh[k] * nr[k]
                val[k] *= np.e ** (-(delta**2) / (2 * sigma**2))
            total += val
        per.append(float(np.mean(total) / len(ref_list) * 10.0))
    return CaptionScore(float(np.mean(np.array(per))), dict(zip(ids, per, strict=True)))


__all__ = [
    "BLEU_N",
    "BleuStats",
    "CIDER_N",
    "CIDER_SIGMA",
    "PUNCTUATIONS",
    "ROUGE_BETA",
    "CaptionScore",
    "DocumentFrequency",
    "bleu",
    "bleu_from_stats",
    "bleu_stats",
    "bleu_stats_all",
    "cider_d",
    "ptb_tokenize",
    "ptb_tokenize_all",
    "rouge_l",
]
