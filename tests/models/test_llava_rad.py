"""LLaVA-Rad (``kind: llava_rad``): tiny twins written in the released layouts, checked against a
re-implementation of the original forward written here from github.com/microsoft/LLaVA-Rad.

The twins use the real file and key names: ``config.json`` of ``LlavaLlamaForCausalLM`` with the
``mm_*`` keys the training scripts set (``scripts/finetune_lora.sh``: ``biomedclip_cxr_518``, its
config path and ``biomedclipcxr_518_checkpoint.pt``, ``mlp2x_gelu``, select layer -2); the LoRA
release as ``model/builder.py`` reads it (``adapter_config.json`` + ``adapter_model.bin`` saved by
peft over the LLaMA, ``non_lora_trainables.bin`` with ``base_model.model.model.mm_projector.*``)
over a base LLaMA folder; a merged folder (``model.*``, ``lm_head``, ``model.mm_projector.*`` and
the tower saved under ``model.vision_tower.vision_tower.vit.*``); the tower as an open_clip
training checkpoint (``state_dict`` with ``module.visual.trunk.*``, ``module.visual.head.*``,
``module.text.*``) and an open_clip model config with ``vision_cfg.timm_model_name``. Dimensions
are tiny: timm's ``test_vit`` (64 wide, 6 blocks, 160 px, patch 16) stands in for the released
trunk, a 2-layer LLaMA for Vicuna-7B.

The reference (``_reference_logits``) follows the original code, not the adapter: the timm trunk
run as ``VisionTower.forward`` (patch_embed, _pos_embed, norm_pre, every block's output kept),
``hidden_states[-2][:, 1:]``, Linear-GELU-Linear, the embeddings of the text pieces around the
-200 sentinel of ``tokenizer_image_token``, LLaMA; the LoRA merged by hand (W + alpha/r B A).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from medrobust_lib.models import base
from medrobust_lib.models.hf_vlm import ModelNotAvailable
from medrobust_lib.models.llava_rad import LlavaRadVLM
from tests.models.vlm_twins import Tokens, build_tokenizer

TOWER = "biomedclip_cxr_518"
TOWER_CONFIG = "llava/model/multimodal_encoder/open_clip_encoder/model_configs/biomedclip_cxr_518.json"
TOWER_CKPT = "biomedclipcxr_518_checkpoint.pt"
SYSTEM = ("A chat between a curious user and an artificial intelligence assistant. "
          "The assistant gives helpful, detailed, and polite answers to the user's questions.")
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
R, ALPHA = 4, 8


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Any:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _jitter(module: torch.nn.Module, seed: int, scale: float = 0.05) -> None:
    """Move every parameter off its initial value (LayerNorms of 1/0 would hide a wrong norm)."""
    g = _seeded(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)


def _tokenizer() -> Any:
    from tokenizers import processors

    tok = build_tokenizer(Tokens("<s>", "</s>", "<unk>", "<unk>"), None)
    # LLaMA's tokenizer prepends BOS to every encoding (tokenizer_image_token relies on it)
    tok._tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A",
                                                                  special_tokens=[("<s>", tok.bos_token_id)])
    return tok


def _trunk(seed: int) -> torch.nn.Module:
    import timm

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        vit = timm.create_model("test_vit", pretrained=False)
    vit.reset_classifier(0)  # open_clip's TimmModel with timm_pool "" and timm_proj "linear"
    _jitter(vit, seed + 1)
    return vit.eval()


def _tower_files(folder: Path, trunk: torch.nn.Module) -> None:
    cfg = {"embed_dim": 16,
           "vision_cfg": {"timm_model_name": "test_vit", "timm_model_pretrained": False, "timm_pool": "",
                          "timm_proj": "linear", "image_size": 160},
           "text_cfg": {"hf_model_name": "microsoft/BiomedNLP-PubMedBERT-base-uncased-abstract",
                        "hf_tokenizer_name": "microsoft/BiomedNLP-PubMedBERT-base-uncased-abstract",
                        "hf_proj_type": "mlp", "hf_pooler_type": "cls_last_hidden_state_pooler",
                        "context_length": 256}}
    (folder / "biomedclip_cxr_518.json").write_text(json.dumps(cfg), encoding="utf-8")
    g = _seeded(3)
    state = {f"module.visual.trunk.{k}": v.detach().clone() for k, v in trunk.state_dict().items()}
    state["module.visual.head.proj.weight"] = torch.randn(16, 64, generator=g)
    state["module.text.proj.0.weight"] = torch.randn(8, 8, generator=g)
    state["module.text.transformer.pooler.dense.weight"] = torch.randn(8, 8, generator=g)
    state["module.logit_scale"] = torch.tensor(4.6)
    torch.save({"epoch": 1, "name": "biomedclip_cxr_518", "state_dict": state}, folder / TOWER_CKPT)


def _llama(tok: Any, seed: int) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=None)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        lm = LlamaForCausalLM(cfg)
    _jitter(lm, seed + 1, 0.02)
    return lm.eval()


def _projector(seed: int) -> dict[str, torch.Tensor]:
    g = _seeded(seed)
    return {"0.weight": torch.randn(32, 64, generator=g) * 0.1, "0.bias": torch.randn(32, generator=g) * 0.1,
            "2.weight": torch.randn(32, 32, generator=g) * 0.1, "2.bias": torch.randn(32, generator=g) * 0.1}


def _config(lm: torch.nn.Module) -> dict[str, Any]:
    cfg = lm.config.to_dict()
    cfg.update({"architectures": ["LlavaLlamaForCausalLM"], "model_type": "llava", "torch_dtype": "float32",
                "mm_vision_tower": TOWER, "mm_vision_tower_config": TOWER_CONFIG,
                "mm_vision_tower_checkpoint": TOWER_CKPT, "mm_projector_type": "mlp2x_gelu", "mm_hidden_size": 64,
                "mm_vision_select_layer": -2, "mm_vision_select_feature": "patch", "mm_use_im_start_end": False,
                "mm_use_im_patch_token": False, "image_aspect_ratio": "square", "image_grid_pinpoints": None,
                "tune_mm_mlp_adapter": False, "freeze_mm_mlp_adapter": False, "use_mm_proj": True,
                "use_cache": True, "tokenizer_model_max_length": 2048, "tokenizer_padding_side": "right"})
    cfg.pop("dtype", None)
    return cfg


@pytest.fixture(scope="module")
def twins(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """{"base", "release", "merged": folders; "trunk", "lm", "proj", "lora": the weights written}."""
    from peft import LoraConfig, get_peft_model

    root = tmp_path_factory.mktemp("llava_rad")
    tok = _tokenizer()
    trunk = _trunk(11)
    lm = _llama(tok, 21)
    proj = _projector(31)

    base_dir = root / "vicuna-7b-v1.5"  # the base LLaMA: save_pretrained layout + tokenizer
    lm.save_pretrained(base_dir, safe_serialization=True)
    tok.save_pretrained(base_dir)

    release = root / "llava-rad"  # the LoRA release
    release.mkdir()
    wrapped = get_peft_model(_llama(tok, 21), LoraConfig(r=R, lora_alpha=ALPHA, target_modules=LORA_TARGETS,
                                                         lora_dropout=0.05, bias="none", task_type="CAUSAL_LM"))
    g = _seeded(41)
    with torch.no_grad():
        for name, p in wrapped.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    wrapped.save_pretrained(release, safe_serialization=False)
    lora = torch.load(release / "adapter_model.bin", weights_only=True)
    torch.save({f"base_model.model.model.mm_projector.{k}": v for k, v in proj.items()},
               release / "non_lora_trainables.bin")
    (release / "config.json").write_text(json.dumps(_config(lm)), encoding="utf-8")
    _tower_files(release, trunk)

    merged = root / "llava-rad-merged"  # scripts/merge_lora_weights.py's output
    merged.mkdir()
    merged_lm = _merge(lm.state_dict(), lora)
    state = dict(merged_lm)
    state.update({f"model.mm_projector.{k}": v for k, v in proj.items()})
    state.update({f"model.vision_tower.vision_tower.vit.{k}": v.detach().clone() for k, v in trunk.state_dict().items()})
    keys = sorted(state)
    save_file({k: state[k].contiguous() for k in keys[: len(keys) // 2]}, str(merged / "model-00001-of-00002.safetensors"))
    save_file({k: state[k].contiguous() for k in keys[len(keys) // 2:]}, str(merged / "model-00002-of-00002.safetensors"))
    (merged / "config.json").write_text(json.dumps(_config(lm)), encoding="utf-8")
    tok.save_pretrained(merged)
    _tower_files(merged, trunk)
    return {"root": root, "base": base_dir, "release": release, "merged": merged, "trunk": trunk, "lm": lm,
            "proj": proj, "lora": lora, "merged_lm": merged_lm, "tok": tok}


def _merge(lm_state: dict[str, torch.Tensor], lora: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """W + (alpha / r) B A for every LoRA pair of the peft file (keys base_model.model.<module>.lora_A.weight)."""
    out = {k: v.detach().clone() for k, v in lm_state.items()}
    n = 0
    for key, a in lora.items():
        if ".lora_A." not in key:
            continue
        module = key.removeprefix("base_model.model.").split(".lora_A.")[0]
        b = lora[key.replace(".lora_A.", ".lora_B.")]
        out[f"{module}.weight"] = out[f"{module}.weight"] + (ALPHA / R) * (b @ a)
        n += 1
    assert n == 2 * len(LORA_TARGETS)  # two layers
    return out


def _reference_pixels(image: np.ndarray) -> torch.Tensor:
    """open_clip's eval transform (image_transform, is_train=False) at 160 px: shortest side to
    160 (bicubic), centre crop, RGB, ToTensor, OpenAI mean/std; the image enters as uint8 RGB."""
    from PIL import Image
    from torchvision import transforms as T

    u8 = np.round(np.clip(image, 0, 1) * 255).astype(np.uint8)
    pil = Image.fromarray(np.repeat(u8[..., None], 3, axis=2) if u8.ndim == 2 else u8).convert("RGB")
    tf = T.Compose([T.Resize(160, interpolation=T.InterpolationMode.BICUBIC), T.CenterCrop(160), T.ToTensor(),
                    T.Normalize((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711))])
    out: torch.Tensor = tf(pil)
    return out


def _reference_ids(tok: Any, question: str) -> list[int]:
    """conv_vicuna_v1's prompt, then tokenizer_image_token (pieces with BOS, BOS once, -200 between)."""
    prompt = f"{SYSTEM} USER: <image>\n{question} ASSISTANT:"
    pieces = [tok(p).input_ids for p in prompt.split("<image>")]
    assert pieces[0][0] == tok.bos_token_id
    return [pieces[0][0], *pieces[0][1:], -200, *pieces[1][1:]]


def _reference_logits(tw: dict[str, Any], lm_state: dict[str, torch.Tensor], image: np.ndarray, question: str
                      ) -> torch.Tensor:
    from transformers import LlamaForCausalLM

    vit = tw["trunk"]
    with torch.no_grad():
        h = vit.norm_pre(vit._pos_embed(vit.patch_embed(_reference_pixels(image)[None])))
        states = [h]
        for block in vit.blocks:
            h = block(h)
            states.append(h)
        feats = states[-2][:, 1:]
        p = tw["proj"]
        x = torch.nn.functional.gelu(torch.nn.functional.linear(feats, p["0.weight"], p["0.bias"]))
        x = torch.nn.functional.linear(x, p["2.weight"], p["2.bias"])[0]
        lm = LlamaForCausalLM(tw["lm"].config).eval()
        lm.load_state_dict(lm_state, strict=True)
        ids = _reference_ids(tw["tok"], question)
        at = ids.index(-200)
        emb = lm.get_input_embeddings()
        seq = torch.cat([emb(torch.tensor(ids[:at])), x, emb(torch.tensor(ids[at + 1:]))])[None]
        out: torch.Tensor = lm(inputs_embeds=seq).logits[0, -1]
        return out


IMG = np.random.default_rng(0).random((120, 200)).astype(np.float32)  # not square: resized + centre-cropped


@pytest.mark.parametrize("layout", ["release", "merged"])
def test_logits_equal_the_original_forward(twins: dict[str, Any], layout: str) -> None:
    vlm = (LlavaRadVLM(twins["base"], release=twins["release"]) if layout == "release"
           else LlavaRadVLM(twins["merged"]))
    assert isinstance(vlm, base.VisionLanguageModel)
    q = "is there a lesion ?"
    ids = vlm.input_ids([q], True)[0]
    assert ids == _reference_ids(twins["tok"], q)
    embeds, mask = vlm._batch([IMG], [q])
    assert embeds.shape[1] == len(ids) - 1 + 100 and bool(mask.all())  # (160/16)^2 patches, CLS dropped
    got = vlm.last_logits(embeds, mask)[0]
    ref = _reference_logits(twins, twins["merged_lm"], IMG, q)
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=0)
    # the LoRA matters: without it the logits are far from the reference
    unmerged = _reference_logits(twins, {k: v.detach() for k, v in twins["lm"].state_dict().items()}, IMG, q)
    assert float((unmerged - ref).abs().max()) > 1e-2
    assert vlm.n_vision_calls == 1
    if layout == "release":
        assert vlm.adapter_hash is not None and len(vlm.adapter_hash) == 16


def test_preprocessing_matches_open_clips_eval_transform(twins: dict[str, Any]) -> None:
    vlm = LlavaRadVLM(twins["merged"])
    for img in (IMG, np.random.default_rng(1).random((200, 90, 3)).astype(np.float32)):
        torch.testing.assert_close(vlm.pixels([img])[0], _reference_pixels(img), atol=1e-6, rtol=0)


def test_batches_scores_variants_and_generation_agree(twins: dict[str, Any]) -> None:
    vlm = LlavaRadVLM(twins["base"], release=twins["release"])
    qs = ["is there a lesion ?", "describe the findings in one sentence ."]  # different lengths: left padding
    one = [vlm.score([IMG], [q], ["yes", "no"])[0] for q in qs]
    both = vlm.score([IMG, IMG], qs, ["yes", "no"])
    for a, b in zip(one, both, strict=True):
        assert a.keys() == {"yes", "no"} and all(v <= 0 for v in a.values())
        assert all(abs(a[k] - b[k]) < 1e-5 for k in a)
    calls = vlm.n_vision_calls
    var = vlm.score_variants(IMG, qs, ["yes", "no"])
    assert vlm.n_vision_calls == calls + 1  # the tower ran once for both prompts
    assert all(abs(var[i][k] - both[i][k]) < 1e-5 for i in range(2) for k in ("yes", "no"))
    capped = vlm.generate_capped([IMG, IMG, None], [*qs, qs[0]], max_new_tokens=3)
    alone = [vlm.generate_capped([im], [q], max_new_tokens=3)[0] for im, q in zip([IMG, IMG, None], [*qs, qs[0]],
                                                                                     strict=True)]
    assert capped == alone
    # the first generated token is the arg-max of the scored logits
    embeds, mask = vlm._batch([IMG], [qs[0]])
    first = int(vlm.last_logits(embeds, mask)[0].argmax())
    gen = vlm.lm.generate(inputs_embeds=embeds, attention_mask=mask, max_new_tokens=1, do_sample=False,
                          pad_token_id=vlm.tokenizer.pad_token_id)
    assert int(gen[0, -1]) == first
    assert vlm.score([None], [qs[0]], ["yes", "no"])[0].keys() == {"yes", "no"}  # text-only prompt


def test_registry_and_suite_build_it(twins: dict[str, Any]) -> None:
    from medrobust_lib.config.vlm import VLMModelConfig
    from medrobust_lib.models.factory import VLMInputs, build_vlm

    m = VLMModelConfig(id="llava-rad", kind="llava_rad", source=str(twins["base"]), adapter=str(twins["release"]))
    vlm = build_vlm(m, VLMInputs(source=str(twins["base"]), adapter=str(twins["release"])))
    assert isinstance(vlm, LlavaRadVLM) and vlm.model_id == "llava-rad"
    with pytest.raises(ValueError, match="names no source"):
        build_vlm(VLMModelConfig(id="x", kind="llava_rad"), VLMInputs())


def _copy(twins: dict[str, Any], name: str, which: str = "release") -> Path:
    dst = Path(twins["root"]) / name
    if not dst.exists():
        shutil.copytree(twins[which], dst)
    return dst


def test_missing_files_fail_with_one_line_naming_them(twins: dict[str, Any]) -> None:
    gone = _copy(twins, "no-tower")
    (gone / TOWER_CKPT).unlink()
    with pytest.raises(ModelNotAvailable, match=r"vision tower checkpoint not found: biomedclipcxr_518_checkpoint\.pt "
                                                r"in .*no-tower") as info:
        LlavaRadVLM(twins["base"], release=gone)
    assert "\n" not in str(info.value)
    nocfg = _copy(twins, "no-tower-config")
    (nocfg / "biomedclip_cxr_518.json").unlink()
    with pytest.raises(ModelNotAvailable, match=r"vision tower config not found: biomedclip_cxr_518\.json, "
                                                r"biomedclipcxr_518\.json in"):
        LlavaRadVLM(twins["base"], release=nocfg)
    # the release's hub name for the tower config is found too
    (nocfg / "biomedclipcxr_518.json").write_text((twins["release"] / "biomedclip_cxr_518.json").read_text())
    assert LlavaRadVLM(twins["base"], release=nocfg).image_size == 160
    with pytest.raises(ModelNotAvailable, match="LLaVA-Rad folder not found"):
        LlavaRadVLM(Path(twins["root"]) / "nowhere")
    with pytest.raises(ValueError, match="LoRA release over a base LLaMA"):
        LlavaRadVLM(twins["release"])
    nolora = _copy(twins, "no-lora")
    (nolora / "adapter_model.bin").unlink()
    with pytest.raises(ModelNotAvailable, match="lacks adapter_model.safetensors / adapter_model.bin"):
        LlavaRadVLM(twins["base"], release=nolora)


def test_loading_is_strict_and_names_the_keys(twins: dict[str, Any]) -> None:
    extra = _copy(twins, "tower-extra")
    ckpt = torch.load(extra / TOWER_CKPT, weights_only=True)
    ckpt["state_dict"]["module.visual.trunk.blocks.9.norm1.weight"] = torch.ones(64)
    del ckpt["state_dict"]["module.visual.trunk.norm.weight"]
    torch.save(ckpt, extra / TOWER_CKPT)
    with pytest.raises(ValueError, match=r"vision tower .*1 missing \['norm.weight'\].*1 unexpected "
                                         r"\['blocks.9.norm1.weight'\]"):
        LlavaRadVLM(twins["base"], release=extra)
    proj = _copy(twins, "proj-missing")
    torch.save({"base_model.model.model.mm_projector.0.weight": twins["proj"]["0.weight"]},
               proj / "non_lora_trainables.bin")
    with pytest.raises(ValueError, match=r"projector .*3 missing \['0.bias', '2.bias', '2.weight'\]"):
        LlavaRadVLM(twins["base"], release=proj)
    merged = _copy(twins, "lm-missing", "merged")
    from safetensors.torch import load_file

    shard = merged / "model-00001-of-00002.safetensors"
    state = load_file(str(shard))
    dropped = sorted(k for k in state if k.startswith("model.layers."))[0]
    del state[dropped]
    save_file(state, str(shard))
    with pytest.raises(ValueError, match=rf"language model .*1 missing \['{dropped}'\]"):
        LlavaRadVLM(merged)


def test_convert_llava_points_llava_rad_to_the_direct_loader(twins: dict[str, Any]) -> None:
    from medrobust_lib.models.convert_llava import NotConvertible, convert_llava

    with pytest.raises(NotConvertible, match="kind: llava_rad"):
        convert_llava(twins["merged"], Path(twins["root"]) / "never")
    with pytest.raises(NotConvertible, match="kind: llava_rad"):
        convert_llava(twins["release"], Path(twins["root"]) / "never")
