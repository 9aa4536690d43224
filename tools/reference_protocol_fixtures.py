"""Fixtures for the reference protocol (``configs/reference_protocol.yaml``), made by running the
reference benchmark's own code on the project's inputs.

Usage (one-off; the reference repository is fetched separately, nothing of it is copied here)::

    python -m tools.reference_protocol_fixtures /path/to/MedFM-Robust- [--only calibration,captions,...]

It imports, from the given checkout of ``github.com/vfdv52/MedFM-Robust-``:

- ``Segmentation/segmentation_generate_perb_all_V10_adpative_efficient.py`` (its ``SimpleITK``
  import is replaced by an empty module: only its NIfTI loader uses it) and runs
  ``Medical2DPerturbationGenerator.apply_perturbation_adaptive`` (which runs ``find_adaptive_param``
  and ``compute_ssim``) over a dataset of demo images, with the generator's three type-specific
  hooks (``_apply_perturbation_with_param``, ``_get_param_range``, ``_is_inverse_param``) bound to
  medrobust's perturbation types, so the bisection, caching and SSIM are the reference's own;
- ``VLM/eval_vlm_perturbation.py`` and runs ``compute_caption_metrics`` (pycocoevalcap on raw
  strings; once with ``round`` bound to the identity, for the unrounded scores, once as published),
  ``parse_bbox_from_text``, ``extract_bbox_from_mask`` (on PNG masks written to a temporary folder)
  and ``calculate_iou``; and ``DeepSeekEvaluator`` (``evaluate_vqa``, ``evaluate_caption``: their
  prompts, and ``_call_api``'s reading of fixed judge replies, ``requests`` replaced by a stand-in);
- ``Segmentation/finetune_utils.py`` and runs ``setup_finetune`` (every strategy the reference's
  ``jobgpu_with_finetune.sh`` runs, with its settings: LoRA r 16 / alpha 32, LoRA+ ratio 16, the last
  2 encoder blocks) and ``build_optimizer`` on SAM-Med2D's ViT-B architecture (medrobust's build of
  it: the published module names, random weights) and on a Hugging Face ``SamModel`` of MedSAM's
  ViT-B configuration, recording which tensors train, their sizes and learning rates;
- ``Segmentation/finetune.py`` (its ``model_zoo`` import replaced by a stand-in: no model is built)
  and ``Segmentation/jobgpu_with_finetune.sh``: the arguments the job script passes to
  ``finetune.py`` for every strategy, parsed by ``finetune.py``'s own ``get_parser`` into the
  ``FinetuneConfig`` its ``main`` builds; the split, which evaluations read ``data_split.json``, and
  ``SegmentationDataset._augment`` run on demo arrays with scripted random draws; and the VLM
  fine-tuning recipe (``VLM/eval_vlm_perturbation.py``'s ``CONFIG``, the runner's ``--epochs``, the
  schedule its trainer builds);
- ``Segmentation/model_zoo.py`` and runs ``MedSAMModel.forward`` (Hugging Face ``SamProcessor``,
  PIL backend, the settings of ``flaviagiammarino/medsam-vit-base``: no download) and
  ``SAMMed2DModel.forward`` on demo images, each with a stand-in for its weights that records the
  model input and stops.

Writes ``tests/reference_protocol/fixtures/*.json`` / ``*.npz``.
"""

from __future__ import annotations

import argparse
import builtins
import contextlib
import importlib.util
import json
import re
import subprocess
import sys
import tempfile
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from medrobust_lib.demo import generators as gens
from medrobust_lib.demo.geometry import Placement
from medrobust_lib.perturb.engine import perturbation_key
from medrobust_lib.perturb.spec import get_perturbation
from medrobust_lib.seeding import rng_for

ROOT = Path(__file__).resolve().parents[1]

OUT = ROOT / "tests" / "reference_protocol" / "fixtures"
G_FILE = "Segmentation/segmentation_generate_perb_all_V10_adpative_efficient.py"
EV_FILE = "VLM/eval_vlm_perturbation.py"
SEED = 0
SIZE = 96
LEVELS = (1, 3, 5)
BANDS = {1: (0.90, 0.98), 3: (0.70, 0.79), 5: (0.50, 0.59)}
# (dataset, modality, generator, medrobust types): the reference's per-dataset subsets (main())
# in medrobust's names, a few per modality.
DATASETS: tuple[tuple[str, str, Any, tuple[str, ...]], ...] = (
    ("derm_ref", "dermoscopy", gens.gen_dermoscopy,
     ("gaussian_noise", "gaussian_blur", "jpeg_compression", "contrast", "pixelate", "hair", "light_reflection")),
    ("us_ref", "ultrasound", lambda rng, pl: gens.gen_ultrasound(rng, pl, True),
     ("gaussian_noise", "speckle_noise", "motion_blur", "acoustic_shadowing", "reverberation", "rotation")),
)
N_IMAGES = 3


def _load(path: Path, name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _git(repo: Path) -> str:
    try:
        return subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _to_float(img: np.ndarray) -> np.ndarray:
    small = cv2.resize(img, (SIZE, SIZE), interpolation=cv2.INTER_AREA)
    f = small.astype(np.float32)
    return (f - f.min()) / max(float(f.max() - f.min()), 1e-6)


def _images() -> dict[str, list[np.ndarray]]:
    """Demo images per dataset, float32 in [0, 1], (SIZE, SIZE[, 3]), rounded through uint8 so the
    fixture stores them exactly."""
    out: dict[str, list[np.ndarray]] = {}
    for ds, _, gen, _ in DATASETS:
        rng = np.random.default_rng([SEED, len(ds)])
        imgs = []
        for i in range(N_IMAGES):
            g = gen(rng, Placement(right=bool(i & 1), lower=bool(i & 2), large=i % 2 == 0))
            u8 = np.round(_to_float(g.image) * 255).astype(np.uint8)
            imgs.append(u8.astype(np.float32) / np.float32(255))
        out[ds] = imgs
    return out


def calibration(repo: Path) -> None:
    sys.modules.setdefault("SimpleITK", types.ModuleType("SimpleITK"))
    g = _load(repo / G_FILE, "reference_generate")
    images = _images()
    results: list[dict[str, Any]] = []
    for ds, modality, _, type_names in DATASETS:
        for name in type_names:
            spec = get_perturbation(name)
            gen = g.Medical2DPerturbationGenerator(seed=42)
            current: dict[str, str] = {}
            gen._get_param_range = lambda _t, spec=spec: spec.strength_range
            gen._is_inverse_param = lambda _t, spec=spec: spec.inverse
            gen._apply_perturbation_with_param = (
                lambda image, _m, _t, param, spec=spec, current=current:
                spec.apply(image, param, rng_for(current["key"])).image)
            for level in LEVELS:
                for i, image in enumerate(images[ds]):
                    sid = f"img{i}"
                    current["key"] = perturbation_key(SEED, ds, sid, name)
                    _, ssim_val, param = gen.apply_perturbation_adaptive(
                        image, "X", name, level, {level: BANDS[level]}, use_cache=True)
                    results.append({"dataset": ds, "modality": modality, "sample_id": sid, "perturbation": name,
                                    "level": level, "param": float(param), "ssim_minmax": float(ssim_val)})
    arrays: dict[str, Any] = {f"{ds}__img{i}": np.round(im * 255).astype(np.uint8) for ds, ims in images.items()
                              for i, im in enumerate(ims)}
    np.savez_compressed(OUT / "calibration_images.npz", **arrays)
    (OUT / "calibration_reference.json").write_text(json.dumps({
        "generator": "tools/reference_protocol_fixtures.py", "reference": f"{G_FILE} @ {_git(repo)}",
        "seed": SEED, "bands": {str(k): v for k, v in BANDS.items()}, "rows": results}, indent=1))
    print(f"calibration: {len(results)} rows")


def _caption_inputs() -> list[dict[str, Any]]:
    """The project's own caption test set (tests/metrics/fixtures/caption_reference_subset.json)."""
    d = json.loads((ROOT / "tests" / "metrics" / "fixtures" / "caption_reference_subset.json").read_text())
    return [{"id": s["id"], "prediction": s["prediction"], "references": s["references"]} for s in d["samples"]]


def captions(repo: Path) -> None:
    ev = _load(repo / EV_FILE, "reference_eval")
    samples = _caption_inputs()
    groups = {"all": samples, "first_40": samples[:40], "middle_40": samples[40:80], "last_40": samples[80:]}
    fn = ev.compute_caption_metrics
    unrounded = types.FunctionType(fn.__code__, {**fn.__globals__, "round": lambda x, n=None: x}, fn.__name__)
    out = {}
    for gname, group in groups.items():
        preds = [s["prediction"] for s in group]
        refs = [list(s["references"]) for s in group]
        raw = unrounded(preds, refs)
        pub = fn(preds, refs)
        if not raw or not pub:
            raise RuntimeError(f"the reference's compute_caption_metrics failed on group {gname}")
        out[gname] = {"ids": [s["id"] for s in group], "unrounded": raw, "rounded": pub}
    assert builtins.round(0.123456, 4) == 0.1235
    (OUT / "caption_raw_reference.json").write_text(json.dumps({
        "generator": "tools/reference_protocol_fixtures.py", "reference": f"{EV_FILE} @ {_git(repo)}",
        "inputs": "tests/metrics/fixtures/caption_reference_subset.json", "samples": samples, "groups": out},
        indent=1))
    print(f"captions: {len(groups)} groups")


GROUNDING_TEXTS: tuple[str | None, ...] = (
    None, "", "no box", "[0.1, 0.2, 0.5, 0.6]", "The lesion is at [0.12,0.30,0.44,0.71].",
    "(0.1, 0.2, 0.3, 0.4)", "box: 10 20 30 40", "[120, 45, 300, 420]", "<box>[0.2, 0.2, 0.6, 0.6]</box>",
    "x1=0.1, y1=0.2, x2=0.3, y2=0.4", "(0.10,0.20),(0.55,0.65)", "-0.1, 0.2, 0.3, 0.4",
    "The answer is 3 lesions at 0.2, 0.3, 0.5, 0.6 and more", "[0.1, 0.2, 0.5]", "1 2 3 4 5 6",
    "<|box_start|>(100,200),(400,500)<|box_end|>", "coordinates 0.25 , 0.25 , 0.75 , 0.75", "[.5, .5, .9, .9]",
    "1.5.2, 3, 4, 5", "[0.3, 0.4, 0.1, 0.2]",
)


def _masks() -> list[tuple[np.ndarray, list[int] | None]]:
    """Rectangular masks and their pixel boxes [x0, y0, x1, y1] (end exclusive), plus an empty one."""
    rng = np.random.default_rng([SEED, 7])
    masks: list[tuple[np.ndarray, list[int] | None]] = []
    for h, w in ((64, 64), (50, 80), (97, 61)):
        for _ in range(3):
            m = np.zeros((h, w), bool)
            y0, x0 = int(rng.integers(0, h - 5)), int(rng.integers(0, w - 5))
            y1, x1 = int(rng.integers(y0 + 1, h + 1)), int(rng.integers(x0 + 1, w + 1))
            m[y0:y1, x0:x1] = True
            masks.append((m, [x0, y0, x1, y1]))
    masks.append((np.zeros((32, 40), bool), None))
    return masks


def grounding(repo: Path) -> None:
    ev = _load(repo / EV_FILE, "reference_eval")
    parsed = [ev.parse_bbox_from_text(t) for t in GROUNDING_TEXTS]
    mask_rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (m, rect) in enumerate(_masks()):
            p = Path(tmp) / f"m{i}.png"
            cv2.imwrite(str(p), m.astype(np.uint8) * 255)
            box = ev.extract_bbox_from_mask(str(p))
            mask_rows.append({"shape": list(m.shape), "pixel_box": rect,
                              "box": None if box is None else [float(v) for v in box]})
    ious = []
    for a in parsed:
        for mr in mask_rows:
            ious.append(float(ev.calculate_iou(a, mr["box"])))
    (OUT / "grounding_reference.json").write_text(json.dumps({
        "generator": "tools/reference_protocol_fixtures.py", "reference": f"{EV_FILE} @ {_git(repo)}",
        "texts": list(GROUNDING_TEXTS), "parsed": parsed, "masks": mask_rows, "ious": ious}, indent=1))
    print(f"grounding: {len(parsed)} texts, {len(mask_rows)} masks")


MZ_FILE = "Segmentation/model_zoo.py"


class _Captured(Exception):
    """Raised by the stand-in model to stop the reference's forward once its input is known."""

    def __init__(self, **tensors: Any) -> None:
        super().__init__("captured")
        self.tensors = tensors


class _StubSamModel:
    """Stands in for the weights the reference's wrappers load: records the preprocessed input."""

    def __call__(self, **inputs: Any) -> Any:  # HF SamModel(**processor outputs)
        raise _Captured(**{k: v for k, v in inputs.items() if hasattr(v, "shape")})

    class image_encoder:  # noqa: N801  (segment-anything's attribute name)
        def __new__(cls, x: Any) -> Any:
            raise _Captured(pixel_values=x)


def _seg_images() -> dict[str, np.ndarray]:
    """Demo images (float32 in [0, 1], through uint8), square and not, grayscale and RGB."""
    rng = np.random.default_rng([SEED, 11])
    derm = gens.gen_dermoscopy(rng, Placement(right=True, lower=False, large=True)).image
    us = gens.gen_ultrasound(rng, Placement(right=False, lower=True, large=False), True).image
    out = {}
    for name, img, hw in (("rgb_square", derm, (96, 96)), ("rgb_wide", derm, (60, 100)),
                          ("gray_tall", us, (90, 50)), ("gray_square", us, (64, 64))):
        small = cv2.resize(img, (hw[1], hw[0]), interpolation=cv2.INTER_AREA)
        f = small.astype(np.float32)
        u8 = np.round((f - f.min()) / max(float(f.max() - f.min()), 1e-6) * 255).astype(np.uint8)
        out[name] = u8
    return out


def preprocessing(repo: Path) -> None:
    import torch
    from transformers import SamProcessor
    from transformers.models.sam.image_processing_pil_sam import SamImageProcessorPil

    mz = _load(repo / MZ_FILE, "reference_model_zoo")
    arrays: dict[str, Any] = {}  # Any: numpy's stub reads **kwargs of savez_compressed as allow_pickle too
    for name, u8 in _seg_images().items():
        arrays[f"image__{name}"] = u8
        img = u8.astype(np.float32) / np.float32(255)
        chw = np.repeat(img[None], 3, axis=0) if img.ndim == 2 else img.transpose(2, 0, 1)
        x = torch.from_numpy(np.ascontiguousarray(chw))[None]
        h, w = img.shape[:2]
        box = [w * 0.2, h * 0.3, w * 0.7, h * 0.8]
        arrays[f"box__{name}"] = np.asarray(box, np.float64)
        # MedSAM: the reference's MedSAMModel.forward with the HF processor of medsam-vit-base
        # (SamImageProcessor defaults: longest edge 1024, ImageNet mean/std, pad 1024; as that
        # checkpoint's preprocessor_config.json), do_rescale=False as the reference sets it. The
        # PIL backend: the processor transformers 4.x loaded (the reference predates 5.x, whose
        # default torchvision backend resizes float tensors without the uint8 round trip).
        # Every image at longest edge 256 (the same steps, small fixtures), one also at 1024.
        for size in (256, 1024) if name == "gray_tall" else (256,):
            med = mz.MedSAMModel.__new__(mz.MedSAMModel)
            torch.nn.Module.__init__(med)
            med.device = "cpu"
            med.model = _StubSamModel()
            proc = SamImageProcessorPil(size={"longest_edge": size}, pad_size={"height": size, "width": size})
            med.processor = SamProcessor(image_processor=proc)
            med.processor.image_processor.do_rescale = False
            try:
                med.forward(x, input_boxes=box)
                raise RuntimeError("the reference MedSAM forward did not reach the model")
            except _Captured as c:
                arrays[f"medsam_pixel_values__{name}__{size}"] = c.tensors["pixel_values"].numpy()
                arrays[f"medsam_input_boxes__{name}__{size}"] = c.tensors["input_boxes"].numpy()
        # SAM-Med2D: the reference's SAMMed2DModel.forward (phase 1) at image_size 256
        from segment_anything.utils.transforms import ResizeLongestSide

        sm = mz.SAMMed2DModel.__new__(mz.SAMMed2DModel)
        torch.nn.Module.__init__(sm)
        sm.device = "cpu"
        sm.image_size = 256
        sm.transform = ResizeLongestSide(256)
        sm.model = _StubSamModel()
        sm.register_buffer("pixel_mean", torch.tensor([123.675, 116.28, 103.53]).view(-1, 1, 1))
        sm.register_buffer("pixel_std", torch.tensor([58.395, 57.12, 57.375]).view(-1, 1, 1))
        try:
            sm.forward(x, input_boxes=box)
            raise RuntimeError("the reference SAM-Med2D forward did not reach the encoder")
        except _Captured as c:
            arrays[f"sammed2d_pixel_values__{name}"] = c.tensors["pixel_values"].numpy()
    np.savez_compressed(OUT / "preprocessing_reference.npz", **arrays)
    import transformers

    (OUT / "preprocessing_reference.json").write_text(json.dumps({
        "generator": "tools/reference_protocol_fixtures.py", "reference": f"{MZ_FILE} @ {_git(repo)}",
        "transformers": transformers.__version__, "images": sorted(_seg_images())}, indent=1))
    print(f"preprocessing: {len(arrays)} arrays")


FU_FILE = "Segmentation/finetune_utils.py"
STEPS_PER_EPOCH = 13


def finetune(repo: Path) -> None:
    """The reference's ``build_optimizer`` (learning rate per parameter) on medrobust's tiny SAM
    after medrobust's ``encoder_partial`` (N = 2) / ``full`` strategies, and its ``build_scheduler``
    (20 epochs, 0.1 warmup epoch) multipliers per step."""
    import torch

    from medrobust_lib.models.sam import SamSegmenter, arch_for, build_sam
    from medrobust_lib.training.strategies import StrategyConfig, apply_strategy

    fu = _load(repo / FU_FILE, "reference_finetune_utils")
    groups: dict[str, dict[str, float]] = {}
    for strategy in ("encoder_partial", "full"):
        seg = SamSegmenter(build_sam(arch_for("tiny", "sam"), seed=0), "sam", "tiny", "0")
        report = apply_strategy(seg, StrategyConfig(name=strategy, encoder_blocks=2))
        for n, p in seg.sam.named_parameters():
            p.requires_grad_(report.is_trainable(n))
        cfg = fu.FinetuneConfig(strategy=strategy, learning_rate=1e-5, weight_decay=0.01, encoder_lr_scale=0.1)
        opt = fu.build_optimizer(seg.sam, cfg)
        ids = {id(p): n for n, p in seg.sam.named_parameters()}
        groups[strategy] = {ids[id(p)]: float(g["lr"]) for g in opt.param_groups for p in g["params"]}
    cfg = fu.FinetuneConfig(num_epochs=20, warmup_epochs=0.1, learning_rate=1.0)
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = fu.build_scheduler(opt, cfg, STEPS_PER_EPOCH)
    factors = [float(sched.lr_lambdas[0](step)) for step in range(20 * STEPS_PER_EPOCH)]
    (OUT / "finetune_reference.json").write_text(json.dumps({
        "generator": "tools/reference_protocol_fixtures.py", "reference": f"{FU_FILE} @ {_git(repo)}",
        "lr": 1e-5, "encoder_lr_scale": 0.1, "encoder_blocks": 2, "param_lr": groups,
        "schedule": {"epochs": 20, "warmup_epochs": 0.1, "steps_per_epoch": STEPS_PER_EPOCH, "factors": factors}},
        indent=1))
    print(f"finetune: {sum(len(g) for g in groups.values())} parameters, {len(factors)} steps")


JUDGE_CASES: tuple[tuple[str, str, str], ...] = (
    ("Which organ is shown?", "The liver.", "Liver"),
    ("Is there a fracture in {the} left femur?", "Possibly; a line at the neck", "Yes, femoral neck fracture"),
    ("", "", ""),
)
JUDGE_REPLIES: tuple[str, ...] = ("1", "0.5", "0", " Score: 0.5 (partially)", "1.0\n", "I'd say 2", "-1", "none",
                                  "0.75", ".5", "10.25.3")


class _FakeResponse:
    status_code = 200

    def __init__(self, content: str) -> None:
        self._content = content

    def json(self) -> dict[str, Any]:
        return {"choices": [{"message": {"content": self._content}}]}


def judge(repo: Path) -> None:
    """The reference judge's prompt (``evaluate_vqa`` with ``_call_api`` returning its argument) and
    its reading of a reply (``_call_api`` with ``requests.post`` answering from a list)."""
    ev = _load(repo / EV_FILE, "reference_eval")
    judge_obj = ev.DeepSeekEvaluator({"api_key": "not-a-key"})
    prompts = []
    for q, pred, gt in JUDGE_CASES:
        judge_obj._call_api = lambda prompt: prompt
        prompts.append({"question": q, "prediction": pred, "ground_truth": gt,
                        "prompt": judge_obj.evaluate_vqa(q, pred, gt)})
    scores = []
    with _fake_requests() as fake_requests:
        caller = ev.DeepSeekEvaluator({"api_key": "not-a-key"})
        for reply in JUDGE_REPLIES:
            fake_requests.post = lambda *a, reply=reply, **k: _FakeResponse(reply)  # type: ignore[attr-defined]
            scores.append({"reply": reply, "score": caller._call_api("prompt")})
    (OUT / "judge_reference.json").write_text(json.dumps({
        "generator": "tools/reference_protocol_fixtures.py", "reference": f"{EV_FILE} @ {_git(repo)}",
        "prompts": prompts, "scores": scores}, indent=1))
    print(f"judge: {len(prompts)} prompts, {len(scores)} replies")


@contextlib.contextmanager
def _fake_requests() -> Iterator[types.ModuleType]:
    """A stand-in ``requests`` module in ``sys.modules`` while the block runs (the reference's judge
    imports it at call time); the real one, if any, is put back afterwards."""
    fake = types.ModuleType("requests")
    real = sys.modules.get("requests")
    sys.modules["requests"] = fake
    try:
        yield fake
    finally:
        if real is not None:
            sys.modules["requests"] = real
        else:
            sys.modules.pop("requests", None)


CAPTION_JUDGE_CASES: tuple[tuple[str, str], ...] = (
    ("CT of the chest showing a small nodule in the right upper lobe.",
     "Axial CT image of the chest demonstrating a 6 mm nodule in the right upper lobe (arrow)."),
    ("An X-ray image. {Fracture} 50% likely; \"quoted\"\nsecond line", "Radiograph of the left femur with {no} fracture."),
    ("", ""),
)
"""(candidate caption, reference caption) pairs shown to the reference's caption judge."""
CAPTION_JUDGE_REPLIES: tuple[str, ...] = ("0.8", "1", "0", "0.85\n", "Score: 0.7 - mostly accurate", "8/10",
                                          "-0.3", "1.5", "none", "", "N/A", "about .6", "0.7.2")
"""Judge replies, well-formed and malformed, read by the reference's ``_call_api``."""


def caption_judge(repo: Path) -> None:
    """The reference's caption judge: its prompt (``evaluate_caption`` with ``_call_api`` returning
    its argument) and its reading of a reply (``_call_api`` with ``requests.post`` answering from a
    list; ``evaluate_caption`` calls the same ``_call_api`` as ``evaluate_vqa``)."""
    ev = _load(repo / EV_FILE, "reference_eval")
    judge_obj = ev.DeepSeekEvaluator({"api_key": "not-a-key"})
    judge_obj._call_api = lambda prompt: prompt
    prompts = [{"prediction": pred, "ground_truth": gt, "prompt": judge_obj.evaluate_caption(pred, gt)}
               for pred, gt in CAPTION_JUDGE_CASES]
    scores = []
    with _fake_requests() as fake_requests:
        caller = ev.DeepSeekEvaluator({"api_key": "not-a-key"})
        for reply in CAPTION_JUDGE_REPLIES:
            sent: list[str] = []

            def post(*a: Any, reply: str = reply, sent: list[str] = sent, **k: Any) -> _FakeResponse:
                sent.append(k["json"]["messages"][0]["content"])
                return _FakeResponse(reply)

            fake_requests.post = post  # type: ignore[attr-defined]
            score = caller.evaluate_caption("a candidate", "a reference")
            assert sent and "a candidate" in sent[0]  # the caption judge's own prompt went out
            scores.append({"reply": reply, "score": score})
    (OUT / "caption_judge_reference.json").write_text(json.dumps({
        "generator": "tools/reference_protocol_fixtures.py", "reference": f"{EV_FILE} @ {_git(repo)}",
        "function": "DeepSeekEvaluator.evaluate_caption", "prompts": prompts, "scores": scores}, indent=1))
    print(f"caption_judge: {len(prompts)} prompts, {len(scores)} replies")


REF_STRATEGIES = ("decoder_only", "decoder_prompt", "adapter_only", "encoder_partial", "lora", "lora_plus_encoder",
                  "lora_plus_decoder", "full")
"""``FINETUNE_STRATEGIES_SAMMED2D`` of ``jobgpu_with_finetune.sh`` (MedSAM's list lacks ``adapter_only``)."""
JS_SETTINGS = {"learning_rate": 1e-5, "weight_decay": 0.01, "lora_r": 16, "lora_alpha": 32, "lora_plus_lr_ratio": 16.0,
               "unfreeze_encoder_layers": 2, "use_amp": True}
"""What ``jobgpu_with_finetune.sh`` passes to ``finetune.py`` (and finetune.py's defaults it does not override)."""


def _setup(fu: types.ModuleType, model: Any, family: str, strategy: str) -> tuple[Any, dict[str, float], list[str]]:
    """The reference's ``setup_finetune`` + ``build_optimizer`` on ``model`` (its wrapper holds it as
    ``.model``, as the reference's model classes do): the set-up model, each trainable tensor's
    learning rate, and the modules that got a LoRA / LoRA+ layer (names without peft's
    ``base_model.model.`` prefix)."""
    import contextlib
    import io

    import torch

    wrapper = types.SimpleNamespace(model=model)
    cfg = fu.FinetuneConfig(strategy=strategy, **JS_SETTINGS)
    with contextlib.redirect_stdout(io.StringIO()):  # the reference prints its diagnostics
        fu.setup_finetune(wrapper, family, cfg)
        opt = fu.build_optimizer(wrapper.model, cfg)
    ids = {id(p): n for n, p in wrapper.model.named_parameters()}
    lrs = {ids[id(p)]: float(g["lr"]) for g in opt.param_groups for p in g["params"]}
    try:
        from peft.tuners.lora import LoraLayer
    except ImportError:  # pragma: no cover
        LoraLayer = ()  # type: ignore[assignment,misc]  # noqa: N806
    wrapped = [n.removeprefix("base_model.model.") for n, m in wrapper.model.named_modules()
               if isinstance(m, fu.LoRAPlusLinear | LoraLayer) and not isinstance(m, torch.nn.Dropout)]
    return wrapper.model, lrs, [w for w in wrapped if w]


def finetune_strategies(repo: Path) -> None:
    """Which tensors each of the reference's strategies trains (``setup_sammed2d_finetune`` /
    ``setup_medsam_finetune``), their sizes and learning rates (``build_optimizer``), on
    SAM-Med2D's ViT-B (segment-anything module names, the reference's model) and on MedSAM's
    Hugging Face ``SamModel`` (ViT-B)."""
    import copy

    import torch
    from transformers import SamConfig, SamModel

    from medrobust_lib.models.sam import arch_for, build_sam

    fu = _load(repo / FU_FILE, "reference_finetune_utils")
    torch.manual_seed(0)
    sammed = build_sam(arch_for("vit_b", "sam_med2d"), seed=0)
    medsam = SamModel(SamConfig())  # medsam-vit-base's architecture (SamConfig's defaults are ViT-B)
    out: dict[str, Any] = {}
    for family, base, strategies in (("sammed2d", sammed, REF_STRATEGIES),
                                     ("medsam", medsam, tuple(s for s in REF_STRATEGIES if s != "adapter_only"))):
        rows: dict[str, Any] = {}
        for strategy in strategies:
            model, lrs, wrapped = _setup(fu, copy.deepcopy(base), family, strategy)
            params = [[n.removeprefix("base_model.model."), int(p.numel()), lrs[n]]
                      for n, p in model.named_parameters() if p.requires_grad]
            rows[strategy] = {"n_trainable": sum(r[1] for r in params), "n_tensors": len(params),
                              "wrapped": wrapped, "params": params}
        out[family] = {"architecture": "vit_b", "strategies": rows,
                       "n_total": int(sum(p.numel() for p in base.parameters()))}
    (OUT / "finetune_strategies_reference.json").write_text(json.dumps({
        "generator": "tools/reference_protocol_fixtures.py", "reference": f"{FU_FILE} @ {_git(repo)}",
        "settings": JS_SETTINGS, "models": {"sammed2d": "medrobust build_sam(arch_for('vit_b', 'sam_med2d'))",
                                            "medsam": "transformers SamModel(SamConfig())"},
        **out}, indent=0))
    print(f"finetune_strategies: {sum(len(v['strategies']) for v in out.values())} strategy set-ups")


JS_FILE = "Segmentation/jobgpu_with_finetune.sh"
FT_FILE = "Segmentation/finetune.py"
VLM_RUNNER = "VLM/run_vlm_perturbation_multi_gpu.sh"
AUGMENT_DRAWS: tuple[tuple[float, ...], ...] = (
    (0.9, 0.9, 0.9),                # nothing
    (0.1, 0.9, 0.9),                # horizontal flip
    (0.9, 0.1, 0.9),                # vertical flip
    (0.1, 0.1, 0.2, 1.0, 1.0),      # both flips, brightness / contrast at alpha 1.2, beta +20
    (0.9, 0.9, 0.0, 0.0, 0.0),      # alpha 0.8, beta -20
    (0.6, 0.4, 0.29, 0.5, 0.25),    # vertical flip, alpha 1.0, beta -10
)
"""Scripted ``np.random.random()`` values for ``SegmentationDataset._augment`` (in its order: horizontal
flip < 0.5, vertical flip < 0.5, brightness / contrast < 0.3, then alpha = 0.8 + 0.4 u, beta = -20 + 40 u)."""


def _shell_var(text: str, name: str) -> str:
    """The value of the last uncommented ``NAME=value`` line of a shell script (comment stripped)."""
    values = re.findall(rf"^{name}=([^#\n]*)", text, re.M)
    if not values:
        raise RuntimeError(f"{name} is not set in the script")
    return values[-1].strip()


def _match(pattern: str, text: str) -> str:
    """The first group of ``pattern``'s first match in ``text`` (dot matches newlines)."""
    m = re.search(pattern, text, re.S)
    if m is None:
        raise RuntimeError(f"the reference no longer has {pattern!r}")
    return m.group(1)


def _shell_list(text: str, name: str) -> list[str]:
    return re.findall(r'"([^"]+)"', _shell_var(text, name))


def recipe(repo: Path) -> None:
    """The reference's fine-tuning recipe as its scripts run it (module docstring)."""
    import numpy as np

    js = (repo / JS_FILE).read_text()
    fu = _load(repo / FU_FILE, "reference_finetune_utils")
    zoo = types.ModuleType("model_zoo")  # finetune.py's model factory: not needed to parse arguments
    zoo.create_model = None  # type: ignore[attr-defined]
    zoo.list_available_models = lambda: ["medsam", "sammed2d"]  # type: ignore[attr-defined]
    sys.modules["model_zoo"], sys.modules["finetune_utils"] = zoo, fu
    try:
        ft = _load(repo / FT_FILE, "reference_finetune")
    finally:
        sys.modules.pop("model_zoo", None)
        sys.modules.pop("finetune_utils", None)
    cmd = js[js.index('FINETUNE_CMD="python finetune.py'):js.index("eval ${FINETUNE_CMD}")]
    full_batch = int(_match(r'"\$\{CURRENT_STRATEGY\}" == "full" \]; then\s+current_batch_size=(\d+)', js))
    # the list in force when each model's runs start (the script swaps it for SAM-Med2D's and back)
    strategies = {"medsam": _shell_list(js[:js.index('run_dataset_all_strategies "medsam"')], "FINETUNE_STRATEGIES"),
                  "sammed2d": _shell_list(js, "FINETUNE_STRATEGIES_SAMMED2D")}
    configs: dict[str, dict[str, Any]] = {}
    for strategy in dict.fromkeys(strategies["medsam"] + strategies["sammed2d"]):
        argv = ["--model_name", "sammed2d", "--strategy", strategy, "--data_path", "data",
                "--num_epochs", _shell_var(js, "FINETUNE_EPOCHS"),
                "--batch_size", str(full_batch) if strategy == "full" else _shell_var(js, "FINETUNE_BATCH_SIZE"),
                "--learning_rate", _shell_var(js, "FINETUNE_LR")]
        argv += ["--use_amp"] if "--use_amp" in cmd else []
        if strategy.startswith("lora"):
            argv += ["--lora_r", _shell_var(js, "LORA_R"), "--lora_alpha", _shell_var(js, "LORA_ALPHA")]
        if strategy.startswith("lora_plus"):
            argv += ["--lora_plus_lr_ratio", _shell_var(js, "LORA_PLUS_LR_RATIO")]
        args = ft.get_parser().parse_args(argv)
        cfg = fu.FinetuneConfig(  # as finetune.py's main() builds it from the arguments
            strategy=args.strategy, learning_rate=args.learning_rate, weight_decay=args.weight_decay,
            num_epochs=args.num_epochs, batch_size=args.batch_size, unfreeze_encoder_layers=args.unfreeze_encoder_layers,
            lora_r=args.lora_r, lora_alpha=args.lora_alpha, lora_plus_lr_ratio=args.lora_plus_lr_ratio,
            gradient_accumulation_steps=args.gradient_accumulation_steps, use_amp=args.use_amp,
            output_dir=args.output_dir)
        configs[strategy] = {**cfg.to_dict(), "use_amp": cfg.use_amp, "max_grad_norm": cfg.max_grad_norm,
                             "gradient_accumulation_steps": cfg.gradient_accumulation_steps,
                             "test_split": args.test_split, "image_size": args.image_size}
    # which pipeline.py runs read the fine-tune's data_split.json (test files only): the fine-tunes'
    pipeline_runs = re.findall(r"python pipeline\.py(.*?)(?:\n\s*\n|\n\s*echo)", js, re.S)
    evaluation = {"finetuned": "--data_split_json" in pipeline_runs[0], "pretrained": "--data_split_json" in pipeline_runs[1]}
    src = (repo / FT_FILE).read_text()
    split_seed = int(_match(r"random_split\(.*?manual_seed\((\d+)\)", src))
    # SegmentationDataset._augment with scripted draws on a demo image, mask and box
    rng = np.random.default_rng([SEED, 46])
    img = rng.integers(0, 256, (12, 16, 3)).astype(np.uint8)
    mask = np.zeros((12, 16), np.float32)
    mask[2:7, 3:12] = 1
    box = [3.0, 2.0, 11.0, 6.0]
    ds = ft.SegmentationDataset.__new__(ft.SegmentationDataset)
    ds.augmentation = True
    cases = []
    real = np.random.random
    try:
        for draws in AUGMENT_DRAWS:
            queue = list(draws)
            np.random.random = lambda queue=queue: queue.pop(0)  # type: ignore[assignment,misc]
            out_img, out_mask, out_box = ds._augment(img.copy(), mask.copy(), list(box))
            if queue:
                raise RuntimeError(f"_augment drew fewer values than scripted: {draws}")
            cases.append({"draws": list(draws), "image": out_img.tolist(), "mask": out_mask.astype(int).tolist(),
                          "box": [float(v) for v in out_box]})
    finally:
        np.random.random = real  # type: ignore[assignment]
    ev = _load(repo / EV_FILE, "reference_eval")
    vlm_src = (repo / EV_FILE).read_text()
    vlm = {**{k: v for k, v in ev.CONFIG["finetune"].items() if k not in ("output_dir",)},
           "runner_epochs": int(_shell_var((repo / VLM_RUNNER).read_text(), "FINETUNE_EPOCHS")),
           "schedule": "linear" if "get_linear_schedule_with_warmup(" in vlm_src else "unknown"}
    (OUT / "finetune_recipe_reference.json").write_text(json.dumps({
        "generator": "tools/reference_protocol_fixtures.py",
        "reference": f"{JS_FILE}, {FT_FILE}, {FU_FILE}, {EV_FILE}, {VLM_RUNNER} @ {_git(repo)}",
        "strategies": strategies, "configs": configs, "split": {"test_split": configs["full"]["test_split"],
                                                                 "seed": split_seed, "validation": False},
        "evaluation_reads_data_split": evaluation, "scheduler": "cosine" if "torch.cos(" in
        (repo / FU_FILE).read_text() else "unknown",
        "augmentation": {"image": img.tolist(), "mask": mask.astype(int).tolist(), "box": box, "cases": cases},
        "vlm": vlm}, indent=1))
    print(f"recipe: {len(configs)} strategies, {len(cases)} augmentation cases")


P_FILE = "Segmentation/pipeline.py"


def _attack_trace(attack: Any, kind: str, eps: float, iters: int) -> dict[str, Any]:
    """Run the reference's ``fgsm_attack`` / ``pgd_attack`` against a stand-in model whose loss is
    linear in the image (gradient sign known: a fixed +-1 pattern), recording every input it is
    given and whether it was in train mode; read the step rule off the inputs."""
    import torch

    class Recorder(torch.nn.Module):  # pipeline.py's model interface: model(img, prompt, mask) -> (pred, loss)
        def __init__(self, w: torch.Tensor) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(w)
            self.device = "cpu"
            self.inputs: list[torch.Tensor] = []
            self.modes: list[bool] = []

        def forward(self, img: torch.Tensor, prompt: Any, mask: Any) -> tuple[None, torch.Tensor]:
            self.inputs.append(img.detach().clone())
            self.modes.append(self.training)
            return None, (img * self.w).sum()

    g = torch.Generator().manual_seed(SEED)
    w = torch.where(torch.rand(1, 3, 16, 16, generator=g) < 0.5, -1.0, 1.0).double()
    # mid-grey, float64 (step sizes read to ~1e-16): no pixel reaches 0 or 1 within eps
    x = torch.full((1, 3, 16, 16), 0.5, dtype=torch.float64)
    model = Recorder(w)
    model.eval()
    torch.manual_seed(SEED)  # pgd_attack's random start draws from the global RNG
    mask = torch.zeros(1, 1, 16, 16, dtype=torch.float64)
    adv = attack(model, x, [0, 0, 8, 8], mask, eps) if kind == "fgsm" else attack(model, x, [0, 0, 8, 8], mask, eps, iters)
    ins = model.inputs
    # a pixel whose step was not cut by the projection moved by exactly the step size
    steps = [float((b - a).abs().max()) for a, b in zip(ins, [*ins[1:], adv], strict=True)]
    return {"steps": len(ins), "step_size": steps[0] if kind == "fgsm" else max(steps[1:] or steps),
            "random_start": bool((ins[0] - x).abs().max() > 0),
            "max_abs_perturbation": float((adv - x).abs().max()),
            "gradient_sign_ascent": bool(((adv - x) * w).min() >= 0) if kind == "fgsm" else None,
            "train_mode": all(model.modes)}


def attacks(repo: Path) -> None:
    """The reference's FGSM / PGD as ``jobgpu_with_finetune.sh`` runs ``pipeline.py``: the attack
    levels and kinds every ``pipeline.py`` call passes, parsed by ``pipeline.py``'s own
    ``get_parser``; epsilon and PGD iterations per level (``LEVEL_TO_EPSILON``,
    ``LEVEL_TO_ITERS``); and the step rule, read off ``fgsm_attack`` / ``pgd_attack`` run on a
    stand-in model (:func:`_attack_trace`)."""
    zoo = types.ModuleType("model_zoo")  # pipeline.py's model factory: no model is built
    zoo.create_model = None  # type: ignore[attr-defined]
    zoo.list_available_models = lambda: ["medsam", "sammed2d"]  # type: ignore[attr-defined]
    sys.modules["model_zoo"] = zoo
    try:
        p = _load(repo / P_FILE, "reference_pipeline")
    finally:
        sys.modules.pop("model_zoo", None)
    js = (repo / JS_FILE).read_text()
    calls = re.findall(r"python pipeline\.py(.*?)(?:\n\s*\n|\n\s*echo)", js, re.S)
    parsed = []
    for call in calls:
        levels = re.search(r"--levels((?:\s+\d+)+)", call)
        kinds = re.search(r"--attack_types((?:\s+[a-z]+)+)", call)
        a = p.get_parser().parse_args(
            (["--levels", *levels.group(1).split()] if levels else [])
            + (["--attack_types", *kinds.group(1).split()] if kinds else []))
        parsed.append({"levels": list(a.levels), "attack_types": list(a.attack_types),
                       "finetuned": "--finetune_checkpoint" in call})
    if not parsed or any(c["levels"] != parsed[0]["levels"] or c["attack_types"] != parsed[0]["attack_types"]
                         for c in parsed):
        raise RuntimeError(f"the pipeline.py calls of {JS_FILE} disagree on levels / attack types: {parsed}")
    by_level: dict[str, Any] = {}
    for level in sorted(p.LEVEL_TO_EPSILON):
        eps, iters = float(p.LEVEL_TO_EPSILON[level]), int(p.LEVEL_TO_ITERS[level])
        by_level[str(level)] = {"epsilon": eps, "epsilon_255": eps * 255, "pgd_iterations": iters,
                                "fgsm": _attack_trace(p.fgsm_attack, "fgsm", eps, iters),
                                "pgd": _attack_trace(p.pgd_attack, "pgd", eps, iters)}
    (OUT / "attacks_reference.json").write_text(json.dumps({
        "generator": "tools/reference_protocol_fixtures.py",
        "reference": f"{JS_FILE}, {P_FILE} @ {_git(repo)}",
        "pipeline_calls": parsed, "levels": parsed[0]["levels"], "attack_types": parsed[0]["attack_types"],
        "levels_default": list(p.get_parser().parse_args([]).levels), "by_level": by_level}, indent=1))
    print(f"attacks: levels {parsed[0]['levels']} over {len(parsed)} pipeline.py calls")


SECTIONS = {"attacks": attacks, "recipe": recipe, "finetune_strategies": finetune_strategies, "judge": judge, "finetune": finetune, "calibration": calibration, "captions": captions, "grounding": grounding, "preprocessing": preprocessing}


GV_FILE = "VLM/generate_perturbation.py"
SAMPLE_POPULATIONS = (50, 100, 101, 150, 1000, 4321)
"""Record counts the reference's draw is run on (100 records, seed 42): fewer, as many, and more."""


def vlm_protocol(repo: Path) -> None:
    """The reference's VLM protocol: its record draw (``sample_data`` of the generator and
    ``DatasetAdapter.load_data`` of the evaluator, both run on lists of record indices), the
    generator's type sets per dataset (``base_perturbations``, ``modality_perturbations`` and the
    ROCO rule of ``generate_perturbations``, read by running it with the loaders and the image
    writer stubbed), and each model's decoding settings (the evaluator's ``CONFIG``)."""
    gv = _load(repo / GV_FILE, "reference_generate")
    ev = _load(repo / EV_FILE, "reference_eval")
    runner = (repo / "VLM/run_vlm_perturbation_multi_gpu.sh").read_text()
    n, seed = int(_match(r"\nSAMPLE_NUM=(\d+)", runner)), int(ev.CONFIG["seed"])

    class Adapter(ev.DatasetAdapter):  # type: ignore[name-defined,misc]
        def __init__(self, pop: list[int]) -> None:
            super().__init__({})
            self.pop = pop

        def load_all_data(self) -> list[int]:
            return list(self.pop)

        def get_image(self, *a: Any, **k: Any) -> None: ...
        def get_prompt(self, *a: Any, **k: Any) -> None: ...
        def get_ground_truth(self, *a: Any, **k: Any) -> None: ...

    draws = []
    for size in SAMPLE_POPULATIONS:
        pop = list(range(size))
        draws.append({"population": size, "n": n, "seed": seed,
                      "generator": gv.sample_data(list(pop), n, seed, "x"),
                      "evaluator": Adapter(pop).load_data(sample_num=n, seed=seed)})
    types_by_dataset: dict[str, list[str]] = {}
    fake = [{"_image_path": "x.png", "image_id": "x", "modality_type": "X-Ray"}]
    cls = gv.MedicalPerturbationGenerator
    stubs: list[tuple[Any, str, Any]] = [
        (gv, "load_omnimedvqa_all", lambda cfg: [dict(f) for f in fake]),
        (gv, "load_roco_all", lambda cfg: [dict(f) for f in fake]),
        (gv, "load_mecovqa_all", lambda cfg: [dict(f) for f in fake]),
        (gv, "sample_data", lambda samples, *a: samples),
        (cls, "load_image", lambda self, p: np.zeros((8, 8), np.float32)),
        (cls, "save_image", lambda self, img, p: None),
        (cls, "apply", lambda self, img, t, sev: self.applied.append(t) or img),
    ]
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in stubs]
    try:
        for obj, name, value in stubs:
            setattr(obj, name, value)
        for ds in ("omnimedvqa", "roco", "mecovqa"):
            seen: list[str] = []
            cls.applied = seen  # the generator instance generate_perturbations builds appends here
            with tempfile.TemporaryDirectory() as tmp:
                gv.CONFIG["datasets"][ds]["output_base"] = tmp
                gv.generate_perturbations(ds, 1, [1], None, seed)
            types_by_dataset[ds] = seen
    finally:
        for obj, name, value in saved:
            setattr(obj, name, value)
    gen = gv.MedicalPerturbationGenerator(seed)
    decoding = {name: {k: ev.CONFIG[name].get(k) for k in ("temperature", "do_sample", "system_prompt",
                                                           "conv_template", "max_new_tokens")}
                for name in ("model", "medgemma", "medgemma15", "gemini", "gpt4v")}
    (OUT / "vlm_protocol_reference.json").write_text(json.dumps({
        "generator": "tools/reference_protocol_fixtures.py",
        "reference": f"{GV_FILE}, {EV_FILE}, VLM/run_vlm_perturbation_multi_gpu.sh @ {_git(repo)}",
        "draws": draws, "base_perturbations": list(gen.base_perturbations),
        "modality_perturbations": {k: list(v) for k, v in gen.modality_perturbations.items()},
        "types_by_dataset": types_by_dataset, "decoding": decoding}, indent=1))
    print(f"vlm_protocol: {len(draws)} draws, types of {sorted(types_by_dataset)}")


SECTIONS["vlm_protocol"] = vlm_protocol
SECTIONS["caption_judge"] = caption_judge


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("repo", type=Path, help="a checkout (or git work tree) of vfdv52/MedFM-Robust-")
    ap.add_argument("--only", default=",".join(SECTIONS), help="comma-separated sections")
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    for name in args.only.split(","):
        SECTIONS[name](args.repo)


if __name__ == "__main__":
    main()
