"""The multiple-choice chance level comes from the data: the mean of 1 / ``n_options`` over the scored
clean items; the floor flag follows it. Known answers on items with 3 and 5 options.

- ``mc3``: 6 items of 3 options, 2 right: accuracy 1/3 = chance 1/3, at the floor (a fixed 0.25
  would have called it informative).
- ``mc5``: 5 items of 5 options, 1 right: accuracy 0.2 = chance 0.2, at the floor; plus an
  excluded 3-option record, outside the chance as it is outside the accuracy.
- ``mix``: 3 items of 3 options and 2 of 5, 2 right: accuracy 0.4 > chance (3/3 + 2/5) / 5 = 0.28.
- ``old``: 4 items written before ``n_options`` existed, 1 right: the fallback chance 0.25, at
  the floor.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import duckdb
import pandas as pd
import pytest

from medrobust_lib.store import results
from medrobust_lib.store.marts import build_mart, connect_readonly
from medrobust_lib.store.schema import VLM_COLUMN_NAMES, VLM_TABLE

# model -> [(n_options, correct)] of its clean items
ITEMS: dict[str, list[tuple[int | None, float]]] = {
    "mc3": [(3, 1.0), (3, 1.0), (3, 0.0), (3, 0.0), (3, 0.0), (3, 0.0)],
    "mc5": [(5, 1.0), (5, 0.0), (5, 0.0), (5, 0.0), (5, 0.0)],
    "mix": [(3, 1.0), (3, 0.0), (3, 0.0), (5, 1.0), (5, 0.0)],
    "old": [(None, 1.0), (None, 0.0), (None, 0.0), (None, 0.0)],
}
CHANCE = {"mc3": 1 / 3, "mc5": 1 / 5, "mix": (3 * (1 / 3) + 2 * (1 / 5)) / 5, "old": 0.25}
ACCURACY = {"mc3": 2 / 6, "mc5": 1 / 5, "mix": 2 / 5, "old": 1 / 4}
FLOOR = {"mc3": True, "mc5": True, "mix": False, "old": True}


def _row(model: str, i: int, level: int, n_options: int | None, correct: float | None,
         outcome: str = "ok") -> dict[str, Any]:
    r: dict[str, Any] = dict.fromkeys(VLM_COLUMN_NAMES)
    r.update(model=model, checkpoint="ck", adapter=None, task="vqa_mc", dataset="ds", modality="ct",
             sample_id=f"s{i}", record_id=f"r{i}", prompt_id=0, image_mode="image",
             perturbation="clean" if level == 0 else "blur", level=level, outcome=outcome, correct=correct,
             n_options=n_options)
    return r


def _rows(model: str) -> pd.DataFrame:
    clean = [_row(model, i, 0, k, c) for i, (k, c) in enumerate(ITEMS[model])]
    blur = [_row(model, i, 1, k, 0.0) for i, (k, _) in enumerate(ITEMS[model])]
    if model == "mc5":
        clean.append(_row(model, 99, 0, 3, None, outcome="excluded:image_not_indexed"))
    return pd.DataFrame(clean + blur, columns=list(VLM_COLUMN_NAMES))


@pytest.fixture(scope="module")
def con(tmp_path_factory: pytest.TempPathFactory) -> Iterator[duckdb.DuckDBPyConnection]:
    root = tmp_path_factory.mktemp("chance")
    res = root / "results"
    for model in ITEMS:
        df = _rows(model)
        if model == "old":  # a chunk written before the column existed
            df = df.drop(columns=["n_options"])
        for level in (0, 1):
            part = {"model": model, "run": "clean" if level == 0 else "perturbation", "modality": "ct",
                    "level": level}
            results.write_chunk(results.chunk_path(res, VLM_TABLE, part, "ds"), df[df["level"] == level], "fp")
    build_mart(res, root / "m.duckdb")
    c = connect_readonly(root / "m.duckdb")
    try:
        yield c
    finally:
        c.close()


def test_n_options_reaches_the_mart(con: duckdb.DuckDBPyConnection) -> None:
    got = con.execute("select model, list(distinct n_options order by n_options) from vlm_results "
                      "group by model order by model").fetchall()
    assert got == [("mc3", [3]), ("mc5", [3, 5]), ("mix", [3, 5]), ("old", [None])]


@pytest.mark.parametrize("model", sorted(ITEMS))
def test_chance_is_the_mean_of_one_over_the_options(con: duckdb.DuckDBPyConnection, model: str) -> None:
    lv = con.execute("select accuracy, chance from vlm_by_level where model = ? and level = 0", [model]).fetchall()
    assert lv == [(pytest.approx(ACCURACY[model]), pytest.approx(CHANCE[model]))]
    fl = con.execute("select clean_value, chance, floor_effect from vlm_floor where model = ?", [model]).fetchall()
    assert fl == [(pytest.approx(ACCURACY[model]), pytest.approx(CHANCE[model]), FLOOR[model])]


def test_every_drop_row_of_a_task_carries_its_chance_and_flag(con: duckdb.DuckDBPyConnection) -> None:
    d = con.execute("select model, column_name, chance, floor_effect from vlm_task_drops").df()
    assert set(d["column_name"]) == {"Clean", "blur", "Avg", "ΔTP"}
    for model, g in d.groupby("model"):
        assert g["chance"].to_numpy() == pytest.approx([CHANCE[str(model)]] * len(g))
        assert set(g["floor_effect"]) == {FLOOR[str(model)]}
