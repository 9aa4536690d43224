"""Known-answer checks of the demo's taxonomy configurations (clean images, pooled over datasets).

They replace the blocked issue's "60 % Ideal or Fragile" target, which no honest image-reliant
model can reach on label-balanced questions (there about half of an accurate model's samples are
Dangerous: the oracle Dangerous floor). The checks, per image-removal mode:

* every configuration: text-only accuracy within 0.5 +- 0.1 (the demo's questions are label-balanced
  per wording, so an answer from the wording alone is right on about half of them);
* ``demo-shortcut``: Dangerous share >= 0.8 and image-reliant share (Ideal + Fragile) <= 0.1;
* ``demo-image-reliant``: image-reliant share >= 0.9 x (1 - its text-only accuracy), i.e. at least
  90 % of the samples an accurate, image-reliant model can show as reliant.

Input: ``taxonomy_quadrant_stats`` rows (:func:`medrobust_lib.taxonomy.aggregates.quadrant_stats`).
Error rows are in no denominator (the stats already leave them out).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from medrobust_lib.types import IMAGE_MODES

SHORTCUT = "demo-shortcut"
IMAGE_RELIANT = "demo-image-reliant"
BALANCE_CENTRE = 0.5
BALANCE_TOLERANCE = 0.1
SHORTCUT_MIN_DANGEROUS = 0.8
SHORTCUT_MAX_RELIANT = 0.1
RELIANT_MIN_FRACTION = 0.9
PRIMARY_MODE = "none"
"""The text-only baseline proper (no image token); ``blank`` / ``noise`` stand-ins are reported too."""


@dataclass(frozen=True)
class Check:
    """One known-answer check: ``name``, the configuration and image mode, the measured ``value``,
    the ``bound`` it is compared with (``op``: ``>=``, ``<=`` or ``within`` +-
    :data:`BALANCE_TOLERANCE`), ``passed``, and ``n`` ok samples behind it."""

    name: str
    config: str
    image_mode: str
    value: float
    op: str
    bound: float
    passed: bool
    n: int

    def text(self) -> str:
        rel = f"within {self.bound:.3f} +- {BALANCE_TOLERANCE}" if self.op == "within" else f"{self.op} {self.bound:.3f}"
        return (f"{'PASS' if self.passed else 'FAIL'} {self.config} [{self.image_mode}] {self.name} = "
                f"{self.value:.3f} ({rel}, n = {self.n})")


def clean_summary(stats: pd.DataFrame) -> pd.DataFrame:
    """Per (config, image_mode) on clean images, pooled over datasets: ``n_total``, ``n_error``, the
    four quadrant shares, ``image_reliant`` (Ideal + Fragile), ``text_only_accuracy``,
    ``dangerous_floor`` and ``flip_rate`` (group values weighted by each dataset's ``n_total``)."""
    clean = stats[stats["perturbation"] == "clean"]
    out: list[dict[str, Any]] = []
    for (cfg, mode), g in clean.groupby(["config", "image_mode"], sort=True):
        groups = g.drop_duplicates(["dataset"])
        n_error = int(groups["n_error"].sum())
        groups = groups[groups["n_total"] > 0]  # a dataset with errors only has no shares
        w = groups["n_total"].astype(float)
        total = float(w.sum())
        if total == 0:
            continue
        shares = {str(q): float(qg["n"].sum()) / total for q, qg in g.groupby("quadrant")}
        rates = {c: float((groups[c].astype(float) * w).sum() / total)
                 for c in ("text_only_accuracy", "dangerous_floor", "flip_rate")}
        out.append({"config": str(cfg), "image_mode": str(mode), "n_total": int(total), "n_error": n_error,
                    **shares, **rates, "image_reliant": shares.get("Ideal", 0.0) + shares.get("Fragile", 0.0)})
    return pd.DataFrame(out)


def demo_checks(stats: pd.DataFrame, modes: tuple[str, ...] = (PRIMARY_MODE,)) -> list[Check]:
    """The known-answer checks on ``stats`` for the given image modes (a mode or configuration
    without clean rows is skipped: an empty list means nothing was checked)."""
    unknown = set(modes) - set(IMAGE_MODES)
    if unknown:
        raise ValueError(f"unknown image modes {sorted(unknown)}; valid: {', '.join(IMAGE_MODES)}")
    checks: list[Check] = []
    for r in clean_summary(stats).to_dict("records"):
        cfg, mode, n = str(r["config"]), str(r["image_mode"]), int(r["n_total"])
        if mode not in modes:
            continue
        acc = float(r["text_only_accuracy"])
        checks.append(Check("text_only_accuracy", cfg, mode, acc, "within", BALANCE_CENTRE,
                            abs(acc - BALANCE_CENTRE) <= BALANCE_TOLERANCE, n))
        if cfg == SHORTCUT:
            d, rel = float(r.get("Dangerous", 0.0)), float(r["image_reliant"])
            checks.append(Check("dangerous_share", cfg, mode, d, ">=", SHORTCUT_MIN_DANGEROUS,
                                d >= SHORTCUT_MIN_DANGEROUS, n))
            checks.append(Check("image_reliant_share", cfg, mode, rel, "<=", SHORTCUT_MAX_RELIANT,
                                rel <= SHORTCUT_MAX_RELIANT, n))
        if cfg == IMAGE_RELIANT:
            rel = float(r["image_reliant"])
            bound = RELIANT_MIN_FRACTION * (1.0 - acc)
            checks.append(Check("image_reliant_share", cfg, mode, rel, ">=", bound, rel >= bound, n))
    return checks


__all__ = ["Check", "clean_summary", "demo_checks"]
