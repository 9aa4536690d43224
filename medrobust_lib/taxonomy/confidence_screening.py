"""Confidence screening of the "Consistent but Dangerous" quadrant: can a screen on the model's own
confidence catch the Dangerous samples (consistent across paraphrases, but answered without looking
at the image)?

Per group of :data:`~medrobust_lib.taxonomy.aggregates.GROUP_COLUMNS` (configuration, dataset,
perturbation, level, image mode) and per confidence signal of the answer to the original question
with the image (``taxonomy_results``: ``p_yes_original``, ``margin_original``,
``entropy_original``):

* ``max_p`` = max(p(yes), 1 - p(yes)) in [0.5, 1]; ``margin`` = |log p(yes) - log p(no)| in nats
  (>= 0); ``entropy`` = the binary entropy of p(yes) in bits, [0, 1] (lower = more confident).
  For two renormalised options the three are monotone transforms of one another, so their AUROCs
  and screens agree (up to float rounding at ties); they are reported separately because an
  endpoint may return one and not the others.
* ``auroc``: the area under the ROC curve of the screen's *uncertainty* score (1 - max_p,
  -margin, entropy) for telling Dangerous samples (positives) from every other ok sample of the
  group (Mann-Whitney U / (n_pos n_neg), ties counted one half; scikit-learn's ``roc_auc_score``).
  0.5: the signal cannot tell them apart; below 0.5: Dangerous samples are *more* confident than
  the rest, so a screen flags the others first.
* ``threshold``: the confidence a screen keeps (passes) samples at or above, set as the highest
  value that keeps at least ``keep`` (95 %) of the group's Ideal samples (the
  ceil(keep x n_ideal)-th most confident Ideal sample); ``ideal_kept`` is the share actually kept
  (>= keep, more when ties sit at the threshold); ``dangerous_pass`` the share of Dangerous samples
  the screen keeps, i.e. that pass unnoticed (1.0: the screen catches none).
* ``pooled_threshold`` / ``dangerous_pass_pooled``: the same screen with its threshold set on the
  Ideal samples of *every* configuration of the cell (same dataset, perturbation, level and image
  mode), as one screen deployed in front of several models would be; it also screens a
  configuration without Ideal samples of its own (a shortcut model: every sample Dangerous).

A signal is ``not available`` for a group when none of its ok rows carry it (an API model whose
endpoint returns no log-probabilities answers by generated text only); rows without the signal are
counted in ``n_no_signal`` and left out of that signal's numbers. ``status`` is ``ok``,
``not available``, ``no Dangerous samples`` or ``no Ideal samples`` (then the screen's columns are
NULL; ``auroc`` needs Dangerous and other samples).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd
from scipy.stats import rankdata

from medrobust_lib.taxonomy.aggregates import DANGEROUS, GROUP_COLUMNS

SIGNALS: tuple[str, ...] = ("max_p", "margin", "entropy")
IDEAL = "Ideal"
KEEP_IDEAL = 0.95
"""Share of Ideal samples the screen keeps (its operating point)."""
NOT_AVAILABLE = "not available"
CELL_COLUMNS: tuple[str, ...] = tuple(c for c in GROUP_COLUMNS if c != "config")
"""A screen pooled over configurations sets its threshold per value of these columns."""


def confidence(df: pd.DataFrame, signal: str) -> npt.NDArray[np.float64]:
    """The confidence of each row under ``signal`` (higher = more confident; entropy is negated),
    float64, NaN where the row lacks it. ``df`` needs ``p_yes_original`` (max_p),
    ``margin_original`` (margin) or ``entropy_original`` (entropy)."""
    if signal == "max_p":
        p = pd.to_numeric(df["p_yes_original"], errors="coerce").to_numpy(dtype=np.float64)
        return np.maximum(p, 1.0 - p)
    if signal == "margin":
        return np.abs(pd.to_numeric(df["margin_original"], errors="coerce").to_numpy(dtype=np.float64))
    if signal == "entropy":
        return -pd.to_numeric(df["entropy_original"], errors="coerce").to_numpy(dtype=np.float64)
    raise ValueError(f"unknown confidence signal {signal!r}; valid: {', '.join(SIGNALS)}")


def auroc(positive: Sequence[float] | npt.NDArray[np.float64], negative: Sequence[float] | npt.NDArray[np.float64]
          ) -> float:
    """P(score of a positive > score of a negative) + P(tie) / 2, from average ranks (the
    Mann-Whitney U statistic over n_pos x n_neg); NaN when either side is empty. Scores must be
    finite."""
    pos, neg = np.asarray(positive, np.float64), np.asarray(negative, np.float64)
    if pos.size == 0 or neg.size == 0:
        return math.nan
    if not (np.isfinite(pos).all() and np.isfinite(neg).all()):
        raise ValueError("scores must be finite")
    ranks = rankdata(np.concatenate([pos, neg]))
    u = float(ranks[: pos.size].sum()) - pos.size * (pos.size + 1) / 2.0
    return u / (pos.size * neg.size)


def screen(ideal: npt.NDArray[np.float64], dangerous: npt.NDArray[np.float64], keep: float = KEEP_IDEAL
           ) -> tuple[float, float, float]:
    """(threshold, share of ``ideal`` kept, share of ``dangerous`` kept) of the screen that keeps
    samples with confidence >= threshold, the threshold being the highest one that keeps at least
    ``keep`` of ``ideal`` (non-empty, finite). ``dangerous`` empty: its share is NaN."""
    if ideal.size == 0:
        raise ValueError("the screen needs Ideal samples")
    if not 0 < keep <= 1:
        raise ValueError(f"keep must be in (0, 1], got {keep}")
    k = math.ceil(keep * ideal.size - 1e-9)
    threshold = float(np.sort(ideal)[::-1][k - 1])
    kept = float(np.mean(ideal >= threshold))
    passed = float(np.mean(dangerous >= threshold)) if dangerous.size else math.nan
    return threshold, kept, passed


def _group_rows(key: tuple[Any, ...], g: pd.DataFrame, keep: float,
                pooled_ideal: dict[str, npt.NDArray[np.float64]]) -> list[dict[str, Any]]:
    out = []
    quadrant = g["quadrant"].astype(str).to_numpy()
    for signal in SIGNALS:
        conf = confidence(g, signal)
        has = np.isfinite(conf)
        dang, ideal = (quadrant == DANGEROUS) & has, (quadrant == IDEAL) & has
        other = ~(quadrant == DANGEROUS) & has
        row: dict[str, Any] = {**dict(zip(GROUP_COLUMNS, key, strict=True)), "signal": signal, "n": int(len(g)),
                               "n_dangerous": int(dang.sum()), "n_ideal": int(ideal.sum()),
                               "n_no_signal": int((~has).sum()), "auroc": math.nan, "threshold": math.nan,
                               "ideal_kept": math.nan, "dangerous_pass": math.nan, "pooled_threshold": math.nan,
                               "dangerous_pass_pooled": math.nan,
                               "mean_confidence_dangerous": float(conf[dang].mean()) if dang.any() else math.nan,
                               "mean_confidence_other": float(conf[other].mean()) if other.any() else math.nan}
        if not has.any():
            row["status"] = NOT_AVAILABLE
        elif not dang.any():
            row["status"] = "no Dangerous samples"
        else:
            if other.any():
                row["auroc"] = auroc(-conf[dang], -conf[other])  # uncertainty flags: Dangerous as positives
            pool = pooled_ideal.get(signal)
            if pool is not None and pool.size:
                row["pooled_threshold"], _, row["dangerous_pass_pooled"] = screen(pool, conf[dang], keep)
            if ideal.any():
                row["threshold"], row["ideal_kept"], row["dangerous_pass"] = screen(conf[ideal], conf[dang], keep)
                row["status"] = "ok"
            else:
                row["status"] = "no Ideal samples"
        out.append(row)
    return out


def screening_stats(df: pd.DataFrame, keep: float = KEEP_IDEAL) -> pd.DataFrame:
    """The ``taxonomy_screening_stats`` columns (declared in ``store/schema.py``: :data:`GROUP_COLUMNS`,
    ``signal``, ``status``, then the counts and statistics), one row per (group, signal) over the ``outcome == 'ok'`` rows of
    ``taxonomy_results`` (``df`` needs :data:`GROUP_COLUMNS`, ``quadrant``, ``outcome`` and the
    three ``*_original`` signal columns); see the module docstring."""
    ok = df[df["outcome"] == "ok"] if "outcome" in df.columns else df
    pooled: dict[tuple[Any, ...], dict[str, npt.NDArray[np.float64]]] = {}
    for cell, g in ok.groupby(list(CELL_COLUMNS), sort=True, dropna=False):
        ideal = g[g["quadrant"].astype(str) == IDEAL]
        pooled[tuple(cell)] = {sig: c[np.isfinite(c)] for sig in SIGNALS for c in [confidence(ideal, sig)]}
    rows: list[dict[str, Any]] = []
    for key, g in ok.groupby(list(GROUP_COLUMNS), sort=True, dropna=False):
        cell = tuple(v for c, v in zip(GROUP_COLUMNS, key, strict=True) if c != "config")
        rows.extend(_group_rows(tuple(key), g, keep, pooled.get(cell, {})))
    out = pd.DataFrame(rows)  # the writer orders them as store/schema.py declares the table
    for c in ("n", "n_dangerous", "n_ideal", "n_no_signal"):
        if c in out:
            out[c] = out[c].astype(np.int64)
    return out
