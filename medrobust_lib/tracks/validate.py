"""``medrobust validate``: check a suite before running it, in seconds (torch only to read the
shapes of a checkpoint that has no ``config.json`` beside it).

:func:`validate_suite` loads the suite (unknown keys and models without weights are errors, see
:class:`medrobust_lib.config.Suite`), refuses a suite that would write into another suite's folders
(:mod:`medrobust_lib.config.isolation`), lists every dataset with its reader (counts of usable and
quarantined samples, the first problems; the first few samples are decoded), and says what a run
would hit: a dataset folder that is empty or matches no file of its layout, masks missing for every
sample (with the expected path and the options that change it), images that do not decode, a
checkpoint whose architecture is not the model's ``arch`` (from the ``config.json`` beside it, else
from its state dict's shapes), weights and record files that do not exist. Relative paths are
checked from the project ``root`` (the path rule of :mod:`medrobust_lib.config.suite`).
"""

from __future__ import annotations

import importlib.util
import json
import struct
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from medrobust_lib.config import Suite, load_suite
from medrobust_lib.config.isolation import check_isolation
from medrobust_lib.config.runtimes import EXPORTED_RUNTIMES, runtime_packages
from medrobust_lib.config.safe_yaml import read_yaml_file
from medrobust_lib.config.segmentation import PACKAGE_CHECKPOINT
from medrobust_lib.config.suite import DEMO_TRAINED
from medrobust_lib.config.vlm import yesno_files
from medrobust_lib.data.dataset import DatasetConfig, index_dataset, load_sample
from medrobust_lib.data.sample import QuarantineRecord, SampleError, SampleRef
from medrobust_lib.model_table import model_entry
from medrobust_lib.models.litemedsam_package import (
    PackagedCheckpointError,
    packaged_checkpoint,
    verify_packaged_checkpoint,
)
from medrobust_lib.ownership import NotOurs, check_cache_target, check_mart_target
from medrobust_lib.project import in_project, project_root
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
    notes: list[str] = field(default_factory=list)
    """What was checked differently and why (an overlay merged over the demo suite, demo data not
    built yet); never a problem."""

    @property
    def ok(self) -> bool:
        return not self.errors and all(d.error is None for d in self.datasets)

    def lines(self) -> list[str]:
        out = [f"suite {self.suite}: {'OK' if self.ok else 'PROBLEMS'}"]
        for d in self.datasets:
            if d.error is not None:
                out.append(f"  {d.name} ({d.modality}, {d.format}): error: {d.error}")
                out.extend(f"    {p}" for p in d.problems)
                continue
            reasons = ", ".join(f"{k} {v}" for k, v in sorted(d.reasons.items()))
            out.append(f"  {d.name} ({d.modality}, {d.format}): {d.n_ok} samples, {d.n_quarantined} quarantined"
                       + (f" ({reasons})" if reasons else ""))
            out.extend(f"    {p}" for p in d.problems)
        out.extend(f"  note: {n}" for n in self.notes)
        out.extend(f"  error: {e}" for e in self.errors)
        return out


_NOT_MASK_OPTIONS = ("mask_threshold", "mask_values")


def _mask_options(cfg: DatasetConfig) -> list[str]:
    """The reader options that say where masks are (``mask_dir``, ``mask_suffix``, ...)."""
    fields = getattr(cfg.reader().options_model, "model_fields", {})
    return [f for f in fields if f.startswith("mask_") and f not in _NOT_MASK_OPTIONS]


def _no_samples(cfg: DatasetConfig, bad: list[QuarantineRecord]) -> str:
    """Why a dataset has no usable sample, and what to change."""
    reasons = Counter(q.reason for q in bad)
    if not bad:
        layout = cfg.reader().layout
        return (f"no samples found under {cfg.root}: the folder is empty or no file matches the "
                f"'{cfg.format}' layout" + (f" ({layout})" if layout else "") + "; check 'root' and 'options'")
    if set(reasons) == {"missing_mask"}:
        detail = bad[0].detail
        opts = _mask_options(cfg)
        change = (f"options {', '.join(opts)} say where masks are" if opts else "the layout fixes where masks are")
        nomask = ", or mask_dir: null for images without masks" if "mask_dir" in opts else ""
        return f"every sample lacks its mask ({detail or 'no mask found'}): {change}{nomask}"
    if set(reasons) <= {"unreadable_image", "unreadable_dicom", "unreadable_mask", "load_error", "truncated",
                        "empty_file", "too_small"}:
        return f"no image decodes ({', '.join(f'{k} {v}' for k, v in sorted(reasons.items()))}): see the problems"
    return "no usable samples found: see the problems"


def _check_dataset(cfg: DatasetConfig, n_load: int, root: Path) -> DatasetCheck:
    base = DatasetCheck(cfg.name, cfg.modality, cfg.format, cfg.root)
    where = in_project(cfg.root, root)
    if not where.is_dir():
        rel = "" if Path(cfg.root).expanduser().is_absolute() else f" (relative paths are relative to the " \
                                                                      f"project root {root})"
        what = "is not a folder" if where.exists() else "does not exist"
        return DatasetCheck(cfg.name, cfg.modality, cfg.format, cfg.root, error=f"root {where} {what}{rel}")
    cfg = cfg.model_copy(update={"root": str(where)})
    try:
        refs, bad = index_dataset(cfg)
    except (FileNotFoundError, ValueError, OSError) as exc:
        return DatasetCheck(base.name, base.modality, base.format, base.root, error=str(exc))
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
                            error=_no_samples(cfg, bad))
    return DatasetCheck(base.name, base.modality, base.format, base.root, len(refs), len(bad), dict(reasons), problems)


def _missing(path: str, root: Path) -> str | None:
    """The absolute path when ``path`` does not exist, with the rule for a relative one."""
    p = in_project(path, root)
    if p.exists():
        return None
    return str(p) + ("" if Path(path).expanduser().is_absolute() else " (relative to the project root)")


def _package_error(model_id: str) -> str | None:
    """Why ``checkpoint: package`` cannot be used (not installed, not the pinned file), or None."""
    try:
        verify_packaged_checkpoint(packaged_checkpoint())
    except (PackagedCheckpointError, OSError) as exc:
        return f"segmentation model {model_id!r}: checkpoint: package: {exc}"
    return None


def _weights_errors(suite: Suite, root: Path) -> list[str]:
    errors = []
    for m in suite.segmentation.models:
        if m.runtime in EXPORTED_RUNTIMES:  # named explicitly: the run would fall back to PyTorch
            missing = [p for p in runtime_packages(m.runtime) if importlib.util.find_spec(p) is None]
            if missing:
                errors.append(f"segmentation model {m.id!r}: runtime {m.runtime!r} needs {' and '.join(missing)} "
                              "(make setup installs them; runtime auto or pytorch runs without)")
        if m.checkpoint == PACKAGE_CHECKPOINT:
            if (err := _package_error(m.id)) is not None:
                errors.append(err)
        elif m.checkpoint not in (None, DEMO_TRAINED) and not m.checkpoint.startswith("models:/") \
                and (gone := _missing(m.checkpoint, root)) is not None:
            errors.append(f"segmentation model {m.id!r}: checkpoint not found: {gone}")
    for v in suite.vlm.models:
        src = v.source
        # "org/name" may be a cached hub id; only an explicit path (absolute, ./ or ../) must exist
        if model_entry(v.kind, "vlm").local_weights and src is not None and src.startswith(("/", "./", "../", "~")) \
                and (gone := _missing(src, root)) is not None:
            errors.append(f"VLM {v.id!r}: source folder not found: {gone}")
        if v.adapter not in (None, "finetuned") and (gone := _missing(v.adapter, root)) is not None:
            errors.append(f"VLM {v.id!r}: adapter folder not found: {gone}")
    for key, path in suite.vlm.records.model_dump(exclude={"yesno"}).items():
        if path is not None and (gone := _missing(path, root)) is not None:
            errors.append(f"vlm.records.{key}: not found: {gone}")
    listed = isinstance(suite.vlm.records.yesno, list)
    for i, f in enumerate(yesno_files(suite.vlm.records)):
        where = f"vlm.records.yesno.{i}" if listed else "vlm.records.yesno"
        for what, path in (("", f.path), (".image_root", f.image_root)):
            if path is not None and (gone := _missing(path, root)) is not None:
                errors.append(f"{where}{what}: not found: {gone}")
    return errors


# --- checkpoint architecture ----------------------------------------------------------------------

_PATCH = "image_encoder.patch_embed.proj.weight"
_BLOCKS = "image_encoder.blocks."


SAFETENSORS_DTYPE_BYTES: dict[str, int] = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4,
                                          "I16": 2, "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


def _safetensors_shapes(path: Path) -> dict[str, list[int]]:
    """Tensor name -> shape from a .safetensors header (8-byte length, then JSON), no tensor read.
    The header must describe the file: each tensor's ``data_offsets`` span exactly its shape x dtype
    bytes and lie inside the file (a file with lying offsets is refused here, as at load)."""
    size = path.stat().st_size
    with path.open("rb") as fh:
        head = fh.read(8)
        if len(head) != 8:
            raise ValueError(f"{path}: not a safetensors file (too short)")
        (n,) = struct.unpack("<Q", head)
        if n > 100_000_000 or 8 + n > size:
            raise ValueError(f"{path}: not a safetensors file (header of {n} bytes)")
        meta = json.loads(fh.read(n))
    data = size - 8 - n
    for k, v in meta.items():
        if k == "__metadata__" or not isinstance(v, dict):
            continue
        begin, end = (int(x) for x in v.get("data_offsets", (0, -1)))
        count = 1
        for d in v.get("shape", []):
            count *= int(d)
        width = SAFETENSORS_DTYPE_BYTES.get(str(v.get("dtype")))
        if not 0 <= begin <= end <= data or (width is not None and end - begin != count * width):
            raise ValueError(f"{path}: tensor {k!r} has data_offsets [{begin}, {end}] that do not fit its shape "
                             f"{v.get('shape')} / dtype {v.get('dtype')} in {data} data bytes")
    return {k: list(v["shape"]) for k, v in meta.items() if isinstance(v, dict) and "shape" in v}


def _torch_shapes(path: Path) -> dict[str, list[int]]:
    """Tensor name -> shape of a torch checkpoint, memory-mapped (``weights_only=True``)."""
    import torch

    obj: Any = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    if isinstance(obj, dict) and isinstance(obj.get("model"), dict):
        obj = obj["model"]
    if not isinstance(obj, dict):
        raise ValueError(f"{path}: expected a state dict, got {type(obj).__name__}")
    return {str(k): list(v.shape) for k, v in obj.items() if hasattr(v, "shape")}


def encoder_shape(shapes: dict[str, list[int]]) -> tuple[int, int] | None:
    """``(embed_dim, depth)`` of a SAM image encoder from its state dict's shapes (a ``module.``
    prefix ignored), or None when the state dict has no SAM image encoder."""
    shapes = {k.removeprefix("module."): v for k, v in shapes.items()}
    patch = shapes.get(_PATCH)
    blocks = {int(k[len(_BLOCKS):].split(".", 1)[0]) for k in shapes
              if k.startswith(_BLOCKS) and k[len(_BLOCKS):].split(".", 1)[0].isdigit()}
    if not patch or not blocks:
        return None
    return int(patch[0]), max(blocks) + 1


def checkpoint_arch_error(model_id: str, arch: str, path: Path) -> str | None:
    """Why the checkpoint at ``path`` (a file, or a folder holding ``model.safetensors``) is not a
    ``arch`` model: the ``arch`` of the ``config.json`` beside it when there is one, else the image
    encoder's width and depth read from the state dict; None when it fits or cannot be told."""
    f = path / "model.safetensors" if path.is_dir() else path
    cfg = f.parent / "config.json"
    if cfg.is_file():
        try:
            stated = json.loads(cfg.read_text()).get("arch")
        except (OSError, ValueError, AttributeError):
            stated = None
        if isinstance(stated, str):
            if stated != arch:
                return (f"segmentation model {model_id!r}: arch {arch!r}, but {cfg} says {stated!r}: "
                        f"set arch: {stated}")
            return None
    from medrobust_lib.models.sam import ARCHS

    try:
        shapes = _safetensors_shapes(f) if f.suffix == ".safetensors" else _torch_shapes(f)
    except Exception as exc:  # any reader failure: the run would fail the same way
        return f"segmentation model {model_id!r}: cannot read checkpoint {f}: {type(exc).__name__}: {exc}"
    got = encoder_shape(shapes)
    want = ARCHS.get(arch)
    if got is None or want is None:
        return None if want is not None else (f"segmentation model {model_id!r}: unknown arch {arch!r}; "
                                              f"valid: {', '.join(sorted(ARCHS))}")
    if got == (want.encoder_embed_dim, want.encoder_depth):
        return None
    match = [n for n, a in ARCHS.items() if (a.encoder_embed_dim, a.encoder_depth) == got]
    return (f"segmentation model {model_id!r}: arch {arch!r} has a {want.encoder_embed_dim}-wide, "
            f"{want.encoder_depth}-block image encoder, but {f} holds a {got[0]}-wide, {got[1]}-block one"
            + (f": set arch: {match[0]}" if match else ""))


def _arch_errors(suite: Suite, root: Path) -> list[str]:
    errors = []
    for m in suite.segmentation.models:
        if m.checkpoint in (None, DEMO_TRAINED, PACKAGE_CHECKPOINT) or m.checkpoint.startswith("models:/"):
            continue
        p = in_project(m.checkpoint, root)
        if p.exists() and not (p.is_file() or p.is_dir()):  # a FIFO or a device: reading it would block
            errors.append(f"segmentation model {m.id!r}: checkpoint {p} is not a regular file")
        elif p.exists():
            err = checkpoint_arch_error(m.id, m.arch, p)
            if err is not None:
                errors.append(err)
    return errors


OVERLAY_BASE = "demo_full.yaml"
"""The suite an overlay file (no ``name`` and no ``extends``: ``configs/reference_protocol.yaml``)
is validated on: the full demo suite beside it, else the project's ``configs/demo_full.yaml`` (the fast
demo evaluates LiteMedSAM at level 4 only, which the reference's levels 1, 3, 5 leave out)."""


def _overlay_base(path: Path) -> Path | None:
    """The suite to validate the overlay ``path`` on, or None when ``path`` is a suite itself."""
    try:
        data = read_yaml_file(path)  # alias bombs and duplicate keys refused, quickly
    except (OSError, ValueError, yaml.YAMLError):
        return None  # load_suite reports it
    if not isinstance(data, dict) or "name" in data or "extends" in data or "datasets" in data:
        return None
    for base in (path.parent / OVERLAY_BASE, project_root() / "configs" / OVERLAY_BASE):
        if base.is_file() and base.resolve() != path.resolve():
            return base
    return None


def _validate_overlay(path: Path, base: Path, n_load: int, root: Path) -> SuiteCheck:
    """An overlay is no suite: validate the suite ``base`` with ``overlays: [path]``, reported
    under the overlay's name."""
    with tempfile.TemporaryDirectory() as tmp:
        merged = Path(tmp) / "overlay_on_base.yaml"
        merged.write_text(yaml.safe_dump({"extends": str(base.resolve()), "overlays": [str(path.resolve())]}),
                          encoding="utf-8")
        report = validate_suite(merged, n_load, root)
    report.suite = str(path)
    report.notes.insert(0, f"an overlay (no name of its own): validated merged over {base}")
    return report


def validate_suite(path: str | Path, n_load: int = 3, root: Path | None = None) -> SuiteCheck:
    """Check the suite at ``path``, decoding the first ``n_load`` samples of each dataset (sorted by
    id); relative paths inside it are taken from ``root`` (default: the project root). Never raises
    for a problem of the suite or its data (they are listed), only for bugs."""
    root = root or project_root()
    overlay_base = _overlay_base(Path(path))
    if overlay_base is not None:
        return _validate_overlay(Path(path), overlay_base, n_load, root)
    report = SuiteCheck(str(path))
    try:
        suite = load_suite(path)
    except (FileNotFoundError, ValueError) as exc:
        report.errors.append(str(exc))
        return report
    try:
        check_isolation(suite, path, root)
    except ValueError as exc:
        report.errors.append(str(exc))
    demo_root = in_project(suite.demo.root, root)
    demo_pending = suite.demo.enabled and not (demo_root / "demo_manifest.json").is_file()
    if demo_pending:
        report.notes.append(f"demo data not built yet at {demo_root}: the run builds it first (asset demo_data, "
                            "or medrobust demo); its datasets are generated and checked then")
    try:
        configs = resolve_datasets(suite.model_copy(update={"demo": suite.demo.model_copy(
            update={"root": str(demo_root), "enabled": suite.demo.enabled and not demo_pending})}))
    except (FileNotFoundError, ValueError) as exc:
        report.errors.append(str(exc))
        configs = []
    if not configs and not report.errors and not demo_pending:
        report.errors.append("no datasets: list some under 'datasets' (or enable the demo)")
    report.datasets = [_check_dataset(c, n_load, root) for c in configs]
    report.errors.extend(_weights_errors(suite, root))
    report.errors.extend(_arch_errors(suite, root))
    report.errors.extend(_output_errors(suite, root))
    return report


def _output_errors(suite: Suite, root: Path) -> list[str]:
    """Output paths that exist and are not the project's (issue 44, finding 3): the run would refuse
    them, so validate does too (:mod:`medrobust_lib.ownership`). The demo root is checked by the demo
    build itself, first thing (the demo's folder names live in the demo package, which the tracks
    do not import)."""
    errors = []
    checks: list[tuple[Any, Any]] = [(check_mart_target, in_project(suite.mart_path, root))]
    checks += [(check_cache_target, in_project(v.api.cache_path, root)) for v in suite.vlm.models
               if v.api is not None and v.api.cache_path]
    for check, path in checks:
        try:
            check(path)
        except NotOurs as exc:
            errors.append(str(exc))
    return errors
