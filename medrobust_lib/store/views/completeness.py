"""Mart view of the infrastructure failures: the partitions left out until re-run
(:mod:`medrobust_lib.store.completeness`)."""

from __future__ import annotations

from medrobust_lib.store.schema import COMPLETENESS_TABLE
from medrobust_lib.store.views.common import View, static

INCOMPLETE_PARTITIONS_SQL = f"""
        select * from {COMPLETENESS_TABLE} where not complete
        order by source_table, model, modality, level"""

VIEWS: list[View] = [
    View("incomplete_partitions", static(INCOMPLETE_PARTITIONS_SQL),
         doc=""": the rows of `partition_completeness` with `complete = false`."""),
]
