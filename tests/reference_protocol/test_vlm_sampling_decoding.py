"""The reference's VLM protocol, as ``tools/reference_protocol_fixtures.py`` read it by running
``VLM/generate_perturbation.py`` and ``VLM/eval_vlm_perturbation.py`` (fixture
``vlm_protocol_reference.json``): the seeded record draw, the type sets per VLM dataset, and each
model's decoding (system prompt, temperature) in the overlay, in the request bodies and in the rows."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from medrobust_lib.config import load_suite
from medrobust_lib.config.vlm import (
    REFERENCE_TYPE_NAMES,
    ApiSettings,
    VLMModelConfig,
    reference_vlm_types,
)
from medrobust_lib.models.api_vlm import ApiVLM
from medrobust_lib.perturb.spec import get_perturbation
from medrobust_lib.tracks.perturbed import selected_types
from medrobust_lib.tracks.vlm.evaluate import decoding_columns
from medrobust_lib.tracks.vlm.items import LoadedItems, VLMItem, sample_records
from tests.http_fakes import FakeEndpoint, completion, read_json, send_json, serving

ROOT = Path(__file__).resolve().parents[2]
REF = json.loads((Path(__file__).parent / "fixtures" / "vlm_protocol_reference.json").read_text())
SYSTEM = "You are an expert medical imaging specialist."


def _items(task: str, n: int) -> list[VLMItem]:
    return [VLMItem(task, f"{task}-{i}", "ds", f"s{i}", "ct", "q") for i in range(n)]


@pytest.mark.parametrize("draw", REF["draws"], ids=lambda d: str(d["population"]))
def test_the_record_draw_is_the_references(draw: dict[str, Any]) -> None:
    assert draw["generator"] == draw["evaluator"]  # the generator and the evaluator draw the same records
    loaded = LoadedItems([*_items("vqa_mc", draw["population"]), *_items("caption", 7)], {}, 0, [])
    got = sample_records(loaded, draw["n"], draw["seed"])
    mc = {it.record_id for it in got.items if it.task == "vqa_mc"}
    assert mc == {f"vqa_mc-{i}" for i in draw["generator"]}
    assert sum(it.task == "caption" for it in got.items) == 7  # each task its own population: 7 <= n, all kept


def test_the_overlay_draws_as_the_reference(tmp_path: Path) -> None:
    s = load_suite(_suite(tmp_path, {}))
    assert s.vlm.record_sample is not None
    assert (s.vlm.record_sample.n, s.vlm.record_sample.seed) == (REF["draws"][0]["n"], REF["draws"][0]["seed"])
    assert load_suite(ROOT / "configs" / "demo.yaml").vlm.record_sample is None  # the demo keeps every record


@pytest.mark.parametrize(("record_file", "ref_dataset"),
                         [("omnimedvqa", "omnimedvqa"), ("roco_captions", "roco"), ("mecovqa_grounding", "mecovqa")])
def test_type_sets_per_vlm_dataset_are_the_references(record_file: str, ref_dataset: str) -> None:
    ref = REF["types_by_dataset"][ref_dataset]
    assert reference_vlm_types(record_file) == [n for r in ref for n in REFERENCE_TYPE_NAMES[r]]
    for name in reference_vlm_types(record_file):
        get_perturbation(name)  # registered
    base = [n for r in REF["base_perturbations"] for n in REFERENCE_TYPE_NAMES[r]]
    assert reference_vlm_types("omnimedvqa") == base and len(REF["base_perturbations"]) == 11
    assert len(REF["modality_perturbations"]["XRAY"]) == 5



def test_window_level_is_the_references_own_type_for_xray_and_ct() -> None:
    assert REFERENCE_TYPE_NAMES["window_level"] == ("window_level",)
    assert "window_level" in reference_vlm_types("roco_captions")
    assert "window_level" not in reference_vlm_types("omnimedvqa")
    # the reference lists it for X-ray and CT alike
    listed = {m.lower() for m, types in REF["modality_perturbations"].items() if "window_level" in types}
    assert listed == {"xray", "ct"} == set(get_perturbation("window_level").modalities)


def test_types_by_dataset_replaces_the_modality_subset(tmp_path: Path) -> None:
    s = load_suite(_suite(tmp_path, {"perturbations": {"types_by_dataset": {
        "omni": reference_vlm_types("omnimedvqa"), "roco": reference_vlm_types("roco_captions")}}}))
    assert selected_types(s, "dermoscopy", 3, "omni") == sorted(reference_vlm_types("omnimedvqa"))
    assert "hair" in selected_types(s, "dermoscopy", 3, "isic")  # another dataset: the modality's subset
    assert "hair" not in selected_types(s, "dermoscopy", 3, "omni")
    xray = selected_types(s, "xray", 1, "roco")
    assert set(xray) == set(reference_vlm_types("roco_captions"))  # the reference's X-ray types, window_level too
    assert "window_level" in xray and "window_shift" not in xray
    ct = selected_types(s, "ct", 1, "roco")  # window_level applies to CT as well (the reference lists it for both)
    assert "window_level" in ct and "scatter" not in ct


def _suite(tmp_path: Path, body: dict[str, Any]) -> Path:
    shutil.copy(ROOT / "configs" / "reference_protocol.yaml", tmp_path / "reference_protocol.yaml")
    p = tmp_path / "suite.yaml"
    p.write_text(yaml.safe_dump({"overlays": ["reference_protocol.yaml"], "segmentation": {"models": []}, **body}))
    return p


API = {"id": "gpt", "kind": "api", "api": {"model": "gpt-4o", "base_url": "http://127.0.0.1:9/v1", "api_key_env": None}}


def test_overlay_decoding_is_the_references(tmp_path: Path) -> None:
    s = load_suite(_suite(tmp_path, {"vlm": {"models": [
        API, {"id": "own", "kind": "api", "system_prompt": "mine",
              "api": {"model": "m", "base_url": "http://127.0.0.1:9/v1", "api_key_env": None, "temperature": 0.0}},
        {"id": "medgemma", "source": "/m/medgemma", "system_prompt": REF["decoding"]["medgemma"]["system_prompt"]},
        {"id": "llava-med", "source": "/m/llava", "temperature": REF["decoding"]["model"]["temperature"]}]}}))
    gpt, own, medgemma, llava = s.vlm.models
    for ref in (REF["decoding"]["gpt4v"], REF["decoding"]["gemini"]):
        assert gpt.decoding() == {"system_prompt": ref["system_prompt"], "temperature": ref["temperature"],
                                  "top_p": None}
    assert own.decoding() == {"system_prompt": "mine", "temperature": 0.0, "top_p": None}  # explicit wins
    # an endpoint's max_tokens caps every task: the reference's 512 (default 256 would cut captions)
    assert gpt.api is not None and gpt.api.max_tokens == REF["decoding"]["gpt4v"]["max_new_tokens"] == 512
    assert REF["decoding"]["gemini"]["max_new_tokens"] == 512
    assert medgemma.decoding() == {"system_prompt": SYSTEM, "temperature": 0.0, "top_p": None}  # do_sample False
    assert REF["decoding"]["medgemma"]["do_sample"] is False
    assert llava.decoding() == {"system_prompt": None, "temperature": 0.2, "top_p": 1.0}
    assert REF["decoding"]["model"]["conv_template"] == "mistral_instruct"
    assert load_suite(ROOT / "configs" / "demo.yaml").vlm.models[0].decoding() == {
        "system_prompt": None, "temperature": 0.0, "top_p": None}  # greedy stays the default


def test_decoding_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="api.temperature"):
        VLMModelConfig.model_validate({**API, "temperature": 0.2})
    with pytest.raises(ValueError, match="llava_rad"):
        VLMModelConfig(id="rad", kind="llava_rad", source="/m", system_prompt="x")
    m = VLMModelConfig(id="m", source="/m")
    assert set(m.model_dump()) == set(VLMModelConfig.model_fields) - {"system_prompt", "temperature", "top_p"}
    assert "top_p" not in ApiSettings(model="x").model_dump()  # the demo's dumps (fingerprints) unchanged


class _Echo(FakeEndpoint):
    bodies: list[dict[str, Any]] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = read_json(self)
        type(self).bodies.append(body)
        send_json(self, completion("yes"))


def test_request_bodies_carry_the_decoding() -> None:
    _Echo.bodies = []
    with serving(_Echo) as url:
        m = VLMModelConfig(id="gpt", kind="api", system_prompt=SYSTEM,
                           api=ApiSettings(model="gpt-4o", base_url=url, api_key_env=None, temperature=0.2,
                                           top_p=0.9, seed=7, max_retries=0))
        assert m.api is not None
        with ApiVLM(m.api, system_prompt=m.system_prompt) as client:
            out = client.generate([np.zeros((4, 4), np.float32)], ["what?"])
        greedy = ApiSettings(model="g", base_url=url, api_key_env=None, max_retries=0)
        with ApiVLM(greedy) as client:
            client.generate([None], ["plain"])
    assert out[0].text == "yes"
    sampled, plain = _Echo.bodies
    assert sampled["messages"][0] == {"role": "system", "content": SYSTEM}
    assert sampled["messages"][1]["role"] == "user"
    assert (sampled["temperature"], sampled["top_p"], sampled["seed"]) == (0.2, 0.9, 7)
    assert [msg["role"] for msg in plain["messages"]] == ["user"]  # no system turn, no seed, no top_p
    assert "seed" not in plain and "top_p" not in plain and plain["temperature"] == 0.0


def test_rows_record_the_decoding() -> None:
    class R:
        m = VLMModelConfig(id="m", source="/m", temperature=0.7, top_p=0.8, system_prompt="s")
        decoding = {**m.decoding(), "decode_seed": 3}

    assert decoding_columns(R()) == {"system_prompt": "s", "temperature": 0.7, "top_p": 0.8, "decode_seed": 3}

    class Greedy:
        m = VLMModelConfig(id="g", source="/g")

    assert decoding_columns(Greedy()) == {"system_prompt": None, "temperature": 0.0, "top_p": None,
                                          "decode_seed": None}
