"""One interface over local and API VLMs for the evaluation: answers with their outcome, latency
and cache flag; a failed batch or request becomes an ``error`` answer, never an exception.

``error`` is an infrastructure outcome (transport, retries exhausted, cache, out of memory, any
exception in the model call): it is not scored and the next run of the partition retries it. A
local batch that runs out of memory (CUDA OOM) is split in halves after freeing the allocator's
cache, down to single prompts; only a single prompt that still does not fit becomes ``error``."""

from __future__ import annotations

import gc
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from medrobust_lib.config import Suite
from medrobust_lib.config.vlm import VLMModelConfig, adapter_box_scale, vlm_model
from medrobust_lib.hashing import folder_hash
from medrobust_lib.lru import LRU, FileStamp, file_stamp
from medrobust_lib.model_table import model_entry
from medrobust_lib.models.base import VisionLanguageEndpoint
from medrobust_lib.models.factory import VLMInputs, build_vlm
from medrobust_lib.paths import checkpoint_dir, suite_paths
from medrobust_lib.tracks.upstream import MissingUpstream

T = TypeVar("T")


@dataclass(frozen=True)
class Answer:
    """``text`` None means no answer (``outcome`` says why: error or refused). ``truncated``: the
    answer hit its token cap (cut, not finished); None where unknown (no answer, or a model that
    does not say)."""

    text: str | None
    outcome: str = "ok"
    latency_s: float = 0.0
    cache_hit: bool = False
    error: str | None = None
    truncated: bool | None = None
    sanitized: bool = False
    """Characters of the text were replaced (lone surrogates, control characters: an API model's
    ``ApiResult.sanitized``)."""


def resolve_source(suite: Suite, m: VLMModelConfig) -> str:
    """Folder or hub id of the base weights (following ``base``)."""
    if m.base is not None:
        return resolve_source(suite, vlm_model(suite, m.base))
    if m.source == "trained":
        folder = checkpoint_dir(suite, m.id)
        if not (folder / "config.json").is_file():
            raise MissingUpstream(f"no trained VLM for {m.id!r} at {folder}: materialize '{m.id}/base_checkpoint' first",
                                  f"{m.id}/base_checkpoint")
        return str(folder)
    if m.source is None:
        raise ValueError(f"VLM {m.id!r} names no source (a local model folder or a cached hub id)")
    return m.source


TRAINING_META = "medrobust_training.json"
"""Written in a fine-tuned adapter's folder (:mod:`medrobust_lib.tracks.finetune.vlm_adapter`): the
task, the box scale its grounding answers were taught in and the splits it saw."""


def trained_box_scale(adapter_folder: str | None) -> str | None:
    """The box scale recorded in an adapter folder's :data:`TRAINING_META` (None: no folder, or
    nothing recorded, e.g. an adapter trained elsewhere)."""
    if adapter_folder is None:
        return None
    p = Path(adapter_folder) / TRAINING_META
    if not p.is_file():
        return None
    value = json.loads(p.read_text()).get("box_scale")
    return str(value) if value is not None else None


def declared_box_scale(suite: Suite, m: VLMModelConfig, adapter_folder: str | None) -> str | None:
    """The box scale grounding answers of ``m`` are read in: an ``adapter: finetuned`` model's is
    the scale its adapter was taught in (recorded in the adapter folder, else
    :func:`~medrobust_lib.config.vlm.adapter_box_scale`), whatever ``box_scale`` says now; any other
    model's is its declared ``box_scale`` (None: detected per answer)."""
    if m.adapter == "finetuned":
        return trained_box_scale(adapter_folder) or adapter_box_scale(suite, m)
    return m.box_scale


def resolve_adapter(suite: Suite, m: VLMModelConfig) -> str | None:
    if m.adapter is None:
        return None
    if m.adapter == "finetuned":
        folder = checkpoint_dir(suite, m.id) / "adapter"
        if not (folder / "adapter_config.json").is_file():
            raise FileNotFoundError(f"no fine-tuned adapter for {m.id!r} at {folder}: materialize "
                                    f"'{m.id}/finetuned_adapter' first")
        return str(folder)
    return m.adapter


def vlm_inputs(suite: Suite, m: VLMModelConfig) -> VLMInputs:
    """What the suite resolves for ``m``'s adapter (:mod:`medrobust_lib.models.factory`): the
    weights (``source``, LoRA ``adapter``) when the adapter loads local weights, and always the
    response-cache file ``<cache>/<id>.sqlite`` and the suite seed."""
    cache = str(suite_paths(suite).cache / f"{m.id}.sqlite")
    if not model_entry(m.kind, "vlm").local_weights:
        return VLMInputs(cache_path=cache, seed=suite.seed)
    adapter = resolve_adapter(suite, m)  # checked first: its error names the asset to materialize
    return VLMInputs(source=resolve_source(suite, m), adapter=adapter, cache_path=cache, seed=suite.seed)


class Runner:
    """``generate`` and ``yes_no`` over a configured model: the adapter registered for
    ``m.kind``, driven as a :class:`VisionLanguageEndpoint` (``api``) or a local
    :class:`medrobust_lib.models.base.VisionLanguageModel` (``hf``)."""

    def __init__(self, suite: Suite, m: VLMModelConfig) -> None:
        self.m = m
        self.api: Any = None
        self.hf: Any = None
        inputs = vlm_inputs(suite, m)
        model = _local_model(m, inputs) if model_entry(m.kind, "vlm").local_weights else build_vlm(m, inputs)
        if isinstance(model, VisionLanguageEndpoint):
            self.api = model
            self.checkpoint = f"api:{model.model_id}"
            self.adapter = None
        else:
            self.hf = model
            self.checkpoint = folder_hash(inputs.source) if inputs.source is not None else f"{m.kind}:{m.id}"
            self.adapter = getattr(self.hf, "adapter_hash", None)
        api_seed = m.api.seed if m.api is not None and "seed" in m.api.model_fields_set else suite.seed
        self.decoding: dict[str, Any] = {**m.decoding(), "decode_seed": api_seed if m.samples() else None}
        """The decoding settings its rows record (:func:`medrobust_lib.tracks.vlm.evaluate.decoding_columns`)."""
        self.box_scale = declared_box_scale(suite, m, inputs.adapter)
        """The scale this model's grounding answers are read in (:func:`declared_box_scale`)."""
        self._vision0 = int(getattr(self.hf, "n_vision_calls", 0))  # the model may be shared: count from here

    @property
    def n_vision_calls(self) -> int:
        """Images the vision encoder encoded since this runner was made (the model may be shared
        with runners of earlier partitions, never with one running at the same time)."""
        return int(getattr(self.hf, "n_vision_calls", 0)) - getattr(self, "_vision0", 0)

    def close(self) -> None:
        if self.api is not None:
            self.api.close()

    def generate(self, images: Sequence[np.ndarray | None], prompts: Sequence[str], max_new_tokens: int) -> list[Answer]:
        if not prompts:
            return []
        if self.api is not None:
            try:
                return [_from_api(r) for r in self.api.generate(images, prompts)]
            except Exception as exc:  # the adapter's own input checks: counted, not fatal
                return [Answer(None, "error", error=_describe(exc)) for _ in prompts]
        out: list[Answer] = []
        bs = self.m.batch_size
        capped = getattr(self.hf, "generate_capped", None)

        def call(i: Sequence[Any], p: Sequence[str]) -> list[tuple[str, bool | None]]:
            if capped is not None:
                return list(capped(i, p, max_new_tokens=max_new_tokens, batch_size=len(p)))
            return [(t, None) for t in self.hf.generate(i, p, max_new_tokens=max_new_tokens, batch_size=len(p))]

        for s in range(0, len(prompts), bs):
            ims, ps = images[s : s + bs], prompts[s : s + bs]
            for value, dt, err in guarded_batch(call, ims, ps):
                out.append(Answer(None, "error", error=err) if err is not None
                           else Answer(value[0], "ok", dt, truncated=value[1]))
        return out

    def yes_no(self, images: Sequence[np.ndarray | None], prompts: Sequence[str]
               ) -> list[tuple[dict[str, float] | None, Answer]]:
        """Per input: (log-probabilities of yes/no or None, the answer). Local models score the
        options; API models ask for logprobs and fall back to generation where none came back."""
        if not prompts:
            return []
        if self.api is not None:
            try:
                results = self.api.score_results(images, prompts)
            except Exception as exc:  # the adapter's own input checks: counted, not fatal
                return [(None, Answer(None, "error", error=_describe(exc))) for _ in prompts]
            out: list[tuple[dict[str, float] | None, Answer]] = []
            need = []
            from medrobust_lib.models.api_vlm import option_logprobs

            for i, r in enumerate(results):
                lp = option_logprobs(r.logprobs, ["yes", "no"]) if r.outcome == "ok" and r.logprobs else None
                if lp is not None and all(v is not None for v in lp.values()):
                    out.append(({k: float(v) for k, v in lp.items() if v is not None}, _from_api(r)))
                else:
                    out.append((None, _from_api(r)))
                    need.append(i)
            if need:
                gen = self.generate([images[i] for i in need], [prompts[i] for i in need], self.m.max_new_tokens)
                for i, a in zip(need, gen, strict=True):
                    out[i] = (None, a)
            return out
        res: list[tuple[dict[str, float] | None, Answer]] = []
        bs = self.m.batch_size
        for s in range(0, len(prompts), bs):
            ims, ps = images[s : s + bs], prompts[s : s + bs]
            for lp, dt, err in guarded_batch(lambda i, p: self.hf.score(i, p, ["yes", "no"], batch_size=len(p)),
                                             ims, ps):
                if err is not None or lp is None:
                    res.append((None, Answer(None, "error", error=err or "no log-probabilities")))
                else:
                    res.append((lp, Answer(max(lp, key=lambda k: lp[k]), "ok", dt)))
        return res


def progress_chunk(runner: Any) -> int:
    """Prompts per progress report of ``runner`` (:func:`chunked`): the model's ``batch_size``; for
    an endpoint that sends ``concurrency`` requests at a time, that rounded up to a multiple of
    ``concurrency``, so every chunk but the last keeps all its request slots busy."""
    bs = max(1, int(runner.m.batch_size))
    api = getattr(runner, "api", None)
    conc = getattr(getattr(api, "config", None), "concurrency", None) if api is not None else None
    if isinstance(conc, int) and conc > 1:
        return conc * -(-bs // conc)
    return bs


def chunked(call: Callable[[Sequence[Any], Sequence[str]], Sequence[T]], images: Sequence[Any],
            prompts: Sequence[str], size: int, tick: Callable[[int], None] | None) -> list[T]:
    """``call(images, prompts)`` made ``size`` prompts at a time, ``tick(n)`` after each chunk of
    ``n`` prompts (None: one call, nothing reported). Each prompt's answer is independent of the
    others in its call (a local model's batches are ``batch_size`` prompts either way; an
    endpoint's requests are one per prompt), so the answers are those of one call."""
    if tick is None or len(prompts) <= 0:
        return list(call(images, prompts))
    out: list[T] = []
    step = max(1, size)
    for s in range(0, len(prompts), step):
        ps = prompts[s : s + step]
        out.extend(call(images[s : s + step], ps))
        tick(len(ps))
    return out


LOCAL_MODEL_BUDGET = 2 << 30
"""Bytes of weights the kept local models may hold together (estimated from their weight files,
twice their size: a float16 file may load as float32). The newest model is always kept, so one
real VLM (gigabytes) stays alone, while the demo's tiny models (megabytes) all stay."""
_LOCAL: LRU[tuple[Any, ...], Any] = LRU(max_bytes=lambda: LOCAL_MODEL_BUDGET, keep_newest=True,
                                        name="vlm.local_models")
"""Local models of recent :class:`Runner` s, by (configuration, base folder and its file stamps,
adapter folder and its file stamps), each counted at its estimated bytes."""


def _stamp(path: str | None) -> tuple[FileStamp, ...]:
    """The :func:`~medrobust_lib.lru.file_stamp` of each file of a weights folder (a file: itself);
    () for a hub id or None."""
    if path is None:
        return ()
    p = Path(path)
    files = sorted(f for f in p.iterdir() if f.is_file()) if p.is_dir() else [p] if p.is_file() else []
    return tuple(file_stamp(f) for f in files)


def _weight_bytes(*stamps: tuple[FileStamp, ...]) -> int:
    """Twice the size of the weight files among :func:`_stamp` s (base and adapter folders); a hub
    id (no local files) counts as the whole budget, so it is kept alone."""
    sizes = [size for stamp in stamps for path, _, size, _ in stamp
             if path.endswith((".safetensors", ".bin", ".pt", ".pth"))]
    return 2 * sum(sizes) if sizes else LOCAL_MODEL_BUDGET


def _local_model(m: VLMModelConfig, inputs: VLMInputs) -> Any:
    """The local VLM of ``m``, loaded once per process while its configuration and weight files
    (the file stamps of the base and adapter folders) stay the same: the
    partitions one process evaluates share it instead of loading the weights per partition.
    Models are kept within :data:`LOCAL_MODEL_BUDGET`, oldest released first, before another
    loads. Inference only: nothing may change the returned model (fine-tuning loads its own)."""
    base, adapter = _stamp(inputs.source), _stamp(inputs.adapter)
    key = (m.model_dump_json(), inputs.source, base, inputs.adapter, adapter)
    hit = _LOCAL.get(key)
    if hit is not None:
        return hit
    need = _weight_bytes(base, adapter)
    if _LOCAL.make_room(need):  # release older models before this one loads
        gc.collect()
    model = build_vlm(m, inputs)
    _LOCAL.put(key, model, need)
    return model


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:300]


def is_out_of_memory(exc: BaseException) -> bool:
    """True for an accelerator or host out-of-memory error (``torch.cuda.OutOfMemoryError``, a
    ``RuntimeError`` saying "out of memory", ``MemoryError``)."""
    return (isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError"
            or "out of memory" in str(exc).lower())


def release_accelerator_memory() -> None:
    """Return cached CUDA blocks to the driver after an OOM (no-op without torch or CUDA)."""

    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


def guarded_batch(fn: Callable[[Sequence[Any], Sequence[str]], Sequence[Any]], images: Sequence[Any],
                  prompts: Sequence[str]) -> list[tuple[Any, float, str | None]]:
    """``fn(images, prompts)`` with every failure turned into per-prompt errors: one
    (value, seconds per prompt, error) per prompt, ``error`` None on success. Out of memory: free
    the cache and retry each half (down to single prompts); any other exception, or a result of the
    wrong length, makes the whole batch ``error``."""
    t0 = time.perf_counter()
    try:
        values = list(fn(images, prompts))
        if len(values) != len(prompts):
            raise RuntimeError(f"model returned {len(values)} results for {len(prompts)} prompts")
    except Exception as exc:
        if is_out_of_memory(exc):
            release_accelerator_memory()
            if len(prompts) > 1:
                h = len(prompts) // 2
                return guarded_batch(fn, images[:h], prompts[:h]) + guarded_batch(fn, images[h:], prompts[h:])
        return [(None, 0.0, _describe(exc)) for _ in prompts]
    dt = (time.perf_counter() - t0) / max(len(prompts), 1)
    return [(v, dt, None) for v in values]


def _from_api(r: Any) -> Answer:
    if r.outcome == "ok":
        return Answer(r.text, "ok", r.latency_s, r.cache_hit, truncated=getattr(r, "truncated", None),
                      sanitized=bool(getattr(r, "sanitized", False)))
    outcome = "refused" if r.outcome == "refused" else "error"
    return Answer(r.text if outcome == "refused" else None, outcome, r.latency_s, r.cache_hit,
                  f"{r.outcome}: {r.error}" if r.error else r.outcome,
                  sanitized=outcome == "refused" and bool(getattr(r, "sanitized", False)))
