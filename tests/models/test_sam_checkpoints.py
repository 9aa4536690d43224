"""SAM-family checkpoints in their published layouts, loaded through ``load_segmenter``.

Tiny instances of the real architectures (``arch_for("tiny", family)``) stand in for the released
weights: what is checked is the key layout, strict loading, safe unpickling, the embedding cache
and the agreement between ``predict`` and ``forward_logits``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from medrobust_lib.models.sam import (
    PIXEL_MEAN,
    PIXEL_STD,
    CheckpointMismatch,
    Family,
    SamSegmenter,
    arch_for,
    build_sam,
    load_segmenter,
    state_dict_hash,
)
from medrobust_lib.models.sam_med2d import AdapterLayer, SamMed2dBlock, insert_adapters

FAMILIES: tuple[Family, ...] = ("sam", "medsam", "sam_med2d")
ADAPTER_PARAMS = ("channel.0.weight", "channel.2.weight", "spatial.0.weight", "spatial.2.weight",
                  "norm.weight", "norm.bias")


def _model(family: Family, seed: int = 3) -> torch.nn.Module:
    return build_sam(arch_for("tiny", family), seed=seed)


def _state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    """Tiny models gain nothing from intra-op threads, and on a shared CPU the thread pool's
    contention costs seconds per test; restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def images() -> list[np.ndarray]:
    """Three float32 images in [0, 1]: two RGB of one size (batched together), one gray non-square."""
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:96, 0:128]
    blob = ((yy - 40) ** 2 + (xx - 70) ** 2 < 20**2).astype(np.float32)
    rgb1 = np.clip(0.2 + 0.6 * blob[..., None] * np.array([1.0, 0.7, 0.4]) + 0.1 * rng.random((96, 128, 3)), 0, 1)
    rgb2 = np.clip(0.5 + 0.3 * rng.standard_normal((96, 128, 3)), 0, 1)
    gray = np.clip(0.3 + 0.5 * rng.random((200, 72)), 0, 1)
    return [a.astype(np.float32) for a in (rgb1, rgb2, gray)]


@pytest.fixture(scope="module")
def boxes() -> list[np.ndarray]:
    """Several XYXY boxes per image (3, 2 and 1)."""
    return [np.array([[50, 20, 92, 62], [0, 0, 128, 96], [10, 30, 40, 90]], np.float32),
            np.array([[5, 5, 60, 50], [64, 40, 120, 90]], np.float32),
            np.array([[8, 30, 60, 170]], np.float32)]


@pytest.fixture(scope="module")
def reference(images: list[np.ndarray], boxes: list[np.ndarray]) -> Callable[[Family], tuple[torch.nn.Module, SamSegmenter, list[np.ndarray]]]:
    """Per family (built once per module): the in-memory tiny model, a segmenter wrapping it and
    its ``predict`` output on ``images`` / ``boxes`` (same batching as the loaded copies)."""
    cache: dict[str, tuple[torch.nn.Module, SamSegmenter, list[np.ndarray]]] = {}

    def get(family: Family) -> tuple[torch.nn.Module, SamSegmenter, list[np.ndarray]]:
        if family not in cache:
            model = _model(family)
            seg = SamSegmenter(model, family, "ref", "none")
            cache[family] = (model, seg, seg.predict(images, boxes))
        return cache[family]

    return get


def _save(model: torch.nn.Module, family: Family, path: Path) -> Path:
    """Write ``model`` in the family's published layout (``.safetensors`` when the suffix says so)."""
    sd = _state_dict(model)
    if path.suffix == ".safetensors":
        save_file(sd, str(path))
    elif family == "sam_med2d":
        torch.save({"model": sd, "epoch": 3}, path)
    else:
        torch.save(sd, path)
    return path


# ---- published layouts load strictly and reproduce the in-memory model -----------------------

@pytest.mark.parametrize(("family", "name"), [
    ("sam", "sam_vit_tiny.pth"),
    ("medsam", "medsam_vit_tiny.pth"),
    ("sam_med2d", "sam-med2d_tiny.pth"),
    ("sam_med2d", "sam-med2d_tiny.safetensors"),
])
def test_published_layout_loads_bit_identical(family: Family, name: str, tmp_path: Path, images: list[np.ndarray],
                                              boxes: list[np.ndarray], reference: Any) -> None:
    model, _, want_probs = reference(family)
    loaded = load_segmenter(family, "tiny", _save(model, family, tmp_path / name))

    assert state_dict_hash(loaded.sam) == state_dict_hash(model)
    assert loaded.model_id == f"{family}-tiny" and len(loaded.checkpoint_hash) == 16
    for got, want, b in zip(loaded.predict(images, boxes), want_probs, boxes, strict=True):
        assert got.dtype == np.float32 and got.shape == want.shape == (len(b), *got.shape[1:])
        assert np.array_equal(got, want)


def test_dataparallel_prefix_is_stripped(tmp_path: Path, reference: Any) -> None:
    model = reference("sam_med2d")[0]
    path = tmp_path / "ddp.pth"
    torch.save({"model": {f"module.{k}": v for k, v in _state_dict(model).items()}}, path)
    loaded = load_segmenter("sam_med2d", "tiny", path)
    assert state_dict_hash(loaded.sam) == state_dict_hash(model)


# ---- SAM-Med2D adapter names and architecture ------------------------------------------------

def test_adapter_keys_have_published_names() -> None:
    vanilla = _model("sam").state_dict()
    adapted = _model("sam_med2d").state_dict()
    extra = sorted(set(adapted) - set(vanilla))
    assert set(vanilla) <= set(adapted)
    assert extra == sorted(f"image_encoder.blocks.{i}.Adapter.{p}" for i in range(2) for p in ADAPTER_PARAMS)
    # tiny: dim 64, mlp_ratio 0.25 -> 16 hidden channel units
    assert adapted["image_encoder.blocks.0.Adapter.channel.0.weight"].shape == (16, 64)
    assert adapted["image_encoder.blocks.0.Adapter.channel.2.weight"].shape == (64, 16)
    assert adapted["image_encoder.blocks.1.Adapter.spatial.0.weight"].shape == (64, 64, 3, 3)
    assert adapted["image_encoder.blocks.1.Adapter.spatial.2.weight"].shape == (64, 64, 4, 4)
    assert adapted["image_encoder.blocks.1.Adapter.norm.bias"].shape == (64,)


def test_vit_b_sam_med2d_matches_published_shapes() -> None:
    """SAM-Med2D's build: ViT-B at 256 px, window 14, rel-pos sized for a 16 x 16 grid, adapters
    in all 12 blocks (built on the meta device: shapes only, no memory)."""
    with torch.device("meta"):
        sd = build_sam(arch_for("vit_b", "sam_med2d")).state_dict()
    shapes = {k: tuple(v.shape) for k, v in sd.items()}
    assert shapes["image_encoder.pos_embed"] == (1, 16, 16, 768)
    assert shapes["image_encoder.blocks.2.attn.rel_pos_h"] == (31, 64)  # global block: 2 * 16 - 1
    assert shapes["image_encoder.blocks.0.attn.rel_pos_w"] == (27, 64)  # window 14: 2 * 14 - 1
    assert shapes["prompt_encoder.pe_layer.positional_encoding_gaussian_matrix"] == (2, 128)
    assert shapes["image_encoder.blocks.11.Adapter.channel.0.weight"] == (192, 768)
    assert shapes["image_encoder.blocks.11.Adapter.spatial.2.weight"] == (768, 768, 4, 4)
    assert sum("Adapter" in k for k in sd) == 12 * len(ADAPTER_PARAMS)


def test_adapter_block_computes_published_forward() -> None:
    """x1 = x + attn(norm1(x)); n = norm2(x1); out = x1 + mlp(n) + Adapter(n), with the adapter
    written out functionally from SAM-Med2D's Adapter_Layer."""
    sam: Any = _model("sam_med2d")
    block = sam.image_encoder.blocks[0]
    assert isinstance(block, SamMed2dBlock)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 16, 16, 64, generator=g)
    a: Any = block.Adapter
    with torch.no_grad():
        x1 = x + block.attn(block.norm1(x))  # tiny: global attention, no windows
        n = block.norm2(x1)
        z = n.permute(0, 3, 1, 2)
        gate = torch.sigmoid(F.linear(F.relu(F.linear(z.mean(dim=(2, 3)), a.channel[0].weight)), a.channel[2].weight))
        zc = gate[:, :, None, None] * z
        sp = F.relu(F.conv_transpose2d(F.relu(F.conv2d(zc, a.spatial[0].weight, stride=2, padding=1)),
                                       a.spatial[2].weight, stride=2, padding=1))
        adapter = F.layer_norm((z + sp).permute(0, 2, 3, 1), (64,), a.norm.weight, a.norm.bias, eps=1e-5)
        want = x1 + block.mlp(n) + adapter
        got = block(x)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def test_adapter_block_attention_half_equals_segment_anything_block() -> None:
    """The re-run attention residual matches segment-anything's Block.forward on windowed,
    padded, rel-pos blocks (a grid of 10 tokens with window 4 pads to 12)."""
    from segment_anything.modeling import ImageEncoderViT

    with torch.random.fork_rng(devices=[]):  # scoped seed for segment-anything's own initialisers
        torch.manual_seed(0)
        enc = ImageEncoderViT(img_size=160, patch_size=16, embed_dim=32, depth=2, num_heads=2, out_chans=16,
                              use_rel_pos=True, window_size=4, global_attn_indexes=(1,))
    original = copy.deepcopy(enc)
    insert_adapters(enc, generator=torch.Generator().manual_seed(0))
    x = torch.randn(1, 10, 10, 32, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        for new, old in zip(enc.blocks, original.blocks, strict=True):
            assert isinstance(new, SamMed2dBlock)
            x1 = new._attention_residual(x)
            assert torch.equal(x1 + new.mlp(new.norm2(x1)), old(x))
            assert torch.equal(new(x), x1 + new.mlp(new.norm2(x1)) + new.Adapter(new.norm2(x1)))


def test_insert_adapters_validates_and_is_seeded() -> None:
    sam: Any = build_sam(arch_for("tiny", "sam"), seed=0)
    enc_a = sam.image_encoder
    enc_b = copy.deepcopy(enc_a)
    insert_adapters(enc_a, generator=torch.Generator().manual_seed(5))
    insert_adapters(enc_b, generator=torch.Generator().manual_seed(5))
    assert state_dict_hash(enc_a) == state_dict_hash(enc_b)
    with pytest.raises(ValueError, match="already has SAM-Med2D adapters"):
        insert_adapters(enc_a)
    with pytest.raises(TypeError, match="ImageEncoderViT"):
        insert_adapters(torch.nn.Linear(2, 2))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="mlp_ratio"):
        AdapterLayer(8, mlp_ratio=0.01)


# ---- refusals ---------------------------------------------------------------------------------

def test_vanilla_sam_checkpoint_refused_by_sam_med2d(tmp_path: Path) -> None:
    path = _save(_model("sam"), "sam", tmp_path / "sam_vit_tiny.pth")
    with pytest.raises(CheckpointMismatch) as err:
        load_segmenter("sam_med2d", "tiny", path)
    msg = str(err.value)
    assert "12 missing keys" in msg and "0 unexpected keys" in msg and "0 shape mismatches" in msg
    assert "image_encoder.blocks.0.Adapter.channel.0.weight" in msg
    assert "image_encoder.blocks.0.Adapter.spatial.0.weight" in msg


def test_sam_med2d_checkpoint_refused_by_plain_sam(tmp_path: Path) -> None:
    path = _save(_model("sam_med2d"), "sam_med2d", tmp_path / "sam-med2d_tiny.pth")
    with pytest.raises(CheckpointMismatch, match=r"12 unexpected keys \[image_encoder\.blocks\.0\.Adapter\."):
        load_segmenter("sam", "tiny", path)


def test_wrong_shape_refused_with_shapes(tmp_path: Path) -> None:
    sd = _state_dict(_model("medsam"))
    sd["image_encoder.pos_embed"] = torch.zeros(1, 8, 8, 64)  # as if built for 128 px
    path = tmp_path / "medsam_128.pth"
    torch.save(sd, path)
    with pytest.raises(CheckpointMismatch) as err:
        load_segmenter("medsam", "tiny", path)
    assert "image_encoder.pos_embed: checkpoint (1, 8, 8, 64) vs model (1, 16, 16, 64)" in str(err.value)
    assert "1 shape mismatches" in str(err.value)


def test_missing_file_names_path_and_source(tmp_path: Path) -> None:
    path = tmp_path / "weights" / "sam-med2d_b.pth"
    with pytest.raises(FileNotFoundError) as err:
        load_segmenter("sam_med2d", "vit_b", path)
    msg = str(err.value)
    assert str(path) in msg
    assert "sam-med2d_b.pth from its release" in msg and "Nothing is downloaded" in msg


# ---- safe unpickling --------------------------------------------------------------------------

EXECUTED: list[str] = []


def _record_execution(tag: str) -> str:
    EXECUTED.append(tag)
    return tag


class _Payload:
    """A custom object whose unpickling would run code (records a call instead of doing harm)."""

    def __reduce__(self) -> tuple[Callable[[str], str], tuple[str]]:
        return _record_execution, ("payload ran",)


def test_torch_load_is_always_weights_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict[str, Any]] = []
    real_load = torch.load

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs)
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    cases: tuple[tuple[Family, str], ...] = (("sam", "a.pth"), ("medsam", "b.pth"), ("sam_med2d", "c.pth"))
    for family, name in cases:
        load_segmenter(family, "tiny", _save(_model(family), family, tmp_path / name))
    assert len(calls) == 3
    assert all(kw.get("weights_only") is True for kw in calls)


def test_pickled_custom_object_is_refused_not_executed(tmp_path: Path) -> None:
    path = tmp_path / "evil.pth"
    torch.save({"model": _state_dict(_model("sam_med2d")), "extra": _Payload()}, path)
    EXECUTED.clear()
    with pytest.raises(CheckpointMismatch, match="weights_only=True"):
        load_segmenter("sam_med2d", "tiny", path)
    assert EXECUTED == []


def test_train_py_layout_with_pickled_optimizer_is_refused_with_conversion_steps(tmp_path: Path) -> None:
    # SAM-Med2D's train.py pickles the torch.optim.Adam object next to the weights (the released
    # sam-med2d_b.pth is ~2.4 GB: weights plus Adam state). weights_only=True cannot rebuild it, so
    # the loader refuses and says how to re-save the weights once.
    model = _model("sam_med2d")
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    path = tmp_path / "epoch15_sam.pth"
    torch.save({"model": _state_dict(model), "optimizer": optimizer}, path)
    with pytest.raises(CheckpointMismatch, match=r"keep only its 'model' entry and re-save it"):
        load_segmenter("sam_med2d", "tiny", path)
    converted = tmp_path / "converted.pth"  # what the prescribed one-off conversion writes
    torch.save({"model": _state_dict(model)}, converted)
    load_segmenter("sam_med2d", "tiny", converted)


# ---- embedding cache and the differentiable path ----------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_image_embedding_computed_once_per_image(family: Family, images: list[np.ndarray],
                                                 reference: Any) -> None:
    _, seg, out = reference(family)  # one predict over 3 images with 3, 2 and 1 boxes
    assert [o.shape for o in out] == [(3, 96, 128), (2, 96, 128), (1, 200, 72)]
    assert all(o.dtype == np.float32 and 0 <= o.min() and o.max() <= 1 for o in out)
    assert seg.n_encoder_calls == len(images)


@pytest.mark.parametrize("family", FAMILIES)
def test_forward_logits_are_the_logits_behind_predict(family: Family, images: list[np.ndarray],
                                                      boxes: list[np.ndarray], reference: Any) -> None:
    seg = SamSegmenter(reference(family)[0], family, "m", "none")
    same_size = images[:2]
    first = np.stack([b[0] for b in boxes[:2]])
    probs = seg.predict(same_size, [b[None] for b in first])
    batch = torch.from_numpy(np.stack(same_size)).permute(0, 3, 1, 2)
    logits = seg.forward_logits(batch, torch.from_numpy(first))
    assert logits.shape == (2, 1, 96, 128) and logits.requires_grad
    got = torch.sigmoid(logits[:, 0]).detach().numpy()
    np.testing.assert_allclose(got, np.concatenate(probs), rtol=0, atol=1e-6)


def test_sam_med2d_preprocess_is_the_published_transform(images: list[np.ndarray]) -> None:
    """BGR channel order (cv2.imread), cv2.INTER_NEAREST resize to 256 x 256, mean/std in the
    listed order: what SAM-Med2D's DataLoader / predictor feed the encoder."""
    seg = SamSegmenter(_model("sam_med2d"), "sam_med2d", "m", "none")
    img = images[0]
    got = seg.preprocess(torch.from_numpy(img).permute(2, 0, 1)[None])[0].permute(1, 2, 0).numpy()
    bgr = cv2.resize(img[..., ::-1] * 255.0, (256, 256), interpolation=cv2.INTER_NEAREST)
    want = (bgr - np.array(PIXEL_MEAN, np.float32)) / np.array(PIXEL_STD, np.float32)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
