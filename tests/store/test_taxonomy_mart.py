"""The taxonomy mart (taxonomy_results, taxonomy_quadrant_stats, taxonomy_correlation_stats and the
taxonomy_quadrants / taxonomy_transitions / taxonomy_correlation views), the stats writer and the
figures, on synthetic rows written through the results store with known quadrants."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pandas as pd
import pytest

from medrobust_lib.report.figures.taxonomy import (
    flip_vs_dangerous_scatter,
    quadrant_bars,
    transition_heatmaps,
    transition_matrix,
)
from medrobust_lib.store import results
from medrobust_lib.store.marts import build_mart, connect_readonly
from medrobust_lib.store.schema import QUADRANTS, TAXONOMY_TABLE
from medrobust_lib.store.schema import TAXONOMY_COLUMN_NAMES as COLUMN_NAMES
from medrobust_lib.taxonomy.aggregates import correlation_points
from medrobust_lib.tracks.taxonomy.stats import (
    CORRELATION_STATS_COLUMNS,
    QUADRANT_STATS_COLUMNS,
    read_taxonomy_results,
    write_taxonomy_stats,
)

FLAGS: dict[str, tuple[bool, bool]] = {  # quadrant -> (consistent, image_reliant)
    "Ideal": (True, True), "Fragile": (False, True), "Dangerous": (True, False), "Worst": (False, False),
}
Q = str | None
# (config, dataset, image_mode) -> per record: (clean quadrant, blur level-1 quadrant); None = outcome error
CASES: dict[tuple[str, str, str], list[tuple[Q, Q]]] = {
    ("cfg-a", "ds", "none"): [("Ideal", "Ideal"), ("Ideal", "Dangerous"), ("Ideal", "Dangerous"),
                              ("Fragile", "Fragile"), ("Dangerous", "Dangerous"), ("Worst", "Worst"),
                              (None, "Dangerous"), ("Ideal", None)],
    ("cfg-a", "ds", "blank"): [("Dangerous", "Worst")],
    ("cfg-b", "ds", "none"): [("Worst", "Ideal"), ("Worst", "Worst")],
    ("cfg-b", "ds2", "none"): [("Ideal", "Fragile")],
}


def _row(config: str, dataset: str, mode: str, i: int, perturbation: str, level: int, quadrant: Q) -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(COLUMN_NAMES)
    row.update(config=config, checkpoint="base", dataset=dataset, modality="ct", sample_id=f"s{i}",
               record_id=f"r{i}", perturbation=perturbation, level=level, image_mode=mode, n_variants=3,
               answer="yes", source="logprobs", ssim=1.0 if level == 0 else 0.9)
    if quadrant is None:
        row.update(outcome="error", error="prediction failed")
    else:
        consistent, reliant = FLAGS[quadrant]
        row.update(outcome="ok", quadrant=quadrant, consistent=consistent, image_reliant=reliant,
                   pairwise_disagreement=0.0 if consistent else 2 / 3, entropy_original=0.5, correct_original=1.0,
                   pred_original="yes", pred_removed="no" if reliant else "yes", margin_removed=-2.0 if reliant else 2.0,
                   n_negations=0)
    return row


def all_rows() -> list[dict[str, Any]]:
    rows = []
    for (cfg, ds, mode), recs in CASES.items():
        for i, (clean, blur) in enumerate(recs):
            rows.append(_row(cfg, ds, mode, i, "clean", 0, clean))
            rows.append(_row(cfg, ds, mode, i, "blur", 1, blur))
    return rows


def write_results(res: Path, rows: list[dict[str, Any]]) -> None:
    df = pd.DataFrame(rows, columns=list(COLUMN_NAMES))
    for (cfg, level, ds), g in df.groupby(["config", "level", "dataset"]):
        part = {"config": cfg, "run": "clean" if level == 0 else "perturbation", "modality": "ct", "level": level}
        results.write_chunk(results.chunk_path(res, TAXONOMY_TABLE, part, str(ds)), g, "fp")


def fake_quadrant_stats(df: pd.DataFrame, seed: int = 0, abstention_tau: float = 0.7, min_n: int = 5) -> pd.DataFrame:
    """A stand-in with the real output's columns: plain shares, CIs = share +- 0.1."""
    keys = ["config", "dataset", "perturbation", "level", "image_mode"]
    out = []
    for key, g in df.groupby(keys, sort=True):
        ok = g[g["outcome"] == "ok"]
        for q in QUADRANTS:
            n = int((ok["quadrant"] == q).sum())
            share = n / len(ok) if len(ok) else np.nan
            out.append({**dict(zip(keys, key, strict=True)), "quadrant": q, "n": n, "n_total": len(ok),
                        "share": share, "share_ci_low": share - 0.1, "share_ci_high": share + 0.1,
                        "accuracy": 1.0, "accuracy_ci_low": 1.0, "accuracy_ci_high": 1.0, "mean_entropy": 0.5,
                        "mean_pairwise_disagreement": 0.1, "n_error": int((g["outcome"] == "error").sum()),
                        "flip_rate": 0.2, "text_only_accuracy": 0.5, "dangerous_floor": 0.5,
                        "share_abstention": share, "abstention_tau": 0.7, "negation_consistency": np.nan,
                        "n_negation_samples": 0})
    return pd.DataFrame(out, columns=list(QUADRANT_STATS_COLUMNS))


def fake_correlation(df: pd.DataFrame, seed: int = 0, min_n: int = 5) -> pd.DataFrame:
    return pd.DataFrame([
        {"scope": "condition", "perturbation": "blur", "level": 1, "image_mode": "none", "n_points": 3,
         "n_configs": 2, "n_error": 1, "r": np.nan, "p_value": np.nan, "ci_low": np.nan, "ci_high": np.nan,
         "ci_method": "bootstrap_points", "note": "too few points"},
        {"scope": "headline", "perturbation": "clean", "level": 0, "image_mode": "none", "n_points": 6,
         "n_configs": 2, "n_error": 1, "r": 0.5, "p_value": 0.3, "ci_low": -0.2, "ci_high": 0.9,
         "ci_method": "bootstrap_points", "note": None},
    ], columns=list(CORRELATION_STATS_COLUMNS))


@pytest.fixture()
def fake_stats(monkeypatch: pytest.MonkeyPatch) -> None:
    from medrobust_lib.taxonomy.aggregates import GROUP_COLUMNS, condition_points

    mod = types.ModuleType("medrobust_lib.taxonomy.aggregates")
    mod.condition_points = condition_points  # type: ignore[attr-defined]  # the scatter's points stay real
    mod.GROUP_COLUMNS = GROUP_COLUMNS  # type: ignore[attr-defined]
    mod.quadrant_stats = fake_quadrant_stats  # type: ignore[attr-defined]
    mod.flip_dangerous_correlation = fake_correlation  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "medrobust_lib.taxonomy.aggregates", mod)


@pytest.fixture()
def mart(tmp_path: Path, fake_stats: None) -> Iterator[tuple[Path, duckdb.DuckDBPyConnection]]:
    res = tmp_path / "results"
    write_results(res, all_rows())
    # cfg-a has 1 error row in each 9-row partition: complete only under a limit above 1/9
    write_taxonomy_stats(res, seed=1, max_error_share=0.2)
    counts = build_mart(res, tmp_path / "m.duckdb", max_error_share=0.2)
    assert counts[TAXONOMY_TABLE] == len(all_rows())
    assert counts["taxonomy_quadrant_stats"] == 4 * 8  # 4 (config, dataset, mode) x 2 conditions, 4 quadrants
    assert counts["taxonomy_correlation_stats"] == 2
    con = connect_readonly(tmp_path / "m.duckdb")
    try:
        yield res, con
    finally:
        con.close()


def _transitions(con: duckdb.DuckDBPyConnection) -> dict[tuple[str, str, str, str, str], tuple[int, float]]:
    df = con.execute("select * from taxonomy_transitions").df()
    assert list(df.columns) == ["config", "dataset", "perturbation", "level", "image_mode", "from_quadrant",
                                "to_quadrant", "n", "share_of_from", "n_error"]
    assert set(df["perturbation"]) == {"blur"} and set(df["level"]) == {1}
    # n_error: error rows of the perturbed cell (cfg-a/ds/none has one blur error), outside every pair
    errs = df.groupby(["config", "dataset", "image_mode"])["n_error"].agg(["min", "max"])
    assert (errs["min"] == errs["max"]).all()
    assert errs["max"].to_dict() == {("cfg-a", "ds", "blank"): 0, ("cfg-a", "ds", "none"): 1,
                                     ("cfg-b", "ds", "none"): 0, ("cfg-b", "ds2", "none"): 0}
    return {(r["config"], r["dataset"], r["image_mode"], r["from_quadrant"], r["to_quadrant"]):
            (int(r["n"]), float(r["share_of_from"])) for r in df.to_dict("records")}


def test_transitions_counts_and_shares_by_hand(mart: tuple[Path, duckdb.DuckDBPyConnection]) -> None:
    _, con = mart
    t = _transitions(con)
    # error rows on either side are not paired; image modes and datasets are paired separately
    assert t == {
        ("cfg-a", "ds", "none", "Ideal", "Ideal"): (1, pytest.approx(1 / 3)),
        ("cfg-a", "ds", "none", "Ideal", "Dangerous"): (2, pytest.approx(2 / 3)),
        ("cfg-a", "ds", "none", "Fragile", "Fragile"): (1, 1.0),
        ("cfg-a", "ds", "none", "Dangerous", "Dangerous"): (1, 1.0),
        ("cfg-a", "ds", "none", "Worst", "Worst"): (1, 1.0),
        ("cfg-a", "ds", "blank", "Dangerous", "Worst"): (1, 1.0),
        ("cfg-b", "ds", "none", "Worst", "Ideal"): (1, 0.5),
        ("cfg-b", "ds", "none", "Worst", "Worst"): (1, 0.5),
        ("cfg-b", "ds2", "none", "Ideal", "Fragile"): (1, 1.0),
    }
    order = con.execute("select from_quadrant, to_quadrant from taxonomy_transitions "
                        "where config = 'cfg-a' and image_mode = 'none'").fetchall()
    assert order == [("Ideal", "Ideal"), ("Ideal", "Dangerous"), ("Fragile", "Fragile"),
                     ("Dangerous", "Dangerous"), ("Worst", "Worst")]


def test_quadrant_and_correlation_views(mart: tuple[Path, duckdb.DuckDBPyConnection]) -> None:
    _, con = mart
    q = con.execute("select * from taxonomy_quadrants").df()
    assert list(q.columns) == list(QUADRANT_STATS_COLUMNS) and len(q) == 32
    assert list(q["quadrant"][:4]) == list(QUADRANTS)  # Ideal, Fragile, Dangerous, Worst, not alphabetical
    r = q[(q["config"] == "cfg-a") & (q["image_mode"] == "none") & (q["perturbation"] == "blur")]
    assert dict(zip(r["quadrant"], r["n"], strict=True)) == {"Ideal": 1, "Fragile": 1, "Dangerous": 4, "Worst": 1}
    assert set(r["n_total"]) == {7} and set(r["n_error"]) == {1} and q["level"].dtype.kind == "i"
    c = con.execute("select * from taxonomy_correlation").df()
    assert list(c.columns) == list(CORRELATION_STATS_COLUMNS)
    assert list(c["scope"]) == ["headline", "condition"] and c["r"].iloc[0] == pytest.approx(0.5)  # headline first
    assert c["level"].iloc[0] == 0 and c["level"].iloc[1] == 1


def test_write_stats_chunks_per_config_and_stale_removed(tmp_path: Path, fake_stats: None) -> None:
    res = tmp_path / "results"
    write_results(res, all_rows())
    stale = results.chunk_path(res, "taxonomy_quadrant_stats", {"config": "gone"}, "stats")
    results.write_chunk(stale, [{"quadrant": "Ideal"}], "old")
    stale_corr = results.chunk_path(res, "taxonomy_correlation_stats", {"batch": "old"}, "stats")
    results.write_chunk(stale_corr, [{"scope": "x"}], "old")
    quad, corr = write_taxonomy_stats(res, seed=0, max_error_share=0.2)
    assert not stale.parent.exists() and not stale_corr.parent.exists()
    root = res / "taxonomy_quadrant_stats"
    assert sorted(d.name for d in root.iterdir()) == ["config=cfg-a", "config=cfg-b"]
    assert (res / "taxonomy_correlation_stats" / "batch=all" / "stats.parquet").is_file()
    back = results.read_table(res, "taxonomy_quadrant_stats")
    assert len(back) == len(quad) == 32 and len(corr) == 2
    df = read_taxonomy_results(res)
    assert list(df.columns) == list(COLUMN_NAMES) and df["level"].dtype.kind == "i"
    assert set(df["config"]) == {"cfg-a", "cfg-b"}
    # no results any more: every stats folder goes
    for f in (res / TAXONOMY_TABLE).rglob("*.parquet"):
        f.unlink()
    quad, corr = write_taxonomy_stats(res)
    assert quad.empty and corr.empty
    assert not any(root.iterdir()) and not any((res / "taxonomy_correlation_stats").iterdir())


def test_write_stats_with_real_module(tmp_path: Path) -> None:
    stats = pytest.importorskip("medrobust_lib.taxonomy.aggregates")
    res = tmp_path / "results"
    write_results(res, all_rows())
    quad, corr = write_taxonomy_stats(res, seed=0, max_error_share=0.2)
    assert set(QUADRANT_STATS_COLUMNS) <= set(quad.columns)
    assert set(CORRELATION_STATS_COLUMNS) <= set(corr.columns)
    build_mart(res, tmp_path / "m.duckdb", max_error_share=0.2)
    con = connect_readonly(tmp_path / "m.duckdb")
    try:
        assert con.execute("select count(*) from taxonomy_quadrants").fetchall()[0][0] == len(quad)
        assert con.execute("select count(*) from taxonomy_correlation").fetchall()[0][0] == len(corr)
        # the SQL transitions view agrees with the pandas transitions on every non-empty cell
        view = con.execute("select * from taxonomy_transitions").df()
        py = stats.transitions(read_taxonomy_results(res))
        py = py[py["count"] > 0]
        keys = ["config", "dataset", "perturbation", "level", "image_mode", "from_quadrant", "to_quadrant"]
        merged = view.merge(py, on=keys, how="outer", validate="one_to_one")
        assert len(merged) == len(view) == len(py)
        assert (merged["n"] == merged["count"]).all()
        assert np.allclose(merged["share_of_from"], merged["share"])
    finally:
        con.close()


def test_transitions_count_a_cell_with_errors_only(tmp_path: Path) -> None:
    res = tmp_path / "results"
    rows = all_rows() + [_row("cfg-b", "ds2", "none", 0, "blur", 2, None)]  # blur level 2: one error, no pair
    write_results(res, rows)
    # that partition is all errors: with a limit that accepts it, the cell is shown with n = 0 ...
    build_mart(res, tmp_path / "m.duckdb", max_error_share=1.0)
    con = connect_readonly(tmp_path / "m.duckdb")
    try:
        got = con.execute("select * from taxonomy_transitions where level = 2").df()
    finally:
        con.close()
    assert len(got) == 1 and got.loc[0, "n"] == 0 and got.loc[0, "n_error"] == 1
    assert pd.isna(got.loc[0, "from_quadrant"]) and pd.isna(got.loc[0, "share_of_from"])
    # ... under the default limit the partition is incomplete and left out until it is re-run
    build_mart(res, tmp_path / "d.duckdb")
    con = connect_readonly(tmp_path / "d.duckdb")
    try:
        assert con.execute("select count(*) from taxonomy_transitions where level = 2").fetchall() == [(0,)]
    finally:
        con.close()


def test_empty_mart_has_taxonomy_views(tmp_path: Path) -> None:
    counts = build_mart(tmp_path / "results", tmp_path / "m.duckdb")
    assert counts[TAXONOMY_TABLE] == counts["taxonomy_quadrant_stats"] == counts["taxonomy_correlation_stats"] == 0
    con = connect_readonly(tmp_path / "m.duckdb")
    try:
        for view in ("taxonomy_quadrants", "taxonomy_transitions", "taxonomy_correlation"):
            assert con.execute(f"select count(*) from {view}").fetchall() == [(0,)]
            assert "n_error" in {d[0] for d in con.execute(f"select * from {view}").description}
    finally:
        con.close()


def test_correlation_points() -> None:
    pts = correlation_points(pd.DataFrame(all_rows()))
    r = pts[(pts["config"] == "cfg-a") & (pts["image_mode"] == "none") & (pts["perturbation"] == "blur")].iloc[0]
    # ok blur rows: Ideal, Dangerous x4, Fragile, Worst -> 4/7 Dangerous; Fragile and Worst are flipped
    assert r["n"] == 7 and r["dangerous_share"] == pytest.approx(4 / 7) and r["n_error"] == 1
    assert r["flip_rate"] == pytest.approx(2 / 7)
    assert len(pts) == 8 and correlation_points(pd.DataFrame()).empty
    clean = correlation_points(pd.DataFrame(all_rows()), clean_only=True)
    assert set(clean["perturbation"]) == {"clean"} and len(clean) == 4


def test_transition_matrix_pools_and_normalises_rows() -> None:
    t = pd.DataFrame({"from_quadrant": ["Ideal", "Ideal", "Worst", "Ideal"],
                      "to_quadrant": ["Ideal", "Dangerous", "Worst", "Dangerous"], "n": [1, 2, 3, 1]})
    n, share = transition_matrix(t)
    assert n[0].tolist() == [1, 0, 3, 0] and n[3, 3] == 3
    assert share[0].tolist() == pytest.approx([0.25, 0, 0.75, 0]) and np.isnan(share[1]).all()


def _is_png(p: Path) -> bool:
    return p.is_file() and p.stat().st_size > 1000 and p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_figures_write_png(mart: tuple[Path, duckdb.DuckDBPyConnection], tmp_path: Path) -> None:
    res, con = mart
    out = tmp_path / "fig"
    bars = quadrant_bars(con.execute("select * from taxonomy_quadrants").df(), out)
    assert sorted(p.name for p in bars) == [
        "taxonomy_quadrants_by_level_blank.png", "taxonomy_quadrants_by_level_none.png",
        "taxonomy_quadrants_clean_blank.png", "taxonomy_quadrants_clean_none.png"]
    heat = transition_heatmaps(con.execute("select * from taxonomy_transitions").df(), out)
    assert sorted(p.name for p in heat) == ["cfg-a_taxonomy_transitions.png", "cfg-b_taxonomy_transitions.png"]
    scatter = flip_vs_dangerous_scatter(correlation_points(read_taxonomy_results(res)),
                                        con.execute("select * from taxonomy_correlation").df(), out)
    assert all(_is_png(p) for p in [*bars, *heat, scatter])
    empty = flip_vs_dangerous_scatter(pd.DataFrame(), pd.DataFrame(), tmp_path / "empty")
    assert _is_png(empty)
    assert quadrant_bars(pd.DataFrame(), out) == [] and transition_heatmaps(pd.DataFrame(), out) == []


def test_incomplete_partitions_leave_stats_and_views(tmp_path: Path, fake_stats: None) -> None:
    """Default limit 0.02: cfg-a's partitions (1 error in 9 rows) are incomplete, so the stats and
    the transitions view hold cfg-b only, and the mart lists cfg-a's partitions as incomplete."""
    res = tmp_path / "results"
    write_results(res, all_rows())
    quad, _ = write_taxonomy_stats(res, seed=0)
    assert set(quad["config"]) == {"cfg-b"}
    build_mart(res, tmp_path / "m.duckdb")
    con = connect_readonly(tmp_path / "m.duckdb")
    try:
        assert con.execute("select model, level, n, n_error from incomplete_partitions "
                           "where source_table = 'taxonomy_results' order by level").fetchall() == [
            ("cfg-a", 0, 9, 1), ("cfg-a", 1, 9, 1)]
        assert {r[0] for r in con.execute("select distinct config from taxonomy_transitions").fetchall()} == {"cfg-b"}
    finally:
        con.close()
