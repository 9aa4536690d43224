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
