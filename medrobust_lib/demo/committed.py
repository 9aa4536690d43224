"""Committed demo weights: the tiny models trained once by the demo's own training code and shipped
as package data (``medrobust_lib/demo/weights/<model id>/``), so a first demo run copies them
instead of training.

Each folder holds the model files (safetensors, config, tokenizer/processor files, ``training.json``)
and ``SHA256SUMS``: a JSON object ``{"files": {relative path: sha256 hex}, "fingerprint": {...}}``.
The fingerprint records what the weights were trained from (the suite's training settings, seeds,
demo size and, for the VLMs, the digest of the record files). The demo assets use the committed
folder only when the suite's fingerprint equals the recorded one and every file's sha256 matches;
otherwise (or with ``demo.retrain``) they train, exactly as before. ``tools/train_demo_weights.py``
(``medrobust demo --retrain`` then copy) refreshes them.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from medrobust_lib.config.common import by_id
from medrobust_lib.hashing import digest, files_digest, tree_sha256
from medrobust_lib.paths import RECORD_FILES, checkpoint_dir

if TYPE_CHECKING:
    from medrobust_lib.config import Suite

WEIGHTS_ROOT = Path(__file__).resolve().parent / "weights"
MANIFEST = "SHA256SUMS"
"""Name of the manifest (no ``.json`` suffix, so model-folder hashes that read ``*.json`` ignore it)."""


def folder_hashes(folder: Path) -> dict[str, str]:
    """sha256 of every file under ``folder`` (relative POSIX paths, sorted), the manifest excluded."""
    return tree_sha256(folder, exclude=(MANIFEST,))


def fingerprint_digest(fingerprint: dict[str, Any]) -> str:
    """The recorded ``fingerprint_sha256`` of a fingerprint: :func:`medrobust_lib.hashing.digest`, the
    one canonical form of every fingerprint. (Until issue 45 the manifests hashed JSON with its default
    separators; the committed ones were rewritten then, their files and fingerprints unchanged.)"""
    return digest(fingerprint)


def write_manifest(folder: Path, fingerprint: dict[str, Any]) -> Path:
    """Write ``SHA256SUMS`` for ``folder`` (its files and the fingerprint they were trained from)."""
    out = folder / MANIFEST
    out.write_text(json.dumps({"files": folder_hashes(folder), "fingerprint": fingerprint,
                               "fingerprint_sha256": fingerprint_digest(fingerprint)}, indent=1, sort_keys=True))
    return out


def read_manifest(folder: Path) -> dict[str, Any]:
    p = folder / MANIFEST
    if not p.is_file():
        raise FileNotFoundError(f"no {MANIFEST} in {folder}")
    data = json.loads(p.read_text())
    if not isinstance(data, dict) or not isinstance(data.get("files"), dict):
        raise ValueError(f"{p}: not a weights manifest (needs a 'files' mapping)")
    return data


def verify(folder: Path) -> dict[str, str]:
    """Check every file of the manifest against its sha256 (and that no file is missing or extra).
    Returns the file hashes; raises ValueError naming each mismatching file."""
    want = read_manifest(folder)["files"]
    have = folder_hashes(folder)
    bad = sorted(k for k in set(want) | set(have) if want.get(k) != have.get(k))
    if bad:
        raise ValueError(f"{folder}: sha256 mismatch for {', '.join(bad)} (recorded in {MANIFEST})")
    return have


def committed_dir(model_id: str, root: Path | None = None) -> Path:
    return (root or WEIGHTS_ROOT) / model_id


@dataclass(frozen=True)
class Installed:
    """Outcome of :func:`install`: ``used`` (the committed weights were copied and verified) and
    ``reason`` (why not, when not); ``meta`` is the committed ``training.json`` (else ``config.json``; empty if neither)."""

    used: bool
    reason: str
    folder: str
    meta: dict[str, Any]


def install(model_id: str, dest: Path, fingerprint: dict[str, Any], *, retrain: bool = False,
            root: Path | None = None) -> Installed:
    """Copy the committed weights of ``model_id`` into ``dest`` (replacing it) when there are any,
    ``retrain`` is false and their fingerprint equals ``fingerprint``; the source is verified
    before and the copy after. Returns what was done; a sha256 mismatch raises ValueError."""
    src = committed_dir(model_id, root)
    if retrain:
        return Installed(False, "retraining was asked for", str(dest), {})
    if not (src / MANIFEST).is_file():
        return Installed(False, f"no committed weights for {model_id}", str(dest), {})
    man = read_manifest(src)
    if man.get("fingerprint_sha256") != fingerprint_digest(fingerprint):
        diff = sorted(k for k in set(fingerprint) | set(man.get("fingerprint", {}))
                      if fingerprint.get(k) != man.get("fingerprint", {}).get(k))
        return Installed(False, f"committed weights of {model_id} were trained from other inputs "
                                f"(differs: {', '.join(diff) or 'fingerprint'})", str(dest), {})
    verify(src)
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(src, dest)
    verify(dest)
    meta_file = next((dest / n for n in ("training.json", "config.json") if (dest / n).is_file()), None)
    meta = json.loads(meta_file.read_text()) if meta_file is not None else {}
    return Installed(True, "", str(dest), meta)


def publish(folder: Path, model_id: str, fingerprint: dict[str, Any], root: Path | None = None) -> Path:
    """Copy a freshly trained model folder into the committed weights (replacing them) and write its
    manifest. Used by ``tools/train_demo_weights.py``."""
    dst = committed_dir(model_id, root)
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(folder, dst, ignore=shutil.ignore_patterns(MANIFEST))
    write_manifest(dst, fingerprint)
    return dst


# ---- what the demo models are trained from -------------------------------------------------------

_NOT_IN_FINGERPRINT = {"time_budget_s"}
"""A safety net, not an input: the committed weights were trained step-bound (``training.json``)."""


def _settings(model: Any) -> dict[str, Any]:
    return {k: v for k, v in model.model_dump().items() if k not in _NOT_IN_FINGERPRINT}


def _demo_inputs(suite: Suite, *record_keys: str) -> dict[str, Any]:

    root = Path(suite.demo.root)
    return {"suite_seed": suite.seed, "demo_seed": suite.demo.seed, "n_per_modality": suite.demo.n_per_modality,
            "modalities": sorted(suite.modalities),
            "records_sha256": files_digest([root / RECORD_FILES[k] for k in record_keys])}


def sam_fingerprint(suite: Suite, model_id: str) -> dict[str, Any]:
    """Inputs of the tiny SAM's training: architecture, training settings, seeds, demo size, splits."""
    m = by_id(suite.segmentation.models, model_id, "segmentation model")
    return {"kind": "segmentation", "family": m.family, "arch": m.arch,
            "train": _settings(suite.segmentation.train), **_demo_inputs(suite, "splits")}


_VLM_RECORDS = ("omnimedvqa", "yesno_paraphrases", "roco_captions", "mecovqa_grounding", "splits")


def vlm_fingerprint(suite: Suite) -> dict[str, Any]:
    """Inputs of the tiny LLaVA's training: training settings, seeds, demo size, record files."""
    return {"kind": "vlm", "train": _settings(suite.vlm.train), **_demo_inputs(suite, *_VLM_RECORDS)}


def adapter_fingerprint(suite: Suite) -> dict[str, Any]:
    """Inputs of the demo LoRA adapter: fine-tuning settings and everything the base was trained from."""
    return {"kind": "vlm_adapter", "finetune": _settings(suite.vlm.finetune), "base": vlm_fingerprint(suite)}


def install_sam(suite: Suite, model_id: str) -> Installed:
    """The committed tiny SAM into ``var/checkpoints/<id>/`` (see :func:`install`)."""
    return install(model_id, checkpoint_dir(suite, model_id), sam_fingerprint(suite, model_id),
                   retrain=suite.demo.retrain)


def install_vlm(suite: Suite, model_id: str) -> Installed:
    """The committed tiny LLaVA into ``var/checkpoints/<id>/`` (see :func:`install`)."""
    return install(model_id, checkpoint_dir(suite, model_id), vlm_fingerprint(suite), retrain=suite.demo.retrain)


def install_adapter(suite: Suite, model_id: str) -> Installed:
    """The committed LoRA adapter into ``var/checkpoints/<id>/adapter`` (see :func:`install`)."""
    return install(model_id, checkpoint_dir(suite, model_id) / "adapter", adapter_fingerprint(suite),
                   retrain=suite.demo.retrain)


def taxonomy_fingerprint(suite: Suite, config_id: str) -> dict[str, Any]:
    """Inputs of a taxonomy known-answer model: its kind, the taxonomy training settings, the
    paraphrase minimum, seeds, demo size and record files (a LoRA config: also its base's)."""
    entry = by_id(suite.taxonomy.configs, config_id, "taxonomy configuration")
    if entry.demo_training is None:
        raise KeyError(f"no demo-trained taxonomy config {config_id!r} in suite {suite.name!r}")
    fp: dict[str, Any] = {"kind": f"taxonomy:{entry.demo_training}", "train": _settings(suite.taxonomy.train),
                          "min_paraphrases": suite.taxonomy.min_paraphrases, **_demo_inputs(suite, *_VLM_RECORDS)}
    if entry.base is not None:
        fp["base"] = taxonomy_fingerprint(suite, entry.base)
    return fp


def install_taxonomy(suite: Suite, config_id: str) -> Installed:
    """The committed known-answer model of a taxonomy configuration (a LoRA one: its adapter)."""
    entry = by_id(suite.taxonomy.configs, config_id, "taxonomy configuration")
    dest = checkpoint_dir(suite, config_id) / ("adapter" if entry.demo_training == "consistency_lora" else "")
    return install(config_id, dest, taxonomy_fingerprint(suite, config_id), retrain=suite.demo.retrain)
