"""Every PartitionsDefinition, defined once."""

from __future__ import annotations

import warnings

import dagster as dg

from medrobust_lib.types import ALL_MODALITIES, SEVERITY_LEVELS

modality_partitions = dg.StaticPartitionsDefinition(list(ALL_MODALITIES))
severity_partitions = dg.StaticPartitionsDefinition([str(lv) for lv in SEVERITY_LEVELS])
modality_severity_partitions = dg.MultiPartitionsDefinition(
    {"modality": modality_partitions, "severity": severity_partitions}
)

LEVELS_TAG = "medrobust/levels"
"""Asset tag naming whose levels a modality x severity asset covers: ``taxonomy`` (the suite's
``taxonomy_levels()``), ``segmentation.<model id>`` or ``vlm.<model id>`` (that model's ``levels``); untagged assets
cover ``perturbations.levels`` (``Suite.levels_for``). The runner plans only those partitions."""

# A modality-partitioned asset feeding a modality x severity one, and back.
with warnings.catch_warnings():
    warnings.simplefilter("ignore", dg.BetaWarning)  # stable in practice since 1.5; keep logs clean
    by_modality = dg.MultiToSingleDimensionPartitionMapping(partition_dimension_name="modality")


def modality_and_level(context: dg.AssetExecutionContext) -> tuple[str, int]:
    keys = context.partition_key.keys_by_dimension  # type: ignore[attr-defined]
    return keys["modality"], int(keys["severity"])
