"""Regression gate: is a candidate checkpoint less robust than a baseline on the same samples?

:func:`compare` works on rows of the ``segmentation_results`` table (see
:mod:`medrobust_lib.tracks.segmentation.evaluate`), one frame per checkpoint. Rows with status ``ok`` on
both sides are paired on ``(dataset, sample_id, condition, perturbation, level)``; rows present on
one side only are counted and returned (``n_unpaired``, ``unpaired``), and rows whose status is not
``ok`` are counted per side (``n_excluded``) -- nothing is dropped silently.

For every condition group ``(condition, perturbation, level)`` the table holds, for IoU and Dice:
the baseline and candidate mean drop (clean score - perturbed score), their difference
``candidate - baseline`` (positive: the candidate loses more), a paired percentile bootstrap CI of
that difference (generator ``rng_for(0, "gate", metric, condition, perturbation, level)``), the
two-sided Wilcoxon signed-rank p on the per-sample drop differences, and Benjamini-Hochberg q
across all rows of the table (per metric). Three more rows:

* ``clean``: the clean IoU / Dice themselves (``measure = "score"``); here ``candidate - baseline``
  is negative when the candidate is worse, and a clean loss is held to the same thresholds as a
  drop increase.
* ``overall`` / ``perturbation``: each sample's mean drop over every corruption group, compared
  pairwise across samples (``n_samples`` is the test's unit, ``n_pairs`` the rows averaged).
* ``overall`` / ``attack``: the same over the adversarial conditions (``fgsm``, ``pgd``).

The regression rule (one rule, applied here and only here: by ``medrobust check``, by the
``robustness_gate`` asset check and by the registry tag ``medrobust.gate``, which all call
:func:`compare`): a row is a REGRESSION when, on IoU or Dice, all three hold

1. the paired bootstrap ``1 - alpha`` CI of ``candidate - baseline`` excludes 0 on the worse side
   (``ci_low > 0`` for a drop; ``ci_high < 0`` for the clean score),
2. the Benjamini-Hochberg q (of the Wilcoxon signed-rank p, across the table's rows) is below
   ``alpha``,
3. the candidate is worse by more than the threshold (:class:`GateThresholds`),

and the row has at least ``min_pairs`` paired samples. The gate passes when no row is a
regression and at least one pair was compared.

Where the rows come from: the caller evaluates each checkpoint through the existing segmentation
pipeline (``evaluate_clean`` / ``evaluate_perturbed`` / ``evaluate_attacks``, i.e. the assets
``<model>/clean_predictions``, ``<model>/perturbed_predictions`` and ``<model>/attack_predictions``),
which writes them to the results store; ``medrobust check``
reads that store and selects each side's rows with :func:`select_rows` -- by model id, by the
checkpoint hash the pipeline stores, or by an MLflow ``models:/name@alias`` URI resolved to that
hash (:func:`resolve_ref`). Only a ``models:/`` side without rows is evaluated first
(:func:`gather_side`); any other side without rows is an error that names the assets to materialize.

Regression gate in CI
---------------------
Evaluate the candidate and the champion on the suite (materialize their segmentation assets), then
gate the promotion on the exit code (0: passed, 1: the candidate regressed, 2: bad input, e.g. no
rows for one side). The first output line is the verdict (``PASS ...`` / ``FAIL: n regressions
...``), then only the regressions; ``--details`` adds the full table::

    # .github/workflows/robustness.yml (a step after the evaluation step)
    - name: Robustness regression gate
      run: |
        medrobust check --format markdown \\
          --candidate models:/medrobust-seg-tiny-sam-lora@candidate \\
          --baseline models:/medrobust-seg-tiny-sam-lora@champion >> "$GITHUB_STEP_SUMMARY" || exit 1

or in a plain shell script::

    medrobust check --candidate models:/medrobust-seg-tiny-sam-lora@candidate \\
        --baseline models:/medrobust-seg-tiny-sam-lora@champion || exit 1
"""

from __future__ import annotations

import importlib
import json
import math
import re
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import pandas as pd

from medrobust_lib.config.segmentation import GateThresholds
from medrobust_lib.metrics.stats import benjamini_hochberg, paired_bootstrap_ci, wilcoxon_paired
from medrobust_lib.seeding import rng_for
from medrobust_lib.store import model_registry
from medrobust_lib.tracks.finetune.strategy_runs import (
    evaluate_model,
    registry_model_config,
    registry_model_id,
)

PAIR_KEY: tuple[str, ...] = ("dataset", "sample_id", "condition", "perturbation", "level")
GROUP_KEY: tuple[str, ...] = ("condition", "perturbation", "level")
ATTACK_CONDITIONS: frozenset[str] = frozenset({"fgsm", "pgd"})
REQUIRED_COLUMNS: tuple[str, ...] = PAIR_KEY + ("iou", "dice", "iou_drop", "dice_drop", "status")
METRICS: tuple[str, ...] = ("iou", "dice")
_HEX = re.compile(r"^[0-9a-f]{8,64}$")


class GateInputError(ValueError):
    """The inputs cannot be compared (no rows, ambiguous selection, unresolvable URI)."""


@dataclass
class GateResult:
    """``table``: one row per condition group plus ``clean`` and ``overall`` rows (columns in the
    module docstring). ``failures``: one readable line per failing (row, metric). ``unpaired``: the
    keys present on one side only, with a ``side`` column. ``n_excluded``: rows per side whose
    status is not ``ok``."""

    table: pd.DataFrame
    passed: bool
    failures: list[str]
    n_unpaired: int
    unpaired: pd.DataFrame
    n_excluded: dict[str, int]
    thresholds: GateThresholds
    notes: list[str] = field(default_factory=list)

    @property
    def n_regressions(self) -> int:
        """Rows (condition groups, clean or overall) that meet the regression rule."""
        return int((self.table["verdict"] == "FAIL").sum()) if len(self.table) else 0

    @property
    def verdict(self) -> str:
        """One line that starts with ``PASS`` or ``FAIL: <n> regression(s)``."""
        n = int((self.table["kind"] != "overall").sum()) if len(self.table) else 0
        extra = f"; {self.n_unpaired} unpaired rows" if self.n_unpaired else ""
        if self.passed:
            return f"PASS: no robustness regression across {n} condition groups{extra}"
        if not self.n_regressions:
            return f"FAIL: {self.failures[0]}" if self.failures else "FAIL"
        k = self.n_regressions
        return f"FAIL: {k} regression{'s' if k != 1 else ''} across {n} condition groups{extra}"

    @property
    def rule(self) -> str:
        """The regression rule in words, with this gate's thresholds."""
        th = self.thresholds
        return (f"regression = candidate worse with the paired bootstrap {100 * (1 - th.alpha):.0f}% CI of the "
                f"difference excluding 0, BH q < {th.alpha:g}, and the difference beyond "
                f"{th.max_iou_drop_increase:g} (IoU) / {th.max_dice_drop_increase:g} (Dice); "
                f"groups with < {th.min_pairs} pairs never fail")

    def to_json(self) -> dict[str, Any]:
        rows = json.loads(self.table.to_json(orient="records"))
        return {"passed": self.passed, "verdict": self.verdict, "rule": self.rule,
                "n_regressions": self.n_regressions, "failures": self.failures,
                "n_unpaired": self.n_unpaired, "n_excluded": self.n_excluded, "notes": self.notes,
                "thresholds": self.thresholds.model_dump(), "rows": rows,
                "unpaired": json.loads(self.unpaired.to_json(orient="records"))}


# ---- selecting rows ----------------------------------------------------------------------------

def checkpoint_hash(path: str | Path) -> str:
    """The hash the segmentation pipeline stores for a checkpoint file (``checkpoint`` column).
    A folder is taken to be a saved checkpoint folder holding ``model.safetensors``."""
    from medrobust_lib.models.sam import checkpoint_file_hash

    try:
        return checkpoint_file_hash(path)
    except FileNotFoundError as exc:
        raise GateInputError(str(exc)) from exc


def resolve_ref(ref: str, mlruns_dir: str | Path | None = None) -> str:
    """A selector for :func:`select_rows`: ``models:/name@alias`` (or ``/version``) becomes the
    stored hash of the registered checkpoint (via ``medrobust_lib.store.model_registry.resolve_model_uri``);
    anything else (a model id or a hash) is returned unchanged. ``mlruns_dir`` None: the registry's
    default (``$MEDROBUST_MLRUNS`` or ``mlruns``)."""
    if not ref.startswith("models:/"):
        return ref
    try:
        resolve = importlib.import_module("medrobust_lib.store.model_registry").resolve_model_uri
    except (ImportError, AttributeError) as exc:
        raise GateInputError(f"cannot resolve {ref}: MLflow registry resolution "
                             f"(medrobust_lib.store.model_registry.resolve_model_uri) is not available ({exc}); "
                             "pass the checkpoint hash or the model id instead") from exc
    try:
        path = Path(resolve(ref, mlruns_dir))
    except (LookupError, ValueError, OSError) as exc:
        raise GateInputError(f"cannot resolve {ref}: {exc}") from exc
    return checkpoint_hash(path)


def _matches(df: pd.DataFrame, ref: str) -> pd.Series:
    hit = pd.Series(False, index=df.index)
    if "model" in df:
        hit |= df["model"].astype(str) == ref
    if "checkpoint" in df:
        ck = df["checkpoint"].astype(str)
        hit |= ck == ref
        if _HEX.match(ref):  # a longer or shorter form of the stored hash prefix
            hit |= ck.map(lambda c: bool(c) and (c.startswith(ref) or ref.startswith(c)))
    return hit


def select_rows(df: pd.DataFrame, ref: str, side: str = "rows") -> pd.DataFrame:
    """Rows of ``df`` whose ``model`` equals ``ref`` or whose ``checkpoint`` is ``ref`` (the stored
    16-hex prefix, a full SHA-256 of the file, or a prefix of at least 8 hex digits). Raises
    :class:`GateInputError` when the rows mix several checkpoints (stale partitions of an older
    checkpoint) or several models sharing a checkpoint (ambiguous pairing)."""
    out = df[_matches(df, ref)] if len(df) else df
    if len(out) and "checkpoint" in out:
        hashes = sorted(out["checkpoint"].dropna().astype(str).unique())
        if len(hashes) > 1:
            raise GateInputError(f"{side} {ref!r} selects rows of {len(hashes)} checkpoints ({', '.join(hashes)}): "
                                 "re-materialize its segmentation assets or select one checkpoint by hash")
    if len(out) and "model" in out:
        models = sorted(out["model"].astype(str).unique())
        if len(models) > 1:
            raise GateInputError(f"{side} {ref!r} selects rows of several models ({', '.join(models)}): "
                                 "select by model id")
    return out


def gather_side(ref: str, side: str, results_dir: str | Path, *, suite: Any = None,
                mlruns_dir: str | Path | None = None, evaluate: bool = True,
                log: Any = None, rows: pd.DataFrame | None = None) -> pd.DataFrame:
    """One side's ``segmentation_results`` rows, evaluating the model when it has none yet.

    ``models:/name/<version>|@alias|/latest`` refs: the rows of the registry evaluation
    ``<name>-v<version>`` (written by the ``registry_evaluation`` asset, or here); otherwise any
    model's rows for the same checkpoint hash (e.g. the ``<base>-<strategy>`` rows of the strategy
    asset, which are the same weights); otherwise, when ``evaluate`` and a ``suite`` are given,
    the version is evaluated now with :func:`medrobust_lib.tracks.finetune.strategy_runs.evaluate_model` on
    the suite's fine-tuning evaluation set, so both sides see the same samples and conditions.
    Other refs (model id, checkpoint hash) are only read. ``rows``: the table already read by the
    caller (read here when None), so two sides cost one read. Raises :class:`GateInputError` when
    no rows can be had."""
    from medrobust_lib.store.results import read_table
    from medrobust_lib.tracks.segmentation.evaluate import RESULTS_TABLE

    if rows is None:
        rows = read_table(results_dir, RESULTS_TABLE)
    if not ref.startswith("models:/"):
        sel = select_rows(rows, ref, side)
        if sel.empty:
            raise GateInputError(f"no {RESULTS_TABLE} rows for the {side} {ref} in {results_dir}: evaluate it first "
                                 "(materialize its segmentation assets) or pass a models:/ URI")
        return sel

    try:
        name, version = model_registry.resolve_version(ref, mlruns_dir)
    except (LookupError, ValueError, OSError) as exc:
        raise GateInputError(f"cannot resolve {ref}: {exc}") from exc
    model_id = registry_model_id(name, version)
    if len(rows) and (rows["model"] == model_id).any():
        return select_rows(rows, model_id, side)
    digest = resolve_ref(f"models:/{name}/{version}", mlruns_dir)
    same = rows[_matches(rows, digest)] if len(rows) else rows
    if len(same):
        # the same weights evaluated under another id: identical rows by construction; take the
        # id with the most rows
        best = same.groupby("model").size().sort_values(ascending=False, kind="stable").index[0]
        if log:
            log(f"{side} {ref}: reusing the rows of {best} (same checkpoint {digest})")
        return select_rows(rows, str(best), side)
    if not evaluate or suite is None:
        raise GateInputError(f"no {RESULTS_TABLE} rows for the {side} {ref} (version {version}, checkpoint "
                             f"{digest}) in {results_dir}; materialize registry_evaluation[{name}:{version}] or "
                             "let the gate evaluate it (a suite and --evaluate)")

    if log:
        log(f"{side} {ref}: no rows yet, evaluating {model_id}")
    evaluate_model(suite, registry_model_config(suite, ref, mlruns_dir), log=log)
    return select_rows(read_table(results_dir, RESULTS_TABLE), model_id, side)


def gate_version(suite: Any, name: str, version: int, mlruns_dir: str | Path | None = None,
                 log: Any = None) -> tuple[int | None, GateResult | None]:
    """The gate for a registered version against its model's ``champion`` (thresholds from the
    suite's ``segmentation.finetune.gate``), with the verdict written as the version tag
    ``medrobust.gate`` (``"PASS vs v<champion>"`` / ``"FAIL vs v<champion>"``). Returns
    ``(champion version, result)``; the result is None when there is no other champion to compare
    with (none yet, or this version is the champion)."""
    from medrobust_lib.store.results import read_table
    from medrobust_lib.tracks.segmentation.evaluate import RESULTS_TABLE

    champion = model_registry.get_alias_version(name, "champion", mlruns_dir)
    if champion is None or champion == version:
        return champion, None
    ft = suite.segmentation.finetune
    th = ft.gate if ft is not None else GateThresholds()
    rows = read_table(suite.results_dir, RESULTS_TABLE)
    sides = [gather_side(f"models:/{name}/{v}", side, suite.results_dir, suite=suite, mlruns_dir=mlruns_dir,
                         log=log, rows=rows) for side, v in (("candidate", version), ("baseline", champion))]
    result = compare(sides[0], sides[1], th)
    model_registry.set_version_tag(name, version, "medrobust.gate", f"{'PASS' if result.passed else 'FAIL'} vs v{champion}",
                             mlruns_dir)
    return champion, result


# ---- comparing -----------------------------------------------------------------------------------

def _prepare(df: pd.DataFrame, side: str) -> pd.DataFrame:
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        raise GateInputError(f"{side} rows lack columns {missing}")
    out = df.copy()
    for c in ("dataset", "sample_id", "condition", "perturbation", "status"):
        out[c] = out[c].astype(str)
    out["level"] = pd.to_numeric(out["level"]).astype("int64")
    dup = out.duplicated(list(PAIR_KEY), keep=False)
    if dup.any():
        first = out.loc[dup, list(PAIR_KEY)].iloc[0].to_dict()
        raise GateInputError(f"{side} has {int(dup.sum())} rows sharing a pairing key (e.g. {first}): "
                             "select a single checkpoint")
    return out


def _kind(condition: str) -> str:
    if condition == "clean":
        return "clean"
    return "attack" if condition in ATTACK_CONDITIONS else "corruption"


def _stats(cand: np.ndarray, base: np.ndarray, key: tuple[object, ...], alpha: float,
           n_boot: int) -> dict[str, float]:
    ok = np.isfinite(cand) & np.isfinite(base)
    c, b = cand[ok], base[ok]
    nan = float("nan")
    if c.size == 0:
        return {"base": nan, "cand": nan, "diff": nan, "ci_low": nan, "ci_high": nan, "p": nan}
    est, lo, hi = paired_bootstrap_ci(c, b, n_boot=n_boot, alpha=alpha, rng=rng_for(0, "gate", *key))
    _, p = wilcoxon_paired(c, b)
    return {"base": float(b.mean()), "cand": float(c.mean()), "diff": est, "ci_low": lo, "ci_high": hi, "p": p}


def _row(kind: str, condition: str, perturbation: str, level: int | None, n_pairs: int, n_samples: int,
         values: dict[str, np.ndarray], alpha: float, n_boot: int) -> dict[str, Any]:
    row: dict[str, Any] = {"kind": kind, "condition": condition, "perturbation": perturbation, "level": level,
                           "measure": "score" if kind == "clean" else "drop", "n_pairs": n_pairs,
                           "n_samples": n_samples}
    for metric in METRICS:
        s = _stats(values[f"{metric}_cand"], values[f"{metric}_base"],
                   (metric, condition, perturbation, "all" if level is None else level), alpha, n_boot)
        row.update({f"{metric}_{k}": v for k, v in s.items()})
    return row


def compare(candidate: pd.DataFrame, baseline: pd.DataFrame, thresholds: GateThresholds | None = None,
            *, n_boot: int = 2000) -> GateResult:
    """Compare a candidate's ``segmentation_results`` rows with a baseline's (see the module
    docstring). Raises :class:`GateInputError` for missing columns or duplicate pairing keys."""
    th = thresholds or GateThresholds()
    cand, base = _prepare(candidate, "candidate"), _prepare(baseline, "baseline")
    keys = list(PAIR_KEY)
    merged = cand.merge(base, on=keys, how="outer", suffixes=("_cand", "_base"), indicator=True)
    one_side = merged[merged["_merge"] != "both"]
    unpaired = one_side[keys].copy()
    unpaired["side"] = one_side["_merge"].map({"left_only": "candidate", "right_only": "baseline"}).astype(str)
    unpaired["status"] = np.where(unpaired["side"] == "candidate", one_side["status_cand"], one_side["status_base"])
    unpaired = unpaired.sort_values(["side", *keys]).reset_index(drop=True)
    n_excluded = {"candidate": int((cand["status"] != "ok").sum()), "baseline": int((base["status"] != "ok").sum())}
    both = merged[merged["_merge"] == "both"]
    paired = both[(both["status_cand"] == "ok") & (both["status_base"] == "ok")]

    notes: list[str] = []
    if len(unpaired):
        counts = unpaired["side"].value_counts().to_dict()
        notes.append("unpaired rows (present on one side only, not compared): "
                     + ", ".join(f"{n} only in {s}" for s, n in sorted(counts.items())))
    for s, n in n_excluded.items():
        if n:
            notes.append(f"{n} {s} rows have a status other than 'ok' and are not compared")

    rows: list[dict[str, Any]] = []
    for key, g in paired.groupby(list(GROUP_KEY), sort=True):
        condition, perturbation, level = cast(tuple[str, str, int], key)
        kind = _kind(str(condition))
        src = ("iou", "dice") if kind == "clean" else ("iou_drop", "dice_drop")
        vals = {f"{m}_{s}": g[f"{col}_{s}"].to_numpy(np.float64) for m, col in zip(METRICS, src, strict=True)
                for s in ("cand", "base")}
        rows.append(_row(kind, str(condition), str(perturbation), int(level), len(g), len(g), vals,
                         th.alpha, n_boot))
    rows.sort(key=lambda r: ({"clean": 0, "corruption": 1, "attack": 2}[r["kind"]], r["condition"],
                             r["perturbation"], r["level"]))
    for kind, condition in (("corruption", "perturbation"), ("attack", "attack")):
        sub = paired[paired["condition"].map(_kind) == kind]
        if not len(sub):
            continue
        cols = [f"{m}_drop_{s}" for m in METRICS for s in ("cand", "base")]
        per_sample = sub.groupby(["dataset", "sample_id"], sort=True)[cols].mean()
        vals = {f"{m}_{s}": per_sample[f"{m}_drop_{s}"].to_numpy(np.float64) for m in METRICS
                for s in ("cand", "base")}
        rows.append(_row("overall", condition, "(all)", None, len(sub), len(per_sample), vals, th.alpha, n_boot))

    table = pd.DataFrame(rows, columns=_COLUMNS)
    table["level"] = table["level"].astype("Int64")
    failures: list[str] = []
    if len(table):
        for metric in METRICS:
            table[f"{metric}_q"] = benjamini_hochberg(table[f"{metric}_p"].to_numpy(np.float64))
        verdicts = []
        for r in table.to_dict("records"):
            verdict = "ok" if r["n_samples"] >= th.min_pairs else "too few pairs"
            bad = [m for m in METRICS if is_regression(r, m, th)]
            if bad:
                verdict = "FAIL"
                failures.append(_failure_line(r, bad, th))
            verdicts.append(verdict)
        table["verdict"] = verdicts
    else:
        table["verdict"] = pd.Series(dtype=str)
        failures.append("no paired rows: candidate and baseline share no ok (dataset, sample_id, condition, "
                        "perturbation, level)")
    return GateResult(table=table, passed=not failures, failures=failures, n_unpaired=len(unpaired),
                      unpaired=unpaired, n_excluded=n_excluded, thresholds=th, notes=notes)


_COLUMNS = ["kind", "condition", "perturbation", "level", "measure", "n_pairs", "n_samples"] + [
    f"{m}_{k}" for m in METRICS for k in ("base", "cand", "diff", "ci_low", "ci_high", "p", "q")]


def _label(r: Mapping[Hashable, Any]) -> str:
    if r["kind"] == "clean":
        return "clean"
    if r["kind"] == "overall":
        return f"overall {'corruptions' if r['condition'] == 'perturbation' else 'attacks'}"
    if r["kind"] == "attack":
        return f"attack {r['perturbation']} level {r['level']}"
    return f"perturbation {r['perturbation']} level {r['level']}"


def is_regression(r: Mapping[Hashable, Any], metric: str, th: GateThresholds) -> bool:
    """THE regression rule (module docstring) for one table row and metric (``iou``/``dice``):
    enough pairs, the candidate worse beyond the threshold, the bootstrap CI of the difference
    excluding 0 on the worse side, and BH q < alpha. NaN statistics never fail."""
    if r["n_samples"] < th.min_pairs:
        return False
    diff, lo, hi, q = (float(r[f"{metric}_{k}"]) for k in ("diff", "ci_low", "ci_high", "q"))
    if any(math.isnan(v) for v in (diff, lo, hi, q)):
        return False
    if r["kind"] == "clean":  # a score: lower is worse
        worse, ci_excludes_0 = -diff, hi < 0.0
    else:  # a drop: higher is worse
        worse, ci_excludes_0 = diff, lo > 0.0
    return worse > th.limit(metric) and ci_excludes_0 and q < th.alpha


def _failure_line(r: Mapping[Hashable, Any], metrics: list[str], th: GateThresholds) -> str:
    parts = []
    for metric in metrics:
        name = "IoU" if metric == "iou" else "Dice"
        what = f"clean {name}" if r["kind"] == "clean" else f"{name} drop"
        parts.append(f"{what} {r[f'{metric}_base']:.4f} -> {r[f'{metric}_cand']:.4f} "
                     f"(diff {r[f'{metric}_diff']:+.4f}, {100 * (1 - th.alpha):.0f}% CI "
                     f"[{r[f'{metric}_ci_low']:+.4f}, {r[f'{metric}_ci_high']:+.4f}], q={r[f'{metric}_q']:.2g})")
    return f"{_label(r)} (n={r['n_samples']}): " + "; ".join(parts)


# ---- rendering -----------------------------------------------------------------------------------

def _fmt(v: Any, spec: str) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def summary_frame(result: GateResult) -> pd.DataFrame:
    """A compact, readable view of ``result.table`` (strings) for the terminal or markdown."""
    out = []
    for r in result.table.to_dict("records"):
        row: dict[str, Any] = {"group": _label(r), "n": r["n_samples"]}
        for m in METRICS:
            row[f"{m} base"] = _fmt(r[f"{m}_base"], ".4f")
            row[f"{m} cand"] = _fmt(r[f"{m}_cand"], ".4f")
            row[f"{m} diff"] = _fmt(r[f"{m}_diff"], "+.4f")
            row[f"{m} CI"] = f"[{_fmt(r[f'{m}_ci_low'], '+.3f')}, {_fmt(r[f'{m}_ci_high'], '+.3f')}]"
            row[f"{m} q"] = _fmt(r[f"{m}_q"], ".3g")
        row["verdict"] = r["verdict"]
        out.append(row)
    return pd.DataFrame(out)


def render(result: GateResult, fmt: str = "table", details: bool = False) -> str:
    """``table`` (plain text) / ``markdown`` (for a CI step summary): the verdict line first, then
    one line per regression, the notes, the rule; with ``details`` the full table of every
    condition group. ``json``: :meth:`GateResult.to_json` (full precision, NaN as null; always
    complete)."""
    if fmt == "json":
        return json.dumps(result.to_json(), indent=1)
    if fmt not in ("table", "markdown"):
        raise ValueError(f"unknown format {fmt!r}; valid: table, markdown, json")
    df = summary_frame(result)
    if fmt == "markdown":
        lines = [f"### {'✅' if result.passed else '❌'} {result.verdict}", ""]
        lines += [f"- {f}" for f in result.failures]
        lines += [f"- note: {n}" for n in result.notes]
        lines += ["", f"_{result.rule}._"]
        if details:
            body = df.to_markdown(index=False, disable_numparse=True) if len(df) else "(no paired rows)"
            lines += ["", f"<details><summary>all {len(df)} rows</summary>", "", body, "", "</details>"]
        return "\n".join(lines)
    lines = [result.verdict]
    lines += [f"  {f}" for f in result.failures]
    lines += [f"note: {n}" for n in result.notes]
    lines += [f"rule: {result.rule}"]
    if details:
        lines += ["", df.to_string(index=False) if len(df) else "(no paired rows)"]
    elif len(df):
        lines += [f"(--details: all {len(df)} rows)"]
    return "\n".join(lines)
