"""Attack strengths of their own (``segmentation.attacks.levels``): a suite that perturbs at levels
1, 3, 5 and attacks at 1, 2, 3 attacks the clean images at eps 2, 4, 6 /255 (level 2 is never
perturbed, and no perturbed data is needed at all); the Dagster partitions and the runner's plan
follow; without the key nothing changes."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pandas as pd
import pytest

from medrobust_assets.definitions import definitions_for
from medrobust_assets.partitions import partitions_for
from medrobust_assets.runner import plan
from medrobust_lib.config import Suite, load_suite
from medrobust_lib.store import results
from medrobust_lib.tracks.datasets import build_clean_index
from medrobust_lib.tracks.segmentation.evaluate import RESULTS_TABLE, evaluate_attacks
from medrobust_lib.tracks.segmentation.model import load_model, model_config, train_base_checkpoint
from tests.suite_helpers import write_suite

ROOT = Path(__file__).resolve().parents[3]
SEG = {"models": [{"id": "tiny-sam", "family": "sam", "arch": "tiny", "checkpoint": "trained"}],
       "train": {"max_steps": 4, "eval_every": 2, "time_budget_s": 60},
       "split": "all", "attacks": {"kinds": ["fgsm", "pgd"], "max_samples": 2, "levels": [1, 2, 3]}}
PERTURB = {"include": ["gaussian_noise"], "split": "all", "calibration_subset": 2, "levels": [1, 3, 5]}


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory, demo_root: Path) -> Suite:
    root = tmp_path_factory.mktemp("attack_levels")
    s = load_suite(write_suite(root, demo_root, modalities=["ct", "dermoscopy"], segmentation=SEG,
                               perturbations=PERTURB))
    for m in s.modalities:  # the base model trains on both (a validation split to select on)
        build_clean_index(s, m)
    return s


def test_attack_levels_are_their_own(suite: Suite) -> None:
    assert suite.perturbations.levels == [1, 3, 5]
    assert suite.attack_levels_for("tiny-sam") == [1, 2, 3] == suite.attack_levels()
    assert suite.levels_for("segmentation.tiny-sam") == [1, 3, 5]


def test_attack_rows_at_their_own_epsilons(suite: Suite) -> None:
    train_base_checkpoint(suite, "tiny-sam")
    model = load_model(suite, model_config(suite, "tiny-sam"))
    # no perturbed data is built: an attack reads only the clean images
    assert not (Path(suite.results_dir) / "perturbed_manifest").exists()
    frames = []
    for lv in suite.attack_levels_for("tiny-sam"):
        summary = evaluate_attacks(suite, "tiny-sam", "ct", lv, model)
        assert summary.n_rows == 2 * 2 and summary.n_failed == 0  # 2 samples x (fgsm, pgd)
        frames.append(results.read_partition(suite.results_dir, RESULTS_TABLE,
                                             {"model": "tiny-sam", "run": "attack", "modality": "ct", "level": lv}))
    df = pd.concat(frames)
    got = df.groupby(["perturbation", "level"])["epsilon"].agg(["min", "max", "size"]).reset_index()
    assert sorted(got["perturbation"].unique()) == ["fgsm", "pgd"]
    for _, r in got.iterrows():
        assert r["min"] == r["max"] == pytest.approx(2 * r["level"] / 255) and r["size"] == 2
    assert sorted(got["level"].unique()) == [1, 2, 3]


def _severities(defs: dg.Definitions, name: str) -> dict[str, dg.PartitionsDefinition | None]:
    """Each model's partitions definition of its asset ``name`` (``<model>/<name>``)."""
    graph = defs.resolve_asset_graph()
    return {key.path[0]: graph.get(key).partitions_def for key in graph.get_all_asset_keys() if key.path[-1] == name}


def test_dagster_partitions_and_plan_attack_the_unperturbed_level(suite: Suite) -> None:
    defs = definitions_for(suite)
    attack = _severities(defs, "attack_predictions")["tiny-sam"]
    perturbed = _severities(defs, "perturbed_predictions")["tiny-sam"]
    assert isinstance(attack, dg.MultiPartitionsDefinition) and isinstance(perturbed, dg.MultiPartitionsDefinition)
    sev = {d.name: d.partitions_def.get_partition_keys() for d in attack.partitions_defs}
    assert sev["severity"] == ["1", "2", "3"] and sev["modality"] == ["ct", "dermoscopy"]
    assert {d.name: d.partitions_def.get_partition_keys() for d in perturbed.partitions_defs}["severity"] == [
        "1", "3", "5"]
    steps = plan(dg.AssetSelection.assets(dg.AssetKey(["tiny-sam", "attack_predictions"])), defs,
                 dg.DagsterInstance.ephemeral())
    assert sorted(str(st.partition) for st in steps) == [f"{m}|{lv}" for m in ("ct", "dermoscopy") for lv in (1, 2, 3)]


def test_without_the_key_attacks_follow_the_perturbed_levels() -> None:
    """Today's behaviour: each model attacked at its perturbed levels, in the same partitions
    definition as its perturbed predictions (one run per partition)."""
    demo = load_suite(ROOT / "configs" / "demo.yaml")
    assert demo.segmentation.attacks.levels is None
    assert "levels" not in demo.segmentation.attacks.model_dump()  # dumps, and so fingerprints, unchanged
    defs = definitions_for(demo)
    attack, perturbed = _severities(defs, "attack_predictions"), _severities(defs, "perturbed_predictions")
    assert attack
    for model_id, pdef in attack.items():
        assert pdef is perturbed[model_id]
        assert demo.attack_levels_for(model_id) == demo.levels_for(f"segmentation.{model_id}")


def test_attack_grid_shares_the_perturbed_definition_where_levels_agree() -> None:
    demo = load_suite(ROOT / "configs" / "demo.yaml")
    parts = partitions_for(demo)
    assert parts.attack_grid(demo.perturbations.levels) is parts.grid()
    assert parts.attack_grid([1, 2]) is parts.attack_grid([2, 1])
    with pytest.raises(ValueError, match="attack levels"):
        parts.attack_grid([6])
