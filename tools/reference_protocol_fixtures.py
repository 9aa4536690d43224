"""Fixtures for the reference protocol (``configs/reference_protocol.yaml``), made by running the
reference benchmark's own code on the project's inputs.

Usage (one-off; the reference repository is fetched separately, nothing of it is copied here)::

    python tools/reference_protocol_fixtures.py /path/to/MedFM-Robust- [--only calibration,captions,...]

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
  and ``calculate_iou``;
- ``Segmentation/model_zoo.py`` and runs ``MedSAMModel.forward`` (Hugging Face ``SamProcessor``,
  PIL backend, the settings of ``flaviagiammarino/medsam-vit-base``: no download) and
  ``SAMMed2DModel.forward`` on demo images, each with a stand-in for its weights that records the
  model input and stops.

Writes ``tests/reference_protocol/fixtures/*.json`` / ``*.npz``.
"""

from __future__ import annotations

import argparse
import builtins
import importlib.util
import json
import subprocess
import sys
import tempfile
import types
from pathlib import Path
from typing import Any

import cv2
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from medrobust_lib.demo import generators as gens  # noqa: E402
from medrobust_lib.demo.geometry import Placement  # noqa: E402
from medrobust_lib.perturb.engine import perturbation_key  # noqa: E402
from medrobust_lib.perturb.spec import get_perturbation  # noqa: E402
from medrobust_lib.seeding import rng_for  # noqa: E402

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
    arrays = {f"{ds}__img{i}": np.round(im * 255).astype(np.uint8) for ds, ims in images.items()
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
    arrays: dict[str, np.ndarray] = {}
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

    from medrobust_lib.finetune.strategies import StrategyConfig, apply_strategy
    from medrobust_lib.models.sam import SamSegmenter, arch_for, build_sam

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
    fake_requests = types.ModuleType("requests")
    scores = []
    real = sys.modules.get("requests")
    try:
        sys.modules["requests"] = fake_requests
        caller = ev.DeepSeekEvaluator({"api_key": "not-a-key"})
        for reply in JUDGE_REPLIES:
            fake_requests.post = lambda *a, reply=reply, **k: _FakeResponse(reply)  # type: ignore[attr-defined]
            scores.append({"reply": reply, "score": caller._call_api("prompt")})
    finally:
        if real is not None:
            sys.modules["requests"] = real
        else:
            sys.modules.pop("requests", None)
    (OUT / "judge_reference.json").write_text(json.dumps({
        "generator": "tools/reference_protocol_fixtures.py", "reference": f"{EV_FILE} @ {_git(repo)}",
        "prompts": prompts, "scores": scores}, indent=1))
    print(f"judge: {len(prompts)} prompts, {len(scores)} replies")


SECTIONS = {"judge": judge, "finetune": finetune, "calibration": calibration, "captions": captions, "grounding": grounding, "preprocessing": preprocessing}


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
