"""Refuse model folders that ask to run their own code.

A transformers folder may name Python classes of its own in ``auto_map`` (``config.json``,
``tokenizer_config.json``, the processor configs); with ``trust_remote_code`` unset transformers
asks on stdin whether to import them, so ``yes | medrobust run`` ran whatever the folder held.
medrobust never runs a model folder's code: every loader passes ``trust_remote_code=False``, and
:func:`refuse_remote_code` refuses such a folder in one line before any loader runs (a clearer
message than transformers' own, and a guard should a loader ignore the flag).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

CONFIG_FILES: tuple[str, ...] = (
    "config.json", "tokenizer_config.json", "processor_config.json", "preprocessor_config.json",
    "image_processor_config.json", "video_preprocessor_config.json", "feature_extractor_config.json",
    "generation_config.json",
)
"""Files of a model folder that transformers reads ``auto_map`` (custom code) from."""

_MAX_CONFIG_BYTES = 64 * 1024 * 1024


class RemoteCodeRefused(ValueError):
    """A model folder names code of its own (``auto_map``); nothing was loaded."""


def _hub_cache() -> Path:
    """The Hugging Face hub cache folder (``HF_HUB_CACHE``, else ``HF_HOME/hub``, else the default)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(home).expanduser() / "hub"


def _config_paths(source: str | Path, revision: str | None) -> list[Path]:
    folder = Path(source)
    if folder.is_dir():
        return [folder / f for f in CONFIG_FILES if (folder / f).is_file()]
    # a hub id: the files of every snapshot already in the local cache (nothing is downloaded);
    # every revision is checked, the one asked for among them
    name = str(source)
    if name.count("/") != 1 or ".." in name:
        return []
    snapshots = _hub_cache() / ("models--" + name.replace("/", "--")) / "snapshots"
    try:
        revs = [d for d in snapshots.iterdir() if d.is_dir()]
    except OSError:
        return []
    return [d / f for d in revs for f in CONFIG_FILES if (d / f).is_file()]


def refuse_remote_code(source: str | Path, revision: str | None = None) -> None:
    """Raise :class:`RemoteCodeRefused` (one line naming the file) when a config file of the model
    folder (or the locally cached hub id) ``source`` has an ``auto_map``: the model would need its
    own code. Unreadable or non-JSON files are left to the loader to report."""
    for path in _config_paths(source, revision):
        try:
            if path.stat().st_size > _MAX_CONFIG_BYTES:
                continue
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and data.get("auto_map"):
            names = data["auto_map"]
            shown = ", ".join(sorted(str(k) for k in names)) if isinstance(names, dict) else type(names).__name__
            shown = shown.replace("\n", " ")[:200]
            raise RemoteCodeRefused(
                f"{path}: auto_map ({shown}) asks to run the model folder's own code; medrobust never runs "
                "it (trust_remote_code=False): use a folder whose config names a class transformers ships")
