"""One interface over local and API VLMs for the evaluation: answers with their outcome, latency
and cache flag; a failed batch or request becomes an ``error`` answer, never an exception."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from medrobust_lib.config import Suite
from medrobust_lib.config.vlm import VLMModelConfig, vlm_model


@dataclass(frozen=True)
class Answer:
    """``text`` None means no answer (``outcome`` says why: error or refused)."""

    text: str | None
    outcome: str = "ok"
    latency_s: float = 0.0
    cache_hit: bool = False
    error: str | None = None


def checkpoint_dir(suite: Suite, model_id: str) -> Path:
    return Path(suite.results_dir).parent / "checkpoints" / model_id


def resolve_source(suite: Suite, m: VLMModelConfig) -> str:
    """Folder or hub id of the base weights (following ``base``)."""
    if m.base is not None:
        return resolve_source(suite, vlm_model(suite, m.base))
    if m.source == "trained":
        folder = checkpoint_dir(suite, m.id)
        if not (folder / "config.json").is_file():
            raise FileNotFoundError(f"no trained VLM for {m.id!r} at {folder}: materialize '{m.id}/base_checkpoint' first")
        return str(folder)
    return m.source


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


class Runner:
    """``generate`` and ``yes_no`` over a configured model."""

    def __init__(self, suite: Suite, m: VLMModelConfig) -> None:
        self.m = m
        self.api: Any = None
        self.hf: Any = None
        if m.kind == "api":
            from medrobust_lib.models.api_vlm import ApiVLM, ApiVLMConfig

            settings = dict(m.api)
            settings.setdefault("cache_path", str(Path(suite.results_dir).parent / "cache" / f"{m.id}.sqlite"))
            Path(settings["cache_path"]).parent.mkdir(parents=True, exist_ok=True)
            settings.setdefault("seed", suite.seed)
            self.api = ApiVLM(ApiVLMConfig(**settings))
            self.checkpoint = f"api:{settings.get('model')}"
            self.adapter = None
        else:
            from medrobust_lib.models.hf_vlm import HFVisionLanguageModel

            adapter = resolve_adapter(suite, m)
            source = resolve_source(suite, m)
            kw: dict[str, Any] = {"adapter": adapter} if adapter else {}
            self.hf = HFVisionLanguageModel(source, model_id=m.id, device=m.device, **kw)
            self.checkpoint = _folder_hash(source)
            self.adapter = getattr(self.hf, "adapter_hash", None)

    @property
    def n_vision_calls(self) -> int:
        return int(getattr(self.hf, "n_vision_calls", 0))

    def close(self) -> None:
        if self.api is not None:
            self.api.close()

    def generate(self, images: Sequence[np.ndarray | None], prompts: Sequence[str], max_new_tokens: int) -> list[Answer]:
        if not prompts:
            return []
        if self.api is not None:
            return [_from_api(r) for r in self.api.generate(images, prompts)]
        out: list[Answer] = []
        bs = self.m.batch_size
        for s in range(0, len(prompts), bs):
            ims, ps = images[s : s + bs], prompts[s : s + bs]
            t0 = time.perf_counter()
            try:
                texts = self.hf.generate(ims, ps, max_new_tokens=max_new_tokens, batch_size=bs)
            except Exception as exc:  # a failed batch is counted, not fatal
                out.extend(Answer(None, "error", error=f"{type(exc).__name__}: {exc}"[:300]) for _ in ps)
                continue
            dt = (time.perf_counter() - t0) / len(ps)
            out.extend(Answer(t, "ok", dt) for t in texts)
        return out

    def yes_no(self, images: Sequence[np.ndarray | None], prompts: Sequence[str]
               ) -> list[tuple[dict[str, float] | None, Answer]]:
        """Per input: (log-probabilities of yes/no or None, the answer). Local models score the
        options; API models ask for logprobs and fall back to generation where none came back."""
        if not prompts:
            return []
        if self.api is not None:
            results = self.api.score_results(images, prompts)
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
            t0 = time.perf_counter()
            try:
                lps = self.hf.score(ims, ps, ["yes", "no"], batch_size=bs)
            except Exception as exc:
                res.extend((None, Answer(None, "error", error=f"{type(exc).__name__}: {exc}"[:300])) for _ in ps)
                continue
            dt = (time.perf_counter() - t0) / len(ps)
            res.extend((lp, Answer(max(lp, key=lambda k: lp[k]), "ok", dt)) for lp in lps)
        return res


def _from_api(r: Any) -> Answer:
    if r.outcome == "ok":
        return Answer(r.text, "ok", r.latency_s, r.cache_hit)
    outcome = "refused" if r.outcome == "refused" else "error"
    return Answer(r.text if outcome == "refused" else None, outcome, r.latency_s, r.cache_hit,
                  f"{r.outcome}: {r.error}" if r.error else r.outcome)


def _folder_hash(source: str) -> str:
    """Hash of a model folder (first 16 hex): names, sizes and the first MiB of every weight and
    config file, so multi-gigabyte checkpoints are not read whole; a hub id is returned as is."""
    import hashlib

    p = Path(source)
    if not p.is_dir():
        return source
    h = hashlib.sha256()
    for f in sorted(p.glob("*.safetensors")) + sorted(p.glob("*.json")):
        h.update(f"{f.name}:{f.stat().st_size}".encode())
        with f.open("rb") as fh:
            h.update(fh.read(1 << 20))
    return h.hexdigest()[:16]
