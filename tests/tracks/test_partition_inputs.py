"""Every suite setting that changes a track's result rows moves that partition's fingerprint, and
the settings that do not (workers, prefetch, devices, ...) leave it alone.

Each track's inputs dataclass (:mod:`medrobust_lib.tracks.partition`) is built from the demo suite
with fixed stand-ins for what the model and the data contribute (the checkpoint hash, the sample
content hashes, the manifest's output hashes); then each setting is changed, one at a time, and
the fingerprint compared. Every field of every config class a track reads is classified below
(``MOVES``: the runs whose fingerprint it must move; ``STILL``: changed and must move nothing;
``NOT_AN_INPUT``: not changed here, with the reason), so a new config field fails this test until
someone decides whether it changes results.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from medrobust_lib.config import load_suite
from medrobust_lib.config.segmentation import AttacksConfig, SegmentationConfig, SegModelConfig
from medrobust_lib.config.suite import PerturbationConfig, Suite
from medrobust_lib.config.taxonomy import TaxonomyConfig
from medrobust_lib.config.vlm import VLMConfig, VLMModelConfig, VLMProtocol, VLMRecordsConfig
from medrobust_lib.hashing import digest
from medrobust_lib.tracks import perturbed as tp
from medrobust_lib.tracks.partition import PartitionInputs
from medrobust_lib.tracks.segmentation import evaluate as seg
from medrobust_lib.tracks.taxonomy import evaluate as tax
from medrobust_lib.tracks.vlm import evaluate as vlm

ROOT = Path(__file__).resolve().parents[2]
DEMO = load_suite(ROOT / "configs" / "demo.yaml")


class _Sample:
    """What the builders read of a sample: its key and content hash."""

    def __init__(self, dataset: str, sample_id: str, content: str = "") -> None:
        self.dataset, self.sample_id = dataset, sample_id
        self._hash = digest([dataset, sample_id, content])

    def content_hash(self) -> str:
        return self._hash


KEYS = [(ds, f"s{i}") for ds in ("dsa", "dsb") for i in range(5)]
SAMPLES: dict[tuple[str, str], Any] = {k: _Sample(*k) for k in KEYS}
UNUSABLE = {("dsb", "s9"): "quarantined:unreadable"}
MANIFEST = pd.DataFrame({"sha256": ["m1", "m2", "m3"]})


def base_for(path: str) -> Suite:
    """The demo suite, without the adapters a split holding their training data would refuse."""
    if path == "vlm.split":
        return changed(DEMO, "vlm.models", [DEMO.vlm.models[0].model_dump()])
    if path == "taxonomy.split":
        return changed(DEMO, "taxonomy.configs", [c.model_dump() for c in DEMO.taxonomy.configs if c.base is None])
    return DEMO


def changed(suite: Suite, path: str, value: Any) -> Suite:
    """``suite`` with the setting at dotted ``path`` (list indices as numbers) set to ``value``,
    validated again as a suite file would be."""
    data = suite.model_dump()
    *head, last = path.split(".")
    node: Any = data
    for part in head:
        node = node[int(part)] if isinstance(node, list) else node[part]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return Suite.model_validate(data)


# ---- segmentation --------------------------------------------------------------------------------

def seg_fps(suite: Suite, *, checkpoint: str = "ck", precision: str = "fp32", level: int = 4,
            samples: dict[tuple[str, str], Any] = SAMPLES, unusable: dict[tuple[str, str], str] = UNUSABLE,
            manifest: pd.DataFrame = MANIFEST, perturbations: list[str] | None = None,
            kinds: list[str] | None = None) -> dict[str, str]:
    m = suite.segmentation.models[0]
    attacked, capped = seg.attacked_samples(suite, m, list(samples.values()))
    return {
        "clean": seg.clean_inputs(suite, m, checkpoint, precision, samples.values(), unusable).fingerprint,
        "perturbed": seg.perturbed_inputs(suite, m, checkpoint, precision, level, manifest, perturbations, samples,
                                          unusable).fingerprint,
        "attack": seg.attack_inputs(suite, m, checkpoint, precision, level, attacked, kinds,
                                    {} if capped else unusable).fingerprint,
    }


ALL_SEG = {"clean", "perturbed", "attack"}
CAPPED = {"perturbed", "attack"}

SEG_MOVES: dict[str, tuple[Any, set[str]]] = {
    "segmentation.models.0.family": ("medsam", ALL_SEG),
    "segmentation.models.0.strategy": ("lora", ALL_SEG),
    "segmentation.models.0.mask_selection": ("best_iou", ALL_SEG),
    "segmentation.models.0.preprocess": ("hf_processor", ALL_SEG),
    "segmentation.models.0.color": ("rgb", ALL_SEG),
    "segmentation.models.0.resize": ("bilinear", ALL_SEG),
    "segmentation.models.0.max_perturbed_per_modality": (4, CAPPED),
    "segmentation.models.0.max_perturbed_per_dataset": (2, CAPPED),
    "segmentation.prompt_margin": (2.0, ALL_SEG),
    "segmentation.prompt_jitter": (0.1, ALL_SEG),
    "segmentation.store_masks": (False, ALL_SEG),
    "segmentation.attacks.kinds": (["fgsm"], {"attack"}),
    "segmentation.attacks.step_size_factor": (1.0, {"attack"}),
    "segmentation.attacks.max_samples": (2, {"attack"}),
    "seed": (1, {"attack"}),
}
SEG_STILL: dict[str, Any] = {
    "segmentation.models.0.device": "cuda",
    "segmentation.models.0.batch_size": 3,
    "segmentation.models.0.engine": "reference",
    "segmentation.models.0.compile": "default",
    "segmentation.models.0.runtime": "pytorch",  # the runtime that ran is in the model's precision
    "segmentation.models.0.precision": "bf16",  # enters as model.precision: the arithmetic that ran
    "segmentation.feed_workers": 0,
    "segmentation.feed_prefetch": 2,
    "segmentation.mce_baseline": "tiny-sam",
    # which attack partitions exist; an attack partition's rows depend on its level (an input), not
    # on the other levels attacked
    "segmentation.attacks.levels": [1, 2, 3],
    "workers": 1,
}
SEG_NOT_AN_INPUT: dict[str, str] = {
    "segmentation.models.0.id": "the partition's folder",
    "segmentation.models.0.arch": "fixed by the checkpoint (medrobust validate checks it)",
    "segmentation.models.0.checkpoint": "enters as the checkpoint hash",
    "segmentation.models.0.levels": "which partitions exist",
    "segmentation.models.0.attacks": "whether attack partitions exist",
    "segmentation.models": "each model's own fields",
    "segmentation.train": "trains the checkpoint: enters as its hash",
    "segmentation.split": "enters as the evaluated samples",
    "segmentation.finetune": "trains checkpoints (their hash); its eval settings are builder arguments",
}


def test_every_segmentation_setting_is_classified() -> None:
    for cls, prefix in ((SegModelConfig, "segmentation.models.0."), (SegmentationConfig, "segmentation."),
                        (AttacksConfig, "segmentation.attacks.")):
        classified = {k[len(prefix):] for k in (*SEG_MOVES, *SEG_STILL, *SEG_NOT_AN_INPUT)
                      if k.startswith(prefix) and "." not in k[len(prefix):]}
        if cls is SegmentationConfig:
            classified.add("attacks")  # its fields are classified one by one
        assert set(cls.model_fields) == classified, f"classify the new {cls.__name__} fields in this test"


@pytest.mark.parametrize("path", sorted(SEG_MOVES))
def test_segmentation_setting_moves_its_runs(path: str) -> None:
    value, runs = SEG_MOVES[path]
    before, after = seg_fps(DEMO), seg_fps(changed(DEMO, path, value))
    assert {r for r in before if before[r] != after[r]} == runs


@pytest.mark.parametrize("path", sorted(SEG_STILL))
def test_segmentation_execution_setting_moves_nothing(path: str) -> None:
    assert seg_fps(changed(DEMO, path, SEG_STILL[path])) == seg_fps(DEMO)


def test_segmentation_model_and_data_inputs_move_it() -> None:
    base = seg_fps(DEMO)
    other_sample = {**SAMPLES, ("dsa", "s0"): _Sample("dsa", "s0", "changed pixels")}
    cases: list[tuple[dict[str, Any], set[str]]] = [
        ({"checkpoint": "ck2"}, ALL_SEG), ({"precision": "bf16-autocast"}, ALL_SEG),
        ({"samples": other_sample}, ALL_SEG),
        ({"unusable": {}}, {"clean"}),  # dsb/s9 is beyond tiny-sam's 3 perturbed samples per dataset
        ({"unusable": {("dsb", "s1"): "missing: x"}}, {"clean", "perturbed"}),
        ({"manifest": MANIFEST.iloc[:2]}, {"perturbed"}), ({"level": 2}, CAPPED),
        ({"perturbations": ["gaussian_*"]}, {"perturbed"}), ({"kinds": ["fgsm"]}, {"attack"}),
    ]
    for kw, runs in cases:
        got = seg_fps(DEMO, **kw)
        assert {r for r in base if base[r] != got[r]} == runs, kw


# ---- VLM -----------------------------------------------------------------------------------------

def vlm_fps(suite: Suite, *, checkpoint: str = "ck", adapter: str | None = None,
            samples: dict[tuple[str, str], Any] = SAMPLES, manifest: pd.DataFrame = MANIFEST) -> dict[str, str]:
    m = suite.vlm.models[0]
    return {"clean": vlm.vlm_inputs(suite, checkpoint, adapter, m, "ct", samples=samples).fingerprint,
            "perturbed": vlm.vlm_inputs(suite, checkpoint, adapter, m, "ct", level=4, manifest=manifest).fingerprint}


BOTH = {"clean", "perturbed"}
VLM_MOVES: dict[str, tuple[Any, set[str]]] = {
    "vlm.models.0.max_new_tokens": (8, BOTH),
    "vlm.models.0.caption_max_new_tokens": (32, BOTH),
    "vlm.models.0.grounding_max_new_tokens": (16, BOTH),
    "vlm.models.0.box_scale": ("0-1000", BOTH),
    # the whole model config is an input (written so before issue 45): these rescore too
    "vlm.models.0.batch_size": (8, BOTH),
    "vlm.models.0.device": ("cuda", BOTH),
    "vlm.models.0.levels": ([], BOTH),
    "vlm.protocol.caption_prompt": ("Describe the image.", BOTH),
    "vlm.protocol.caption_raw_scores": (True, BOTH),
    "vlm.protocol.grounding_parse": ("reference", BOTH),
    "vlm.protocol.open_vqa_max_new_tokens": (100, BOTH),
    "vlm.protocol.caption_judge": ("tiny-llava-lora", BOTH),  # an added key: dumped only when set
    "vlm.records.omnimedvqa": ("/elsewhere/mc.jsonl", BOTH),
    "vlm.split": ("val", BOTH),
    "vlm.max_records_per_task": (3, BOTH),
    "vlm.judge": ("tiny-llava-lora", BOTH),
    "vlm.record_sample": ({"n": 3, "seed": 1}, BOTH),
    "vlm.models.0.system_prompt": ("You are a radiologist.", BOTH),
    "vlm.models.0.temperature": (0.2, BOTH),
    "vlm.models.0.top_p": (0.9, BOTH),
}
VLM_STILL: dict[str, Any] = {"seed": 1,  # a local model decodes greedily: the seed is not read
                             "workers": 1, "segmentation.feed_workers": 0, "taxonomy.min_paraphrases": 2,
                             "segmentation.prompt_margin": 2.0}
VLM_NOT_AN_INPUT: dict[str, str] = {
    "vlm.models": "each model's whole config is the inputs' ``model`` field",
    "vlm.protocol.open_vqa_judge": "in the protocol dump (an endpoint model is needed to change it)",
    "vlm.train": "trains the checkpoint: enters as its hash",
    "vlm.finetune": "trains the adapter: enters as its hash",
}


def test_every_vlm_setting_is_classified() -> None:
    for cls, prefix in ((VLMConfig, "vlm."), (VLMProtocol, "vlm.protocol.")):
        classified = {k[len(prefix):] for k in (*VLM_MOVES, *VLM_NOT_AN_INPUT)
                      if k.startswith(prefix) and "." not in k[len(prefix):]}
        classified |= {"protocol", "records"} if cls is VLMConfig else set()
        assert set(cls.model_fields) == classified, f"classify the new {cls.__name__} fields in this test"
    m = DEMO.vlm.models[0]
    assert set(vlm.vlm_inputs(DEMO, "ck", None, m, "ct", samples=SAMPLES).model) == set(
        VLMModelConfig.model_fields) - set(VLMModelConfig.ADDED_KEYS)  # added keys: dumped when set (VLM_MOVES)
    assert set(vlm.vlm_inputs(DEMO, "ck", None, m, "ct", samples=SAMPLES).records) == set(
        VLMRecordsConfig.model_fields)


@pytest.mark.parametrize("path", sorted(VLM_MOVES))
def test_vlm_setting_moves_its_runs(path: str) -> None:
    value, runs = VLM_MOVES[path]
    suite = base_for(path)
    before, after = vlm_fps(suite), vlm_fps(changed(suite, path, value))
    assert {r for r in before if before[r] != after[r]} == runs


def test_an_endpoint_reads_the_suite_seed() -> None:
    api = {"id": "remote", "kind": "api", "api": {"model": "m", "base_url": "http://127.0.0.1:9/v1"}}
    suite = changed(DEMO, "vlm.models", [api, *[m.model_dump() for m in DEMO.vlm.models]])
    assert vlm_fps(changed(suite, "seed", 1)) != vlm_fps(suite)
    assert vlm_fps(changed(suite, "vlm.models.0.api.temperature", 0.5)) != vlm_fps(suite)
    assert vlm_fps(changed(suite, "vlm.models.0.api.top_p", 0.5)) != vlm_fps(suite)


def test_a_sampling_local_model_reads_the_suite_seed() -> None:
    sampled = changed(DEMO, "vlm.models.0.temperature", 0.2)
    assert vlm_fps(changed(sampled, "seed", 1)) != vlm_fps(sampled)
    assert vlm_fps(changed(DEMO, "seed", 1)) == vlm_fps(DEMO)  # greedy: the seed is not read


def test_vlm_unrelated_settings_and_data_inputs() -> None:
    base = vlm_fps(DEMO)
    for path, value in VLM_STILL.items():
        assert vlm_fps(changed(DEMO, path, value)) == base, path
    other_sample = {**SAMPLES, ("dsa", "s0"): _Sample("dsa", "s0", "changed pixels")}
    for kw, runs in (({"checkpoint": "ck2"}, BOTH), ({"adapter": "ad"}, BOTH), ({"samples": other_sample}, {"clean"}),
                     ({"manifest": MANIFEST.iloc[:2]}, {"perturbed"})):
        got = vlm_fps(DEMO, **kw)
        assert {r for r in base if base[r] != got[r]} == runs, kw


# ---- taxonomy ------------------------------------------------------------------------------------

def tax_fps(suite: Suite, config_id: str = "demo-image-reliant", *, checkpoint: str = "ck",
            samples: dict[tuple[str, str], Any] = SAMPLES, manifest: pd.DataFrame = MANIFEST) -> dict[str, str]:
    return {"clean": tax.taxonomy_inputs(suite, config_id, checkpoint, None, 0, samples, None).fingerprint,
            "perturbed": tax.taxonomy_inputs(suite, config_id, checkpoint, None, 4, samples, manifest).fingerprint,
            "baselines": tax.baseline_inputs(suite, config_id, checkpoint, None, 12).fingerprint}


ALL_TAX = {"clean", "perturbed", "baselines"}
TAX_MOVES: dict[str, tuple[Any, set[str]]] = {
    "taxonomy.image_modes": (["none"], ALL_TAX),
    "taxonomy.min_paraphrases": (2, ALL_TAX),
    "taxonomy.negations": (True, ALL_TAX),
    "taxonomy.abstention_tau": (0.5, ALL_TAX),
    "taxonomy.known_answer_checks": ("off", ALL_TAX),
    "taxonomy.split": ("val", ALL_TAX),
    "taxonomy.levels": ([4], ALL_TAX),
    "taxonomy.train": ({"max_steps": 5}, ALL_TAX),
    "vlm.records.yesno": ("/elsewhere/yesno.jsonl", ALL_TAX),
    "seed": (1, ALL_TAX),
}
TAX_NOT_AN_INPUT: dict[str, str] = {
    "taxonomy.configs": "in the taxonomy dump; a config's model: see test_a_named_model_is_an_input",
    "taxonomy.api_paraphraser": "in the taxonomy dump (an endpoint model is needed to change it)",
}


def test_every_taxonomy_setting_is_classified() -> None:
    classified = {k.split(".")[1] for k in (*TAX_MOVES, *TAX_NOT_AN_INPUT) if k.startswith("taxonomy.")}
    assert set(TaxonomyConfig.model_fields) == classified, "classify the new TaxonomyConfig fields in this test"


@pytest.mark.parametrize("path", sorted(TAX_MOVES))
def test_taxonomy_setting_moves_its_runs(path: str) -> None:
    value, runs = TAX_MOVES[path]
    suite = base_for(path)
    before, after = tax_fps(suite), tax_fps(changed(suite, path, value))
    assert {r for r in before if before[r] != after[r]} == runs


def test_a_named_model_is_an_input() -> None:
    """A configuration that names a ``vlm.models`` entry depends on that entry's settings; a
    demo-trained one only on its weights."""
    suite = changed(DEMO, "taxonomy.configs", [*[c.model_dump() for c in DEMO.taxonomy.configs],
                                                {"id": "named", "model": "tiny-llava"}])
    other = changed(suite, "vlm.models.0.max_new_tokens", 8)
    assert tax_fps(other, "named") != tax_fps(suite, "named")
    assert tax_fps(other, "demo-shortcut") == tax_fps(suite, "demo-shortcut")
    base = tax_fps(DEMO)
    assert tax_fps(changed(DEMO, "workers", 1)) == base
    assert tax_fps(DEMO, checkpoint="ck2") != base
    assert tax_fps(DEMO, manifest=MANIFEST.iloc[:2])["perturbed"] != base["perturbed"]


LORA_ENTRY = {"id": "tiny-cons", "lora_of": "tiny-llava"}
"""A consistency LoRA recipe on the demo's base VLM (``taxonomy.configs[].lora_of``)."""
TAX_ENTRY_CLASSIFIED: dict[str, str] = {
    "id": "the partition's folder",
    "model": "its entry's settings: test_a_named_model_is_an_input",
    "demo_training": "in the taxonomy dump; the demo weights enter as their hash",
    "base": "in the taxonomy dump; the base weights enter as their hash",
    "lora_of": "its entry's settings: test_a_lora_recipe_and_its_model_are_inputs",
    "recipe": "each field: RECIPE_MOVES",
}
RECIPE_MOVES: dict[str, dict[str, Any]] = {
    "r": {"r": 4}, "alpha": {"alpha": 8}, "dropout": {"dropout": 0.1}, "target_regex": {"target_regex": ".*q_proj"},
    "max_steps": {"max_steps": 5}, "batch_size": {"batch_size": 2}, "lr": {"lr": 1e-3},
    "eval_every": {"eval_every": 5}, "patience": {"patience": 2}, "time_budget_s": {"time_budget_s": 10.0},
    "epochs": {"epochs": 2}, "grad_accumulation": {"grad_accumulation": 2}, "weight_decay": {"weight_decay": 0.1},
    "warmup_steps": {"warmup_steps": 0}, "warmup_ratio": {"warmup_ratio": 0.1}, "lr_schedule": {"lr_schedule": "linear"},
    "select_on": {"select_on": "loss"}, "seed": {"seed": 5}, "negations": {"negations": False},
    "min_paraphrases": {"min_paraphrases": 2}, "select_split": {"select_split": None},
    "train_split": {"train_split": "val", "select_split": "train"},
}
RECIPE_NOT_AN_INPUT = {"kind": "one value (consistency)"}


def _with_lora(suite: Suite, recipe: dict[str, Any] | None = None) -> Suite:
    entry = {**LORA_ENTRY, "recipe": recipe} if recipe is not None else LORA_ENTRY
    return changed(suite, "taxonomy.configs", [*[c.model_dump() for c in suite.taxonomy.configs], entry])


def test_every_taxonomy_config_and_recipe_setting_is_classified() -> None:
    from medrobust_lib.config.taxonomy import ConsistencyLoraRecipe, TaxonomyConfigEntry

    assert set(TaxonomyConfigEntry.model_fields) == set(TAX_ENTRY_CLASSIFIED), "classify the new config-entry fields"
    assert set(ConsistencyLoraRecipe.model_fields) == set(RECIPE_MOVES) | set(RECIPE_NOT_AN_INPUT), \
        "classify the new recipe fields"


@pytest.mark.parametrize("field", sorted(RECIPE_MOVES))
def test_a_recipe_setting_moves_the_runs_of_its_configuration(field: str) -> None:
    """The recipe is in the taxonomy dump (every configuration's inputs), and the adapter it trains
    enters as its hash besides."""
    base = _with_lora(DEMO)
    assert base.taxonomy.configs[-1].recipe is not None
    recipe = base.taxonomy.configs[-1].recipe.model_dump()
    assert {k: recipe[k] for k in RECIPE_MOVES[field]} != RECIPE_MOVES[field]
    other = _with_lora(DEMO, {**recipe, **RECIPE_MOVES[field]})
    before, after = tax_fps(base, "tiny-cons"), tax_fps(other, "tiny-cons")
    assert {r for r in before if before[r] != after[r]} == ALL_TAX


def test_a_lora_recipe_and_its_model_are_inputs() -> None:
    """A ``lora_of`` configuration depends on the named model's settings (as ``model`` does) and on
    its adapter's hash; adding it leaves a plain suite's dump, hence its fingerprints, alone."""
    suite = _with_lora(DEMO)
    assert tax_fps(changed(suite, "vlm.models.0.max_new_tokens", 8), "tiny-cons") != tax_fps(suite, "tiny-cons")
    ad = tax.taxonomy_inputs(suite, "tiny-cons", "ck", "adapter-hash", 0, SAMPLES, None).fingerprint
    assert ad != tax_fps(suite, "tiny-cons")["clean"]
    assert DEMO.taxonomy.model_dump()["configs"] == [{k: v for k, v in c.items() if k not in ("lora_of", "recipe")}
                                                     for c in DEMO.taxonomy.model_dump()["configs"]]


# ---- perturbed datasets --------------------------------------------------------------------------

class _Image:
    shape = (32, 32)


class _ChunkSample(_Sample):
    image = _Image()


CHUNK_SAMPLES: list[Any] = [_ChunkSample("dsa", f"s{i}") for i in range(3)]


def chunk_fp(suite: Suite, samples: list[Any] = CHUNK_SAMPLES) -> str:
    return tp.chunk_inputs(tp.chunk_spec(suite, "dsa", "ct", "gaussian_noise", 4), samples).fingerprint


CHUNK_MOVES: dict[str, Any] = {
    "perturbations.bands": {**{k: list(v) for k, v in DEMO.perturbations.bands.items()}, 4: [0.61, 0.68]},
    "perturbations.calibration_subset": 2,
    "perturbations.calibration_mode": "fixed",
    "perturbations.calibration_by_dataset": {"dsa": "reference"},
    "perturbations.levels": [3, 4],  # level 4's anchor level (ChunkSpec.previous): its lower levels and their bands
    "seed": 1,
}
CHUNK_STILL: dict[str, Any] = {"workers": 1, "perturbations.include_off_band": True,
                               "perturbations.calibration_by_dataset": {"other": "reference"},
                               "perturbations.levels": [2, 4, 5]}  # a higher level anchors nothing below it
CHUNK_NOT_AN_INPUT: dict[str, str] = {
    "perturbations.include": "which chunks exist", "perturbations.exclude": "which chunks exist",
    "perturbations.types_by_modality": "which chunks exist",
    "perturbations.types_by_dataset": "which chunks exist",
    "perturbations.split": "enters as the chunk's samples", "perturbations.max_samples": "enters as the samples",
}


def test_every_perturbation_setting_is_classified() -> None:
    classified = {k.split(".")[1] for k in (*CHUNK_MOVES, *CHUNK_STILL, *CHUNK_NOT_AN_INPUT)
                  if k.startswith("perturbations.")}
    assert set(PerturbationConfig.model_fields) == classified, "classify the new perturbation settings in this test"


@pytest.mark.parametrize("path", sorted(CHUNK_MOVES))
def test_perturbation_setting_moves_the_chunk(path: str) -> None:
    assert chunk_fp(changed(DEMO, path, CHUNK_MOVES[path])) != chunk_fp(DEMO)


def test_perturbation_unrelated_settings_and_samples() -> None:
    for path, value in CHUNK_STILL.items():
        assert chunk_fp(changed(DEMO, path, value)) == chunk_fp(DEMO), path
    assert chunk_fp(DEMO, [*CHUNK_SAMPLES[:2], _ChunkSample("dsa", "s2", "changed pixels")]) != chunk_fp(DEMO)


# ---- the suite's own settings and the core -------------------------------------------------------

SUITE_NOT_AN_INPUT = {
    "name": "a location", "results_dir": "a location", "mart_path": "a location", "overlays": "read at load",
    "protocol": "resolved into each model's settings when the suite loads", "workers": "execution (tested: STILL)",
    "modalities": "which partitions exist", "demo": "enters as the samples and records",
    "datasets": "enter as the samples", "splits": "enter as the samples", "max_pixels": "enters as the samples",
    "perturbations": "classified above", "segmentation": "classified above", "vlm": "classified above",
    "taxonomy": "classified above", "max_error_share": "a check's threshold", "stats": "the report's statistics",
    "seed": "tested: moves attacks, VLM, taxonomy and chunks",
}


def test_every_suite_setting_is_classified() -> None:
    assert set(Suite.model_fields) == set(SUITE_NOT_AN_INPUT), "classify the new Suite fields in this test"


def test_every_field_is_in_the_payload() -> None:
    """The payload holds every field (an ``added`` one left out only at its legacy value): a
    field cannot be declared and then forgotten by the fingerprint."""
    for cls_inputs in (seg.clean_inputs(DEMO, DEMO.segmentation.models[0], "ck", "fp32", SAMPLES.values(), UNUSABLE),
                       vlm.vlm_inputs(DEMO, "ck", None, DEMO.vlm.models[0], "ct", level=4, manifest=MANIFEST),
                       tp.chunk_inputs(tp.chunk_spec(DEMO, "dsa", "ct", "gaussian_noise", 4), CHUNK_SAMPLES)):
        assert isinstance(cls_inputs, PartitionInputs)
        payload = cls_inputs.payload()
        n_present = len(payload)
        n_fields = len(dataclasses.fields(cls_inputs))
        n_legacy = sum(1 for f in dataclasses.fields(cls_inputs)
                       if "medrobust.legacy" in f.metadata and getattr(cls_inputs, f.name) == f.metadata["medrobust.legacy"])
        assert n_present == n_fields - n_legacy


def test_fingerprints_of_the_demo_are_those_written_before_the_inputs_were_dataclasses() -> None:
    """The payloads keep the form of the fingerprints stored before issue 45 (a list in field order
    for the evaluation tracks, a mapping for manifest chunks), so stored results stay current."""
    m = DEMO.segmentation.models[0]
    assert m.family == "sam" and m.strategy == "pretrained"
    got = seg.clean_inputs(DEMO, m, "ck", "fp32", SAMPLES.values(), UNUSABLE).fingerprint
    want = digest([1, "ck", DEMO.segmentation.prompt.protocol, sorted((k[1], s.content_hash()) for k, s in SAMPLES.items()),
                   "fp32", [[["dsb", "s9"], "quarantined:unreadable"]]])
    assert got == want
    ch = tp.chunk_spec(DEMO, "dsa", "ct", "gaussian_noise", 4)
    rows = [{"sample_id": "x"}]
    assert tp.error_chunk_inputs(ch, rows).fingerprint == digest({"version": tp.CALIBRATION_VERSION,
                                                                   "chunk": tp._chunk_fields(ch), "errors": rows})


def test_canonical_form_is_compact_and_sorted() -> None:
    from medrobust_lib.hashing import canonical_json

    assert canonical_json({"b": 1, "a": [1, (2, None)], "p": Path("x")}) == '{"a":[1,[2,null]],"b":1,"p":"x"}'
