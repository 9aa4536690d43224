"""Mart views of the fine-tuning strategies: the ranking, without and with the floor datasets."""

from __future__ import annotations

from medrobust_lib.store.schema import RANKING_TABLE, RANKING_VIEW
from medrobust_lib.store.views.common import ALL_SUFFIX, View, static


def strategy_ranking(include_floor: bool) -> str:
    """``strategy_ranking_stats`` rows of one variant (``with_floor``; rows that do not say, written
    before the column existed, are in both) plus the relative drops."""
    keep = "with_floor is not false" if include_floor else "with_floor is not true"
    return f"""
        select *, mean_iou_drop / nullif(clean_iou, 0) as iou_rel_drop,
               mean_dice_drop / nullif(clean_dice, 0) as dice_rel_drop
        from {RANKING_TABLE}
        where {keep}
        order by model, kind, rank, strategy"""


VIEWS: list[View] = [
    View(RANKING_VIEW, static(strategy_ranking(False)),
         doc=""": the `strategy_ranking_stats` rows without floor datasets (`with_floor` not
true) plus the relative drops `iou_rel_drop` (`mean_iou_drop / clean_iou`) and `dice_rel_drop`
(NULL when the clean score is 0), ordered by model, kind, rank, strategy."""),
    View(RANKING_VIEW + ALL_SUFFIX, static(strategy_ranking(True)),
         doc=""": the same for the rows with the floor datasets kept (`with_floor` not
false)."""),
]
