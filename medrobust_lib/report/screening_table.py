"""The report's confidence-screening table (mart view ``taxonomy_screening``): can a screen on the
model's own confidence catch the Dangerous samples? Clean images only; the mart keeps every
perturbed condition."""

from __future__ import annotations

from collections.abc import Sequence

import duckdb

from medrobust_lib.report.paper_tables import TableResult, relation_exists, where_in
from medrobust_lib.report.table import Column, ReportTable


def taxonomy_screening(con: duckdb.DuckDBPyConnection, configs: Sequence[str] | None) -> TableResult:
    """One row per (config, dataset, image mode, signal) on clean images: ``n_dangerous``,
    ``n_ideal``, ``auroc`` (the signal's uncertainty telling Dangerous from the other samples; 0.5 =
    blind, below = Dangerous more confident), ``dangerous_pass`` (share of Dangerous samples a screen
    keeping 95 % of the Ideal ones lets through), ``threshold``, ``dangerous_pass_pooled`` (the same with
    the threshold set on every configuration's Ideal samples) and ``status`` (``not available``:
    no log-probabilities, e.g. an API endpoint that returns none)."""
    if not relation_exists(con, "taxonomy_screening"):
        return "the mart has no taxonomy_screening view"
    where, params = where_in("config", configs)
    df = con.execute(f"""
        select config, dataset, image_mode, signal, n_dangerous, n_ideal, n_no_signal, auroc, dangerous_pass,
               threshold, dangerous_pass_pooled, pooled_threshold, status
        from taxonomy_screening where perturbation = 'clean' and {where}
        order by config, dataset, image_mode, case signal when 'max_p' then 0 when 'margin' then 1 else 2 end""",
        params).df()
    if df.empty:
        return "no clean taxonomy_screening rows for the selected configurations"
    for c in ("n_dangerous", "n_ideal", "n_no_signal"):
        df[c] = df[c].astype("Int64")
    cols = (Column("Config", "config"), Column("Dataset", "dataset"), Column("Image removed", "image_mode"),
            Column("Signal", "signal"), Column("Dangerous", "n_dangerous", "int"), Column("Ideal", "n_ideal", "int"),
            Column("AUROC", "auroc", "float"), Column("Dangerous passing", "dangerous_pass", "float"),
            Column("Threshold", "threshold", "float"),
            Column("Passing (pooled screen)", "dangerous_pass_pooled", "float"),
            Column("No signal", "n_no_signal", "int"),
            Column("Status", "status"))
    return ReportTable(
        "taxonomy_screening", "Confidence screening: are Dangerous samples visible to the model's confidence?", df,
        cols,
        "Clean images. Signals of the answer to the original question with the image: max_p = max(p(yes), "
        "p(no)), margin = |log p(yes) - log p(no)|, entropy (bits); for two options they rank samples alike. "
        "AUROC: the signal's uncertainty separating Dangerous from every other sample (0.5: blind; below 0.5: "
        "Dangerous answers are more confident than the rest). Dangerous passing: share of Dangerous samples "
        "a screen keeping 95% of the Ideal samples lets through (1.0: the screen catches none); pooled screen: "
        "its threshold set on the Ideal samples of every configuration (it also screens a model with no Ideal "
        "samples of its own). 'not "
        "available': the model gave no log-probabilities (an API endpoint without logprobs).",
        group_by=("config",))
