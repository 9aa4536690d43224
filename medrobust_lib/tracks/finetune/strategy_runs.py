"""Fine-tuning strategies for the segmentation track (issue 6): fine-tune a base SAM-family model
with one strategy on the train split, select on val, report test Dice, and save a checkpoint the
existing loader reads (LoRA merged into plain SAM weights; adapter checkpoints carry their adapter
keys and load into SAM + adapters).

Suite YAML (``segmentation.finetune``)::

    segmentation:
      finetune:
        base: tiny-sam                       # a segmentation.models id
        strategies: [full, decoder_only, decoder_prompt, encoder_partial, lora, adapter,
                     lora_plus_encoder, lora_plus_decoder]
        encoder_blocks: 4                    # encoder_partial (the last N blocks; ViT-B has 12)
        lora: {r: 8, alpha: 16, dropout: 0.05, target_regex: null}
        lora_targets: {}                     # per strategy and base family (the reference overlay sets them)
        lora_plus_lr_ratio: 16
        train: {max_steps: 200, lr: 0.0005, batch_size: 8, eval_every: 25, patience: 3, time_budget_s: 30}
        eval: {levels: [1, 3, 5], perturbations: null, attack_levels: [1, 3, 5], split: null}   # null: all
        gate: {max_iou_drop_increase: 0.01, max_dice_drop_increase: 0.01, alpha: 0.05, min_pairs: 5}

Model ids: a strategy checkpoint is evaluated as ``<base>-<strategy>`` (e.g. ``tiny-sam-lora``), a
registry version as ``<registered name>-v<version>`` (e.g. ``medrobust-seg-tiny-sam-lora-v3``);
both write ordinary ``segmentation_results`` rows with their ``strategy``.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from medrobust_lib.config import Suite
from medrobust_lib.config.segmentation import (
    LORA_FINETUNE_STRATEGIES,
    FinetuneConfig,
    FinetuneEval,
    SegModelConfig,
)
from medrobust_lib.hashing import digest, file_sha256
from medrobust_lib.paths import suite_paths
from medrobust_lib.seeding import rng_for, scoped_torch_seed
from medrobust_lib.store import model_registry
from medrobust_lib.tracks.segmentation.model import load_model, model_config, resolve_checkpoint, seg_splits

if TYPE_CHECKING:
    from medrobust_lib.data.sample import Sample
    from medrobust_lib.training.strategies import StrategyConfig
    from medrobust_lib.training.train import TrainConfig


def strategy_dir(suite: Suite, base: str, strategy: str) -> Path:
    return suite_paths(suite).checkpoints / f"{base}-{strategy}"


def require_finetune(suite: Suite) -> FinetuneConfig:
    ft = suite.segmentation.finetune
    if ft is None:
        raise ValueError("the suite has no segmentation.finetune section")
    return ft


def strategy_model_config(suite: Suite, strategy: str) -> SegModelConfig:
    """The evaluation config of the checkpoint :func:`finetune_strategy` saves for ``strategy``."""

    ft = require_finetune(suite)
    base = model_config(suite, ft.base)
    ckpt = strategy_dir(suite, ft.base, strategy) / "model.safetensors"
    return _eval_caps(suite, base.model_copy(update={"id": f"{ft.base}-{strategy}", "checkpoint": str(ckpt),
                                                     "strategy": strategy}))


def _eval_caps(suite: Suite, m: SegModelConfig) -> SegModelConfig:
    """``m`` with the images cap of ``finetune.eval`` (``max_perturbed_per_modality``) when the
    suite sets one; unchanged otherwise."""
    ft = suite.segmentation.finetune
    cap = ft.eval.max_perturbed_per_modality if ft is not None else None
    return m if cap is None else m.model_copy(update={"max_perturbed_per_modality": cap})


def registry_model_id(name: str, version: int) -> str:
    return f"{name}-v{version}"


def registry_model_config(suite: Suite, uri: str, mlruns_dir: str | Path | None = None) -> SegModelConfig:
    """An evaluation config for a registered version (``models:/name/3``, ``@alias`` or ``/latest``):
    id ``<name>-v<version>``, checkpoint pinned to that version, family / arch / strategy from the
    version's ``config.json`` (written by :func:`finetune.train.save_checkpoint`), every other
    setting from :func:`_evaluation_template` (the fine-tuning base's caps and levels, so the
    version's rows pair sample by sample with the strategies'; ``finetune.eval``'s images cap
    when the suite sets one, as for the strategies). The checkpoint is the version's
    local file, so loading needs no registry lookup."""
    name, version = model_registry.resolve_version(uri, mlruns_dir)
    pinned = f"models:/{name}/{version}"
    weights = model_registry.resolve_model_uri(pinned, mlruns_dir)
    cfg_file = weights.with_name("config.json")
    meta = json.loads(cfg_file.read_text()) if cfg_file.is_file() else {}
    if "family" not in meta or "arch" not in meta:
        raise ValueError(f"{uri}: version {version} has no config.json with 'family' and 'arch' next to its weights "
                         f"({cfg_file}); register checkpoint folders written by save_checkpoint")
    template = _evaluation_template(suite, str(meta["family"]), str(meta["arch"]))
    if template is None:  # no suite model of its family and architecture: the defaults
        devices = {m.device for m in suite.segmentation.models}
        template = SegModelConfig(id=registry_model_id(name, version), family=meta["family"], arch=meta["arch"],
                                  checkpoint=str(weights.resolve()), device=devices.pop() if len(devices) == 1 else "cpu")
    return _eval_caps(suite, template.model_copy(update={
        "id": registry_model_id(name, version), "checkpoint": str(weights.resolve()),
        "strategy": str(meta.get("strategy", "unknown"))}))


def _evaluation_template(suite: Suite, family: str, arch: str) -> SegModelConfig | None:
    """The suite model whose evaluation settings a registered version of ``family`` / ``arch``
    takes (device, batch size, engine, precision, preprocessing, ``levels``,
    ``max_perturbed_per_modality``, ``attacks``), so that its rows cover the same samples as the
    models it is compared with: the fine-tuning base when it matches, else the first suite model
    of that family and architecture; None when there is none (then the defaults)."""

    ft = suite.segmentation.finetune
    candidates = [model_config(suite, ft.base)] if ft is not None else []
    candidates += list(suite.segmentation.models)
    return next((m for m in candidates if m.family == family and m.arch == arch), None)


@dataclass
class ModelEvalSummary:
    model: str
    checkpoint: str
    n_rows: int = 0
    n_failed: int = 0
    n_partitions: int = 0
    seconds: float = 0.0
    mean_iou: dict[str, float] = field(default_factory=dict)  # clean / perturbed / attack, mean of partitions


def evaluation_suite(suite: Suite, ev: FinetuneEval) -> Suite:
    """``suite`` as a fine-tuned checkpoint is evaluated: on ``ev.split`` when it names one (the
    reference evaluates its base models on every image and its fine-tunes on the test split),
    else unchanged."""
    if ev.split is None or ev.split == suite.segmentation.split:
        return suite
    return suite.model_copy(update={"segmentation": suite.segmentation.model_copy(update={"split": ev.split})})


def evaluate_model(suite: Suite, m: SegModelConfig, ev: FinetuneEval | None = None,
                   log: Callable[[str], None] | None = None) -> ModelEvalSummary:
    """Clean, perturbed and attack rows for one model over every modality of the suite, restricted
    by ``ev`` (default: the suite's ``finetune.eval``; its ``split`` replaces
    ``segmentation.split``); the model is loaded once. Rows go to the ordinary segmentation
    partitions of ``m.id``, so a re-run replaces them (no duplicates)."""
    from medrobust_lib.tracks.segmentation.evaluate import (
        evaluate_attacks,
        evaluate_clean,
        evaluate_perturbed,
    )

    t0 = time.perf_counter()
    if ev is None:
        ft = suite.segmentation.finetune
        ev = ft.eval if ft is not None else FinetuneEval()
    suite = evaluation_suite(suite, ev)
    levels = ev.levels if ev.levels is not None else list(suite.perturbations.levels)
    attack_levels = ev.attack_levels if ev.attack_levels is not None else suite.attack_levels()
    model = load_model(suite, m)
    out = ModelEvalSummary(m.id, model.checkpoint_hash)
    ious: dict[str, list[float]] = {}

    def add(kind: str, s: Any) -> None:
        out.n_rows += s.n_rows
        out.n_failed += s.n_failed
        out.n_partitions += 1
        if s.n_rows and s.mean_iou == s.mean_iou:
            ious.setdefault(kind, []).append(float(s.mean_iou))

    for modality in suite.modalities:
        add("clean", evaluate_clean(suite, m, modality, model=model))
        for lv in levels:
            add("perturbed", evaluate_perturbed(suite, m, modality, lv, model=model, perturbations=ev.perturbations))
        for lv in attack_levels:
            add("attack", evaluate_attacks(suite, m, modality, lv, model=model, kinds=ev.attack_kinds))
        if log:
            log(f"{m.id}: {modality} evaluated ({out.n_rows} rows so far)")
    _prune_partitions(suite, m.id, {("clean", mo, 0) for mo in suite.modalities}
                      | {("perturbation", mo, lv) for mo in suite.modalities for lv in levels}
                      | {("attack", mo, lv) for mo in suite.modalities for lv in attack_levels})
    out.mean_iou = {k: sum(v) / len(v) for k, v in ious.items()}
    out.seconds = time.perf_counter() - t0
    return out


def _prune_partitions(suite: Suite, model_id: str, keep: set[tuple[str, str, int]]) -> list[Path]:
    """Remove ``model_id``'s result partitions that this evaluation did not write (levels or
    modalities of an earlier evaluation set), so every model's rows cover one set of conditions."""

    from medrobust_lib.tracks.segmentation.evaluate import RESULTS_TABLE

    root = Path(suite.results_dir) / RESULTS_TABLE / f"model={model_id}"
    removed: list[Path] = []
    for folder in sorted(root.glob("run=*/modality=*/level=*")) if root.is_dir() else []:
        run, modality, level = (p.split("=", 1)[1] for p in folder.parts[-3:])
        if (run, modality, int(level)) not in keep:
            shutil.rmtree(folder)
            removed.append(folder)
    return removed


def degrade_checkpoint(src: str | Path, dst: str | Path, *, noise: float = 0.5, seed: int = 0,
                       prefix: str = "image_encoder.") -> Path:
    """A deliberately worse copy of a checkpoint folder, for exercising the regression gate:
    every floating tensor under ``prefix`` gets seeded Gaussian noise of ``noise`` times its own
    standard deviation. ``config.json`` is copied with ``degraded`` recorded. Returns the new
    ``model.safetensors``."""

    import torch
    from safetensors.torch import load_file, save_file


    src, dst = Path(src), Path(dst)
    if src.is_file():
        src = src.parent
    state = load_file(str(src / "model.safetensors"))
    touched = 0
    for k in sorted(state):
        t = state[k]
        if k.startswith(prefix) and t.is_floating_point() and t.numel() > 1:
            g = rng_for(seed, "degrade", k)
            n = torch.from_numpy(g.standard_normal(tuple(t.shape)).astype("float32")).to(t.dtype)
            state[k] = t + noise * float(t.float().std()) * n
            touched += 1
    if not touched:
        raise ValueError(f"no floating tensor under {prefix!r} in {src}")
    dst.mkdir(parents=True, exist_ok=True)
    save_file(state, str(dst / "model.safetensors"))
    meta = json.loads((src / "config.json").read_text()) if (src / "config.json").is_file() else {}
    meta["degraded"] = {"from": str(src), "noise": noise, "seed": seed, "prefix": prefix, "tensors": touched}
    (dst / "config.json").write_text(json.dumps(meta, indent=1, sort_keys=True, default=str))
    return dst / "model.safetensors"


@dataclass
class StrategySummary:
    strategy: str
    checkpoint: str
    n_trainable: int
    n_total: int
    trainable_modules: list[str]
    val_dice: float
    test_dice: float
    base_val_dice: float
    steps: int
    seconds: float
    meta: dict[str, Any] = field(default_factory=dict)
    reused: bool = False
    """The checkpoint in the strategy's folder was trained from the same recipe (:func:`_recipe`)
    and kept: nothing was trained."""


FINETUNE_VERSION = 1
"""Part of every fine-tuning recipe: raise it when training code changes what a recipe produces,
so that checkpoints trained before are trained again."""


EVAL_ONLY = ("id", "batch_size", "levels", "max_perturbed_per_modality", "max_perturbed_per_dataset", "attacks",
             "runtime")
"""Base-model settings that only say how the model is evaluated: changing them retrains nothing."""


def _recipe(base: SegModelConfig, base_hash: str, strategy: StrategyConfig, train: dict[str, Any], seed: int,
            prompt: str, splits: dict[str, list[Sample]]) -> str:
    """Fingerprint of everything a fine-tuned checkpoint follows from: the base model's settings
    (those that change its forward pass: not its evaluation-only ``EVAL_ONLY`` fields) and weights
    (``base_hash``), the strategy's settings, the training loop's, the seed, the prompt protocol and
    the content of the train / val / test samples."""
    settings: dict[str, Any] = {"name": strategy.name, "encoder_blocks": strategy.encoder_blocks,
                                "lora": strategy.lora.model_dump(mode="json"), "adapter_ratio": strategy.adapter_ratio}
    # settings added later enter only when they matter, so earlier recipes keep their fingerprints
    if strategy.encoder_partial_adapters:
        settings["encoder_partial_adapters"] = True
    if strategy.name.startswith("lora_plus"):
        settings.update(lora_plus_lr_ratio=strategy.lora_plus_lr_ratio, lora_modules=strategy.lora_modules)
    model = base.model_dump(mode="json", exclude=set(EVAL_ONLY))
    return digest([FINETUNE_VERSION, model, base_hash, settings, train,
                                seed, prompt, {name: sorted([s.dataset, s.sample_id, s.content_hash()] for s in ss)
                                               for name, ss in sorted(splits.items())}])


def _kept(out_dir: Path, recipe: str, strategy: str, t0: float) -> StrategySummary | None:
    """The summary of the checkpoint already in ``out_dir`` when it was trained from ``recipe`` and
    its weights file is the one it recorded (``weights_sha256``); None otherwise (then it is
    trained again)."""
    path, cfg = out_dir / "model.safetensors", out_dir / "config.json"
    try:
        meta = json.loads(cfg.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or meta.get("recipe") != recipe or not path.is_file():
        return None
    if meta.get("weights_sha256") != file_sha256(path):
        return None
    (out_dir / "train_state.pt").unlink(missing_ok=True)  # a later, interrupted run of the same recipe
    return StrategySummary(strategy, str(path), int(meta["n_trainable"]), int(meta["n_total"]),
                           list(meta["trainable_modules"]), float(meta["val_dice"]), float(meta["test_dice"]),
                           float(meta["base_val_dice"]), int(meta["steps"]), time.perf_counter() - t0, meta,
                           reused=True)


@dataclass(frozen=True)
class StrategyRecipe:
    """Everything one strategy's fine-tune of the suite's base model follows from, and its
    fingerprint (:func:`_recipe`; recorded in the checkpoint's ``config.json`` as ``recipe``)."""

    base: SegModelConfig
    splits: dict[str, list[Sample]]
    strategy: StrategyConfig
    train: TrainConfig
    seed: int
    fingerprint: str


AUGMENTATION_SETTINGS: dict[str, dict[str, Any]] = {
    "project": {},  # TrainConfig's defaults: dihedral / gain / zoom, boxes jittered by 5 %
    "reference": {"augment_set": "reference", "box_jitter": 0.0},
    "none": {"augment": False, "box_jitter": 0.0},
}
"""``finetune.train.augmentation`` -> the :class:`~medrobust_lib.training.train.TrainConfig` settings."""


def strategy_config(ft: FinetuneConfig, strategy: str, family: str) -> StrategyConfig:
    """The :class:`~medrobust_lib.training.strategies.StrategyConfig` of one strategy on a base of
    ``family`` from the suite's ``finetune`` section (LoRA targets resolved per strategy and family:
    :meth:`~medrobust_lib.config.segmentation.FinetuneConfig.lora_for`)."""
    from medrobust_lib.training.strategies import StrategyConfig

    lora, lora_modules = ft.lora_for(strategy, family)
    return StrategyConfig(name=strategy, encoder_blocks=ft.encoder_blocks, lora=lora, adapter_ratio=ft.adapter_ratio,
                          encoder_partial_adapters=ft.encoder_partial_adapters,
                          lora_plus_lr_ratio=ft.lora_plus_lr_ratio, lora_modules=lora_modules)


def train_config(ft: FinetuneConfig, strategy: str, seed: int) -> TrainConfig:
    """The :class:`~medrobust_lib.training.train.TrainConfig` of one strategy from the suite's
    ``finetune`` section: the batch size of ``full`` (``batch_size_full``), the encoder
    learning-rate factor for ``encoder_partial`` and ``full``, LoRA+'s ``B``-matrix ratio for the
    LoRA+ strategies (the reference's ``build_optimizer``), and the recipe switches."""
    from medrobust_lib.training.train import TrainConfig

    tc = ft.train
    return TrainConfig(max_steps=tc.max_steps, lr=tc.lr, eval_every=tc.eval_every,
                       batch_size=tc.batch_size_full if strategy == "full" and tc.batch_size_full else tc.batch_size,
                       patience=tc.patience, time_budget_s=tc.time_budget_s, seed=seed, warmup_steps=tc.warmup_steps,
                       weight_decay=tc.weight_decay, epochs=tc.epochs, warmup_epochs=tc.warmup_epochs,
                       encoder_lr_factor=tc.encoder_lr_factor if strategy in ("encoder_partial", "full") else 1.0,
                       lora_b_lr_factor=ft.lora_plus_lr_ratio if strategy.startswith("lora_plus") else 1.0,
                       amp=tc.amp, lr_schedule=tc.lr_schedule, select=tc.select,
                       **AUGMENTATION_SETTINGS[tc.augmentation])


def strategy_recipe(suite: Suite, strategy: str, seed: int | None = None) -> StrategyRecipe:
    """The recipe of fine-tuning the suite's ``finetune.base`` with ``strategy`` (``seed``: default
    the suite's). Raises ValueError for a strategy the suite does not configure."""
    from medrobust_lib.models.sam import checkpoint_file_hash
    from medrobust_lib.training.train import config_dict

    ft = require_finetune(suite)
    if strategy not in ft.strategies:
        raise ValueError(f"strategy {strategy!r} is not configured; configured: {ft.strategies}")
    base = model_config(suite, ft.base)
    splits = seg_splits(suite)
    scfg = strategy_config(ft, strategy, base.family)
    seed = suite.seed if seed is None else seed
    cfg = train_config(ft, strategy, seed)
    # the weights' hash from the file: no model is loaded only to fingerprint it
    fp = _recipe(base, checkpoint_file_hash(resolve_checkpoint(suite, base)), scfg, config_dict(cfg), seed,
                 suite.segmentation.prompt.protocol, splits)
    return StrategyRecipe(base, splits, scfg, cfg, seed, fp)


def finetune_strategy(suite: Suite, strategy: str, log: Callable[[str], None] | None = None, *,
                      seed: int | None = None, out_dir: str | Path | None = None, reuse: bool = True) -> StrategySummary:
    """Fine-tune the configured base model with one strategy and save
    ``var/checkpoints/<base>-<strategy>/model.safetensors`` + ``config.json`` (or ``out_dir``).
    ``seed`` (default: the suite's) drives the data order, augmentation, LoRA/adapter init and
    dropout: another seed gives an independently retrained candidate of the same recipe.
    A checkpoint already there from the same recipe (:func:`strategy_recipe`; its ``config.json``
    records it) is kept instead of trained again (``reused``), so a resumed run does not repeat
    hours of training (``reuse=False``: always train, as a benchmark must); an interrupted training
    resumes from its ``train_state.pt``."""
    from medrobust_lib.training.strategies import apply_strategy, merge_lora, prepare_for_eval
    from medrobust_lib.training.train import config_dict, evaluate_dice, save_checkpoint, train_segmenter

    t0 = time.perf_counter()
    ft = require_finetune(suite)
    rc = strategy_recipe(suite, strategy, seed)
    base, splits, scfg, cfg, seed, recipe = rc.base, rc.splits, rc.strategy, rc.train, rc.seed, rc.fingerprint
    prompt = suite.segmentation.prompt
    out_dir = Path(out_dir) if out_dir is not None else strategy_dir(suite, ft.base, strategy)
    kept = _kept(out_dir, recipe, strategy, t0) if reuse else None
    if kept is not None:
        if log:
            log(f"{ft.base}-{strategy}: kept {kept.checkpoint} (trained from the same recipe)")
        return kept
    model = load_model(suite, base, fresh=True)  # trained in place: never the shared inference copy
    base_val = evaluate_dice(model, splits["val"], prompt)
    report = apply_strategy(model, scfg, seed=seed)
    out_dir.mkdir(parents=True, exist_ok=True)
    state = out_dir / "train_state.pt"  # resume point; removed once the checkpoint is saved
    with scoped_torch_seed(seed, "strategy-train", strategy, module=model.sam):  # LoRA dropout
        res = train_segmenter(model, splits["train"], splits["val"], cfg, trainable=report.is_trainable, log=log,
                              state_path=state)
    prepare_for_eval(model)  # dropout (LoRA included) off for every number below
    test_dice = evaluate_dice(model, splits["test"], prompt)
    if strategy in LORA_FINETUNE_STRATEGIES:
        merge_lora(model)  # plain SAM weights: the ordinary loader reads them
    meta = {"family": base.family, "arch": base.arch, "model_id": f"{ft.base}-{strategy}", "strategy": strategy,
            "base_model": ft.base, "base_checkpoint_sha256": model.checkpoint_hash, "train": config_dict(cfg),
            "val_dice": res.best_val_dice, "best_step": res.best_step, "steps": res.steps, "test_dice": test_dice,
            "base_val_dice": base_val, "recipe": recipe, **report.summary()}
    path = save_checkpoint(model, out_dir, meta)
    state.unlink(missing_ok=True)
    return StrategySummary(strategy, str(path), report.n_trainable, report.n_total, list(report.trainable_modules),
                           res.best_val_dice, test_dice, base_val, res.steps, time.perf_counter() - t0, meta)


def register_version(folder: str | Path, name: str, tags: dict[str, str], *, run: Any = None,
                     mlruns_dir: str | Path | None = None, experiment: str = "registry") -> tuple[int, bool]:
    """Register a checkpoint folder as a new version of ``name`` with the ``candidate`` alias, unless
    a version with the same weights (tag ``checkpoint_sha256``) exists already: then that version is
    returned and nothing changes (re-running a deterministic fine-tune does not pile up versions).
    The first version of a model also becomes ``champion`` (the baseline the gate compares new
    candidates with). Without a ``run``, the registration gets its own run in ``experiment`` (a
    suite's is ``paths.experiment_name(suite, "registry")``). A version found by checksum whose
    registration was interrupted before its aliases were set gets them now (:func:`_finish_aliases`).
    Returns ``(version, created)``."""

    digest = file_sha256(Path(folder) / "model.safetensors")
    try:
        for v in model_registry.list_versions(name, mlruns_dir):
            if v["tags"].get("checkpoint_sha256") == digest:
                _finish_aliases(name, int(v["version"]), v["tags"].get(ALIASES_SET_TAG) == "true", mlruns_dir)
                return int(v["version"]), False
    except model_registry.RegistryError:
        pass
    rv = model_registry.register_checkpoint(folder, name, tags={**tags, "checkpoint_sha256": digest}, run=run,
                                      experiment=experiment, mlruns_dir=mlruns_dir, alias="candidate")
    _finish_aliases(name, rv.version, False, mlruns_dir)
    return rv.version, True


ALIASES_SET_TAG = "medrobust.aliases_set"
"""Version tag written (``true``) once a registration has set its aliases: a version without it was
interrupted between ``create_model_version`` and the alias writes."""


def _finish_aliases(name: str, version: int, done: bool, mlruns_dir: str | Path | None) -> None:
    """Give ``version`` the aliases its registration sets, idempotently, so a registration killed
    between creating the version and writing its aliases is finished by the next run (which finds
    the version by checksum): ``candidate`` when the model has none, or when this registration never
    completed (``done`` False) and ``candidate`` points at an older version; ``champion`` when the
    model has none. A completed registration leaves a hand-moved ``candidate`` alone."""
    candidate = model_registry.get_alias_version(name, "candidate", mlruns_dir)
    if candidate is None or (not done and candidate < version):
        model_registry.set_alias(name, "candidate", version, mlruns_dir)
    if model_registry.get_alias_version(name, "champion", mlruns_dir) is None:
        model_registry.set_alias(name, "champion", version, mlruns_dir)
    if not done:
        model_registry.set_version_tag(name, version, ALIASES_SET_TAG, "true", mlruns_dir)


def reuse_rows(results_dir: str | Path, src_model: str, dst_model: str, checkpoint: str) -> int:
    """Copy ``src_model``'s ``segmentation_results`` partitions to ``dst_model`` when every one of
    its rows has ``checkpoint`` (the same weights, evaluated with the same suite settings): the
    registry evaluation of a version the strategy asset already evaluated costs no model call.
    Returns the rows copied (0: nothing reusable; ``dst_model`` is left untouched)."""

    import pandas as pd

    from medrobust_lib.tracks.segmentation.evaluate import RESULTS_TABLE

    src = Path(results_dir) / RESULTS_TABLE / f"model={src_model}"
    files = sorted(src.rglob("*.parquet")) if src.is_dir() else []
    if not files:
        return 0
    frames = [pd.read_parquet(f, columns=["checkpoint"]) for f in files]
    ck = set(pd.concat(frames)["checkpoint"].astype(str))
    if ck != {checkpoint}:
        return 0
    dst = Path(results_dir) / RESULTS_TABLE / f"model={dst_model}"
    tmp = dst.with_name(dst.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    shutil.rmtree(dst, ignore_errors=True)
    tmp.replace(dst)
    return int(sum(len(f) for f in frames))


def evaluate_version(suite: Suite, name: str, version: int, mlruns_dir: str | Path | None = None, *,
                     reuse: bool = True, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """``segmentation_results`` rows for a registered version, as model ``<name>-v<version>``.

    When ``reuse`` and the version is the suite's ``<base>-<strategy>`` checkpoint that the strategy
    asset already evaluated (same weights, same ``finetune.eval``), its rows are copied
    (:func:`reuse_rows`); otherwise the version is evaluated with :func:`evaluate_model`. Returns
    metadata: model_id, checkpoint_hash, reused_rows, and for an evaluation n_rows, n_failed,
    seconds and ``mean_iou_<clean|perturbed|attack>``."""
    from medrobust_lib.models.sam import checkpoint_file_hash

    m = registry_model_config(suite, f"models:/{name}/{version}", mlruns_dir)
    if m.checkpoint is None:
        raise ValueError(f"registered version {name}/{version} resolved to no checkpoint")
    digest = checkpoint_file_hash(m.checkpoint)
    ft = suite.segmentation.finetune
    reused = 0
    if reuse and ft is not None and name == model_registry.seg_model_name(ft.base, m.strategy):
        reused = reuse_rows(suite.results_dir, f"{ft.base}-{m.strategy}", m.id, digest)
    meta: dict[str, Any] = {"model_id": m.id, "checkpoint_hash": digest, "reused_rows": reused}
    if not reused:
        r = evaluate_model(suite, m, log=log)
        meta.update({"n_rows": r.n_rows, "n_failed": r.n_failed, "seconds": r.seconds,
                     **{f"mean_iou_{k}": v for k, v in r.mean_iou.items()}})
    return meta


def strategy_params(suite: Suite) -> dict[str, int]:
    """Trainable parameters of every saved strategy checkpoint, by evaluated model id
    (``<base>-<strategy>``), read from its ``config.json``."""

    ft = require_finetune(suite)
    out: dict[str, int] = {}
    for st in ft.strategies:
        cfg = strategy_dir(suite, ft.base, st) / "config.json"
        if cfg.is_file():
            n = json.loads(cfg.read_text()).get("n_trainable")
            if n is not None:
                out[f"{ft.base}-{st}"] = int(n)
    return out
