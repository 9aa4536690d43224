"""The fast SAM engine against segment-anything's reference modules on the same weights, and the
batched prediction / on-device scoring against the per-image reference path.

Tiny random configurations of every family keep this fast: 128 px input (8 x 8 tokens), windowed
blocks of 3 (the grid is padded to 9 x 9, so window padding is exercised) plus a global block, and
non-zero relative-position tables (zero-initialised tables would make the folded bias trivial).
"""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from segment_anything.modeling.image_encoder import Attention, PatchEmbed, add_decomposed_rel_pos

from medrobust_lib.demo import build_demo
from medrobust_lib.demo.committed import committed_dir
from medrobust_lib.metrics.segmentation import dice, iou
from medrobust_lib.models.sam import ARCHS, Family, SamArch, SamSegmenter, arch_for, build_sam, load_segmenter
from medrobust_lib.models.sam_fast import (
    FastAttention,
    FastPatchEmbed,
    engine_of,
    fold_rel_pos,
    pads_v,
    use_engine,
)

SMALL = replace(ARCHS["vit_b"], encoder_embed_dim=64, encoder_depth=2, encoder_num_heads=2,
                encoder_global_attn_indexes=(1,), image_size=128, window_size=3, prompt_embed_dim=64,
                decoder_mlp_dim=128, decoder_num_heads=2, iou_head_hidden_dim=32, mask_in_chans=8)
CASES: dict[str, tuple[Family, SamArch]] = {
    "sam": ("sam", SMALL),
    "medsam": ("medsam", SMALL),
    "sam_med2d": ("sam_med2d", replace(SMALL, adapter=True)),
    "tiny": ("sam", arch_for("tiny", "sam")),
}


def _model(arch: SamArch, seed: int = 0) -> torch.nn.Module:
    model = build_sam(arch, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "rel_pos" in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
    return model


def _pair(case: str, **kw: object) -> tuple[SamSegmenter, SamSegmenter]:
    family, arch = CASES[case]
    ref = _model(arch)
    fast = copy.deepcopy(ref)
    return (SamSegmenter(ref, family, "ref", "0", engine="reference", **kw),  # type: ignore[arg-type]
            SamSegmenter(fast, family, "fast", "0", engine="fast", **kw))  # type: ignore[arg-type]


def _inputs(size: int, n: int = 3, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.rand((n, 3, size, size), generator=g)
    lo = torch.randint(0, size // 2, (n, 2), generator=g).float()
    hi = lo + torch.randint(size // 8, size // 2, (n, 2), generator=g).float()
    return x, torch.cat([lo, hi], dim=1)


def test_fold_rel_pos_reproduces_the_reference_scores() -> None:
    """scale * q'.k' equals segment-anything's q.k * scale + decomposed rel-pos terms."""
    g = torch.Generator().manual_seed(0)
    b, heads, h, w, c = 2, 3, 5, 4, 16
    q, k, v = (torch.randn((b, heads, h * w, c), generator=g) for _ in range(3))
    rph, rpw = torch.randn((2 * h - 1, c), generator=g), torch.randn((2 * w - 1, c), generator=g)
    scale = c**-0.5
    qf, kf = q.reshape(b * heads, h * w, c), k.reshape(b * heads, h * w, c)
    want = add_decomposed_rel_pos((qf * scale) @ kf.transpose(-2, -1), qf, rph, rpw, (h, w), (h, w))
    q2, k2, v2 = fold_rel_pos(q, k, v, rph, rpw, (h, w), scale, pad_v=True)
    assert q2.shape[-1] % 8 == 0 and q2.shape[-1] >= c + h + w and v2.shape[-1] == q2.shape[-1]
    assert torch.equal(v2[..., :c], v) and not v2[..., c:].any()
    got = scale * q2 @ k2.transpose(-2, -1)
    torch.testing.assert_close(got.reshape(b * heads, h * w, h * w), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", list(CASES))
def test_fast_engine_matches_reference_fp32(case: str) -> None:
    """Same weights, fp32: max |delta logit| <= 1e-3 x max |logit| (mask logits at input size),
    and the image embeddings agree as closely."""
    ref, fast = _pair(case)
    assert engine_of(ref.sam) == "reference" and engine_of(fast.sam) == "fast"
    assert list(ref.sam.state_dict()) == list(fast.sam.state_dict())
    x, boxes = _inputs(ref.image_size if case != "tiny" else 96)
    with torch.no_grad():
        e_ref, e_fast = ref.embed(x), fast.embed(x)
        l_ref, l_fast = ref.forward_logits(x, boxes), fast.forward_logits(x, boxes)
    assert float((e_ref - e_fast).abs().max()) <= 1e-3 * float(e_ref.abs().max())
    assert float((l_ref - l_fast).abs().max()) <= 1e-3 * float(l_ref.abs().max())
    assert float(l_ref.std()) > 1e-3  # a non-degenerate model: logits vary over pixels and images


def test_fast_engine_input_gradients_match() -> None:
    """Attacks differentiate through the fast encoder: d loss / d image agrees with the reference."""
    ref, fast = _pair("sam_med2d")
    x, boxes = _inputs(ref.image_size, n=2)
    target = (torch.rand((2, 1, *x.shape[2:]), generator=torch.Generator().manual_seed(3)) > 0.5).float()
    grads = []
    for seg in (ref, fast):
        xi = x.clone().requires_grad_(True)
        (g,) = torch.autograd.grad(seg.loss(seg.forward_logits(xi, boxes), target), xi)
        grads.append(g)
    assert float((grads[0] - grads[1]).abs().max()) <= 1e-3 * float(grads[0].abs().max())


def test_engine_switch_is_in_place_and_reversible() -> None:
    model = _model(SMALL)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    use_engine(model, "fast")
    attn = [m for m in model.image_encoder.modules() if isinstance(m, Attention)]
    assert attn and all(type(m) is FastAttention for m in attn)
    use_engine(model, "reference")
    assert all(type(m) is Attention for m in attn)
    after = model.state_dict()
    assert list(after) == list(before) and all(torch.equal(after[k], before[k]) for k in before)
    with pytest.raises(ValueError, match="valid: fast, reference"):
        use_engine(model, "turbo")


@pytest.mark.parametrize(("size", "kernel"), [(64, 16), (70, 16), (24, 4)])
def test_fast_patch_embed_is_the_convolution_as_a_matmul(size: int, kernel: int) -> None:
    """The patch embedding as one matrix product equals the strided convolution (a grid that
    does not divide the image drops the remainder, as the convolution does)."""
    torch.manual_seed(0)
    ref = PatchEmbed(kernel_size=(kernel, kernel), stride=(kernel, kernel), in_chans=3, embed_dim=32)
    fast = copy.deepcopy(ref)
    fast.__class__ = FastPatchEmbed
    x = torch.randn(2, 3, size, size)
    want, got = ref(x), fast(x)
    assert got.shape == want.shape == (2, size // kernel, size // kernel, 32) and got.is_contiguous()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    overlapping = PatchEmbed(kernel_size=(4, 4), stride=(2, 2), in_chans=3, embed_dim=8)
    ov = copy.deepcopy(overlapping)
    ov.__class__ = FastPatchEmbed
    torch.testing.assert_close(ov(x), overlapping(x))


def test_engine_switch_covers_patch_embedding_and_sets_v_padding_per_device() -> None:
    """``use_engine`` swaps the patch embedding with the attention modules, and the CPU never
    pads v (the math kernel takes a narrower v)."""
    sam = _model(SMALL)
    use_engine(sam, "fast")
    encoder: Any = sam.image_encoder
    assert isinstance(encoder.patch_embed, FastPatchEmbed)
    assert all(m.auto_pad_v is False for m in sam.modules() if isinstance(m, FastAttention))
    assert pads_v(torch.device("cpu")) is False
    use_engine(sam, "reference")
    assert type(encoder.patch_embed) is PatchEmbed


def test_compiled_encoder_pads_short_batches_to_one_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``compile_mode`` the encoder sees one batch size (the largest so far): a short last
    batch is zero-padded, and its embeddings equal the eager ones (each image is encoded alone)."""
    import medrobust_lib.models.sam_fast as sam_fast

    sizes: list[int] = []

    def fake_compile(enc: torch.nn.Module, mode: str = "default") -> object:
        def run(x: torch.Tensor) -> torch.Tensor:
            sizes.append(int(x.shape[0]))
            return enc(x)
        return run

    monkeypatch.setattr(sam_fast, "compiled_encoder", fake_compile)
    seg = SamSegmenter(_model(SMALL), "sam", "c", "0", engine="fast", compile_mode="default")
    eager = SamSegmenter(copy.deepcopy(seg.sam), "sam", "e", "0", engine="fast")
    x, _ = _inputs(seg.image_size, n=4, seed=9)
    inp = seg.preprocess(x)
    with torch.no_grad():
        seg.encode(inp)
        short = seg.encode(inp[:3])
        want = eager.encode(inp[:3])
    assert sizes == [4, 4] and short.shape[0] == 3
    torch.testing.assert_close(short, want, rtol=1e-5, atol=1e-5)


def test_default_engine_is_reference_on_cpu() -> None:
    seg = SamSegmenter(_model(SMALL), "sam", "m", "0")
    assert seg.engine == "reference" and seg.autocast_dtype is None


# ---- batched prediction and on-device scoring ------------------------------------------------

def _images() -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Mixed sizes and channels; several, one and zero boxes per image."""
    rng = np.random.default_rng(0)
    shapes = [(96, 128, 3), (96, 128, 3), (70, 50), (96, 128, 3), (70, 50), (64, 64, 3)]
    images = [rng.random(s).astype(np.float32) for s in shapes]
    boxes = [np.array([[10, 10, 60, 50], [40, 20, 120, 90]], np.float32), np.array([[5, 5, 60, 50]], np.float32),
             np.array([[4, 8, 40, 60]], np.float32), np.zeros((0, 4), np.float32),
             np.array([[0, 0, 50, 70], [10, 10, 30, 30], [20, 5, 45, 66]], np.float32),
             np.array([[8, 8, 40, 40]], np.float32)]
    return images, boxes


def _per_image_reference(seg: SamSegmenter, images: list[np.ndarray], boxes: list[np.ndarray]) -> list[np.ndarray]:
    """One image at a time through segment-anything's own ``MaskDecoder.forward`` (``decode``)."""
    from medrobust_lib.models.sam import to_tensor_batch

    out = []
    with torch.no_grad():
        for im, b in zip(images, boxes, strict=True):
            h, w = im.shape[:2]
            if len(b) == 0:
                out.append(np.zeros((0, h, w), np.float32))
                continue
            emb = seg.embed(to_tensor_batch([im]))
            out.append(torch.sigmoid(seg.decode(emb, torch.from_numpy(b), h, w)[:, 0]).numpy())
    return out


@pytest.mark.parametrize(("case", "selection"), [("sam", "single"), ("medsam", "single"), ("sam_med2d", "best_iou"),
                                                 ("sam_med2d", "single"), ("sam", "best_iou")])
def test_batched_predict_equals_per_image_decode(case: str, selection: str) -> None:
    family, arch = CASES[case]
    seg = SamSegmenter(_model(arch), family, "m", "0", mask_selection=selection)
    images, boxes = _images()
    got = seg.predict(images, boxes, batch_size=4)
    want = _per_image_reference(seg, images, boxes)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == np.float32
        np.testing.assert_allclose(g, w, atol=2e-5)


@pytest.mark.parametrize("engine", ["reference", "fast"])
def test_score_equals_host_metrics_of_predict(engine: str) -> None:
    seg = SamSegmenter(_model(SMALL), "sam", "m", "0", engine=engine)
    images, boxes = _images()
    rng = np.random.default_rng(1)
    gts = [rng.random(im.shape[:2]) > 0.6 for im in images]
    gts[2] = np.zeros_like(gts[2])  # empty ground truth
    probs = seg.predict(images, boxes, batch_size=3)
    res = seg.score(iter(zip(images, boxes, gts, strict=True)), batch_size=3)
    for k, (p, gt) in enumerate(zip(probs, gts, strict=True)):
        pred = p.max(axis=0) > 0.5 if len(p) else np.zeros_like(gt)
        assert res.iou[k] == iou(pred, gt) and res.dice[k] == dice(pred, gt)
    assert res.iou.dtype == np.float64 and len(res.iou) == len(images)
    # an image without boxes predicts nothing: IoU 0 against a non-empty mask
    assert res.iou[3] == 0.0


def test_mixed_sizes_share_one_encoder_batch() -> None:
    seg = SamSegmenter(_model(SMALL), "sam", "m", "0")
    images, boxes = _images()
    calls: list[int] = []
    h = seg.sam.image_encoder.register_forward_pre_hook(lambda _m, args: calls.append(int(args[0].shape[0])))
    try:
        seg.predict(images, boxes, batch_size=6)
    finally:
        h.remove()
    assert calls == [6]


def _agreement(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """Pixel agreement and IoU of two bool masks (IoU 1 when both are empty)."""
    union = float((a | b).sum())
    return float((a == b).mean()), (float((a & b).sum()) / union if union else 1.0)


def _bf16_iou_bar(ref_model: torch.nn.Module, family: Family, x: torch.Tensor, boxes: torch.Tensor,
                  base: torch.Tensor) -> float:
    """The mask-IoU bar for bf16 against fp32: 0.99 (issue 15), or, where segment-anything's own
    modules under bf16 autocast cannot reach it, their IoU less 0.005 (the fast engine must add no
    error of its own). Random weights put most mask logits within bf16 rounding of zero (75% of
    |logit| < 0.05 at ViT-B 1024 px, measured on an H200): there the reference's own bf16 run
    reaches only 0.984 (ViT-B) and 0.989 (small SAM-Med2D), the fast engine 0.985 and 0.988,
    and the fast engine in fp32 1.000 (``bench/gpu_mask_agreement.py``)."""
    own = SamSegmenter(copy.deepcopy(ref_model), family, "b", "0", device="cuda", engine="reference",
                       autocast_dtype=torch.bfloat16)
    with torch.no_grad():
        b = own.forward_logits(x, boxes) > 0
    return min(0.99, _agreement(base.cpu().numpy(), b.cpu().numpy())[1] - 0.005)


GPU_CASES: dict[str, tuple[Family, SamArch, int, int]] = {
    **{case: (*CASES[case], 8, 5) for case in ("sam", "sam_med2d", "tiny")},
    "vit_b_1024": ("sam", ARCHS["vit_b"], 2, 11),  # the real size: ViT-B at 1024 px
}
"""GPU agreement cases: (family, architecture, images, seed); random weights with non-zero rel-pos tables."""


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("case", list(GPU_CASES))
def test_fast_bf16_masks_agree_with_reference_fp32_on_cuda(case: str) -> None:
    """bf16 fast engine (autocast over the fp32 weights, the default) vs fp32 reference on CUDA, same
    weights: pixel agreement >= 99.5%, mask IoU >= the bar of :func:`_bf16_iou_bar`."""
    family, arch, n, seed = GPU_CASES[case]
    ref_model = _model(arch)
    ref = SamSegmenter(ref_model, family, "r", "0", device="cuda", engine="reference")
    fast = SamSegmenter(copy.deepcopy(ref_model), family, "f", "0", device="cuda", engine="fast")
    assert fast.autocast_dtype == torch.bfloat16
    x, boxes = _inputs(ref.image_size, n=n, seed=seed)
    x, boxes = x.cuda(), boxes.cuda()
    with torch.no_grad():
        a = ref.forward_logits(x, boxes) > 0
        b = fast.forward_logits(x, boxes) > 0
    agree, mask_iou = _agreement(a.cpu().numpy(), b.cpu().numpy())
    assert agree >= 0.995 and mask_iou >= _bf16_iou_bar(ref_model, family, x, boxes, a), (agree, mask_iou)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_batched_pgd_on_cuda_under_bf16_keeps_the_budget() -> None:
    """PGD through the fast engine on the device (bf16 autocast inside the model): fp32 input
    gradients, the result within the epsilon-ball and [0, 1], and it lowers the loss."""
    from medrobust_lib.attacks import pgd, torch_generator_for

    seg = SamSegmenter(_model(SMALL), "sam", "f", "0", device="cuda", engine="fast")
    x, boxes = _inputs(seg.image_size, n=4, seed=7)
    x, boxes = x.cuda(), boxes.cuda()
    with torch.no_grad():
        y = (seg.forward_logits(x, boxes) > 0).float()
    xi = x.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(seg.loss(seg.forward_logits(xi, boxes), y), xi)
    assert g.dtype == torch.float32 and torch.isfinite(g).all()
    eps = 8 / 255
    adv = pgd(seg, x, boxes, y, eps, 5, generator=torch_generator_for(0, "gpu-test"))
    assert adv.device.type == "cuda" and float((adv - x).abs().max()) <= eps + 1e-6
    assert float(adv.min()) >= 0.0 and float(adv.max()) <= 1.0
    with torch.no_grad():
        assert float(seg.loss(seg.forward_logits(adv, boxes), y)) > float(seg.loss(seg.forward_logits(x, boxes), y))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fast_bf16_agrees_with_reference_on_demo_images_on_cuda(demo_root: Path) -> None:
    """The committed tiny demo SAM on the demo's own PNG images and box prompts: fast bf16 vs
    reference fp32 predictions (probability > 0.5) agree on >= 99.5% of pixels with IoU >= 0.99."""
    root = demo_root
    manifest = build_demo(root, seed=0, n_per_modality=4)
    images, boxes = [], []
    for s in manifest.samples():
        if s.image_path.endswith(".png"):
            images.append(np.asarray(Image.open(root / s.image_path).convert("RGB"), np.float32) / 255.0)
            boxes.append(np.asarray([s.box], np.float32))
    assert len(images) >= 8
    ckpt = committed_dir("tiny-sam") / "model.safetensors"
    ref = load_segmenter("sam", "tiny", ckpt, device="cuda", engine="reference")
    fast = load_segmenter("sam", "tiny", ckpt, device="cuda", engine="fast")
    a = np.concatenate([p.ravel() > 0.5 for p in ref.predict(images, boxes)])
    b = np.concatenate([p.ravel() > 0.5 for p in fast.predict(images, boxes)])
    agree, mask_iou = _agreement(a, b)
    assert a.any() and agree >= 0.995 and mask_iou >= 0.99, (agree, mask_iou)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_bf16_inference_copy_follows_weight_updates_on_cuda() -> None:
    """The bf16 copy the fast engine evaluates with (``bf16_weights``) is rebuilt after an in-place weight change
    (an optimiser step) and is not used in train mode (fine-tuning keeps fp32 master weights)."""
    seg = SamSegmenter(_model(SMALL), "sam", "f", "0", device="cuda", engine="fast", bf16_weights=True)
    x, _ = _inputs(seg.image_size, n=2, seed=3)
    inp = seg.preprocess(x.cuda())
    with torch.no_grad():
        before = seg.encode(inp).float()
        enc, dtype = seg._encoder()
        assert dtype == torch.bfloat16 and next(enc.parameters()).dtype == torch.bfloat16
        for p in seg.sam.image_encoder.parameters():
            p.mul_(0.5)
        after = seg.encode(inp).float()
        fresh = SamSegmenter(copy.deepcopy(seg.sam), "sam", "g", "0", device="cuda", engine="fast",
                             bf16_weights=True).encode(inp).float()
    assert not torch.allclose(before, after, atol=1e-2)
    torch.testing.assert_close(after, fresh, rtol=0, atol=0)
    seg.sam.image_encoder.train()
    assert seg._encoder()[1] is None
