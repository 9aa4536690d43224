"""Suite-level consistency LoRA recipes (``taxonomy.configs[].lora_of``) on a tiny random LLaVA
(transformers' ``LlavaForConditionalGeneration``: CLIP tower + Llama) in a ``kind: hf`` folder: the
recipe trains on the train split, saves a safetensors adapter, moves the evaluated answers away from
the base model's, is reused while its fingerprint holds and trained again when a setting changes;
the suite refuses endpoints, LLaVA-Rad (with the reason), unknown ids and evaluating on a split the
adapter saw."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from medrobust_lib.config import Suite, load_suite
from medrobust_lib.store import results
from medrobust_lib.store.schema import TAXONOMY_TABLE
from medrobust_lib.taxonomy.paraphrase import template_paraphrases, variant_targets
from medrobust_lib.tracks.taxonomy import evaluate as tx
from medrobust_lib.tracks.taxonomy.lora import (
    RECIPE_FILE,
    ConsistencyLoraSummary,
    lora_folder,
    recipe_examples,
    train_consistency_lora,
)
from medrobust_lib.tracks.vlm.items import YESNO_SUFFIX, load_items
from tests.suite_helpers import write_suite

MODALITIES = ["ct", "xray"]  # the small demo: ct has the test images, xray the val ones
RECIPE = {"r": 4, "alpha": 8, "dropout": 0.0, "max_steps": 6, "eval_every": 3, "batch_size": 16, "lr": 5e-2,
          "warmup_steps": 0, "min_paraphrases": 2}


def suite_config(folder: Path, recipe: dict[str, Any] | None = None, **taxonomy: Any) -> dict[str, Any]:
    return {
        "modalities": MODALITIES,
        "vlm": {"models": [{"id": "tiny", "source": str(folder), "batch_size": 64}], "split": "test"},
        "taxonomy": {"configs": [{"id": "tiny", "model": "tiny"},
                                 {"id": "tiny-cons", "lora_of": "tiny", "recipe": recipe or RECIPE}],
                     "image_modes": ["none"], "split": "test", "levels": [], **taxonomy},
    }


@dataclass
class Setup:
    root: Path
    demo_root: Path
    folder: Path
    suite: Suite
    trained: ConsistencyLoraSummary


def save_tiny_llava(suite: Suite, folder: Path) -> None:
    """A random tiny LLaVA whose word-level tokenizer knows the suite's yes/no questions and their
    template variants, saved as a ``kind: hf`` folder."""
    from medrobust_lib.models.tiny_vlm import build_tiny_llava, build_tokenizer, save_tiny

    items = [it for it in load_items(suite).items if it.task == "vqa_yesno"]
    texts = ["yes no", YESNO_SUFFIX] + [t for it in items for t, _ in [(it.question, 1),
                                                                      *template_paraphrases(it.question)]]
    model, proc = build_tiny_llava(build_tokenizer(texts), seed=4)
    save_tiny(model, proc, folder)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory, demo_root: Path, one_torch_thread: None) -> Iterator[Setup]:
    from medrobust_lib.tracks.datasets import build_clean_index

    root = tmp_path_factory.mktemp("tax_lora")
    folder = root / "tiny-llava"
    suite = load_suite(write_suite(root, demo_root, **suite_config(folder)))
    save_tiny_llava(suite, folder)
    for m in suite.modalities:
        build_clean_index(suite, m)
    yield Setup(root, demo_root, folder, suite, train_consistency_lora(suite, "tiny-cons"))


def test_recipe_trains_on_the_train_split_with_flipped_negation_targets(setup: Setup) -> None:
    from medrobust_lib.tracks.datasets import load_clean_samples

    data = recipe_examples(setup.suite, tx.config_entry(setup.suite, "tiny-cons"))

    def keys(split: str) -> set[str]:
        return {f"{s.dataset}/{s.sample_id}" for m in MODALITIES
                for v in load_clean_samples(setup.suite, m, split=split).values() for s in v}

    assert data.train and data.val
    assert {e.image_key for e in data.train} <= keys("train") and {e.image_key for e in data.val} <= keys("val")
    assert not {e.image_key for e in data.train + data.val} & keys("test")  # the evaluated split is never seen
    # the original, the record's paraphrases (topped up to 2) and its negations; a negation's target is flipped
    by_key: dict[str, list[Any]] = {}
    for e in data.train:
        by_key.setdefault(e.image_key, []).append(e)
    item = next(it for it in load_items(setup.suite).items
                if it.task == "vqa_yesno" and f"{it.dataset}/{it.sample_id}" in by_key)
    variants = tx.variants_of(item, 2, negations=True)
    pols = [v[1] for v in variants]
    assert pols.count(1) >= 3 and -1 in pols and pols == sorted(pols, reverse=True)
    want = [(t + YESNO_SUFFIX, a) for t, a in variant_targets(variants, item.answer)]
    assert [(e.question, e.answer) for e in by_key[f"{item.dataset}/{item.sample_id}"]][:len(want)] == want
    assert {a for _, a in want} == {"yes", "no"}
    t = setup.trained
    assert not t.reused and t.steps >= 1 and t.n_train == len(data.train) and t.n_val == len(data.val)


def test_adapter_is_saved_as_safetensors_and_loads_weights_only(setup: Setup) -> None:
    from safetensors.torch import load_file

    folder = lora_folder(setup.suite, "tiny-cons")
    assert Path(setup.trained.folder) == folder
    names = sorted(p.name for p in folder.iterdir())
    assert "adapter_model.safetensors" in names and "adapter_config.json" in names
    assert not [n for n in names if n.endswith((".bin", ".pt", ".pth", ".pkl"))]
    tensors = load_file(str(folder / "adapter_model.safetensors"))  # no pickle anywhere
    assert tensors and all("lora_" in k for k in tensors) and not any("vision_tower" in k for k in tensors)
    rec = json.loads((folder / RECIPE_FILE).read_text())
    assert rec["fingerprint"] == setup.trained.fingerprint and rec["trained_on"] == "train"
    assert rec["selected_on"] == "val" and rec["lora_of"] == "tiny"


def _evaluate(suite: Suite, config_id: str) -> pd.DataFrame:
    tx.compute_baselines(suite, config_id, "ct")
    tx.evaluate(suite, config_id, "ct", 0)
    return results.read_partition(suite.results_dir, TAXONOMY_TABLE,
                                  {"config": config_id, "run": "clean", "modality": "ct", "level": 0})


def test_evaluation_loads_base_plus_adapter_and_the_answers_change(setup: Setup) -> None:
    base, lora = _evaluate(setup.suite, "tiny"), _evaluate(setup.suite, "tiny-cons")
    assert len(base) == len(lora) > 0 and set(base["outcome"]) == set(lora["outcome"]) == {"ok"}
    assert base["adapter"].isna().all() and lora["adapter"].notna().all()
    assert (base["checkpoint"] == lora["checkpoint"]).all()  # the same base weights
    b = base.set_index("record_id").sort_index()
    c = lora.set_index("record_id").sort_index()
    assert float((b["p_yes_original"] - c["p_yes_original"]).abs().max()) > 1e-3


def test_same_fingerprint_is_reused_and_a_changed_setting_retrains(setup: Setup) -> None:
    again = train_consistency_lora(setup.suite, "tiny-cons")
    assert again.reused and again.adapter_hash == setup.trained.adapter_hash
    assert again.fingerprint == setup.trained.fingerprint
    other_root = setup.root / "changed"
    changed = load_suite(write_suite(other_root, setup.demo_root, **suite_config(setup.folder, {**RECIPE, "r": 2})))
    changed = changed.model_copy(update={"results_dir": setup.suite.results_dir})  # the same checkpoint folder
    assert lora_folder(changed, "tiny-cons") == lora_folder(setup.suite, "tiny-cons")
    re = train_consistency_lora(changed, "tiny-cons")
    assert not re.reused and re.fingerprint != setup.trained.fingerprint
    assert re.adapter_hash != setup.trained.adapter_hash
    back = train_consistency_lora(setup.suite, "tiny-cons")  # the first recipe again: trained again, same weights
    assert not back.reused and back.adapter_hash == setup.trained.adapter_hash


# ---- validation ---------------------------------------------------------------------------------

def _load(tmp_path: Path, demo_root: Path, **over: Any) -> Suite:
    cfg = suite_config(tmp_path / "model")
    for key, value in over.items():
        cfg[key] = {**cfg[key], **value}
    return load_suite(write_suite(tmp_path, demo_root, **cfg))


API = {"id": "remote", "kind": "api", "api": {"model": "m", "base_url": "http://127.0.0.1:9/v1", "api_key_env": None}}


@pytest.mark.parametrize(("over", "message"), [
    ({"vlm": {"models": [API]}, "taxonomy": {"configs": [{"id": "c", "lora_of": "remote"}]}},
     r"lora_of 'remote' is kind api, which cannot be LoRA fine-tuned here: an endpoint .* no local weights"),
    ({"vlm": {"models": [{"id": "rad", "kind": "llava_rad", "source": "/models/llava-rad-merged"}]},
      "taxonomy": {"configs": [{"id": "c", "lora_of": "rad"}]}},
     r"lora_of 'rad' is kind llava_rad, which cannot be LoRA fine-tuned here: LLaVA-Rad already is a base \+ LoRA "
     r"release"),
    ({"taxonomy": {"configs": [{"id": "c", "lora_of": "nope"}]}},
     r"lora_of 'nope' is not a vlm.models id; configured: \['tiny'\]"),
    ({"taxonomy": {"split": "train"}}, r"taxonomy config 'tiny-cons' \(lora_of 'tiny'\) would be evaluated on "
                                       r"taxonomy.split 'train', which holds its consistency LoRA's training"),
    ({"taxonomy": {"split": "all"}}, r"would be evaluated on taxonomy.split 'all'"),
    ({"taxonomy": {"configs": [{"id": "c", "lora_of": "tiny", "recipe": {"train_split": "test"}}]}},
     r"would be evaluated on taxonomy.split 'test'"),
    ({"taxonomy": {"configs": [{"id": "c", "lora_of": "tiny", "recipe": {"select_split": "train"}}]}},
     r"selects on the split it trains on"),
    ({"taxonomy": {"configs": [{"id": "c", "model": "tiny", "recipe": "consistency"}]}},
     r"'recipe' goes with 'lora_of'"),
    ({"taxonomy": {"configs": [{"id": "c", "model": "tiny", "lora_of": "tiny"}]}},
     r"give exactly one of 'model' .* got model, lora_of"),
    ({"taxonomy": {"configs": [{"id": "c", "lora_of": "tiny", "recipe": {"rank": 4}}]}}, r"rank.*unknown key"),
    ({"taxonomy": {"configs": [{"id": "c", "lora_of": "tiny", "recipe": "fancy"}]}}, r"consistency"),
    ({"vlm": {"models": [{"id": "tiny", "source": "/m"}, {"id": "ad", "base": "tiny", "adapter": "/some/lora"}]},
      "taxonomy": {"configs": [{"id": "c", "lora_of": "ad"}]}}, r"lora_of 'ad' already carries an adapter"),
])
def test_the_suite_refuses_what_a_recipe_cannot_train(tmp_path: Path, demo_root: Path, over: dict[str, Any],
                                                       message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _load(tmp_path, demo_root, **over)


def test_recipe_by_name_is_the_default_recipe_and_plain_suites_dump_as_before(tmp_path: Path,
                                                                              demo_root: Path) -> None:
    s = _load(tmp_path, demo_root, taxonomy={"configs": [{"id": "c", "lora_of": "tiny", "recipe": "consistency"},
                                                         {"id": "d", "lora_of": "tiny"}]})
    c, d = s.taxonomy.configs
    assert c.recipe == d.recipe and c.recipe is not None and c.recipe.seen_splits() == ("train", "val")
    assert c.trains() and "recipe" in c.model_dump()
    plain = _load(tmp_path / "plain", demo_root, taxonomy={"configs": [{"id": "tiny", "model": "tiny"}]})
    assert plain.taxonomy.configs[0].model_dump() == {"id": "tiny", "model": "tiny", "demo_training": None,
                                                      "base": None}
    assert yaml.safe_dump(plain.taxonomy.model_dump())  # the fingerprinted dump has no new keys


def test_an_untrained_recipe_names_its_asset(tmp_path: Path, demo_root: Path) -> None:
    s = _load(tmp_path, demo_root)
    with pytest.raises(FileNotFoundError, match=r"materialize 'tiny-cons/taxonomy_model' first"):
        tx.model_for(s, tx.config_entry(s, "tiny-cons"))


def test_evaluation_refuses_an_adapter_of_another_or_an_unfinished_recipe(tmp_path: Path, demo_root: Path) -> None:
    """The adapter folder is this configuration's only with the record of its current recipe: an
    interrupted retraining (record removed, the old weights left) or an edited recipe is refused."""
    s = _load(tmp_path, demo_root)
    entry = tx.config_entry(s, "tiny-cons")
    assert entry.recipe is not None
    folder = lora_folder(s, "tiny-cons")
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match=r"current recipe \(or its training did not finish\)"):
        tx.model_for(s, entry)  # no record: a retraining that did not finish
    record = {"inputs": {"recipe": {**entry.recipe.model_dump(), "r": 2}}}
    (folder / RECIPE_FILE).write_text(json.dumps(record))
    with pytest.raises(FileNotFoundError, match=r"current recipe"):
        tx.model_for(s, entry)  # trained by another recipe
    (folder / RECIPE_FILE).write_text(json.dumps({"inputs": {"recipe": entry.recipe.model_dump()}}))
    m = tx.model_for(s, entry)
    assert m.id == "tiny-cons" and m.adapter == str(folder)


def test_recipe_trains_on_its_models_cuda_device(setup: Setup, tmp_path: Path) -> None:
    """The recipe trains where the ``lora_of`` model's ``device`` says (the trainer moves each
    CPU-collated batch there); the saved adapter is the same kind of file. Runs on CUDA only."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    cfg = suite_config(setup.folder)
    cfg["vlm"]["models"][0]["device"] = "cuda"
    s = load_suite(write_suite(tmp_path, setup.demo_root, **cfg))
    s = s.model_copy(update={"results_dir": str(tmp_path / "cuda" / "results")})
    from medrobust_lib.tracks.datasets import build_clean_index

    for m in s.modalities:
        build_clean_index(s, m)
    r = train_consistency_lora(s, "tiny-cons")
    assert not r.reused and r.steps >= 1 and (Path(r.folder) / "adapter_model.safetensors").is_file()
    assert r.fingerprint == setup.trained.fingerprint  # the device is not a recipe input
