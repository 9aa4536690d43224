"""The Dagster wiring of a consistency LoRA recipe (``taxonomy.configs[].lora_of``): the
configuration's ``taxonomy_model`` asset depends on its model's assets, trains the adapter, reuses it
when materialized again, and the evaluation assets run on the base plus the adapter."""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from medrobust_assets.definitions import definitions_for_file
from medrobust_lib import runtime
from tests.dagster_helpers import asset_runner
from tests.suite_helpers import write_suite
from tests.tracks.taxonomy.test_lora_recipe import save_tiny_llava, suite_config


def test_recipe_assets_train_reuse_and_evaluate(tmp_path: Path, demo_root: Path, one_torch_thread: None) -> None:
    folder = tmp_path / "tiny-llava"
    path = write_suite(tmp_path, demo_root, **suite_config(folder))
    save_tiny_llava(runtime.load_suite(path), folder)
    graph = definitions_for_file(path, mlruns_dir=str(tmp_path / "mlruns"))
    repo = graph.get_repository_def().asset_graph
    model = repo.get(dg.AssetKey(["tiny-cons", "taxonomy_model"]))
    assert dg.AssetKey("clean_samples") in model.parent_keys
    assert dg.AssetKey(["tiny-cons", "taxonomy_model"]) in repo.get(
        dg.AssetKey(["tiny-cons", "text_only_baselines"])).parent_keys
    assert dg.AssetKey(["tiny", "taxonomy_model"]) not in repo.get_all_asset_keys()  # a named model trains nothing
    instance = dg.DagsterInstance.ephemeral()

    run = asset_runner(graph, instance)

    run("demo_data")
    for m in ("ct", "xray"):
        run("clean_samples", m)
    first = run("tiny-cons/taxonomy_model").asset_materializations_for_node("tiny_cons__taxonomy_model")[0].metadata
    again = run("tiny-cons/taxonomy_model").asset_materializations_for_node("tiny_cons__taxonomy_model")[0].metadata
    assert first["reused"].value is False and again["reused"].value is True
    assert first["adapter_hash"].value == again["adapter_hash"].value and first["n_train"].value > 0
    assert "registered_version" not in again
    run("tiny-cons/text_only_baselines", "ct")
    meta = run("tiny-cons/taxonomy_clean", "ct").asset_materializations_for_node("tiny_cons__taxonomy_clean")[0].metadata
    assert meta["n_rows"].value > 0 and meta["n_ok"].value == meta["n_rows"].value
