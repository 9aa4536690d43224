"""VLM result rows say how many options a multiple-choice item offered (its chance level is 1 / that)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from medrobust_lib.store.schema import VLM_COLUMN_NAMES
from medrobust_lib.tracks.vlm.evaluate import _row, n_options
from medrobust_lib.tracks.vlm.items import VLMItem

RUNNER: Any = SimpleNamespace(m=SimpleNamespace(id="vlm"), checkpoint="ck", adapter=None)
COND: Any = SimpleNamespace(sample=SimpleNamespace(modality="ct"), perturbation="clean", level=0, strength=None,
                            ssim=None)


@pytest.mark.parametrize(("item", "expected"), [
    (VLMItem("vqa_mc", "r3", "ds", "s", "ct", "q?", "A", options=("a", "b", "c")), 3),
    (VLMItem("vqa_mc", "r5", "ds", "s", "ct", "q?", "B", options=("a", "b", "c", "d", "e")), 5),
    (VLMItem("vqa_yesno", "y", "ds", "s", "ct", "q?", "yes"), None),
    (VLMItem("grounding", "g", "ds", "s", "ct", "where?", box=(0.0, 0.0, 1.0, 1.0)), None),
])
def test_rows_carry_the_number_of_options(item: VLMItem, expected: int | None) -> None:
    assert n_options(item) == expected
    row = _row(item, COND, RUNNER)
    assert row["n_options"] == expected and list(row) == list(VLM_COLUMN_NAMES)
