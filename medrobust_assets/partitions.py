"""The PartitionsDefinitions of one suite: its modalities, and its modalities x levels.

Built from the suite object (:func:`partitions_for`), never from fixed lists: an asset is
partitioned over exactly the modalities and severity levels the suite evaluates it at (the
perturbed data and the VLMs over ``perturbations.levels``, the taxonomy over
``taxonomy.levels``, a segmentation model over its own ``levels``, its attacks over the suite's
attack levels, :meth:`~medrobust_lib.config.suite.Suite.attack_levels_for`), so Dagster itself
refuses a partition outside them (the UI does not offer it; the runner refuses it in one line)."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import dagster as dg

from medrobust_lib.config import Suite
from medrobust_lib.types import ATTACK_EPSILONS

MODALITY = "modality"
SEVERITY = "severity"


@dataclass
class SuitePartitions:
    """The partitions definitions of one suite. ``modality``: its modalities; :meth:`grid`: its
    modalities x some of its levels, one object per set of levels (assets over the same levels
    share it, so the runner can run them together)."""

    modalities: tuple[str, ...]
    levels: tuple[int, ...]
    """The suite's perturbed levels (``perturbations.levels``)."""
    modality: dg.StaticPartitionsDefinition = field(init=False)
    _grids: dict[tuple[int, ...], dg.MultiPartitionsDefinition] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        if not self.modalities or not self.levels:
            raise ValueError("a suite needs at least one modality and one perturbed level to partition its assets")
        self.modality = dg.StaticPartitionsDefinition(list(self.modalities))

    def grid(self, levels: Sequence[int] | None = None) -> dg.MultiPartitionsDefinition:
        """Modality x severity over ``levels`` (None: every perturbed level of the suite), in the
        suite's level order. A level the suite does not perturb is a ValueError."""
        want = self.levels if levels is None else tuple(lv for lv in self.levels if lv in set(levels))
        unknown = sorted(set(levels or ()) - set(self.levels))
        if unknown or not want:
            raise ValueError(f"levels {list(levels or ())} are not among the suite's perturbed levels "
                             f"{list(self.levels)}")
        return self._grid(want)

    def attack_grid(self, levels: Sequence[int]) -> dg.MultiPartitionsDefinition:
        """Modality x severity over attack ``levels`` (1-5, ascending): perturbed by the suite or
        not, since an attack reads only the clean images. The same object as :meth:`grid` where the
        levels are the same, so an attack partition runs with the perturbed ones of its level."""
        want = tuple(sorted(set(int(lv) for lv in levels)))
        bad = [lv for lv in want if lv not in ATTACK_EPSILONS]
        if bad or not want:
            raise ValueError(f"attack levels {list(levels)} are not among {list(ATTACK_EPSILONS)}")
        return self.grid(want) if set(want) <= set(self.levels) else self._grid(want)

    def _grid(self, want: tuple[int, ...]) -> dg.MultiPartitionsDefinition:
        held = self._grids.get(want)
        if held is None:
            held = self._grids[want] = dg.MultiPartitionsDefinition({
                MODALITY: self.modality,
                SEVERITY: dg.StaticPartitionsDefinition([str(lv) for lv in want])})
        return held


def partitions_for(suite: Suite) -> SuitePartitions:
    """The partitions definitions of ``suite``: ``suite.modalities`` x ``perturbations.levels``."""
    return SuitePartitions(tuple(str(m) for m in suite.modalities), tuple(int(lv) for lv in suite.perturbations.levels))


def describe(pdef: dg.PartitionsDefinition) -> str:
    """The keys of a static or multi partitions definition, in one line:
    ``modality (ct, mri) x severity (2, 4)``."""
    if isinstance(pdef, dg.MultiPartitionsDefinition):
        return " x ".join(f"{d.name} ({', '.join(d.partitions_def.get_partition_keys())})"
                          for d in pdef.partitions_defs)
    if isinstance(pdef, dg.StaticPartitionsDefinition):
        return ", ".join(pdef.get_partition_keys())
    return type(pdef).__name__


# A modality-partitioned asset feeding a modality x severity one, and back.
with warnings.catch_warnings():
    warnings.simplefilter("ignore", dg.BetaWarning)  # stable in practice since 1.5; keep logs clean
    by_modality = dg.MultiToSingleDimensionPartitionMapping(partition_dimension_name=MODALITY)


def modality_and_level(context: dg.AssetExecutionContext) -> tuple[str, int]:
    keys = context.partition_key.keys_by_dimension  # type: ignore[attr-defined]
    return keys[MODALITY], int(keys[SEVERITY])
