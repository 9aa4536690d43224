"""``medrobust validate``: check a suite before running it, in seconds and without torch.

:func:`validate_suite` loads the suite (unknown keys and models without weights are errors, see
:class:`medrobust_lib.config.Suite`), lists every dataset with its reader (counts of usable and
quarantined samples, the first problems; the first few samples are decoded), and checks that every named weights file or folder and
every VLM record file exists.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from medrobust_lib.config import Suite, load_suite
from medrobust_lib.config.suite import DEMO_TRAINED
from medrobust_lib.config.vlm import yesno_files
from medrobust_lib.data.dataset import DatasetConfig, index_dataset, load_sample
from medrobust_lib.data.sample import QuarantineRecord, SampleError, SampleRef
from medrobust_lib.tracks.datasets import resolve_datasets

MAX_PROBLEMS = 5


@dataclass(frozen=True)
class DatasetCheck:
    """One dataset: ``n_ok`` indexed samples, ``n_quarantined`` with ``reasons`` (reason -> count)
    and up to :data:`MAX_PROBLEMS` ``problems`` (``sample_id: reason (detail)``); ``error``: the
    layout could not be read at all (missing folder, bad options)."""

    name: str
    modality: str
    format: str
    root: str
    n_ok: int = 0
    n_quarantined: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    error: str | None = None


@dataclass
class SuiteCheck:
    """The whole report; ``ok`` when there is no error (quarantined samples are not errors)."""

    suite: str
    datasets: list[DatasetCheck] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors and all(d.error is None for d in self.datasets)

    def lines(self) -> list[str]:
        out = [f"suite {self.suite}: {'OK' if self.ok else 'PROBLEMS'}"]
        for d in self.datasets:
            if d.error is not None:
                out.append(f"  {d.name} ({d.modality}, {d.format}): error: {d.error}")
                continue
            reasons = ", ".join(f"{k} {v}" for k, v in sorted(d.reasons.items()))
            out.append(f"  {d.name} ({d.modality}, {d.format}): {d.n_ok} samples, {d.n_quarantined} quarantined"
                       + (f" ({reasons})" if reasons else ""))
            out.extend(f"    {p}" for p in d.problems)
        out.extend(f"  error: {e}" for e in self.errors)
        return out


def _check_dataset(cfg: DatasetConfig, n_load: int) -> DatasetCheck:
    base = DatasetCheck(cfg.name, cfg.modality, cfg.format, cfg.root)
    try:
        refs, bad = index_dataset(cfg)
    except (FileNotFoundError, ValueError, OSError) as exc:
        return DatasetCheck(cfg.name, cfg.modality, cfg.format, cfg.root, error=str(exc))
    loaded: list[SampleRef] = []
    for ref in refs[:n_load]:  # decode a few, so a codec or mask problem shows before a run
        try:
            load_sample(cfg, ref)
            loaded.append(ref)
        except SampleError as exc:
            bad.append(QuarantineRecord(cfg.name, ref.sample_id, ref.image_path, exc.reason, exc.detail))
        except Exception as exc:  # any decoder failure is a finding here, not a crash
            bad.append(QuarantineRecord(cfg.name, ref.sample_id, ref.image_path, "load_error",
                                        f"{type(exc).__name__}: {exc}"))
    failed = {q.sample_id for q in bad}
    refs = [r for r in refs if r.sample_id not in failed]
    reasons = Counter(q.reason for q in bad)
    problems = [f"{q.sample_id}: {q.reason}" + (f" ({q.detail})" if q.detail else "") for q in bad[:MAX_PROBLEMS]]
    if not refs:
        return DatasetCheck(base.name, base.modality, base.format, base.root, 0, len(bad), dict(reasons), problems,
                            error="no usable samples found")
    return DatasetCheck(base.name, base.modality, base.format, base.root, len(refs), len(bad), dict(reasons), problems)


def _weights_errors(suite: Suite) -> list[str]:
    errors = []
    for m in suite.segmentation.models:
        if m.checkpoint not in (None, DEMO_TRAINED) and not m.checkpoint.startswith("models:/") \
                and not Path(m.checkpoint).exists():
            errors.append(f"segmentation model {m.id!r}: checkpoint not found: {m.checkpoint}")
    for v in suite.vlm.models:
        src = v.source
        # "org/name" may be a cached hub id; only an explicit path (absolute, ./ or ../) must exist
        if v.kind == "hf" and src is not None and src.startswith(("/", "./", "../")) and not Path(src).exists():
            errors.append(f"VLM {v.id!r}: source folder not found: {src}")
        if v.adapter not in (None, "finetuned") and not Path(v.adapter).exists():
            errors.append(f"VLM {v.id!r}: adapter folder not found: {v.adapter}")
    for key, path in suite.vlm.records.model_dump(exclude={"yesno"}).items():
        if path is not None and not Path(path).exists():
            errors.append(f"vlm.records.{key}: not found: {path}")
    listed = isinstance(suite.vlm.records.yesno, list)
    for i, f in enumerate(yesno_files(suite.vlm.records)):
        where = f"vlm.records.yesno.{i}" if listed else "vlm.records.yesno"
        for what, path in (("", f.path), (".image_root", f.image_root)):
            if path is not None and not Path(path).exists():
                errors.append(f"{where}{what}: not found: {path}")
    return errors


def validate_suite(path: str | Path, n_load: int = 3) -> SuiteCheck:
    """Check the suite at ``path``, decoding the first ``n_load`` samples of each dataset (sorted by
    id); never raises for a problem of the suite or its data (they are listed), only for bugs."""
    report = SuiteCheck(str(path))
    try:
        suite = load_suite(path)
    except (FileNotFoundError, ValueError) as exc:
        report.errors.append(str(exc))
        return report
    try:
        configs = resolve_datasets(suite)
    except (FileNotFoundError, ValueError) as exc:
        report.errors.append(str(exc))
        configs = []
    if not configs and not report.errors:
        report.errors.append("no datasets: list some under 'datasets' (or enable the demo)")
    report.datasets = [_check_dataset(c, n_load) for c in configs]
    report.errors.extend(_weights_errors(suite))
    return report
