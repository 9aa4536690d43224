"""The VLM track: clean and perturbed evaluation of VQA (multiple choice, yes/no), captioning and
grounding, written as ``vlm_results`` rows (schema in :mod:`medrobust_lib.store.schema`).

Each condition runs on the same sample set: the evaluation split of the clean index, and every
perturbed image of the (modality, level) manifest partition, regenerated bit-exactly. Spatial
perturbations move the grounding box with the image. Every record yields a row: failures are
outcomes, never gaps. A sample of the evaluation split that cannot be used now (unreadable or
changed since the clean index was built, quarantined since the manifest was built, or gone from
the clean index) gives an ``error`` row per record with the reason (``quarantined:<reason>``,
``missing: ...``); only another split is skipped. A record its reader quarantined (its image file
is gone: ``missing_image``; or a malformed entry) that still names its image gets, wherever a
readable record of that image would get a row, an ``error`` row with its own reason
(``missing: <image path>``, ``quarantined:<reason>: <detail>``), or the same
``excluded:image_not_indexed`` row when the image is not in the clean index.

Re-runs: rows already stored for the partition under the same input fingerprint are kept, except
``error`` rows (infrastructure failures), which are asked again; so a re-run after an outage only
retries the failures, and a run interrupted between its dataset chunks resumes from the chunks it
wrote. Rows are merged by :data:`ROW_KEY`, so no row is duplicated or lost.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import pandas as pd

from medrobust_lib.config import Suite
from medrobust_lib.config.vlm import VLMModelConfig, VLMProtocol, vlm_model
from medrobust_lib.data.sample import Sample
from medrobust_lib.metrics.caption_raw import RAW_COLUMNS, raw_caption_rows
from medrobust_lib.model_table import list_models, model_entry
from medrobust_lib.progress import Progress, finish
from medrobust_lib.store import rerun, results
from medrobust_lib.store.completeness import ERROR_OUTCOME
from medrobust_lib.store.schema import VLM_COLUMN_NAMES as COLUMN_NAMES
from medrobust_lib.store.schema import VLM_TABLE, excluded_outcome
from medrobust_lib.tracks.partition import (
    Condition,
    Partition,
    PartitionInputs,
    added,
    error_row,
    manifest_hashes,
    outcome_counts,
)
from medrobust_lib.tracks.vlm.items import (
    DroppedRecord,
    VLMItem,
    box_in_sample,
    load_items,
    prompt_for,
    records_config,
    sample_records,
)
from medrobust_lib.tracks.vlm.model import Answer, Runner, chunked, progress_chunk
from medrobust_lib.vlm_tasks.grounding_reference import score_grounding_reference
from medrobust_lib.vlm_tasks.judge import judge_mc
from medrobust_lib.vlm_tasks.judge_caption import judge_captions
from medrobust_lib.vlm_tasks.judge_open import judge_open
from medrobust_lib.vlm_tasks.scoring import score_captions, score_grounding, score_mc, score_yes_no
from medrobust_lib.vlm_tasks.vqa import LETTERS

ROW_KEY: tuple[str, ...] = ("task", "dataset", "sample_id", "record_id", "prompt_id", "image_mode", "perturbation")
"""Identifies a ``vlm_results`` row within its partition (model, modality and level are the partition)."""
_ERROR_CLEARED: tuple[str, ...] = (
    "parsed", "correct", "iou", "acc_75", "box_scale", "margin", "p_yes", "entropy", "bleu_4", "rouge_l", "cider_d",
    "bleu_c1", "bleu_c2", "bleu_c3", "bleu_c4", "bleu_g1", "bleu_g2", "bleu_g3", "bleu_g4", "hyp_len", "ref_len",
    *RAW_COLUMNS,
    "truncated", "caption_judge_score",
)
"""Score columns an ``error`` row leaves NULL: it was never answered, so nothing may count it."""


@dataclass
class VLMEvalSummary:
    n_rows: int = 0
    n_images: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    model_seconds: float = 0.0
    n_vision_calls: int = 0
    n_reused: int = 0
    """Rows kept from the previous run of the partition (same fingerprint, outcome not error)."""
    n_truncated: int = 0
    """Answers that hit their token cap (``truncated``: cut, not finished; scored as they are)."""


def _row(item: VLMItem, cond: Condition, runner: Runner, prompt_id: int = 0) -> dict[str, Any]:
    r: dict[str, Any] = dict.fromkeys(COLUMN_NAMES)
    r.update(model=runner.m.id, checkpoint=runner.checkpoint, adapter=runner.adapter, task=item.task,
             dataset=item.dataset, modality=cond.sample.modality, sample_id=item.sample_id, record_id=item.record_id,
             prompt_id=prompt_id, image_mode="image", perturbation=cond.perturbation, level=cond.level,
             strength=cond.strength, ssim=cond.ssim, cache_hit=False, n_options=n_options(item),
             **decoding_columns(runner))
    return r


def decoding_columns(runner: Any) -> dict[str, Any]:
    """The decoding a row's answer came from: ``system_prompt``, ``temperature``, ``top_p`` (None
    where not used) and ``decode_seed`` (the seed of a sampling model; None when it decodes
    greedily)."""
    given = getattr(runner, "decoding", None)
    if given is not None:
        return dict(given)
    of_config = getattr(runner.m, "decoding", None)  # a stand-in runner without a model config: unknown
    return {**(of_config() if of_config is not None else dict.fromkeys(("system_prompt", "temperature", "top_p"))),
            "decode_seed": None}


def n_options(item: VLMItem) -> int | None:
    """The answer options a multiple-choice item offers (its chance level is 1 / that); None for
    the other tasks."""
    return len(item.options) if item.task == "vqa_mc" else None


def _with_answer(r: dict[str, Any], a: Answer, scored: dict[str, Any]) -> dict[str, Any]:
    r.update(scored)
    r.update(latency_s=a.latency_s, cache_hit=a.cache_hit, error=a.error,
             truncated=None if a.text is None or r.get("source") == "logprobs" else a.truncated,
             sanitized=None if a.text is None else a.sanitized)
    if a.outcome == ERROR_OUTCOME:
        r.update(dict.fromkeys(_ERROR_CLEARED), outcome=ERROR_OUTCOME, prediction=None)
    elif a.text is None and a.outcome == "refused":
        r["outcome"] = a.outcome
        if r.get("correct") is not None:
            r["correct"] = 0.0
    return r


def _unusable_rows(items: Iterable[VLMItem], cond: Condition, runner: Runner, reason: str,
                   done: Collection[tuple[str, ...]] = frozenset()) -> list[dict[str, Any]]:
    """``error`` rows (nothing scored, retried by the next run) for the items of a sample that
    cannot be used now, except those whose row key is in ``done``."""
    return [error_row(_row(it, cond, runner), reason) for it in items if _item_key(it, cond.perturbation) not in done]


def _dropped_rows(dropped: Iterable[DroppedRecord], cond: Condition, runner: Runner,
                  done: Collection[tuple[str, ...]] = frozenset()) -> list[dict[str, Any]]:
    """``error`` rows, each with its record's own reason (:attr:`DroppedRecord.error`), for the
    records of ``cond``'s sample that their reader quarantined, except those whose row key is in
    ``done``."""
    return [r for d in dropped for r in _unusable_rows([d.as_item()], cond, runner, d.error, done)]


def _not_indexed_row(it: VLMItem, modality: str, runner: Runner, why: str = "") -> dict[str, Any]:
    """The ``excluded:image_not_indexed`` row of a record whose image is not a usable sample of the
    clean index (``why``: the reader's reason when the record was quarantined too)."""
    stand_in = Sample(it.sample_id, it.dataset, modality, np.zeros((1, 1), np.float32))
    r = _row(it, Condition(stand_in, stand_in.image), runner)
    error = f"no usable sample {it.dataset}/{it.sample_id} in the clean index"
    r.update(outcome="excluded:image_not_indexed", error=f"{error} (record {why})"[:300] if why else error)
    return r


def _item_key(it: VLMItem, perturbation: str) -> tuple[str, ...]:
    """:data:`ROW_KEY` of the row an item gets under ``perturbation`` (prompt 0, image mode image)."""
    return (it.task, it.dataset, it.sample_id, it.record_id, "0", "image", perturbation)


def _merge(kept: dict[tuple[str, ...], dict[str, Any]], new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return rerun.merge_rows(kept, new, ROW_KEY)


def _judge(judge: Runner, pairs: list[tuple[VLMItem, dict[str, Any]]]) -> None:
    """Fill the judge columns of unparseable multiple-choice rows (text only; failures recorded)."""

    if not pairs or judge.api is None:
        return
    verdicts = judge_mc(judge.api, [it.question for it, _ in pairs], [list(it.options) for it, _ in pairs],
                        [str(r["prediction"]) for _, r in pairs])
    for (it, r), v in zip(pairs, verdicts, strict=True):
        r.update(judge_model=judge.m.id, judge_outcome=v.outcome, judge_parsed=v.letter,
                 judge_correct=None if v.letter is None else float(v.letter == it.answer))


T = TypeVar("T")

PROGRESS_WHAT = "model answers"
"""The unit of a VLM partition's progress: prompts answered by the evaluated model (judge calls
not counted)."""


class _Tally:
    """The partition's :data:`~medrobust_lib.progress.Progress` over a known ``total`` of prompts:
    ``(0, total)`` at once, ``(done, total)`` after each chunk, ``(total, total)`` at :meth:`close`."""

    def __init__(self, progress: Progress | None, total: int) -> None:
        self.progress, self.total, self.done = progress, total, 0
        if progress is not None:
            progress(0, total, PROGRESS_WHAT)

    def tick(self, n: int) -> None:
        self.done = min(self.total, self.done + n)
        if self.progress is not None and self.done < self.total:
            self.progress(self.done, self.total, PROGRESS_WHAT)

    def close(self) -> None:
        finish(self.progress, self.total, PROGRESS_WHAT)


def _asked(it: VLMItem, perturbation: str, done: Collection[tuple[str, ...]], open_vqa: bool) -> tuple[bool, bool]:
    """Whether :func:`ask` asks ``it`` under ``perturbation`` alone (the open-VQA twin of a
    multiple-choice item, when ``open_vqa``) and as itself: each unless its row is ``done`` (kept
    from a previous run). The one rule for what :func:`ask` sends and :func:`_n_asked` counts."""
    alone = (open_vqa and it.task == "vqa_mc"
             and _item_key(dataclasses.replace(it, task=OPEN_TASK), perturbation) not in done)
    return alone, not (done and _item_key(it, perturbation) in done)


def _n_asked(items: Iterable[VLMItem], perturbation: str, done: Collection[tuple[str, ...]], open_vqa: bool) -> int:
    """Prompts :func:`ask` sends the evaluated model for ``items`` of one image under
    ``perturbation`` (grounding boxes moved out of view included: :func:`ask` counts them off)."""
    return sum(sum(_asked(it, perturbation, done, open_vqa)) for it in items)


def _reported(call: Callable[[Sequence[Any], Sequence[str]], Sequence[T]], runner: Runner,
              images: Sequence[np.ndarray | None], prompts: Sequence[str], tally: _Tally | None) -> list[T]:
    """``call(images, prompts)`` (the runner's ``generate`` or ``yes_no``), reported to ``tally`` per
    chunk (:func:`chunked`)."""
    tick = tally.tick if tally is not None and tally.progress is not None else None
    return chunked(call, images, prompts, progress_chunk(runner), tick)


def _generate(runner: Runner, images: Sequence[np.ndarray | None], prompts: Sequence[str], max_new_tokens: int,
              tally: _Tally | None) -> list[Answer]:
    return _reported(lambda i, p: runner.generate(i, p, max_new_tokens), runner, images, prompts, tally)


def ask(items_by_sample: dict[tuple[str, str], list[VLMItem]], conditions: Sequence[Condition], runner: Runner,
        caption_df_refs: Mapping[str, Sequence[str]], summary: VLMEvalSummary,
        judge: Runner | None = None, done: Collection[tuple[str, ...]] = frozenset(),
        protocol: VLMProtocol | None = None, open_judge: Runner | None = None,
        tally: _Tally | None = None, caption_judge: Runner | None = None) -> list[dict[str, Any]]:
    """Every item of every condition's sample, batched per task across conditions, except those
    whose row key (:func:`_item_key`) is in ``done`` (kept from a previous run). ``judge``: the
    optional LLM judge for unparseable multiple-choice answers (recorded separately). ``protocol``:
    the reference-protocol options (caption prompt, raw caption scores, grounding parse);
    ``open_judge``: the judge of ``protocol.open_vqa_judge`` (multiple-choice questions also asked
    alone, rows of task ``vqa_open``). ``tally``: the partition's progress, told of every chunk of
    prompts answered (:func:`_n_asked` counts them). ``caption_judge``: the judge of
    ``protocol.caption_judge`` (every caption also scored by it: :func:`_judge_captions`)."""
    proto = protocol or VLMProtocol()

    m = runner.m
    jobs: dict[str, list[tuple[VLMItem, Condition]]] = {"vqa_mc": [], "vqa_yesno": [], "caption": [], "grounding": []}
    rows: list[dict[str, Any]] = []
    open_jobs: list[tuple[VLMItem, Condition]] = []
    for c in conditions:
        for it in items_by_sample.get((c.sample.dataset, c.sample.sample_id), []):
            alone, itself = _asked(it, c.perturbation, done, open_judge is not None)
            if alone:
                open_jobs.append((it, c))
            if not itself:
                continue
            if it.task == "grounding" and c.boxes.get(it.record_id) is None:
                r = _row(it, c, runner)
                r.update(outcome="excluded:box_out_of_view", error="the perturbation moved the box out of the image")
                rows.append(r)
                if tally is not None:
                    tally.tick(1)  # counted by _n_asked, not sent
                continue
            jobs[it.task].append((it, c))
    t0 = time.perf_counter()
    mc = jobs["vqa_mc"]
    answers = _generate(runner, [c.image for _, c in mc], [prompt_for(it) for it, _ in mc], m.max_new_tokens, tally)
    mc_rows = [_with_answer(_row(it, c, runner), a, score_mc(a.text, it.options, it.answer))
               for (it, c), a in zip(mc, answers, strict=True)]
    if judge is not None:
        _judge(judge, [(it, r) for (it, _), r in zip(mc, mc_rows, strict=True) if r["outcome"] == "unparseable"])
    rows.extend(mc_rows)
    if open_judge is not None and open_jobs:
        rows.extend(_open_rows(open_jobs, runner, open_judge, proto.open_vqa_max_new_tokens, tally))
    yn = jobs["vqa_yesno"]
    scored = _reported(runner.yes_no, runner, [c.image for _, c in yn], [prompt_for(it, 0) for it, _ in yn], tally)
    for (it, c), (lp, a) in zip(yn, scored, strict=True):
        rows.append(_with_answer(_row(it, c, runner), a, score_yes_no(a.text, it.answer, lp)))
    gr = jobs["grounding"]
    answers = _generate(runner, [c.image for _, c in gr], [prompt_for(it) for it, _ in gr],
                        m.grounding_max_new_tokens, tally)
    for (it, c), a in zip(gr, answers, strict=True):
        box = c.boxes[it.record_id]
        assert box is not None
        s = (score_grounding_reference(a.text, box[0].tolist(), c.image.shape[:2])
             if proto.grounding_parse == "reference" else
             score_grounding(a.text, box[0].tolist(), c.image.shape[:2], runner.box_scale))
        rows.append(_with_answer(_row(it, c, runner), a, s))
    cap = jobs["caption"]
    answers = _generate(runner, [c.image for _, c in cap],
                        [proto.caption_prompt or prompt_for(it) for it, _ in cap], m.caption_max_new_tokens, tally)
    if cap:
        keys = [f"{k}" for k in range(len(cap))]
        per = score_captions({k: a.text for k, a in zip(keys, answers, strict=True)},
                             {k: it.references for k, (it, _) in zip(keys, cap, strict=True)}, caption_df_refs or None)
        if proto.caption_raw_scores:
            _add_raw_scores(per, keys, cap, answers, items_by_sample)
        cap_rows = [_with_answer(_row(it, c, runner), a, per[k]) for k, (it, c), a in zip(keys, cap, answers, strict=True)]
        if caption_judge is not None:
            _judge_captions(caption_judge, [(it, r) for (it, _), r in zip(cap, cap_rows, strict=True)
                                            if r["outcome"] != ERROR_OUTCOME])
        rows.extend(cap_rows)
    summary.model_seconds += time.perf_counter() - t0
    summary.n_images += len(conditions)
    return rows


OPEN_TASK = "vqa_open"
"""Task of the judge-scored open-answer rows (``vlm.protocol.open_vqa_judge``)."""


def _open_rows(jobs: list[tuple[VLMItem, Condition]], runner: Runner, judge: Runner,
               max_new_tokens: int, tally: _Tally | None = None) -> list[dict[str, Any]]:
    """The multiple-choice questions asked alone and judged (:mod:`medrobust_lib.vlm_tasks.judge_open`):
    ``correct`` = judge score >= 0.5, ``parsed`` and ``judge_parsed`` the score. A judge failure or
    a reply without a score is an ``error`` row (not scored, retried by the next run). ``tally``: as
    in :func:`ask`."""
    answers = _generate(runner, [c.image for _, c in jobs], [it.question for it, _ in jobs], max_new_tokens, tally)
    texts = [a.text or "" for a in answers]
    truths = [it.options[LETTERS.index(it.answer.upper())] if it.answer else "" for it, _ in jobs]
    verdicts = judge_open(judge.api, [it.question for it, _ in jobs], texts, truths) if judge.api else []
    out = []
    for (it, c), a, v in zip(jobs, answers, verdicts, strict=True):
        r = _row(dataclasses.replace(it, task=OPEN_TASK), c, runner)
        r["n_options"] = None
        scored: dict[str, Any] = {"prediction": a.text, "judge_model": judge.m.id, "judge_outcome": v.outcome}
        if v.score is None:
            scored.update(outcome=ERROR_OUTCOME, correct=None, error=f"open-VQA judge: {v.outcome}")
        else:
            scored.update(outcome="ok", correct=v.correct, parsed=f"{v.score:g}", judge_parsed=f"{v.score:g}",
                          judge_correct=v.correct)
        row = _with_answer(r, a, scored)
        if v.score is None and a.outcome != ERROR_OUTCOME:
            row["error"] = scored["error"]
        out.append(row)
    return out


def _judge_captions(judge: Runner, pairs: list[tuple[VLMItem, dict[str, Any]]]) -> None:
    """Score answered captions with the caption judge (:mod:`medrobust_lib.vlm_tasks.judge_caption`):
    ``caption_judge_score`` as the reference reads the reply (NULL when it holds no number; the row
    keeps its outcome and its other scores). The judge sees the record's first reference caption
    (the reference has one per record). A failed judge call makes the row an ``error`` (nothing
    scored, retried by the next run)."""
    if not pairs or judge.api is None:
        return
    verdicts = judge_captions(judge.api, [str(r["prediction"] or "") for _, r in pairs],
                              [it.references[0] if it.references else "" for it, _ in pairs])
    for (_, r), v in zip(pairs, verdicts, strict=True):
        r.update(judge_model=judge.m.id, judge_outcome=v.outcome, caption_judge_score=v.score)
        if v.failed:
            r.update(dict.fromkeys(_ERROR_CLEARED), outcome=ERROR_OUTCOME, error=f"caption judge: {v.outcome}")


def _add_raw_scores(per: dict[str, dict[str, Any]], keys: list[str], cap: list[tuple[VLMItem, Condition]],
                    answers: Sequence[Answer], items_by_sample: Mapping[tuple[str, str], list[VLMItem]]) -> None:
    """Add the raw (untokenised) caption scores to ``per``, dataset by dataset, CIDEr's document
    frequencies from the references of every caption record of that dataset's evaluation samples."""
    by_ds: dict[str, list[int]] = {}
    for i, (it, _) in enumerate(cap):
        by_ds.setdefault(it.dataset, []).append(i)
    for ds, idx in by_ds.items():
        df_refs = [list(it.references) for (d, _), its in items_by_sample.items() if d == ds
                   for it in its if it.task == "caption"]
        raw = raw_caption_rows({keys[i]: answers[i].text for i in idx},
                               {keys[i]: cap[i][0].references for i in idx}, df_refs)
        for k, cols in raw.items():
            per[str(k)].update(cols)


@dataclass
class _Items:
    """The records of one evaluation (:func:`_items_for`)."""

    by: dict[tuple[str, str], list[VLMItem]]
    """Readable records of the evaluation samples, by sample."""
    dropped: dict[tuple[str, str], list[DroppedRecord]]
    """Records of the evaluation samples that their reader quarantined, by sample."""
    not_indexed: list[VLMItem]
    """Readable records whose image is not a usable sample of the clean index."""
    dropped_not_indexed: list[DroppedRecord]
    """Quarantined records whose image is not a usable sample of the clean index."""
    df_refs: dict[str, list[str]]
    """The clean caption reference set over every evaluation record."""


def _items_for(suite: Suite, samples: Collection[tuple[str, str]]) -> _Items:
    """The records of the evaluation samples ``samples`` (keys), and those of images not indexed.
    ``max_records_per_task`` caps the records per task: the readable ones first, then those their
    reader quarantined."""
    vc = suite.vlm
    loaded = load_items(suite)
    if vc.record_sample is not None:
        loaded = sample_records(loaded, vc.record_sample.n, vc.record_sample.seed)
    counts: dict[str, int] = {}

    def take(task: str) -> bool:
        n = counts.get(task, 0)
        if vc.max_records_per_task is not None and n >= vc.max_records_per_task:
            return False
        counts[task] = n + 1
        return True

    by: dict[tuple[str, str], list[VLMItem]] = {}
    for it in loaded.items:
        key = (it.dataset, it.sample_id)
        if key in samples and take(it.task):
            by.setdefault(key, []).append(it)
    dropped: dict[tuple[str, str], list[DroppedRecord]] = {}
    for d in loaded.dropped:
        if d.key in samples and take(d.task):
            dropped.setdefault(d.key, []).append(d)
    indexed = _indexed_keys(suite)
    df_refs = {it.record_id: list(it.references) for it in loaded.items if it.task == "caption"
               and (it.dataset, it.sample_id) in indexed
               and vc.split in ("all", indexed[(it.dataset, it.sample_id)])}
    return _Items(by, dropped, [it for it in loaded.items if (it.dataset, it.sample_id) not in indexed],
                  [d for d in loaded.dropped if d.key not in indexed], df_refs)


def _indexed_keys(suite: Suite) -> dict[tuple[str, str], str]:
    """(dataset, sample_id) -> split for every usable sample of the clean index."""
    from medrobust_lib.tracks.datasets import CLEAN_TABLE

    df = results.read_table(suite.results_dir, CLEAN_TABLE)
    if df.empty:
        return {}
    ok = df[df["status"] == "ok"]
    return {(str(d), str(s)): str(sp) for d, s, sp in zip(ok["dataset"], ok["sample_id"], ok["split"], strict=True)}


def _grounding_boxes(items: list[VLMItem], s: Sample) -> dict[str, np.ndarray | None]:
    orig = s.metadata.get("original_size") if s.metadata else None
    hw = (int(s.image.shape[0]), int(s.image.shape[1]))
    return {it.record_id: box_in_sample(it, hw, tuple(orig) if orig else None)  # type: ignore[arg-type]
            for it in items if it.task == "grounding" and it.box is not None}


def _partition(suite: Suite, model_id: str, modality: str, level: int) -> Partition:
    """A ``vlm_results`` partition: model / run (clean at level 0, else perturbation) / modality /
    level; rows sorted by type, task, record and prompt."""
    return Partition(suite.results_dir, VLM_TABLE, {"model": model_id, "run": "clean" if level == 0 else "perturbation",
                                                    "modality": modality, "level": level}, COLUMN_NAMES,
                     lambda r: (str(r["perturbation"]), str(r["task"]), str(r["record_id"]), int(r["prompt_id"])))


def _summarize(rows: list[dict[str, Any]], s: VLMEvalSummary, t0: float, runner: Runner) -> VLMEvalSummary:
    s.n_rows = len(rows)
    s.seconds = time.perf_counter() - t0
    s.n_vision_calls = runner.n_vision_calls
    if not rows:
        return s
    df = pd.DataFrame(rows)
    s.outcomes = outcome_counts(df)
    s.n_truncated = int(df["truncated"].eq(True).sum()) if "truncated" in df else 0
    scored = df[df["outcome"].isin(("ok", "unparseable", "refused"))]
    for task, g in scored.groupby("task"):
        if task == "caption":
            s.metrics["caption_cider_d"] = float(g["cider_d"].mean())
            judged = g["caption_judge_score"].dropna() if "caption_judge_score" in g else pd.Series(dtype=float)
            if len(judged):
                s.metrics["caption_judge_score"] = float(judged.mean())
        else:
            s.metrics[f"{task}_accuracy"] = float(g["correct"].mean())
        if task == "grounding":
            s.metrics["grounding_mean_iou"] = float(g["iou"].mean())
    return s


def _judge_runner(suite: Suite) -> Runner | None:
    vc = suite.vlm
    if vc.judge is None:
        return None
    m = vlm_model(suite, vc.judge)
    if not model_entry(m.kind, "vlm").is_endpoint:
        raise ValueError(f"vlm.judge {m.id!r} must be an endpoint model (kind: "
                         f"{' or '.join(list_models('vlm', is_endpoint=True))})")
    return Runner(suite, m)


def _open_judge_runner(suite: Suite) -> Runner | None:
    return _protocol_judge(suite, "open_vqa_judge")


def _caption_judge_runner(suite: Suite) -> Runner | None:
    return _protocol_judge(suite, "caption_judge")


def _protocol_judge(suite: Suite, key: str) -> Runner | None:
    """The judge client of ``vlm.protocol.<key>`` (an endpoint model; None when unset)."""
    model_id = getattr(suite.vlm.protocol, key)
    if model_id is None:
        return None
    m = vlm_model(suite, model_id)
    if not model_entry(m.kind, "vlm").is_endpoint:
        raise ValueError(f"vlm.protocol.{key} {m.id!r} must be an endpoint model (kind: "
                         f"{' or '.join(list_models('vlm', is_endpoint=True))})")
    return Runner(suite, m)


@dataclass(frozen=True, kw_only=True)
class VLMInputs(PartitionInputs):
    """What a ``vlm_results`` partition's rows depend on (:mod:`medrobust_lib.tracks.partition`).
    Build with :func:`vlm_inputs`."""

    checkpoint: str
    """The base weights (``Runner.checkpoint``: the model folder's hash, ``api:<model>``, ...)."""
    adapter: str | None
    """The LoRA adapter's hash (None: none)."""
    model: dict[str, Any]
    """The model's whole configuration (its token caps, box scale, API settings, ...)."""
    records: dict[str, Any]
    """The record files asked about (:func:`~medrobust_lib.tracks.vlm.items.records_config`)."""
    max_records_per_task: int | None
    judge: str | None
    """The multiple-choice judge model."""
    modality: str
    level: int | None = added(None)
    """The perturbation level (None: the clean partition)."""
    samples: list[Any] | None = added(None)
    """Clean: ((dataset, sample id), content hash) of every usable evaluation sample."""
    manifest: list[str] | None = added(None)
    """Perturbed: the manifest partition's output hashes."""
    protocol: dict[str, Any] | None = added(None)
    """``vlm.protocol`` when not the default."""
    seed: int = added(0)
    """The suite seed where the model reads it (an endpoint's requests, unless its ``api`` sets one;
    a local model that samples); 0 for local models that decode greedily."""
    split: str = added("test")
    """``vlm.split``: which samples and records the partition holds."""
    record_sample: dict[str, Any] | None = added(None)
    """``vlm.record_sample``: the seeded draw of records (None: every record)."""


def vlm_inputs(suite: Suite, checkpoint: str, adapter: str | None, m: VLMModelConfig, modality: str, *,
               samples: Mapping[tuple[str, str], Sample] | None = None, level: int | None = None,
               manifest: pd.DataFrame | None = None) -> VLMInputs:
    """The inputs of a clean partition (``samples``: the usable evaluation samples by key) or a
    perturbed one (``level`` and its ``manifest``) of model ``m`` with weights ``checkpoint`` /
    ``adapter``."""
    vc = suite.vlm
    return VLMInputs(checkpoint=checkpoint, adapter=adapter, model=m.model_dump(),
                     records=records_config(suite).model_dump(), max_records_per_task=vc.max_records_per_task,
                     judge=vc.judge, modality=modality, level=level,
                     samples=sorted((k, s.content_hash()) for k, s in samples.items()) if samples is not None else None,
                     manifest=manifest_hashes(manifest) if manifest is not None else None,
                     protocol=None if vc.protocol.is_default() else vc.protocol.model_dump(),
                     seed=suite.seed if model_entry(m.kind, "vlm").is_endpoint or m.samples() else 0,
                     split=vc.split,
                     record_sample=None if vc.record_sample is None else vc.record_sample.model_dump())


def evaluate_clean(suite: Suite, model_id: str, modality: str, runner: Runner | None = None,
                   log: Callable[[str], None] | None = None, progress: Progress | None = None) -> VLMEvalSummary:
    """Clean rows for every record of the modality's evaluation samples; records whose image is
    not in the clean index at all are written as ``excluded:image_not_indexed`` rows (in the
    partition of their record's modality); records of an image the clean index lists as ok that
    cannot be used now are ``error`` rows with the reason; records of an evaluation image that their
    reader quarantined are ``error`` rows with the reader's reason. ``progress``: told of the
    :data:`PROGRESS_WHAT` per chunk of ``batch_size`` prompts, of the partition's total."""
    from medrobust_lib.tracks.datasets import load_eval_samples, placeholder_sample

    t0 = time.perf_counter()
    vc = suite.vlm
    runner = runner or Runner(suite, vlm_model(suite, model_id))
    ev = load_eval_samples(suite, modality, vc.split)
    samples = ev.samples
    its = _items_for(suite, samples.keys() | ev.unusable.keys())
    by, df_refs = its.by, its.df_refs
    fp = vlm_inputs(suite, runner.checkpoint, runner.adapter, runner.m, modality, samples=samples).fingerprint
    part = _partition(suite, model_id, modality, 0)
    kept = part.kept_rows(fp, ROW_KEY)
    conds = [Condition(s, s.image, boxes=_grounding_boxes(by.get(k, []), s)) for k, s in sorted(samples.items())
             if any(_item_key(it, "clean") not in kept for it in by.get(k, []))]
    summary = VLMEvalSummary(n_reused=len(kept))
    judge = _judge_runner(suite)
    open_judge = _open_judge_runner(suite)
    caption_judge = _caption_judge_runner(suite)
    tally = _Tally(progress, sum(_n_asked(by.get((c.sample.dataset, c.sample.sample_id), []), "clean", kept.keys(),
                                          open_judge is not None) for c in conds))
    rows = ask(by, conds, runner, df_refs, summary, judge, done=kept.keys(), protocol=vc.protocol,
               open_judge=open_judge, tally=tally, caption_judge=caption_judge)
    tally.close()
    for key, reason in sorted(ev.unusable.items()):
        stand_in = placeholder_sample(key, modality)
        rows += _unusable_rows(by.get(key, []), Condition(stand_in, stand_in.image), runner, reason)
    for key, lost in sorted(its.dropped.items()):
        stand_in = placeholder_sample(key, modality)
        rows += _dropped_rows(lost, Condition(stand_in, stand_in.image), runner)
    rows += [_not_indexed_row(it, modality, runner) for it in its.not_indexed if it.modality == modality]
    rows += [_not_indexed_row(d.as_item(), modality, runner, d.error) for d in its.dropped_not_indexed
             if d.modality == modality]
    rows = _merge(kept, rows)
    part.write(rows, fp)
    return _summarize(rows, summary, t0, runner)


def evaluate_perturbed(suite: Suite, model_id: str, modality: str, level: int, runner: Runner | None = None,
                       log: Callable[[str], None] | None = None, progress: Progress | None = None) -> VLMEvalSummary:
    """Rows for every record of every perturbed image of one (modality, level) manifest partition;
    a manifest row of the evaluation split whose sample cannot be used now gives ``error`` rows, and
    so does every record of its image that the reader quarantined (with the reader's reason).
    ``progress``: as in :func:`evaluate_clean`."""
    from medrobust_lib.perturb.regen_cache import regenerate_cached
    from medrobust_lib.tracks.datasets import load_eval_samples, placeholder_sample
    from medrobust_lib.tracks.perturbed import manifest_keys, read_manifest

    t0 = time.perf_counter()
    vc = suite.vlm
    runner = runner or Runner(suite, vlm_model(suite, model_id))
    ev = load_eval_samples(suite, modality, vc.split)
    samples = ev.samples
    manifest = read_manifest(suite, modality, level)
    reasons = ev.reasons_for(manifest_keys(manifest))
    its = _items_for(suite, samples.keys() | reasons.keys())
    by, df_refs = its.by, its.df_refs
    fp = vlm_inputs(suite, runner.checkpoint, runner.adapter, runner.m, modality, level=level,
                    manifest=manifest).fingerprint
    part = _partition(suite, model_id, modality, level)
    kept = part.kept_rows(fp, ROW_KEY)
    summary = VLMEvalSummary(n_reused=len(kept))
    judge = _judge_runner(suite)
    open_judge = _open_judge_runner(suite)
    caption_judge = _caption_judge_runner(suite)
    rows: list[dict[str, Any]] = []
    conds: list[Condition] = []
    chunk = 64
    todo: list[tuple[dict[str, Any], tuple[str, str], Sample, Condition]] = []
    for rec in manifest.to_dict("records"):
        mr = {str(k): v for k, v in rec.items()}
        key = (str(mr["dataset"]), str(mr["sample_id"]))
        if key not in by and key not in its.dropped:
            continue  # another split, or no record asks about this image
        s = samples.get(key) or placeholder_sample(key, modality)
        base = Condition(s, s.image, str(mr["perturbation"]), level, mr.get("strength"), mr.get("ssim"))
        rows.extend(_dropped_rows(its.dropped.get(key, []), base, runner, kept.keys()))
        if all(_item_key(it, base.perturbation) in kept for it in by.get(key, [])):
            continue  # no readable record, or every row of this image is kept from the previous run
        if key in reasons:
            rows.extend(_unusable_rows(by[key], base, runner, reasons[key], kept.keys()))
            continue
        if mr["status"] != "ok":
            for it in by[key]:
                r = _row(it, base, runner)
                r.update(outcome=excluded_outcome(str(mr["status"])), error=str(mr.get("error")))
                rows.append(r)
            continue
        todo.append((mr, key, s, base))  # asked below, once the partition's total is known
    open_vqa = open_judge is not None
    tally = _Tally(progress, sum(_n_asked(by[key], base.perturbation, kept.keys(), open_vqa)
                                 for _, key, _, base in todo))
    for mr, key, s, base in todo:
        try:
            gt = _grounding_boxes(by[key], s)
            out = regenerate_cached(mr, s)  # shared with the other models of this process
            moved = {rid: _move_box(mr, s, box) for rid, box in gt.items() if box is not None}
        except Exception as exc:  # e.g. out of memory: an infrastructure failure, retried by the next run
            for it in by[key]:
                if _item_key(it, base.perturbation) not in kept:
                    r = _row(it, base, runner)
                    r.update(outcome=ERROR_OUTCOME, error=f"regenerating the image failed: {type(exc).__name__}: "
                                                          f"{exc}"[:300])
                    rows.append(r)
            tally.tick(_n_asked(by[key], base.perturbation, kept.keys(), open_vqa))  # not asked
            continue
        conds.append(dataclasses.replace(base, image=out.image, boxes=moved))
        if len(conds) >= chunk:
            rows.extend(ask(by, conds, runner, df_refs, summary, judge, done=kept.keys(), protocol=vc.protocol,
                            open_judge=open_judge, tally=tally, caption_judge=caption_judge))
            conds = []
    rows.extend(ask(by, conds, runner, df_refs, summary, judge, done=kept.keys(), protocol=vc.protocol,
                    open_judge=open_judge, tally=tally, caption_judge=caption_judge))
    tally.close()
    rows = _merge(kept, rows)
    part.write(rows, fp)
    return _summarize(rows, summary, t0, runner)


def _move_box(mr: dict[str, Any], s: Sample, box: np.ndarray) -> np.ndarray | None:
    """The ground-truth box after the manifest row's perturbation: unchanged for intensity types,
    the tight box of the moved box region for spatial ones (None when it left the image)."""
    from medrobust_lib.perturb.engine import regenerate
    from medrobust_lib.perturb.spec import get_perturbation

    spec = get_perturbation(str(mr["perturbation"]))
    if spec.geometry != "spatial":
        return box
    h, w = s.image.shape[:2]
    region = np.zeros((h, w), bool)
    x0, y0, x1, y1 = box[0]
    region[int(np.floor(y0)) : int(np.ceil(y1)), int(np.floor(x0)) : int(np.ceil(x1))] = True
    out = regenerate(mr, dataclasses.replace(s, mask=region, boxes=box))
    if out.mask is None or not out.mask.any():
        return None
    ys, xs = np.nonzero(out.mask)
    return np.array([[xs.min(), ys.min(), xs.max() + 1, ys.max() + 1]], np.float32)
