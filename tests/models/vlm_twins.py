"""Tiny random-weight twins of the released VLM architectures, built locally (no download).

Each twin is the real transformers model class built from its real config class (a few layers,
hidden sizes of 32-64), with a word-level tokenizer built here that carries the architecture's
real special tokens, the image processor class of the release (tiny sizes) and the released chat
template. ``build_twin(arch, folder)`` saves it with ``save_pretrained`` so it loads through the
public path (``HFVisionLanguageModel(folder)``).

Where the chat templates come from (exact strings, copied from public copies of the released
files; see ``TEMPLATE_SOURCES``):

- LLaVA 1.5 (``llava-hf/llava-1.5-7b-hf`` chat_template.json) and LLaVA-NeXT
  (``llava-hf/llava-v1.6-mistral-7b-hf`` chat_template.json) and Qwen2-VL
  (``Qwen/Qwen2-VL-2B-Instruct`` tokenizer_config.json): quoted verbatim with their source in
  openvino.genai ``src/cpp/src/tokenizer.cpp`` (``chat_template_fallback_map``).
- Qwen2.5-VL: the Qwen2-VL template (the rendered Qwen2.5-VL prompt in public write-ups is the same);
  the exact file was not found in a public copy.
- Gemma 3 (``google/gemma-3-4b-it``): the template printed from the released tokenizer by
  distributed-llama's ``convert-tokenizer-hf.py`` and reproduced in LiteRT-LM's model templates.
- SmolVLM / Idefics3: ``HuggingFaceTB/SmolVLM`` template, as in transformers' own Idefics3 and
  SmolVLM processor tests and in the SmolVLM processor (``DEFAULT_CHAT_TEMPLATE``).
- Mllama (``meta-llama/Llama-3.2-11B-Vision-Instruct``): as in swift-jinja's ``VisionTests``.
- PaliGemma: no chat template (the processor writes ``<image>``*N + ``<bos>`` + prompt + ``\\n``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

LLAVA15_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] != 'system' %}{{ message['role'].upper() + ': '}}{% endif %}"
    "{# Render all images first #}{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}"
    "{{ '<image>\n' }}{% endfor %}{# Render all text next #}{% if message['role'] != 'assistant' %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ content['text'] + ' '}}"
    "{% endfor %}{% else %}{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{% generation %}{{ content['text'] + ' '}}{% endgeneration %}{% endfor %}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"
)
LLAVA_NEXT_MISTRAL_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'system' %}"
    "{{ '<<SYS>>\n' + message['content'][0]['text'] + '\n<</SYS>>\n\n' }}{% elif message['role'] == 'user' %}"
    "{{ '[INST] ' }}{# Render all images first #}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>\n' }}{% endfor %}"
    "{# Render all text next #}{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{{ content['text'] }}{% endfor %}{{' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ ' ' + message['content'][0]['text'] + '<\\\\s> '}}{% else %}"
    "{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"
)
QWEN2_VL_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n{% else %}"
    "{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}Picture {{ image_count.value }}: "
    "{% endif %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
GEMMA3_TEMPLATE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"""
SMOLVLM_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}"
    "{% if message['content'][0]['type'] == 'image' %}{{':'}}{% else %}{{': '}}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{line['text']}}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}<end_of_utterance>\n{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)
MLLAMA_TEMPLATE = (
    "{{- bos_token }}\n{%- if custom_tools is defined %}\n    {%- set tools = custom_tools %}\n{%- endif %}\n"
    "{%- if not tools_in_user_message is defined %}\n    {%- set tools_in_user_message = true %}\n{%- endif %}\n"
    "{%- if not date_string is defined %}\n    {%- if strftime_now is defined %}\n"
    "        {%- set date_string = strftime_now(\"%d %b %Y\") %}\n    {%- else %}\n"
    "        {%- set date_string = \"26 Jul 2024\" %}\n    {%- endif %}\n{%- endif %}\n"
    "{%- if not tools is defined %}\n    {%- set tools = none %}\n{%- endif %}\n\n"
    "{#- This block extracts the system message, so we can slot it into the right place. #}\n"
    "{%- if messages[0]['role'] == 'system' %}\n    {%- set system_message = messages[0]['content']|trim %}\n"
    "    {%- set messages = messages[1:] %}\n{%- else %}\n    {%- set system_message = \"\" %}\n{%- endif %}\n\n"
    "{#- Find out if there are any images #}\n{% set image_ns = namespace(has_images=false) %}      \n"
    "{%- for message in messages %}\n    {%- for content in message['content'] %}\n"
    "        {%- if content['type'] == 'image' %}\n            {%- set image_ns.has_images = true %}\n"
    "        {%- endif %}\n    {%- endfor %}\n{%- endfor %}\n\n"
    "{#- Error out if there are images and system message #}\n"
    "{%- if image_ns.has_images and not system_message == \"\" %}\n"
    "    {{- raise_exception(\"Prompting with images is incompatible with system messages.\") }}\n{%- endif %}\n\n"
    "{#- System message if there are no images #}\n{%- if not image_ns.has_images %}\n"
    "    {{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}\n    {%- if tools is not none %}\n"
    "        {{- \"Environment: ipython\\n\" }}\n    {%- endif %}\n"
    "    {{- \"Cutting Knowledge Date: December 2023\\n\" }}\n"
    "    {{- \"Today Date: \" + date_string + \"\\n\\n\" }}\n"
    "    {%- if tools is not none and not tools_in_user_message %}\n"
    "        {{- \"You have access to the following functions. To call a function, please respond with JSON for a "
    "function call.\" }}\n"
    "        {{- 'Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its "
    "value}.' }}\n"
    "        {{- \"Do not use variables.\\n\\n\" }}\n        {%- for t in tools %}\n"
    "            {{- t | tojson(indent=4) }}\n            {{- \"\\n\\n\" }}\n        {%- endfor %}\n    {%- endif %}\n"
    "    {{- system_message }}\n    {{- \"<|eot_id|>\" }}\n{%- endif %}\n\n"
    "{#- Custom tools are passed in a user message with some extra guidance #}\n"
    "{%- if tools_in_user_message and not tools is none %}\n"
    "    {#- Extract the first user message so we can plug it in here #}\n    {%- if messages | length != 0 %}\n"
    "        {%- set first_user_message = messages[0]['content']|trim %}\n        {%- set messages = messages[1:] %}\n"
    "    {%- else %}\n"
    "        {{- raise_exception(\"Cannot put tools in the first user message when there's no first user message!\") }}\n"
    "{%- endif %}\n    {{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}\n"
    "    {{- \"Given the following functions, please respond with a JSON for a function call \" }}\n"
    "    {{- \"with its proper arguments that best answers the given prompt.\\n\\n\" }}\n"
    "    {{- 'Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its "
    "value}.' }}\n"
    "    {{- \"Do not use variables.\\n\\n\" }}\n    {%- for t in tools %}\n        {{- t | tojson(indent=4) }}\n"
    "        {{- \"\\n\\n\" }}\n    {%- endfor %}\n    {{- first_user_message + \"<|eot_id|>\"}}\n{%- endif %}\n\n"
    "{%- for message in messages %}\n"
    "    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}\n"
    "    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}\n"
    "        {%- if message['content'] is string %}\n            {{- message['content'] }}\n        {%- else %}\n"
    "            {%- for content in message['content'] %}\n                {%- if content['type'] == 'image' %}\n"
    "                    {{- '<|image|>' }}\n                {%- elif content['type'] == 'text' %}\n"
    "                    {{- content['text'] }}\n                {%- endif %}\n            {%- endfor %}\n"
    "        {%- endif %}\n        {{- '<|eot_id|>' }}\n    {%- elif 'tool_calls' in message %}\n"
    "        {%- if not message.tool_calls|length == 1 %}\n"
    "            {{- raise_exception(\"This model only supports single tool-calls at once!\") }}\n        {%- endif %}\n"
    "        {%- set tool_call = message.tool_calls[0].function %}\n"
    "        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}\n"
    "        {{- '{\"name\": \"' + tool_call.name + '\", ' }}\n        {{- '\"parameters\": ' }}\n"
    "        {{- tool_call.arguments | tojson }}\n        {{- \"}\" }}\n        {{- \"<|eot_id|>\" }}\n"
    "    {%- elif message.role == \"tool\" or message.role == \"ipython\" %}\n"
    "        {{- \"<|start_header_id|>ipython<|end_header_id|>\\n\\n\" }}\n"
    "        {%- if message.content is mapping or message.content is iterable %}\n"
    "            {{- message.content | tojson }}\n        {%- else %}\n            {{- message.content }}\n"
    "        {%- endif %}\n        {{- \"<|eot_id|>\" }}\n    {%- endif %}\n{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n{%- endif %}\n"
)

TEMPLATE_SOURCES = {
    "llava": "llava-hf/llava-1.5-7b-hf chat_template.json, quoted in openvino.genai src/cpp/src/tokenizer.cpp",
    "llava_next": "llava-hf/llava-v1.6-mistral-7b-hf chat_template.json, quoted in openvino.genai tokenizer.cpp",
    "gemma3": "google/gemma-3-4b-it tokenizer chat_template (distributed-llama dump; LiteRT-LM kGemma3)",
    "qwen2_vl": "Qwen/Qwen2-VL-2B-Instruct tokenizer_config.json, quoted in openvino.genai tokenizer.cpp",
    "qwen2_5_vl": "the Qwen2-VL template (Qwen2.5-VL's own file not found in a public copy)",
    "idefics3": "HuggingFaceTB/SmolVLM template (transformers Idefics3/SmolVLM processor tests)",
    "paligemma": "none: PaliGemma has no chat template; the processor builds the prefix",
    "mllama": "meta-llama/Llama-3.2-11B-Vision-Instruct template, as in swift-jinja VisionTests",
}

# Prompt words of the tests, the template words and the answers; everything else is <unk>.
WORDS = (
    "is there a lesion in the left half of image ? which modality this a. ct b. mri c. d. small bright "
    "yes no describe findings one sentence answer with box as [ ] , . : user assistant system you are helpful "
    "model cutting knowledge date december 2023 today jul nov 2024 2025 2026 question inst picture / - 0 1 2 3 4 5 6 "
    "7 8 9 jan feb mar apr may jun aug sep oct dec the option's letter from given choices directly"
).split()


@dataclass(frozen=True)
class Tokens:
    """The special tokens of one release: ``bos``/``eos``/``pad``/``unk`` strings (None = absent)
    and ``extra`` (all other special tokens, in order); ``named``: tokenizer attributes such as
    ``image_token`` that processors read."""

    bos: str | None
    eos: str
    pad: str
    unk: str
    extra: tuple[str, ...] = ()
    named: dict[str, str] = field(default_factory=dict)


def build_tokenizer(tokens: Tokens, template: str | None) -> Any:
    """A word-level ``PreTrainedTokenizerFast``: lower-cased words and punctuation of ``WORDS``,
    the release's special tokens as unnormalised special tokens, and its chat template."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = [t for t in (tokens.pad, tokens.unk, tokens.bos, tokens.eos) if t is not None]
    specials += [t for t in tokens.extra if t not in specials]
    vocab: dict[str, int] = {}
    for w in specials + sorted(set(WORDS)):
        vocab.setdefault(w, len(vocab))
    tk = Tokenizer(models.WordLevel(vocab, unk_token=tokens.unk))
    tk.normalizer = normalizers.Lowercase()
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.WhitespaceSplit(),
        pre_tokenizers.Split(Regex(r"[^a-z0-9.'\-]"), behavior="isolated"),
    ])
    tk.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins tokens with spaces
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    kw: dict[str, Any] = {"pad_token": tokens.pad, "unk_token": tokens.unk, "eos_token": tokens.eos}
    if tokens.bos is not None:
        kw["bos_token"] = tokens.bos
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, extra_special_tokens=dict(tokens.named), **kw)
    if template is not None:
        tok.chat_template = template
    return tok


def _seeded(seed: int, make: Callable[[], Any]) -> Any:
    with torch.random.fork_rng(devices=[]):
        torch.random.manual_seed(seed)  # scoped: the caller's global RNG state is restored
        return make()


def _llama(tok: Any, **kw: Any) -> dict[str, Any]:
    cfg = {"vocab_size": len(tok), "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512,
           "pad_token_id": tok.pad_token_id, "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id}
    cfg.update(kw)
    return cfg


def _clip(image_size: int, patch: int) -> dict[str, Any]:
    return {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
            "image_size": image_size, "patch_size": patch}


def build_llava(seed: int) -> tuple[Any, Any]:
    from transformers import (
        CLIPImageProcessor,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )

    tok = build_tokenizer(Tokens("<s>", "</s>", "<pad>", "<unk>", ("<image>",), {"image_token": "<image>"}),
                          LLAVA15_TEMPLATE)
    cfg = LlavaConfig(vision_config=CLIPVisionConfig(**_clip(32, 8)), text_config=LlamaConfig(**_llama(tok)),
                      image_token_index=tok.convert_tokens_to_ids("<image>"), vision_feature_layer=-2,
                      vision_feature_select_strategy="default", image_seq_length=16)
    model = _seeded(seed, lambda: LlavaForConditionalGeneration(cfg))
    ip = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    proc = LlavaProcessor(image_processor=ip, tokenizer=tok, patch_size=8, vision_feature_select_strategy="default",
                          chat_template=LLAVA15_TEMPLATE, num_additional_image_tokens=1)
    return model, proc


def build_llava_next(seed: int) -> tuple[Any, Any]:
    from transformers import (
        CLIPVisionConfig,
        LlavaNextConfig,
        LlavaNextForConditionalGeneration,
        LlavaNextImageProcessor,
        LlavaNextProcessor,
        MistralConfig,
    )

    tok = build_tokenizer(Tokens("<s>", "</s>", "<pad>", "<unk>", ("<image>", "[INST]", "[/INST]"),
                                 {"image_token": "<image>"}), LLAVA_NEXT_MISTRAL_TEMPLATE)
    pinpoints = [[32, 64], [64, 32], [64, 64]]
    cfg = LlavaNextConfig(vision_config=CLIPVisionConfig(**_clip(32, 8)), text_config=MistralConfig(**_llama(tok)),
                          image_token_index=tok.convert_tokens_to_ids("<image>"), image_grid_pinpoints=pinpoints,
                          vision_feature_layer=-2, vision_feature_select_strategy="default", image_seq_length=16)
    model = _seeded(seed, lambda: LlavaNextForConditionalGeneration(cfg))
    ip = LlavaNextImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32},
                                 image_grid_pinpoints=pinpoints)
    proc = LlavaNextProcessor(image_processor=ip, tokenizer=tok, patch_size=8, vision_feature_select_strategy="default",
                              chat_template=LLAVA_NEXT_MISTRAL_TEMPLATE, num_additional_image_tokens=1)
    return model, proc


def build_gemma3(seed: int) -> tuple[Any, Any]:
    from transformers import (
        Gemma3Config,
        Gemma3ForConditionalGeneration,
        Gemma3ImageProcessor,
        Gemma3Processor,
        Gemma3TextConfig,
        SiglipVisionConfig,
    )

    named = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"}
    tok = build_tokenizer(Tokens("<bos>", "<eos>", "<pad>", "<unk>",
                                 ("<start_of_turn>", "<end_of_turn>", *named.values()), named), GEMMA3_TEMPLATE)
    text = Gemma3TextConfig(**_llama(tok, head_dim=16, sliding_window=64, query_pre_attn_scalar=16))
    cfg = Gemma3Config(text_config=text, vision_config=SiglipVisionConfig(**_clip(32, 8)), mm_tokens_per_image=4,
                       boi_token_index=tok.convert_tokens_to_ids("<start_of_image>"),
                       eoi_token_index=tok.convert_tokens_to_ids("<end_of_image>"),
                       image_token_index=tok.convert_tokens_to_ids("<image_soft_token>"))
    model = _seeded(seed, lambda: Gemma3ForConditionalGeneration(cfg))
    ip = Gemma3ImageProcessor(size={"height": 32, "width": 32})
    proc = Gemma3Processor(image_processor=ip, tokenizer=tok, chat_template=GEMMA3_TEMPLATE, image_seq_length=4)
    return model, proc


def _qwen_tokens() -> Tokens:
    extra = ("<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
    return Tokens(None, "<|im_end|>", "<|endoftext|>", "<unk>", extra,
                  {"image_token": "<|image_pad|>", "video_token": "<|video_pad|>"})


def build_qwen2_vl(seed: int) -> tuple[Any, Any]:
    from transformers import (
        Qwen2VLConfig,
        Qwen2VLForConditionalGeneration,
        Qwen2VLImageProcessor,
        Qwen2VLProcessor,
        Qwen2VLVideoProcessor,
    )

    tok = build_tokenizer(_qwen_tokens(), QWEN2_VL_TEMPLATE)
    text = _llama(tok, rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 10000.0})
    vision = {"depth": 2, "embed_dim": 32, "hidden_size": 64, "num_heads": 2, "patch_size": 8, "spatial_merge_size": 2,
              "temporal_patch_size": 2, "mlp_ratio": 2}
    cfg = Qwen2VLConfig(text_config=text, vision_config=vision,
                        image_token_id=tok.convert_tokens_to_ids("<|image_pad|>"),
                        video_token_id=tok.convert_tokens_to_ids("<|video_pad|>"),
                        vision_start_token_id=tok.convert_tokens_to_ids("<|vision_start|>"),
                        vision_end_token_id=tok.convert_tokens_to_ids("<|vision_end|>"))
    model = _seeded(seed, lambda: Qwen2VLForConditionalGeneration(cfg))
    ip = Qwen2VLImageProcessor(min_pixels=32 * 32, max_pixels=64 * 64, patch_size=8, merge_size=2,
                               temporal_patch_size=2)
    vp = Qwen2VLVideoProcessor(min_pixels=32 * 32, max_pixels=64 * 64, patch_size=8, merge_size=2,
                               temporal_patch_size=2)
    proc = Qwen2VLProcessor(image_processor=ip, tokenizer=tok, video_processor=vp, chat_template=QWEN2_VL_TEMPLATE)
    return model, proc


def build_qwen2_5_vl(seed: int) -> tuple[Any, Any]:
    from transformers import (
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2_5_VLProcessor,
        Qwen2VLImageProcessor,
        Qwen2VLVideoProcessor,
    )

    tok = build_tokenizer(_qwen_tokens(), QWEN2_VL_TEMPLATE)
    text = _llama(tok, rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 10000.0})
    vision = {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "patch_size": 8,
              "spatial_merge_size": 2, "temporal_patch_size": 2, "window_size": 32, "out_hidden_size": 64,
              "fullatt_block_indexes": [1]}
    cfg = Qwen2_5_VLConfig(text_config=text, vision_config=vision,
                           image_token_id=tok.convert_tokens_to_ids("<|image_pad|>"),
                           video_token_id=tok.convert_tokens_to_ids("<|video_pad|>"),
                           vision_start_token_id=tok.convert_tokens_to_ids("<|vision_start|>"),
                           vision_end_token_id=tok.convert_tokens_to_ids("<|vision_end|>"))
    model = _seeded(seed, lambda: Qwen2_5_VLForConditionalGeneration(cfg))
    ip = Qwen2VLImageProcessor(min_pixels=32 * 32, max_pixels=64 * 64, patch_size=8, merge_size=2,
                               temporal_patch_size=2)
    vp = Qwen2VLVideoProcessor(min_pixels=32 * 32, max_pixels=64 * 64, patch_size=8, merge_size=2,
                               temporal_patch_size=2)
    proc = Qwen2_5_VLProcessor(image_processor=ip, tokenizer=tok, video_processor=vp,
                               chat_template=QWEN2_VL_TEMPLATE)
    return model, proc


def build_idefics3(seed: int) -> tuple[Any, Any]:
    from transformers import (
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3ImageProcessor,
        Idefics3Processor,
        Idefics3VisionConfig,
        LlamaConfig,
    )

    grid = tuple(f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7))
    extra = ("<|im_start|>", "<end_of_utterance>", "<fake_token_around_image>", "<image>", "<global-img>", *grid)
    tok = build_tokenizer(Tokens("<|im_start|>", "<end_of_utterance>", "<|im_end|>", "<unk>", extra,
                                 {"image_token": "<image>"}), SMOLVLM_TEMPLATE)
    vis = Idefics3VisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                               image_size=32, patch_size=8)
    cfg = Idefics3Config(vision_config=vis, text_config=LlamaConfig(**_llama(tok)), scale_factor=2,
                         image_token_id=tok.convert_tokens_to_ids("<image>"))
    model = _seeded(seed, lambda: Idefics3ForConditionalGeneration(cfg))
    ip = Idefics3ImageProcessor(do_image_splitting=True, size={"longest_edge": 64},
                                max_image_size={"longest_edge": 32})
    proc = Idefics3Processor(image_processor=ip, tokenizer=tok, image_seq_len=4, chat_template=SMOLVLM_TEMPLATE)
    return model, proc


def build_paligemma(seed: int) -> tuple[Any, Any]:
    from transformers import (
        GemmaConfig,
        PaliGemmaConfig,
        PaliGemmaForConditionalGeneration,
        PaliGemmaProcessor,
        SiglipImageProcessor,
        SiglipVisionConfig,
    )

    tok = build_tokenizer(Tokens("<bos>", "<eos>", "<pad>", "<unk>", ("<image>",), {"image_token": "<image>"}), None)
    ip = SiglipImageProcessor(size={"height": 32, "width": 32}, image_seq_length=16)
    proc = PaliGemmaProcessor(image_processor=ip, tokenizer=tok)  # adds the <loc>/<seg> tokens
    text = GemmaConfig(**_llama(tok, vocab_size=len(tok), head_dim=16))
    cfg = PaliGemmaConfig(vision_config=SiglipVisionConfig(**_clip(32, 8)), text_config=text,
                          image_token_index=tok.convert_tokens_to_ids("<image>"), projection_dim=64)
    model = _seeded(seed, lambda: PaliGemmaForConditionalGeneration(cfg))
    return model, proc


def build_mllama(seed: int) -> tuple[Any, Any]:
    from transformers import (
        MllamaConfig,
        MllamaForConditionalGeneration,
        MllamaImageProcessor,
        MllamaProcessor,
    )

    extra = ("<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>", "<|image|>",
             "<|python_tag|>", "<|finetune_right_pad_id|>")
    tok = build_tokenizer(Tokens("<|begin_of_text|>", "<|eot_id|>", "<|finetune_right_pad_id|>", "<unk>", extra,
                                 {"image_token": "<|image|>"}), MLLAMA_TEMPLATE)
    text = _llama(tok, cross_attention_layers=[1], rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    vision = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_global_layers": 1,
              "attention_heads": 2, "image_size": 32, "patch_size": 8, "max_num_tiles": 2,
              "intermediate_layers_indices": [0], "vision_output_dim": 64,
              "supported_aspect_ratios": [[1, 1], [1, 2], [2, 1]]}
    cfg = MllamaConfig(text_config=text, vision_config=vision, image_token_index=tok.convert_tokens_to_ids("<|image|>"))
    model = _seeded(seed, lambda: MllamaForConditionalGeneration(cfg))
    ip = MllamaImageProcessor(size={"height": 32, "width": 32}, max_image_tiles=2)
    proc = MllamaProcessor(image_processor=ip, tokenizer=tok, chat_template=MLLAMA_TEMPLATE)
    return model, proc


BUILDERS: dict[str, Callable[[int], tuple[Any, Any]]] = {
    "llava": build_llava,
    "llava_next": build_llava_next,
    "gemma3": build_gemma3,
    "qwen2_vl": build_qwen2_vl,
    "qwen2_5_vl": build_qwen2_5_vl,
    "idefics3": build_idefics3,
    "paligemma": build_paligemma,
    "mllama": build_mllama,
}
ARCHS = tuple(BUILDERS)


def build_twin(arch: str, folder: str | Path, seed: int = 0) -> Path:
    """Build the tiny twin of ``arch`` and ``save_pretrained`` it (safetensors) with its processor."""
    if arch not in BUILDERS:
        raise KeyError(f"unknown architecture {arch!r}; choose from {sorted(BUILDERS)}")
    model, proc = BUILDERS[arch](seed)
    model.generation_config.pad_token_id = proc.tokenizer.pad_token_id
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    proc.save_pretrained(out)
    return out
