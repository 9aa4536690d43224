"""``medrobust convert llava``: original ``llava`` code-base checkpoints -> transformers LLaVA.

The tiny source checkpoints are written in the released layout (keys and config fields as the
llava / LLaVA-Med / LLaVA-Rad code reads them: ``model.mm_projector.{0,2}``, ``model.embed_tokens``,
``lm_head``, ``mm_vision_tower`` by name, ``mm_vision_select_layer``, ...). The converted model's
logits are compared with a re-implementation of the original forward pass
(``LlavaMetaForCausalLM.encode_images`` + ``prepare_inputs_labels_for_multimodal``): the CLIP
hidden state at ``mm_vision_select_layer`` without CLS, the Linear-GELU-Linear projector, the
image features spliced between the text embeddings, the Mistral/Llama LM.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from typer.testing import CliRunner

from medrobust_lib.models.convert_llava import NotConvertible, convert_llava
from medrobust_lib.models.hf_vlm import HFVisionLanguageModel
from tests.models.vlm_twins import Tokens, build_tokenizer

TOWER_NAME = "openai/clip-vit-large-patch14-336"


def _clip_folder(root: Path) -> Path:
    from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModel

    cfg = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=2,
                           image_size=32, patch_size=8, projection_dim=16)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(5)
        model = CLIPVisionModel(cfg)
    out = root / "clip"
    model.save_pretrained(out, safe_serialization=True)
    CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(out)
    return out


def _original(root: Path, *, arch: str = "LlavaMistralForCausalLM", fmt: str = "safetensors",
              tower_in_ckpt: Path | None = None, **cfg_over: Any) -> Path:
    """A tiny checkpoint in the original llava layout (LLaVA-Med v1.5: Mistral, mlp2x_gelu, pad)."""
    from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

    tok = build_tokenizer(Tokens("<s>", "</s>", "<unk>", "<unk>"), None)
    text_cls, model_cls = ((MistralConfig, MistralForCausalLM) if arch == "LlavaMistralForCausalLM"
                           else (LlamaConfig, LlamaForCausalLM))
    tcfg = text_cls(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                    bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(7)
        lm = model_cls(tcfg)
        proj = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 64))
    state = {k: v.detach().clone() for k, v in lm.state_dict().items()}
    state.update({f"model.mm_projector.{k}": v.detach().clone() for k, v in proj.state_dict().items()})
    if tower_in_ckpt is not None:
        from safetensors.torch import load_file

        clip = load_file(str(tower_in_ckpt / "model.safetensors"))
        # the released layout: CLIPVisionModel keys (vision_model.*) under model.vision_tower.vision_tower
        state.update({f"model.vision_tower.vision_tower.vision_model.{k.removeprefix('vision_model.')}": v
                      for k, v in clip.items()})
    out = root / f"orig-{arch}-{fmt}"
    out.mkdir(parents=True)
    if fmt == "safetensors":  # sharded like the release (model-0000N-of-0000M.safetensors)
        keys = sorted(state)
        half = len(keys) // 2
        save_file({k: state[k].contiguous() for k in keys[:half]}, str(out / "model-00001-of-00002.safetensors"))
        save_file({k: state[k].contiguous() for k in keys[half:]}, str(out / "model-00002-of-00002.safetensors"))
    else:
        torch.save(state, out / "pytorch_model.bin")
    cfg = tcfg.to_dict()
    cfg.update({"architectures": [arch], "model_type": "llava_mistral" if "Mistral" in arch else "llava",
                "mm_vision_tower": TOWER_NAME, "mm_projector_type": "mlp2x_gelu", "mm_hidden_size": 32,
                "mm_vision_select_layer": -2, "mm_vision_select_feature": "patch", "mm_use_im_start_end": False,
                "mm_use_im_patch_token": False, "mm_patch_merge_type": "flat", "image_aspect_ratio": "pad",
                "tune_mm_mlp_adapter": False, "freeze_mm_mlp_adapter": False, "use_mm_proj": True,
                "tokenizer_model_max_length": 2048, "tokenizer_padding_side": "right"})
    cfg.update(cfg_over)
    (out / "config.json").write_text(json.dumps(cfg), encoding="utf-8")
    tok.save_pretrained(out)
    return out


def _reference_logits(src: Path, clip_dir: Path, pixel_values: torch.Tensor, before: list[int],
                      after: list[int]) -> torch.Tensor:
    """The original forward: LM(embed(before) ++ proj(CLIP hidden[-2][:, 1:]) ++ embed(after))."""
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM, CLIPVisionModel

    state: dict[str, torch.Tensor] = {}
    for f in sorted(src.glob("*.safetensors")):
        state.update(load_file(str(f)))
    cfg = json.loads((src / "config.json").read_text())
    mt = "mistral" if cfg["architectures"] == ["LlavaMistralForCausalLM"] else "llama"
    tcfg = AutoConfig.for_model(mt, **{k: v for k, v in cfg.items() if not k.startswith("mm_") and k not in (
        "architectures", "model_type", "image_aspect_ratio", "tune_mm_mlp_adapter", "freeze_mm_mlp_adapter",
        "use_mm_proj", "tokenizer_model_max_length", "tokenizer_padding_side", "transformers_version", "dtype")})
    lm = AutoModelForCausalLM.from_config(tcfg).eval()
    lm.load_state_dict({k: v for k, v in state.items() if not k.startswith("model.mm_projector")}, strict=True)
    clip = CLIPVisionModel.from_pretrained(clip_dir).eval()
    with torch.no_grad():
        feats = clip(pixel_values, output_hidden_states=True).hidden_states[cfg["mm_vision_select_layer"]][:, 1:]
        h = torch.nn.functional.linear(feats, state["model.mm_projector.0.weight"], state["model.mm_projector.0.bias"])
        h = torch.nn.functional.gelu(h)
        h = torch.nn.functional.linear(h, state["model.mm_projector.2.weight"], state["model.mm_projector.2.bias"])
        emb = lm.get_input_embeddings()
        seq = torch.cat([emb(torch.tensor(before)), h[0], emb(torch.tensor(after))])[None]
        return lm(inputs_embeds=seq).logits[0, -1]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("convert_llava")


@pytest.fixture(scope="module")
def clip_dir(root: Path) -> Path:
    return _clip_folder(root)


@pytest.mark.parametrize("arch", ["LlavaMistralForCausalLM", "LlavaLlamaForCausalLM"])
def test_converted_logits_equal_the_original_forward(root: Path, clip_dir: Path, arch: str) -> None:
    src = _original(root, arch=arch)
    dst = root / f"hf-{arch}"
    report = convert_llava(src, dst, vision_tower=clip_dir)
    assert report.text_model_type == ("mistral" if "Mistral" in arch else "llama")
    assert not list(dst.glob("*.bin")) and list(dst.glob("*.safetensors"))
    vlm = HFVisionLanguageModel(dst)
    assert type(vlm.model).__name__ == "LlavaForConditionalGeneration"
    img = np.random.default_rng(0).random((24, 40, 3)).astype(np.float32)  # not square: padded like the original
    batch = vlm._inputs([img], ["is there a lesion ?"])
    ids = batch["input_ids"][0].tolist()
    pos = [i for i, t in enumerate(ids) if t == report.image_token_id]
    assert len(pos) == 16 and pos == list(range(pos[0], pos[0] + 16))  # (32/8)^2 patches, CLS dropped
    with torch.no_grad():
        got = vlm.model(**batch).logits[0, -1]
    ref = _reference_logits(src, clip_dir, batch["pixel_values"], ids[: pos[0]], ids[pos[-1] + 1:])
    n = ref.shape[0]
    assert got.shape[0] == n + 1  # one added token: <image>
    torch.testing.assert_close(got[:n], ref, atol=1e-4, rtol=1e-4)
    text = vlm.chat_prompt("is there a lesion ?", with_image=True)
    if "Mistral" in arch:  # LLaVA-Med v1.5's conv_mistral_instruct
        assert text == "[INST] <image>\nis there a lesion ? [/INST]"
    else:  # conv_vicuna_v1
        assert text.endswith(" USER: <image>\nis there a lesion ? ASSISTANT:") and text.startswith("A chat between")
    assert vlm.processor.image_processor.do_pad  # image_aspect_ratio: pad
    assert vlm.generate([img, None], ["is there a lesion ?"] * 2, max_new_tokens=3)


def test_pickle_checkpoint_and_tower_inside_the_folder(root: Path, clip_dir: Path) -> None:
    src = _original(root, fmt="bin", tower_in_ckpt=clip_dir)
    report = convert_llava(src, root / "hf-bin", vision_tower=clip_dir)
    assert report.vision_tower_source == "checkpoint"
    from transformers import LlavaForConditionalGeneration

    got = LlavaForConditionalGeneration.from_pretrained(root / "hf-bin").state_dict()
    orig = torch.load(src / "pytorch_model.bin", weights_only=True)
    assert torch.equal(got["model.multi_modal_projector.linear_2.weight"], orig["model.mm_projector.2.weight"])
    assert torch.equal(got["model.language_model.layers.1.mlp.down_proj.weight"],
                       orig["model.layers.1.mlp.down_proj.weight"])
    k = "model.vision_tower.encoder.layers.0.self_attn.q_proj.weight"
    assert torch.equal(got[k], orig["model.vision_tower.vision_tower.vision_model.encoder.layers.0.self_attn.q_proj.weight"])


@pytest.mark.parametrize(("over", "files", "match"), [
    ({"mm_vision_tower": "biomedclip_cxr_518",
      "mm_vision_tower_config": "llava/model/multimodal_encoder/open_clip_encoder/model_configs/biomedclip_cxr_518.json",
      "mm_vision_tower_checkpoint": "biomedclipcxr_518_checkpoint.pt"}, {}, "open_clip/timm"),
    ({"mm_projector_type": "linear"}, {}, "Linear-GELU-Linear"),
    ({"mm_use_im_start_end": True}, {}, "im_start"),
    ({}, {"adapter_config.json": "{}", "non_lora_trainables.bin": ""}, "LoRA release"),
])
def test_unfaithful_conversions_are_refused(root: Path, clip_dir: Path, over: dict[str, Any], files: dict[str, str],
                                            match: str) -> None:
    src = _original(root / f"refuse-{match[:6].replace('/', '_')}", **over)
    for name, text in files.items():
        (src / name).write_text(text)
    dst = root / "never"
    with pytest.raises(NotConvertible, match=match):
        convert_llava(src, dst, vision_tower=clip_dir)
    assert not dst.exists()


def test_cli_converts_and_refuses_with_exit_2(root: Path, clip_dir: Path) -> None:
    from medrobust_cli import app

    src = _original(root / "cli")
    runner = CliRunner()
    res = runner.invoke(app, ["convert", "llava", str(src), str(root / "cli-out"), "--vision-tower", str(clip_dir)])
    assert res.exit_code == 0, res.output
    assert (root / "cli-out" / "config.json").is_file()
    res = runner.invoke(app, ["convert", "llava", str(src), str(root / "cli-none")])
    assert res.exit_code == 2
    assert "referenced by name" in res.output and TOWER_NAME in res.output
    rad = _original(root / "cli-rad", arch="LlavaLlamaForCausalLM", mm_vision_tower="biomedclip_cxr_518",
                    mm_vision_tower_config="biomedclip_cxr_518.json")
    res = runner.invoke(app, ["convert", "llava", str(rad), str(root / "cli-rad-out"), "--vision-tower", str(clip_dir)])
    assert res.exit_code == 2 and "cannot be converted faithfully" in res.output
