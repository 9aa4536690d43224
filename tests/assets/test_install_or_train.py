"""install_or_train: the one body of the demo model assets (committed weights, or training)."""

from __future__ import annotations

from typing import Any

import dagster as dg

from medrobust_assets.metadata import COMMITTED_WEIGHTS, install_or_train
from medrobust_lib.demo.committed import Installed


def _never() -> dict[str, Any]:
    raise AssertionError("not called")


def test_committed_weights_give_their_metadata_and_train_nothing() -> None:
    inst = Installed(True, "", "/w/tiny-sam", {"best_step": 7})
    with dg.build_asset_context() as ctx:
        res = install_or_train(ctx, inst, what="training tiny-sam", train=_never,
                               committed=lambda: {"steps": inst.meta["best_step"], "val_dice": None})
    assert res.metadata == {"weights": COMMITTED_WEIGHTS, "steps": 7, "val_dice": None}


def test_without_committed_weights_it_trains_and_drops_missing_values() -> None:
    inst = Installed(False, "retraining was asked for", "/w/tiny-sam", {})
    with dg.build_asset_context() as ctx:
        res = install_or_train(ctx, inst, what="training tiny-sam", committed=_never,
                               train=lambda: {"steps": 3, "registered_version": None})
    assert res.metadata == {"steps": 3}
