"""The official LiteMedSAM inference's clean Dice on the demo's real-label datasets.

``official_real.json`` (package data beside this module) holds, per real demo dataset, the mean
union Dice of the official LiteMedSAM inference script on the dataset's samples, as
``tools/litemedsam_official_real.py`` measured it::

    {"source": "tools/litemedsam_official_real.py",
     "datasets": {"lits117_liver": {"mean_dice": 0.91, "n": 16}, ...}}

The demo puts it into each real dataset's config as its ``reference_dice``
(:func:`medrobust_lib.demo.real.describe` and ``_report_fields``); the clean index carries it into
the mart's ``dataset_info``, and the report shows it beside the project's own clean Dice of a
``litemedsam`` model on the same dataset, so a reader sees that the adapter reproduces the official
pipeline before reading its robustness numbers. A dataset the file does not list has none.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

OFFICIAL_REAL_PATH = Path(__file__).with_name("official_real.json")
OFFICIAL_FAMILY = "litemedsam"
"""The adapter family whose rows the official numbers describe."""


@dataclass(frozen=True)
class OfficialDice:
    """The official inference's ``mean_dice`` (in [0, 1]) over ``n`` samples of one dataset."""

    mean_dice: float
    n: int


@dataclass(frozen=True)
class OfficialReal:
    """What produced the numbers (``source``) and dataset -> :class:`OfficialDice`."""

    source: str
    datasets: dict[str, OfficialDice] = field(default_factory=dict)


@functools.cache
def shipped_official_real() -> OfficialReal:
    """:func:`load_official_real` of the shipped :data:`OFFICIAL_REAL_PATH`, read once per process
    (every real dataset's config asks for it)."""
    return load_official_real(OFFICIAL_REAL_PATH)


def load_official_real(path: str | Path | None = None) -> OfficialReal:
    """Read ``path`` (default :data:`OFFICIAL_REAL_PATH`).

    Raises:
        ValueError: the file is not of the schema above (names the entry and what is wrong):
            ``source`` a string, ``datasets`` an object of ``{"mean_dice": float in [0, 1],
            "n": int >= 1}`` (other keys of an entry are ignored).
    """
    p = Path(path) if path is not None else OFFICIAL_REAL_PATH
    data = json.loads(p.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or not isinstance(data.get("source"), str) or not isinstance(
            data.get("datasets"), dict):
        raise ValueError(f"{p}: expected {{'source': str, 'datasets': {{name: {{'mean_dice', 'n'}}}}}}")
    out: dict[str, OfficialDice] = {}
    for name, entry in data["datasets"].items():
        if not isinstance(entry, dict) or not {"mean_dice", "n"} <= set(entry):
            raise ValueError(f"{p}: dataset {name!r} must have the keys 'mean_dice' and 'n', got {entry!r}")
        dice, n = entry["mean_dice"], entry["n"]
        if isinstance(dice, bool) or not isinstance(dice, int | float) or not math.isfinite(dice) \
                or not 0.0 <= dice <= 1.0:
            raise ValueError(f"{p}: dataset {name!r}: mean_dice must be a number in [0, 1], got {dice!r}")
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"{p}: dataset {name!r}: n must be an integer >= 1, got {n!r}")
        out[str(name)] = OfficialDice(float(dice), n)
    return OfficialReal(data["source"], out)
