"""SAM-family adapters over segment-anything: SAM (vit_b/l/h), MedSAM and SAM-Med2D, plus the
tiny demo architecture.

Preprocessing per family (``predict`` and ``forward_logits`` share it, so attack gradients and
fine-tuning see exactly the evaluated model):

* ``sam``: resize the longest side to ``image_size`` (bilinear, antialiased), scale to 0-255,
  normalise with SAM's pixel mean/std, zero-pad bottom/right to a square (as
  ``segment_anything.SamPredictor`` does).
* ``medsam``: resize to ``image_size`` x ``image_size`` regardless of aspect (MedSAM's
  ``transform.resize(img, (1024, 1024))``; bilinear antialiased here instead of skimage's bicubic),
  per-image min-max normalisation to [0, 1], **no** mean/std normalisation (MedSAM feeds
  ``image_encoder`` directly, bypassing ``Sam.preprocess``). Box scaled to the 1024 grid.
* ``sam_med2d``: channels in BGR order, resize to 256 x 256 regardless of aspect with nearest
  neighbour (``F.interpolate(mode="nearest")`` equals ``cv2.INTER_NEAREST`` exactly), scale to 0-255
  and normalise with the pixel mean/std in the listed order. This is SAM-Med2D's pipeline:
  ``DataLoader.py`` and ``predictor_example.ipynb`` read images with ``cv2.imread`` (BGR) and
  normalise with the RGB-ordered mean/std, ``predictor_sammed.py`` and ``utils.train_transforms``
  resize with ``cv2.INTER_NEAREST`` (``test.py`` centre-pads images smaller than 256 on both sides
  instead; the predictor always resizes, as here). Grayscale inputs are unaffected by the channel
  order. Image encoder with adapter blocks (``medrobust_lib.models.sam_med2d``).

The mask decoder's low-resolution logits are upsampled to the model grid, the padding is cropped,
and the result is resized to the input resolution (bilinear). Probabilities = sigmoid(logits).

Per-family fidelity switches (:class:`SamSegmenter`): ``mask_selection`` (SAM-Med2D keeps the best
of its three masks by predicted IoU, as its predictor does; SAM and MedSAM the single-mask output)
and MedSAM's ``preprocess: exact`` (``MedSAM_Inference.py``: skimage bicubic resize on uint8,
sigmoid at 256 px, then resize). Engines: ``reference`` (segment-anything's modules) and ``fast``
(:mod:`medrobust_lib.models.sam_fast`, same weights and state-dict keys).
"""

from __future__ import annotations

import copy
import hashlib
import json
import pickle
import time
from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch
import torch.nn.functional as F

from medrobust_lib.hashing import SHORT_HASH_LEN, short_file_hash
from medrobust_lib.metrics.segmentation import THRESHOLD, dice_from_counts, iou_from_counts
from medrobust_lib.model_table import list_models
from medrobust_lib.models.base import SegmentationModel
from medrobust_lib.models.instance_counts import box_counts as instance_box_counts
from medrobust_lib.types import Boxes, FloatImage

if TYPE_CHECKING:
    from medrobust_lib.config.segmentation import SegModelConfig

Family = Literal["sam", "medsam", "sam_med2d", "litemedsam"]
PIXEL_MEAN = (123.675, 116.28, 103.53)
PIXEL_STD = (58.395, 57.12, 57.375)


@dataclass(frozen=True)
class SamArch:
    """Architecture hyper-parameters of a SAM image encoder + prompt encoder + mask decoder."""

    encoder_embed_dim: int
    encoder_depth: int
    encoder_num_heads: int
    encoder_global_attn_indexes: tuple[int, ...]
    image_size: int = 1024
    patch_size: int = 16
    prompt_embed_dim: int = 256
    window_size: int = 14
    use_rel_pos: bool = True
    decoder_depth: int = 2
    decoder_mlp_dim: int = 2048
    decoder_num_heads: int = 8
    iou_head_hidden_dim: int = 256
    mask_in_chans: int = 16
    adapter: bool = False
    adapter_mlp_ratio: float = 0.25


ARCHS: dict[str, SamArch] = {
    "vit_b": SamArch(768, 12, 12, (2, 5, 8, 11)),
    "vit_l": SamArch(1024, 24, 16, (5, 11, 17, 23)),
    "vit_h": SamArch(1280, 32, 16, (7, 15, 23, 31)),
    # Demo architecture (docs/design.md, section 4): a 64-wide, 2-block encoder at 256 px.
    "tiny": SamArch(64, 2, 2, (1,), image_size=256, prompt_embed_dim=64, window_size=0, use_rel_pos=False,
                    decoder_depth=2, decoder_mlp_dim=256, decoder_num_heads=2, iou_head_hidden_dim=64,
                    mask_in_chans=8),
}


def arch_for(name: str, family: Family) -> SamArch:
    """The architecture for an arch name; SAM-Med2D is ViT-B at 256 px with adapters."""
    if name not in ARCHS:
        raise KeyError(f"unknown SAM architecture {name!r}; valid: {', '.join(sorted(ARCHS))}")
    arch = ARCHS[name]
    if family == "sam_med2d":
        arch = replace(arch, adapter=True, image_size=256 if name != "tiny" else arch.image_size)
    return arch


def build_sam(arch: SamArch, seed: int = 0) -> torch.nn.Module:
    """A randomly initialised ``segment_anything.modeling.Sam`` of this architecture (weights
    from a ``torch.Generator`` seeded by ``seed``; global RNG untouched)."""
    from segment_anything.modeling import ImageEncoderViT, MaskDecoder, PromptEncoder, Sam, TwoWayTransformer

    devnull = torch.random.fork_rng(devices=[])
    with devnull:
        torch.random.manual_seed(seed)  # scoped: fork_rng restores the global state on exit
        emb = arch.image_size // arch.patch_size
        encoder = ImageEncoderViT(
            depth=arch.encoder_depth, embed_dim=arch.encoder_embed_dim, img_size=arch.image_size,
            mlp_ratio=4, norm_layer=partial(torch.nn.LayerNorm, eps=1e-6), num_heads=arch.encoder_num_heads,
            patch_size=arch.patch_size, qkv_bias=True, use_rel_pos=arch.use_rel_pos,
            global_attn_indexes=arch.encoder_global_attn_indexes, window_size=arch.window_size,
            out_chans=arch.prompt_embed_dim,
        )
        if arch.adapter:
            from medrobust_lib.models.sam_med2d import insert_adapters

            insert_adapters(encoder, arch.adapter_mlp_ratio)
        sam = Sam(
            image_encoder=encoder,
            prompt_encoder=PromptEncoder(embed_dim=arch.prompt_embed_dim, image_embedding_size=(emb, emb),
                                         input_image_size=(arch.image_size, arch.image_size),
                                         mask_in_chans=arch.mask_in_chans),
            mask_decoder=MaskDecoder(
                num_multimask_outputs=3,
                transformer=TwoWayTransformer(depth=arch.decoder_depth, embedding_dim=arch.prompt_embed_dim,
                                              mlp_dim=arch.decoder_mlp_dim, num_heads=arch.decoder_num_heads),
                transformer_dim=arch.prompt_embed_dim, iou_head_depth=3, iou_head_hidden_dim=arch.iou_head_hidden_dim,
            ),
            pixel_mean=list(PIXEL_MEAN), pixel_std=list(PIXEL_STD),
        )
    sam.eval()
    return sam


class CheckpointMismatch(ValueError):
    """A checkpoint that does not fit the architecture (missing/unexpected keys, wrong shapes)."""


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Tensors from ``.safetensors`` or a torch checkpoint loaded with ``weights_only=True``.
    Published layouts: a plain state dict (SAM, MedSAM) or ``{"model": state_dict, ...}``
    (SAM-Med2D). A ``module.`` prefix (DataParallel) is stripped."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(
            f"checkpoint not found: {p}. Place the published weights there (SAM: sam_vit_b_01ec64.pth from "
            "the segment-anything release; MedSAM: medsam_vit_b.pth from the MedSAM release; SAM-Med2D: "
            "sam-med2d_b.pth from its release) or point models[].checkpoint in the suite YAML at your file. "
            "Nothing is downloaded at run time."
        )
    if p.suffix == ".safetensors":
        from safetensors.torch import load_file

        sd = load_file(str(p))
    else:

        try:
            obj = torch.load(p, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as exc:
            raise CheckpointMismatch(
                f"{p} holds pickled Python objects besides tensors (SAM-Med2D's train.py saves the whole "
                "optimizer object next to the weights), so it cannot be read with weights_only=True. Convert "
                "it once, in an environment you trust: open it with torch's loader allowing pickles "
                "(weights_only=False), keep only its 'model' entry and re-save it as torch.save({'model': "
                "state_dict}, 'OUT.pth') or as safetensors; then point the suite at OUT.pth. "
                f"({type(exc).__name__}: {str(exc)[:200]})"
            ) from None
        if isinstance(obj, dict) and "model" in obj and isinstance(obj["model"], dict):
            obj = obj["model"]
        if not isinstance(obj, dict):
            raise CheckpointMismatch(f"{p}: expected a state dict, got {type(obj).__name__}")
        sd = obj
    return {k.removeprefix("module."): v for k, v in sd.items() if isinstance(v, torch.Tensor)}


def load_into(model: torch.nn.Module, sd: dict[str, torch.Tensor], source: str) -> None:
    """Load strictly, or raise CheckpointMismatch listing what does not fit."""
    own = model.state_dict()
    missing = sorted(set(own) - set(sd))
    unexpected = sorted(set(sd) - set(own))
    shapes = sorted(f"{k}: checkpoint {tuple(sd[k].shape)} vs model {tuple(own[k].shape)}"
                    for k in set(own) & set(sd) if own[k].shape != sd[k].shape)
    if missing or unexpected or shapes:
        def head(xs: list[str]) -> str:
            return ", ".join(xs[:5]) + (f" ... (+{len(xs) - 5})" if len(xs) > 5 else "")

        raise CheckpointMismatch(
            f"checkpoint {source} does not fit this architecture: {len(missing)} missing keys [{head(missing)}], "
            f"{len(unexpected)} unexpected keys [{head(unexpected)}], {len(shapes)} shape mismatches [{head(shapes)}]"
        )
    model.load_state_dict(sd, strict=True)


CHECKPOINT_HASH_LEN = SHORT_HASH_LEN
"""``SamSegmenter.checkpoint_hash`` (the ``checkpoint`` column) is the file's SHA-256, first 16 hex."""


def checkpoint_file_hash(path: str | Path) -> str:
    """The hash stored for a checkpoint (``checkpoint`` column): ``short_file_hash(path)`` (:mod:`medrobust_lib.hashing`). A folder
    is taken to be a saved checkpoint folder holding ``model.safetensors``.

    Raises:
        FileNotFoundError: no such checkpoint file.
    """
    p = Path(path)
    if p.is_dir():
        p = p / "model.safetensors"
    if not p.is_file():
        raise FileNotFoundError(f"checkpoint file not found: {p}")
    return short_file_hash(p)


def state_dict_hash(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for k, v in sorted(model.state_dict().items()):
        h.update(k.encode())
        h.update(v.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def _shape_key(image: FloatImage | torch.Tensor) -> tuple[object, ...]:
    """The batching key of a host image (its shape) or a device image tensor (C, H, W)."""
    if isinstance(image, torch.Tensor):
        return ("device", *image.shape)
    return tuple(np.shape(image))


def _image_hw(image: FloatImage | torch.Tensor) -> tuple[int, int]:
    """(H, W) of a host image (H, W[, C]) or a device image tensor (C, H, W)."""
    if isinstance(image, torch.Tensor):
        return int(image.shape[-2]), int(image.shape[-1])
    shape = np.shape(image)
    return int(shape[0]), int(shape[1])


def to_tensor_batch(images: Sequence[FloatImage]) -> torch.Tensor:
    """Stack same-size images to (B, 3, H, W) float32 (grayscale replicated)."""
    arrs = [np.repeat(im[..., None], 3, axis=2) if im.ndim == 2 else im for im in images]
    return torch.from_numpy(np.stack(arrs).astype(np.float32)).permute(0, 3, 1, 2).contiguous()


EXACT_FAMILIES: tuple[str, ...] = tuple(list_models("segmentation", exact_preprocess=True))
"""Families with a host-side ``preprocess: exact`` mode (their official inference script's uint8 steps;
the model table's ``exact_preprocess``)."""
MaskSelection = Literal["single", "best_iou"]
Preprocess = Literal["default", "exact", "hf_processor"]
MASK_SELECTIONS: tuple[str, ...] = ("single", "best_iou")
PREPROCESS_MODES: tuple[str, ...] = ("default", "exact", "hf_processor")
Color = Literal["bgr", "rgb"]
Resize = Literal["nearest", "bilinear"]
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
"""The Hugging Face ``SamImageProcessor`` normalisation (of [0, 1] values)."""


def default_mask_selection(family: Family) -> MaskSelection:
    """SAM-Med2D's predictor decodes three masks and keeps the one with the highest predicted IoU
    (``SammedPredictor.predict_torch`` with its default ``multimask_output=True``); SAM and MedSAM
    evaluate the single-mask output."""
    return "best_iou" if family == "sam_med2d" else "single"


@dataclass
class ScoreResult:
    """Per-sample overlap scores from :meth:`SamSegmenter.score`: float64 (N,) arrays in input
    order, ``model_seconds`` spent in preprocessing, the model and the metrics (device time is
    only exact after the final synchronisation, which :meth:`SamSegmenter.score` does once)."""

    iou: np.ndarray
    dice: np.ndarray
    model_seconds: float
    box_iou: list[np.ndarray] = field(default_factory=list)
    """Per item, float64 (K,): each box's mask against its own instance (empty without targets)."""
    box_dice: list[np.ndarray] = field(default_factory=list)
    masks: list[np.ndarray] | None = None
    """Per item, the bool (H, W) union prediction (only with ``keep_masks``)."""


class SamSegmenter:
    """A SAM-family model behind the SegmentationModel protocol.

    ``engine``: ``fast`` (encoder attention through fused SDPA with the relative-position bias
    folded in, :mod:`medrobust_lib.models.sam_fast`) or ``reference`` (segment-anything's modules
    as released); default fast on CUDA, reference elsewhere. The switch patches the attention
    modules in place: same parameters, same state-dict keys. On CUDA the fast engine runs under
    bf16 autocast unless ``autocast_dtype`` says otherwise (fp32 master weights stay, so
    fine-tuning keeps its fp32 optimiser state). ``bf16_weights`` (CUDA, fast engine, encoder in
    eval mode): run a bf16 copy of the encoder instead (bf16 weights, activations and residual
    stream), rebuilt whenever a parameter of the fp32 encoder changes in place (an optimiser step,
    ``load_state_dict``). Off by default: on an H200 (ViT-B 1024 px) it was no faster than autocast
    (154-158 vs 159-163 img/s eager, 286 vs 288 compiled) and no closer to the fp32 masks.
    ``compile_mode``: ``torch.compile`` the image encoder (no-grad evaluation only; one compiled
    module per process, reused across partitions).

    ``mask_selection``: ``single`` (the single-mask output, mask token 0) or ``best_iou`` (the
    three multimask outputs, keeping the one with the highest predicted IoU, per box, as
    SAM-Med2D's predictor does); default per family (:func:`default_mask_selection`). It applies to
    ``predict``, ``score`` and ``forward_logits`` alike.

    ``preprocess``: ``default`` (module docstring) or, for MedSAM only, ``exact``:
    ``MedSAM_Inference.py``'s steps on the host: the [0, 1] image is rounded to uint8, resized with
    ``skimage.transform.resize(order=3, preserve_range=True, anti_aliasing=True)`` and truncated
    back to uint8, min-max normalised; the box is scaled in float64 (``box / [W, H, W, H] * S``);
    the low-resolution logits go through the sigmoid at 256 px and the *probabilities* are resized
    bilinearly to the input size. It is not differentiable, so it applies to ``predict`` and
    ``score``; ``forward_logits`` (attacks, fine-tuning) keeps the differentiable default path.
    Or, for MedSAM only, ``hf_processor``: the Hugging Face ``SamProcessor`` pipeline the reference
    benchmark ran MedSAM through (``flaviagiammarino/medsam-vit-base``, ``do_rescale=False`` on
    [0, 1] input): :meth:`preprocess_hf` on the host for ``predict`` / ``score`` (uint8 truncation,
    PIL bilinear resize of the longest side, ImageNet mean/std, zero padding), and the same steps
    without the uint8 round trip (bilinear antialiased resize) in the differentiable path; boxes
    and masks use the longest-side geometry (as ``sam``).

    ``color`` / ``resize`` (SAM-Med2D only; None: its published ``bgr`` / ``nearest``): ``rgb``
    keeps the channel order; ``bilinear`` is the reference benchmark's wrapper: longest side to
    ``image_size`` (``int(h * scale)``), bilinear without antialiasing, zero padding *before* the
    ``x 255`` mean/std normalisation, as its ``SAMMed2DModel.forward`` does.
    """

    def __init__(self, sam: torch.nn.Module, family: Family, model_id: str, checkpoint_hash: str,
                 device: str = "cpu", autocast_dtype: torch.dtype | None = None, *, engine: str | None = None,
                 compile_mode: str | None = None, mask_selection: str | None = None,
                 preprocess: str = "default", bf16_weights: bool = False, color: str | None = None,
                 resize: str | None = None) -> None:
        from medrobust_lib.models.sam_fast import default_engine, use_engine

        self.sam: Any = sam.to(device).eval()
        self.family: Family = family
        self.model_id = model_id
        self.checkpoint_hash = checkpoint_hash
        self.device = torch.device(device)
        self.engine = engine or default_engine(self.device)
        use_engine(self.sam, self.engine)
        if autocast_dtype is None and self.engine == "fast" and self.device.type == "cuda":
            autocast_dtype = torch.bfloat16
        encoder: Any = self.sam.image_encoder
        self.image_size = int(encoder.img_size)
        self.autocast_dtype = autocast_dtype
        self.compile_mode = compile_mode
        self.bf16_weights = bf16_weights
        self._lp_cache: tuple[tuple[tuple[int, int], ...], Any] | None = None
        self._compile_batch = 0
        selection = mask_selection or default_mask_selection(family)
        if selection not in MASK_SELECTIONS:
            raise ValueError(f"unknown mask_selection {selection!r}; valid: {', '.join(MASK_SELECTIONS)}")
        self.mask_selection: MaskSelection = selection  # type: ignore[assignment]
        if preprocess not in PREPROCESS_MODES:
            raise ValueError(f"unknown preprocess {preprocess!r}; valid: {', '.join(PREPROCESS_MODES)}")
        if preprocess == "exact" and family not in EXACT_FAMILIES:
            raise ValueError("preprocess 'exact' is the published host pipeline of "
                             f"{' and '.join(EXACT_FAMILIES)}; family {family!r} has no exact mode (its default is "
                             "already its published one)")
        if preprocess == "hf_processor" and family != "medsam":
            raise ValueError(f"preprocess {preprocess!r} is one of MedSAM's pipelines; family {family!r} has no "
                             "such mode (its default is already its published one)")
        self.preprocess_mode: Preprocess = preprocess  # type: ignore[assignment]
        if (color is not None or resize is not None) and family != "sam_med2d":
            raise ValueError(f"color / resize are SAM-Med2D options; family {family!r} has its own fixed pipeline")
        if color not in (None, "bgr", "rgb") or resize not in (None, "nearest", "bilinear"):
            raise ValueError(f"unknown color {color!r} or resize {resize!r}; valid: bgr, rgb / nearest, bilinear")
        self.color: Color = color or "bgr"  # type: ignore[assignment]
        self.resize_mode: Resize = resize or "nearest"  # type: ignore[assignment]
        # Host-to-device copies: float32 keeps CPU results identical to the reference; on CUDA the
        # images travel as float16 from pinned memory (half the bytes; far below bf16 rounding).
        self.host_dtype = torch.float16 if self.device.type == "cuda" else torch.float32
        self.n_encoder_calls = 0
        self.register_buffers()

    @classmethod
    def from_config(cls, m: SegModelConfig, checkpoint: str | Path, *,
                    cache_dir: str | Path | None = None) -> SamSegmenter:
        """The model of a suite's segmentation entry (family, arch, device, engine, compile,
        mask selection, preprocessing) loaded from ``checkpoint`` (:func:`load_segmenter`); the
        constructor that :func:`medrobust_lib.models.factory.build_segmenter` calls. ``cache_dir``
        is unused (these families run PyTorch only: ``runtime`` auto or pytorch)."""
        return load_segmenter(m.family, m.arch, checkpoint, model_id=m.id, device=m.device, engine=m.engine,
                              compile_mode=m.compile, mask_selection=m.mask_selection,
                              preprocess=m.preprocess or "default", color=m.color, resize=m.resize)

    def register_buffers(self) -> None:
        self.mean = torch.tensor(PIXEL_MEAN, device=self.device).view(1, 3, 1, 1)
        self.std = torch.tensor(PIXEL_STD, device=self.device).view(1, 3, 1, 1)
        self.imagenet_mean = torch.tensor(IMAGENET_MEAN, device=self.device).view(1, 3, 1, 1)
        self.imagenet_std = torch.tensor(IMAGENET_STD, device=self.device).view(1, 3, 1, 1)

    # ---- preprocessing -------------------------------------------------------------------
    def _geometry(self, h: int, w: int) -> tuple[int, int]:
        """Size (h', w') of the resized image inside the model grid."""
        s = self.image_size
        if self.family == "sam" or self.preprocess_mode == "hf_processor":
            scale = s / max(h, w)
            return int(h * scale + 0.5), int(w * scale + 0.5)
        if self.family == "sam_med2d" and self.resize_mode == "bilinear":
            scale = s / max(h, w)
            return int(h * scale), int(w * scale)
        return s, s

    def preprocess(self, images: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) in [0, 1] -> (B, 3, S, S) model input; differentiable."""
        _, _, h, w = images.shape
        nh, nw = self._geometry(h, w)
        x = images
        s = self.image_size
        if self.family == "sam_med2d":
            # SAM-Med2D was trained and evaluated on cv2.imread (BGR) input resized with INTER_NEAREST.
            if self.color == "bgr":
                x = x.flip(1)
            if self.resize_mode == "bilinear":  # the reference benchmark's wrapper (class docstring)
                if (nh, nw) != (h, w):
                    x = F.interpolate(x, size=(nh, nw), mode="bilinear", align_corners=False)
                return (F.pad(x, (0, s - nw, 0, s - nh)) * 255.0 - self.mean) / self.std
            if (nh, nw) != (h, w):
                x = F.interpolate(x, size=(nh, nw), mode="nearest")
        elif (nh, nw) != (h, w):
            x = F.interpolate(x, size=(nh, nw), mode="bilinear", align_corners=False, antialias=True)
        if self.family == "medsam" and self.preprocess_mode == "hf_processor":
            return F.pad((x - self.imagenet_mean) / self.imagenet_std, (0, s - nw, 0, s - nh))
        if self.family == "medsam":
            lo = x.amin(dim=(1, 2, 3), keepdim=True)
            hi = x.amax(dim=(1, 2, 3), keepdim=True)
            return (x - lo) / (hi - lo).clamp_min(1e-8)
        x = (x * 255.0 - self.mean) / self.std
        return F.pad(x, (0, s - nw, 0, s - nh))

    def preprocess_hf(self, images: Sequence[FloatImage]) -> torch.Tensor:
        """MedSAM through Hugging Face ``SamProcessor`` as the reference benchmark calls it
        (``do_rescale=False`` on a [0, 1] float image): per channel ``uint8(x * 255)`` (truncated,
        float32), PIL bilinear resize of the longest side to ``image_size``, back to [0, 1]
        (``/ 255``), ImageNet mean/std, zero padding bottom/right. Same-size images -> (B, 3, S, S)
        float32 on the device; not differentiable."""
        from PIL import Image

        s = self.image_size
        mean = np.asarray(IMAGENET_MEAN, np.float32)
        std = np.asarray(IMAGENET_STD, np.float32)
        out = []
        for im in images:
            a = np.asarray(im, np.float32)
            a = np.repeat(a[:, :, None], 3, axis=-1) if a.ndim == 2 else a
            h, w = a.shape[:2]
            nh, nw = self._geometry(h, w)
            u8 = (a * np.float32(255)).astype(np.uint8)
            r = np.asarray(Image.fromarray(u8).resize((nw, nh), resample=Image.Resampling.BILINEAR), np.float32)
            x = ((r * np.float32(1 / 255) - mean) / std).astype(np.float32)
            padded = np.zeros((s, s, 3), np.float32)
            padded[:nh, :nw] = x
            out.append(torch.from_numpy(padded).permute(2, 0, 1))
        return torch.stack(out).to(self.device)

    def preprocess_exact(self, images: Sequence[FloatImage]) -> torch.Tensor:
        """MedSAM_Inference.py's host preprocessing (class docstring) of same-size images ->
        (B, 3, S, S) float32 on the device."""
        from skimage import transform

        s = self.image_size
        out = []
        for im in images:
            u8 = np.clip(np.rint(np.asarray(im, np.float64) * 255.0), 0, 255).astype(np.uint8)
            img_3c = np.repeat(u8[:, :, None], 3, axis=-1) if u8.ndim == 2 else u8
            r = transform.resize(img_3c, (s, s), order=3, preserve_range=True, anti_aliasing=True).astype(np.uint8)
            r = (r - r.min()) / np.clip(r.max() - r.min(), a_min=1e-8, a_max=None)
            out.append(torch.tensor(r).float().permute(2, 0, 1))
        return torch.stack(out).to(self.device)

    def preprocess_exact_device(self, images: torch.Tensor) -> torch.Tensor:
        """The ``exact`` preprocessing of a device batch (B, 3, H, W) in [0, 1]. By default through the
        host (:meth:`preprocess_exact`); a family with a device form of its official steps overrides it."""
        host = [np.ascontiguousarray(a.permute(1, 2, 0).numpy()) for a in images.detach().float().cpu()]
        return self.preprocess_exact(host)

    def exact_model_boxes(self, boxes: np.ndarray, h: int, w: int) -> np.ndarray:
        """Pixel XYXY boxes (K, 4) of an H x W input -> model-grid boxes as the family's official
        script computes them (``preprocess: exact``). MedSAM: ``box / [W, H, W, H] * S`` in float64."""
        return boxes.astype(np.float64) / np.array([w, h, w, h]) * self.image_size

    def transform_boxes(self, boxes: torch.Tensor, h: int, w: int) -> torch.Tensor:
        nh, nw = self._geometry(h, w)
        scale = self._to_device(torch.tensor([nw / w, nh / h, nw / w, nh / h], dtype=boxes.dtype), boxes.device)
        return boxes * scale

    def _to_device(self, host: torch.Tensor, device: torch.device | None = None) -> torch.Tensor:
        """A host tensor on ``device`` (default the model's). On CUDA the copy goes through pinned
        memory without blocking: a copy from pageable memory first waits for the stream to drain,
        which would stall the host behind every queued encoder batch."""
        dev = device or self.device
        if dev.type == "cuda":
            return host.pin_memory().to(dev, non_blocking=True)
        return host.to(dev)

    def postprocess(self, low_res: torch.Tensor, h: int, w: int) -> torch.Tensor:
        s = self.image_size
        nh, nw = self._geometry(h, w)
        x = low_res
        if tuple(x.shape[-2:]) != (s, s):  # a same-size bilinear resize is the identity: skipped
            x = F.interpolate(x, size=(s, s), mode="bilinear", align_corners=False)
        return F.interpolate(x[..., :nh, :nw], size=(h, w), mode="bilinear", align_corners=False)

    def probabilities(self, low_res: torch.Tensor, h: int, w: int) -> torch.Tensor:
        """Low-resolution logits (M, 1, 256, 256) -> foreground probabilities (M, H, W) float32:
        sigmoid after :meth:`postprocess`, or (MedSAM exact) sigmoid at 256 px, then resized."""
        if self.preprocess_mode == "exact" and self.family == "medsam":
            p = torch.sigmoid(low_res.float())
            return F.interpolate(p, size=(h, w), mode="bilinear", align_corners=False)[:, 0]
        return torch.sigmoid(self.postprocess(low_res.float(), h, w))[:, 0]

    # ---- model ---------------------------------------------------------------------------
    def _low_precision_encoder(self) -> Any | None:
        """The bf16 inference copy of the image encoder (class docstring), or None where it does
        not apply: not CUDA, not the fast engine, no bf16 autocast, or the encoder in train mode.
        The copy is keyed on every encoder parameter's identity and in-place version counter."""
        enc = self.sam.image_encoder
        if (not self.bf16_weights or self.device.type != "cuda" or self.engine != "fast"
                or self.autocast_dtype != torch.bfloat16 or enc.training):
            return None
        key = tuple((id(p), p._version) for p in enc.parameters())
        if self._lp_cache is None or self._lp_cache[0] != key:
            self._lp_cache = None  # free the stale copy before building the next
            lp = copy.deepcopy(enc).to(torch.bfloat16).eval()
            for p in lp.parameters():
                p.requires_grad_(False)
            self._lp_cache = (key, lp)
        return self._lp_cache[1]

    def _compiled(self) -> bool:
        """Whether :meth:`encode` runs the compiled encoder now (``compile_mode``, no grad)."""
        return bool(self.compile_mode) and not torch.is_grad_enabled()

    def _encoder(self) -> tuple[Any, torch.dtype | None]:
        """The encoder module to call and the dtype its input must have (None: as given)."""
        lp = self._low_precision_encoder()
        enc, dtype = (lp, torch.bfloat16) if lp is not None else (self.sam.image_encoder, None)
        if self._compiled():
            from medrobust_lib.models.sam_fast import compiled_encoder

            return compiled_encoder(enc, str(self.compile_mode)), dtype
        return enc, dtype

    def encode(self, model_input: torch.Tensor) -> torch.Tensor:
        """Preprocessed (B, 3, S, S) -> image embeddings (B, C, e, e) under the model's autocast
        (bf16 on CUDA with the fast engine; gradients still reach a float32 input)."""
        b = int(model_input.shape[0])
        self.n_encoder_calls += b
        enc, dtype = self._encoder()
        x = model_input if dtype is None else model_input.to(dtype)
        if self._compiled():
            # a compiled graph is specialised to its batch size: pad every batch up to the largest
            # seen so far, so a partition's short last batch reuses the graph instead of recompiling
            self._compile_batch = max(self._compile_batch, b)
            if b < self._compile_batch:
                x = torch.cat([x, x.new_zeros((self._compile_batch - b, *x.shape[1:]))])
        with self._autocast():
            return enc(x)[:b]

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        return self.encode(self.preprocess(images.to(self.device)))

    def decode(self, embedding: torch.Tensor, boxes: torch.Tensor, h: int, w: int) -> torch.Tensor:
        """One image embedding (1, C, e, e) and its K boxes (K, 4) -> logits (K, 1, H, W)."""
        tb = self.transform_boxes(boxes.to(self.device, torch.float32), h, w)
        with self._autocast():
            sparse, dense = self.sam.prompt_encoder(points=None, boxes=tb, masks=None)
            multi = self.mask_selection == "best_iou"
            low, iou = self.sam.mask_decoder(image_embeddings=embedding, image_pe=self.sam.prompt_encoder.get_dense_pe(),
                                             sparse_prompt_embeddings=sparse, dense_prompt_embeddings=dense,
                                             multimask_output=multi)
            if multi:
                best = iou.argmax(dim=1)
                low = low[torch.arange(low.shape[0], device=low.device), best][:, None]
        return self.postprocess(low.float(), h, w)

    def decode_low(self, embeddings: torch.Tensor, model_boxes: torch.Tensor) -> torch.Tensor:
        """M image embeddings (M, C, e, e) paired with M boxes (M, 4) already in model-grid pixels
        -> low-resolution logits (M, 1, 256, 256) of the selected mask (``mask_selection``).

        segment-anything's ``MaskDecoder.predict_masks`` repeats one image embedding per prompt,
        so it cannot pair M embeddings with M boxes; this runs the same modules batched (as
        MedSAM's patched decoder does)."""
        md = self.sam.mask_decoder
        with self._autocast():
            sparse, dense = self.sam.prompt_encoder(points=None, boxes=model_boxes, masks=None)
            b = embeddings.shape[0]
            out_tokens = torch.cat([md.iou_token.weight, md.mask_tokens.weight], dim=0)
            tokens = torch.cat([out_tokens.unsqueeze(0).expand(b, -1, -1), sparse], dim=1)
            src = embeddings + dense
            pos = self.sam.prompt_encoder.get_dense_pe().expand(b, -1, -1, -1)
            _, c, eh, ew = src.shape
            hs, src = md.transformer(src, pos, tokens)
            up = md.output_upscaling(src.transpose(1, 2).reshape(b, c, eh, ew))
            _, uc, uh, uw = up.shape
            if self.mask_selection == "single":
                hyper = md.output_hypernetworks_mlps[0](hs[:, 1, :]).unsqueeze(1)
                return (hyper @ up.reshape(b, uc, uh * uw)).reshape(b, 1, uh, uw)
            # best_iou: the three multimask outputs (tokens 1..3), highest predicted IoU wins
            hyper = torch.stack([md.output_hypernetworks_mlps[i](hs[:, 1 + i, :]) for i in range(1, md.num_mask_tokens)],
                                dim=1)
            masks = (hyper @ up.reshape(b, uc, uh * uw)).reshape(b, -1, uh, uw)
            iou = md.iou_prediction_head(hs[:, 0, :])[:, 1:]
            best = iou.argmax(dim=1)
            return masks[torch.arange(b, device=masks.device), best][:, None]

    def decode_images(self, embeddings: torch.Tensor, owner: torch.Tensor, model_boxes: torch.Tensor) -> torch.Tensor:
        """:meth:`decode_low` of M boxes (M, 4) in model-grid pixels over E images: ``embeddings``
        (E, C, e, e), ``owner`` int64 (M,) the index into them of each box's image (on any device)
        -> low-resolution logits (M, 1, 256, 256). Here the embeddings are repeated per box; an
        exported decoder (LiteMedSAM) takes each image's once for all its boxes."""
        where = owner if owner.device == embeddings.device else self._to_device(owner, embeddings.device)
        return self.decode_low(embeddings.index_select(0, where), model_boxes)

    def decode_batch(self, embeddings: torch.Tensor, boxes: torch.Tensor, h: int, w: int) -> torch.Tensor:
        """B image embeddings (B, C, e, e) with one box each (B, 4) pixel XYXY of an H x W input
        -> logits (B, 1, H, W) (the selected mask, as ``decode``)."""
        tb = self.transform_boxes(boxes.to(self.device, torch.float32), h, w)
        return self.postprocess(self.decode_low(embeddings, tb).float(), h, w)

    def forward_logits(self, images: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
        _, _, h, w = images.shape
        return self.decode_batch(self.embed(images), boxes, h, w)

    def loss(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        from medrobust_lib.models.losses import dice_bce_loss

        return dice_bce_loss(logits, target)

    # ---- batched inference: probabilities and on-device metrics ----------------------------
    def _upload(self, images: Sequence[FloatImage] | Sequence[torch.Tensor]) -> torch.Tensor:
        """Same-size images -> (B, 3, H, W) float32 on the device. The host batch is stacked in
        ``host_dtype`` (pinned and copied without blocking on CUDA); grayscale is replicated to
        three channels on the device. Device images (torch tensors (C, H, W), C = 1 or 3, e.g. from
        the device perturbation engine) are stacked where they are, without a host round trip."""
        if isinstance(images[0], torch.Tensor):
            x = torch.stack([im.to(self.device, torch.float32) for im in images])  # type: ignore[union-attr]
            return x.expand(-1, 3, -1, -1) if x.shape[1] == 1 else x
        host = torch.from_numpy(np.stack([np.asarray(im, np.float32) for im in images])).to(self.host_dtype)
        x = self._to_device(host).float()
        return x[:, None].expand(-1, 3, -1, -1) if x.ndim == 3 else x.permute(0, 3, 1, 2)

    def _bucket_probs(self, images: Sequence[FloatImage], boxes: Sequence[Boxes], *, logits: bool = False
                      ) -> list[tuple[list[int], torch.Tensor, list[tuple[int, int]]]]:
        """One encoder batch over images of any sizes (each size group preprocessed on its own,
        all fed to the encoder together) and one decoder batch over all their boxes.

        Returns per size group: (indices into ``images``, probabilities (M, H, W) float32 on the
        device for the group's M boxes in order, spans: per image of the group the (start, end)
        of its boxes among the M, on the host)."""
        groups: dict[tuple[object, ...], list[int]] = {}
        for i, im in enumerate(images):
            groups.setdefault(_shape_key(im), []).append(i)
        inputs = []
        for idx in groups.values():
            sel = [images[i] for i in idx]
            if self.preprocess_mode == "exact" and isinstance(sel[0], torch.Tensor):
                inputs.append(self.preprocess_exact_device(self._upload(sel)))
            elif self.preprocess_mode == "exact":
                inputs.append(self.preprocess_exact(sel))
            elif self.preprocess_mode == "hf_processor":
                inputs.append(self.preprocess_hf(sel))
            else:
                inputs.append(self.preprocess(self._upload(sel)))
        emb = self.encode(torch.cat(inputs)) if len(inputs) > 1 else self.encode(inputs[0])
        out = []
        start = 0
        owners, mboxes, runs, spans = [], [], [], []
        for idx in groups.values():
            h, w = _image_hw(images[idx[0]])
            counts = [len(np.asarray(boxes[i]).reshape(-1, 4)) for i in idx]
            if sum(counts):
                # each box's image among the encoder batch's (the groups are concatenated in order)
                owner = torch.repeat_interleave(torch.arange(start, start + len(idx)), torch.tensor(counts, dtype=torch.long))
                bx = np.concatenate([np.asarray(boxes[i], np.float32).reshape(-1, 4) for i in idx])
                if self.preprocess_mode == "exact":
                    tb = self._to_device(torch.as_tensor(self.exact_model_boxes(bx, h, w), dtype=torch.float))
                else:
                    tb = self.transform_boxes(self._to_device(torch.from_numpy(bx)), h, w)
                owners.append(owner)
                mboxes.append(tb)
            ends = np.cumsum(counts).tolist()
            runs.append(list(zip([0, *ends[:-1]], ends, strict=True)))
            spans.append((idx, h, w, sum(counts)))
            start += len(idx)
        low = self.decode_images(emb, torch.cat(owners), torch.cat(mboxes)) if owners else None
        pos = 0
        for (idx, h, w, m), run in zip(spans, runs, strict=True):
            if m and low is not None:
                if logits:
                    probs = self.postprocess(low[pos : pos + m].float(), h, w)[:, 0]
                else:
                    probs = self.probabilities(low[pos : pos + m], h, w)
            else:
                probs = torch.zeros((0, h, w), dtype=torch.float32, device=self.device)
            out.append((idx, probs, run))
            pos += m
        return out

    @torch.no_grad()
    def predict(self, images: Sequence[FloatImage], boxes: Sequence[Boxes], batch_size: int = 8) -> list[np.ndarray]:
        """Probabilities float32 (N_i, H, W) per image (SegmentationModel.predict). Images of any
        sizes share encoder batches of ``batch_size``; all boxes of a batch decode at once."""
        return self._predict(images, boxes, batch_size, logits=False)

    @torch.no_grad()
    def predict_logits(self, images: Sequence[FloatImage], boxes: Sequence[Boxes], batch_size: int = 8
                       ) -> list[np.ndarray]:
        """Logits float32 (N_i, H, W) per image at the input resolution, before the sigmoid that
        :meth:`predict` applies (MedSAM's exact mode takes its sigmoid at 256 px, so it has none)."""
        if self.preprocess_mode == "exact" and self.family == "medsam":
            raise ValueError("MedSAM's exact mode applies the sigmoid before resizing: it has no full-size logits")
        return self._predict(images, boxes, batch_size, logits=True)

    def _predict(self, images: Sequence[FloatImage], boxes: Sequence[Boxes], batch_size: int, *, logits: bool
                 ) -> list[np.ndarray]:
        self.sam.eval()
        out: list[np.ndarray] = []
        for start in range(0, len(images), batch_size):
            chunk = list(images[start : start + batch_size])
            chunk_boxes = list(boxes[start : start + batch_size])
            probs: dict[int, np.ndarray] = {}
            for idx, p, run in self._bucket_probs(chunk, chunk_boxes, logits=logits):
                host = p.cpu().numpy()
                for i, (a, e) in zip(idx, run, strict=True):
                    probs[i] = np.ascontiguousarray(host[a:e], dtype=np.float32)
            out.extend(probs[i] for i in range(len(chunk)))
        return out

    @torch.no_grad()
    def score(self, items: Iterable[tuple[Any, ...]], batch_size: int = 8, *, keep_masks: bool = False) -> ScoreResult:
        """IoU and Dice per (image, boxes, ground-truth mask[, targets]) item, computed on the device.

        The prediction of an item is the union over its boxes of ``probability > 0.5`` (an item
        without boxes predicts nothing), scored against its bool (H, W) mask with
        :data:`medrobust_lib.metrics.segmentation.EMPTY_GT_POLICY`: the pixel counts |P & G|,
        |P|, |G| are taken on the device and turned into scores by
        :func:`~medrobust_lib.metrics.segmentation.iou_from_counts` / ``dice_from_counts``, the
        formulas of ``metrics.segmentation.iou`` / ``dice``. An optional fourth element
        ``(instances, ids)`` (int32 (H, W) instance map, int32 (K,) the id each of the K boxes
        targets) also scores each box's own mask against its own instance
        (``ScoreResult.box_iou`` / ``box_dice``, (K,) per item; empty without targets).
        ``keep_masks``: also return each item's union mask (bool (H, W), ``ScoreResult.masks``).
        ``items`` may be a generator (the perturbation feed): it is consumed ``batch_size`` items
        at a time, mixed sizes batched together; the counts return to the host once, at the end.
        An item's image and mask may also be device tensors, image (C, H, W) float in [0, 1] and mask
        (H, W) bool (the device perturbation feed, :func:`medrobust_lib.perturb.torch_engine.perturbed_batch`):
        they are used where they are, without a host round trip."""

        self.sam.eval()
        counts: list[torch.Tensor] = []
        box_counts: list[tuple[int, torch.Tensor]] = []  # (item index, (K, 3) counts)
        masks: list[tuple[int, torch.Tensor]] = []
        seconds = 0.0
        n = 0
        it = iter(items)
        while True:
            batch = [x for _, x in zip(range(batch_size), it, strict=False)]
            if not batch:
                break
            t0 = time.perf_counter()
            b_counts = torch.empty((len(batch), 3), dtype=torch.int64, device=self.device)
            for idx, probs, run in self._bucket_probs([x[0] for x in batch], [x[1] for x in batch]):
                h, w = probs.shape[1:]
                above = probs > THRESHOLD  # (M, H, W) bool, each box's mask
                pred = torch.zeros((len(idx), h, w), dtype=torch.bool, device=self.device)
                for j, (a, e) in enumerate(run):
                    if e > a:  # the union; a max over bytes is 5x faster than any() over dim 0 here
                        pred[j] = above[a:e].view(torch.uint8).amax(dim=0).bool()
                gt = self._upload_masks([batch[i][2] for i in idx])
                at = self._to_device(torch.as_tensor(idx))
                b_counts[at] = torch.stack([(pred & gt).sum(dim=(1, 2), dtype=torch.int64),
                                            pred.sum(dim=(1, 2), dtype=torch.int64),
                                            gt.sum(dim=(1, 2), dtype=torch.int64)], dim=1)
                if keep_masks:
                    masks.extend((n + i, pred[j]) for j, i in enumerate(idx))
                for j, i in enumerate(idx):
                    targets = batch[i][3] if len(batch[i]) > 3 else None
                    if targets is None or targets[0] is None:
                        continue
                    inst, ids = targets
                    mine = above[run[j][0] : run[j][1]]  # this item's boxes, in order
                    lab = self._to_device(torch.from_numpy(np.array(inst, np.int32)))
                    tid = self._to_device(torch.as_tensor(np.asarray(ids, np.int32)))
                    box_counts.append((n + i, instance_box_counts(mine, lab, tid)))
            counts.append(b_counts)
            n += len(batch)
            seconds += time.perf_counter() - t0
        t0 = time.perf_counter()
        host = torch.cat(counts).cpu().numpy() if counts else np.zeros((0, 3), np.int64)
        iou_h, dice_h = iou_from_counts(*host.T), dice_from_counts(*host.T)
        box_iou = [np.zeros(0, np.float64) for _ in range(n)]
        box_dice = [np.zeros(0, np.float64) for _ in range(n)]
        for i, c in box_counts:
            ch = c.cpu().numpy()
            box_iou[i], box_dice[i] = iou_from_counts(*ch.T), dice_from_counts(*ch.T)
        kept = None
        if keep_masks:
            kept = [np.zeros((0, 0), bool)] * n
            for i, m in masks:
                kept[i] = m.cpu().numpy()
        return ScoreResult(iou_h, dice_h, seconds + time.perf_counter() - t0, box_iou, box_dice, kept)

    def _upload_masks(self, masks: Sequence[np.ndarray] | Sequence[torch.Tensor]) -> torch.Tensor:
        if isinstance(masks[0], torch.Tensor):  # already on the device (the device perturbation feed)
            return torch.stack([m.to(self.device, torch.bool) for m in masks])  # type: ignore[union-attr]
        return self._to_device(torch.from_numpy(np.stack([np.asarray(m, bool) for m in masks])))

    def _autocast(self) -> AbstractContextManager[Any]:
        """The model's own autocast (``autocast_dtype`` on CUDA). Without one this is a no-op
        context, NOT ``autocast(enabled=False)``: that would switch off an autocast the caller
        opened (the training loop's bf16 AMP)."""
        if self.autocast_dtype is None or self.device.type not in ("cuda", "cpu"):
            return nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)

    @property
    def precision(self) -> str:
        """The arithmetic the model runs in, as recorded in every result row (``precision``
        column): ``fp32`` or ``<dtype>-autocast`` (e.g. ``bf16-autocast``)."""
        if self.autocast_dtype is None:
            return "fp32"
        return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(self.autocast_dtype, str(self.autocast_dtype)) + "-autocast"


def _adapter_strategy_checkpoint(checkpoint: Path) -> bool:
    """Whether the ``config.json`` beside a checkpoint says the adapter strategy added bottleneck
    adapters to a vanilla SAM (a SAM-Med2D release checkpoint without that file stays refused by
    the plain SAM family: it needs SAM-Med2D's preprocessing)."""

    cfg = checkpoint.parent / "config.json"
    if not cfg.is_file():
        return False
    try:
        return json.loads(cfg.read_text()).get("strategy") == "adapter"
    except (OSError, ValueError):
        return False


def load_segmenter(family: Family, arch: str, checkpoint: str | Path, *, model_id: str | None = None,
                   device: str = "cpu", autocast_dtype: torch.dtype | None = None, engine: str | None = None,
                   compile_mode: str | None = None, mask_selection: str | None = None,
                   preprocess: str = "default", color: str | None = None, resize: str | None = None) -> SamSegmenter:
    """Build the architecture and load a local checkpoint in its published layout. ``engine``,
    ``compile_mode``, ``mask_selection`` and ``preprocess``: see :class:`SamSegmenter`."""
    if family not in ("sam", "medsam", "sam_med2d"):
        raise ValueError(f"unknown SAM family {family!r}; valid: sam, medsam, sam_med2d")
    a = arch_for(arch, family)
    sd = read_state_dict(checkpoint)
    if not a.adapter and _adapter_strategy_checkpoint(Path(checkpoint)):
        a = replace(a, adapter=True)  # a vanilla SAM fine-tuned with bottleneck adapters (adapter strategy)
    model = build_sam(a)
    load_into(model, sd, str(checkpoint))
    return SamSegmenter(model, family, model_id or f"{family}-{arch}", short_file_hash(checkpoint), device,
                        autocast_dtype, engine=engine, compile_mode=compile_mode, mask_selection=mask_selection,
                        preprocess=preprocess, color=color, resize=resize)


_PROTOCOL: type[SegmentationModel] = SamSegmenter
"""Static proof (mypy) that the adapter satisfies :class:`SegmentationModel`."""
