"""Resolving the suite's datasets and the clean-sample index."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from medrobust_lib.config import Suite
from medrobust_lib.data.dataset import DatasetConfig, index_dataset, load_sample
from medrobust_lib.data.sample import Sample, SampleError, SampleRef
from medrobust_lib.data.splits import SPLIT_FRACTIONS, split_of
from medrobust_lib.hashing import digest
from medrobust_lib.store import results
from medrobust_lib.tracks.upstream import MissingUpstream

CLEAN_TABLE = "clean_samples"
INFO_TABLE = "dataset_info"
CLEAN_VERSION = 1
SampleKey = tuple[str, str]
"""(dataset, sample_id)."""


def resolve_datasets(suite: Suite) -> list[DatasetConfig]:
    """The demo datasets (when enabled; the demo must have been built) plus explicit ones. The demo's
    generated datasets (its manifest's ``datasets``) come out with ``synthetic_labels`` true, its
    real ones (``real_datasets``) and the suite's own with their setting (default false)."""
    configs: list[dict[str, Any]] = []  # the demo's, as its manifest lists them
    if suite.demo.enabled:

        manifest = Path(suite.demo.root) / "demo_manifest.json"
        if not manifest.is_file():
            raise MissingUpstream(f"demo data not built at {manifest.parent}: materialize 'demo_data' first",
                                  "demo_data")
        data = json.loads(manifest.read_text())
        # the manifest's "datasets" are the generated ones (masks drawn with the image); its entries
        # do not carry the flag (nor do those of a demo built before it existed), so it is set here
        configs.extend({"synthetic_labels": True, **c} for c in data["datasets"])
        configs.extend(data.get("real_datasets", []))  # evaluation-only real image-mask pairs
    out = [DatasetConfig(**{"max_pixels": suite.max_pixels, **c}) for c in configs]
    # the suite's own entries were checked when it loaded; one without max_pixels takes the suite's
    out += [d if "max_pixels" in d.model_fields_set else d.model_copy(update={"max_pixels": suite.max_pixels})
            for d in suite.datasets]
    names = [c.name for c in out]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"dataset names must be unique, duplicated: {dupes}")
    return [c for c in out if c.modality in suite.modalities]


def datasets_for(suite: Suite, modality: str) -> list[DatasetConfig]:
    return [c for c in resolve_datasets(suite) if c.modality == modality]


@dataclass(frozen=True)
class CleanIndexSummary:
    n_ok: int
    n_quarantined: int
    reasons: dict[str, int]
    datasets: list[str]


def build_clean_index(suite: Suite, modality: str) -> CleanIndexSummary:
    """Load every sample of the modality's datasets once, record it (status ok) or its
    quarantine reason, and write the ``clean_samples`` partition (one chunk per dataset)."""
    part = {"modality": modality}
    n_ok = n_q = 0
    reasons: dict[str, int] = {}
    cfgs = datasets_for(suite, modality)
    fractions = suite.splits.as_tuple()
    for cfg in cfgs:
        rows = clean_rows(cfg, fractions)
        df = pd.DataFrame(rows)
        n_ok += int((df["status"] == "ok").sum()) if len(df) else 0
        for r in rows:
            if r["status"] != "ok":
                n_q += 1
                reasons[r["reason"]] = reasons.get(r["reason"], 0) + 1
        # the suite's split shares enter only when they are not the default (earlier indexes stay current)
        fp = digest([CLEAN_VERSION, cfg.model_dump(),
                                  *([] if suite.splits.is_default() else [list(fractions)])])
        results.write_chunk(results.chunk_path(suite.results_dir, INFO_TABLE, part, cfg.name), info_rows(cfg), fp)
        results.write_chunk(results.chunk_path(suite.results_dir, CLEAN_TABLE, part, cfg.name), df, fp)
    results.finalize_partition(suite.results_dir, INFO_TABLE, part, [c.name for c in cfgs])
    results.finalize_partition(suite.results_dir, CLEAN_TABLE, part, [c.name for c in cfgs])
    return CleanIndexSummary(n_ok, n_q, reasons, [c.name for c in cfgs])


def info_rows(cfg: DatasetConfig) -> list[dict[str, Any]]:
    """The ``dataset_info`` rows of a dataset: one per reference family (``reference_dice``), or
    one with no reference; each with what the report says of the dataset."""
    base = {"dataset": cfg.name, "modality": cfg.modality, "format": cfg.format, "synthetic_labels": cfg.synthetic_labels,
            "evaluation_only": cfg.evaluation_only, "description": cfg.description}
    refs = [{"reference_family": fam, "reference_dice": r.dice, "reference_n": r.n, "reference_source": r.source}
            for fam, r in sorted(cfg.reference_dice.items())]
    empty = {"reference_family": None, "reference_dice": None, "reference_n": None, "reference_source": None}
    return [{**base, **r} for r in refs] or [{**base, **empty}]


def clean_rows(cfg: DatasetConfig, fractions: tuple[tuple[str, float], ...] = SPLIT_FRACTIONS) -> list[dict[str, Any]]:
    """The clean index rows of a dataset; ``split`` from :func:`split_of` with ``fractions`` (the
    suite's ``splits``)."""
    refs, quarantined = index_dataset(cfg)
    rows: list[dict[str, Any]] = []
    for q in quarantined:
        rows.append(_row(cfg, fractions, q.sample_id, q.path, status="quarantined", reason=q.reason,
                         detail=q.detail))
    for ref in refs:
        try:
            s = load_sample(cfg, ref)
        except SampleError as exc:
            rows.append(_row(cfg, fractions, ref.sample_id, ref.image_path, status="quarantined", reason=exc.reason,
                             detail=exc.detail))
            continue
        except Exception as exc:  # any decoder failure is a counted quarantine, never a crash
            rows.append(_row(cfg, fractions, ref.sample_id, ref.image_path, status="quarantined",
                             reason="unreadable", detail=f"{type(exc).__name__}: {exc}"[:500]))
            continue
        rows.append(_row(
            cfg, fractions, s.sample_id, ref.image_path, status="ok", height=s.image.shape[0], width=s.image.shape[1],
            channels=s.n_channels, mask_area=None if s.mask is None else int(s.mask.sum()),
            n_boxes=None if s.boxes is None else len(s.boxes), sha256=s.content_hash(),
        ))
    rows.sort(key=lambda r: r["sample_id"])
    return rows


def _row(cfg: DatasetConfig, fractions: tuple[tuple[str, float], ...], sample_id: str, path: str,
         **kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "sample_id": sample_id, "dataset": cfg.name, "modality": cfg.modality,
        "split": split_of(cfg.name, sample_id, cfg.evaluation_only, fractions), "image_path": str(path),
        "height": None, "width": None,
        "channels": None, "mask_area": None, "n_boxes": None, "sha256": None, "status": None,
        "reason": None, "detail": None, "synthetic_labels": cfg.synthetic_labels,
    }
    base.update(kw)
    return base


def load_clean_samples(
    suite: Suite, modality: str, split: str = "all", max_samples: int | None = None,
    on_error: Callable[[SampleRef, Exception], None] | None = None,
) -> dict[str, list[Sample]]:
    """The usable samples per dataset (status ok in the clean index, filtered by split), loaded
    through the readers and checked against the recorded hash."""
    index = results.read_partition(suite.results_dir, CLEAN_TABLE, {"modality": modality})
    if index.empty:
        raise MissingUpstream(f"no clean sample index for modality {modality!r}: materialize 'clean_samples' first",
                              "clean_samples")
    out: dict[str, list[Sample]] = {}
    for cfg in datasets_for(suite, modality):
        ok = index[(index["dataset"] == cfg.name) & (index["status"] == "ok")]
        if split != "all":
            ok = ok[ok["split"] == split]
        ok = ok.sort_values("sample_id")
        if max_samples is not None:
            ok = ok.head(max_samples)
        wanted = dict(zip(ok["sample_id"], ok["sha256"], strict=True))
        refs, _ = index_dataset(cfg)
        samples = []
        for ref in refs:
            if ref.sample_id not in wanted:
                continue
            try:
                s = load_sample(cfg, ref)
                if s.content_hash() != wanted[ref.sample_id]:
                    raise SampleError("changed_on_disk", "content differs from the clean index; re-materialize clean_samples")
                samples.append(s)
            except Exception as exc:
                if on_error is None:
                    raise
                on_error(ref, exc)
        out[cfg.name] = samples
    return out


@dataclass(frozen=True)
class EvalSamples:
    """The samples of one evaluation split: those usable now, and why the others cannot be used.

    ``quarantined``: samples of the split that the clean index records as quarantined
    (``quarantined:<reason>``). ``unusable``: samples the clean index records as ok that cannot be
    used now: the reader no longer finds them (``missing: <path>``) or loading them fails
    (``quarantined:<reason>: <detail>``, e.g. ``changed_on_disk``). An evaluation writes an
    ``error`` row with this reason for each of them instead of dropping it. ``evaluation_only``:
    names of the datasets whose samples are all in the test split (``DatasetConfig.evaluation_only``).
    ``fractions``: the suite's split shares (``splits``)."""

    split: str
    samples: dict[SampleKey, Sample]
    quarantined: dict[SampleKey, str]
    unusable: dict[SampleKey, str]
    evaluation_only: frozenset[str] = frozenset()
    fractions: tuple[tuple[str, float], ...] = SPLIT_FRACTIONS

    def reason(self, key: SampleKey) -> str | None:
        """Why the sample ``key`` (named by a manifest row) cannot be evaluated now; None when it is
        usable or belongs to another split than this evaluation (the only legitimate skips)."""
        if key in self.samples:
            return None
        if key in self.unusable:
            return self.unusable[key]
        if key in self.quarantined:
            return self.quarantined[key]
        if self.split != "all" and split_of(*key, key[0] in self.evaluation_only, self.fractions) != self.split:
            return None
        return f"missing: {key[0]}/{key[1]} is not a sample of the clean index"

    def reasons_for(self, keys: Iterable[tuple[object, object]]) -> dict[SampleKey, str]:
        """:meth:`reason` of every one of ``keys`` ((dataset, sample_id) pairs, e.g. a manifest's)
        that cannot be evaluated now; usable samples and those of another split are left out."""
        out: dict[SampleKey, str] = {}
        for d, i in keys:
            key = (str(d), str(i))
            reason = self.reason(key)
            if reason is not None:
                out[key] = reason
        return out


def load_eval_samples(suite: Suite, modality: str, split: str) -> EvalSamples:
    """The modality's samples of ``split`` (``all``: every split) as :class:`EvalSamples`: loaded
    and checked like :func:`load_clean_samples`, a sample that fails to load is recorded, not
    raised."""
    failures: dict[SampleKey, str] = {}

    def note(ref: SampleRef, exc: Exception) -> None:
        failures[(ref.dataset, ref.sample_id)] = _failure_reason(exc)

    loaded = load_clean_samples(suite, modality, split=split, on_error=note)
    samples = {(s.dataset, s.sample_id): s for v in loaded.values() for s in v}
    index = results.read_partition(suite.results_dir, CLEAN_TABLE, {"modality": modality})
    names = {c.name for c in datasets_for(suite, modality)}
    index = index[index["dataset"].isin(names)]
    if split != "all":
        index = index[index["split"] == split]
    quarantined: dict[SampleKey, str] = {}
    unusable: dict[SampleKey, str] = {}
    for r in index.to_dict("records"):
        key = (str(r["dataset"]), str(r["sample_id"]))
        if r["status"] != "ok":
            quarantined[key] = f"quarantined:{r['reason']}"
        elif key not in samples:
            unusable[key] = failures.get(key, f"missing: {r['image_path']}")
    evaluation_only = frozenset(c.name for c in datasets_for(suite, modality) if c.evaluation_only)
    return EvalSamples(split, samples, quarantined, unusable, evaluation_only, suite.splits.as_tuple())


def _failure_reason(exc: Exception) -> str:
    """The reason recorded for a sample the clean index lists as ok that fails to load now."""
    if isinstance(exc, SampleError):
        return f"quarantined:{exc.reason}: {exc.detail}"[:300] if exc.detail else f"quarantined:{exc.reason}"
    return f"quarantined:load_error: {type(exc).__name__}: {exc}"[:300]


def placeholder_sample(key: SampleKey, modality: str) -> Sample:
    """A 1 x 1 stand-in that only names a sample (dataset, id, modality), for the rows of a sample
    that cannot be loaded."""
    return Sample(key[1], key[0], modality, np.zeros((1, 1), np.float32))
