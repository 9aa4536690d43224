"""Every chunk a table writes carries the table's declared Arrow schema (store.schema)."""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from medrobust_lib.store import results
from medrobust_lib.store.schema import MART_TABLES, conform, table_columns


def _manifest_rows(miss: object) -> pd.DataFrame:
    return pd.DataFrame({"sample_id": ["a", "b"], "dataset": ["d", "d"], "perturbation": ["blur", "blur"],
                         "level": [1, 2], "ssim": [0.95, 0.85], "band_reached": [True, False],
                         "miss_reason": [miss, miss], "n_ssim_evals": [3, np.nan]})


def test_all_null_column_takes_its_declared_type(tmp_path: Path) -> None:
    part = {"modality": "ct", "level": 1}
    a = results.chunk_path(tmp_path, "perturbation_manifest", part, "c0")
    b = results.chunk_path(tmp_path, "perturbation_manifest", part, "c1")
    results.write_chunk(a, _manifest_rows(None), "fp")  # every miss_reason null
    results.write_chunk(b, _manifest_rows("unreachable"), "fp")
    sa, sb = pq.read_schema(a), pq.read_schema(b)
    assert sa.field("miss_reason").type == pa.string() == sb.field("miss_reason").type
    # integers with a missing value stay integers (nullable), not float
    assert sa.field("n_ssim_evals").type == pa.int32() and sa.field("band_reached").type == pa.bool_()
    # any reader reads the folder as one table without unifying schemas
    table = ds.dataset(str(tmp_path / "perturbation_manifest"), format="parquet").to_table()
    assert table.num_rows == 4 and pa.types.is_string(table.schema.field("miss_reason").type)
    got = duckdb.sql(f"select count(*) from read_parquet('{tmp_path}/perturbation_manifest/**/*.parquet')").fetchall()[0]
    assert got == (4,)


def test_every_declared_type_maps_to_arrow() -> None:
    from medrobust_lib.store.schema import _ARROW_TYPES

    for t in MART_TABLES:
        for col, typ in t.columns:
            assert typ.split("(")[0] in _ARROW_TYPES, (t.name, col, typ)


def test_conform_keeps_undeclared_columns_and_unknown_tables() -> None:
    df = pd.DataFrame({"sample_id": ["x"], "extra": [None]})
    out, schema = conform(df, "perturbation_manifest")
    assert schema is not None and schema.field("sample_id").type == pa.string()
    assert schema.field("extra").type == pa.string()  # undeclared: inferred, null promoted to string
    assert conform(df, "no_such_table")[1] is None
    assert table_columns("no_such_table") is None


def test_taxonomy_baselines_is_declared_and_typed_though_not_in_the_mart(tmp_path: Path) -> None:
    """``taxonomy_baselines`` (Parquet only) is declared in store.schema: an all-null column of a chunk
    takes its declared type (it was typed ``null`` before), and the mart does not load it."""
    from medrobust_lib.store.schema import RESULTS_ONLY_TABLES, column_names
    from medrobust_lib.tracks.taxonomy.evaluate import BASELINE_COLUMNS, BASELINE_TABLE

    assert BASELINE_TABLE not in {t.name for t in MART_TABLES}
    assert BASELINE_TABLE in {t.name for t in RESULTS_ONLY_TABLES}
    assert BASELINE_COLUMNS == column_names(BASELINE_TABLE)
    row = {"checkpoint": "ck", "adapter": None, "dataset": "d", "sample_id": "s", "record_id": "r",
           "image_mode": "none", "lp_yes": -0.1, "lp_no": -2.3, "pred": "yes", "source": "logprobs",
           "outcome": "ok", "error": None}
    path = results.chunk_path(tmp_path, BASELINE_TABLE, {"config": "c", "modality": "ct"}, "d")
    results.write_chunk(path, pd.DataFrame([row]), "fp")
    schema = pq.read_schema(path)
    assert schema.field("adapter").type == pa.string() and schema.field("error").type == pa.string()
    assert pq.read_table(path).to_pylist()[0]["lp_no"] == -2.3


def test_column_names_of_an_undeclared_table_is_an_error() -> None:
    import pytest

    from medrobust_lib.store.schema import column_names

    assert column_names("taxonomy_paraphrases", without=("modality",))[-1] == "source"
    with pytest.raises(KeyError, match="not declared"):
        column_names("no_such_table")
