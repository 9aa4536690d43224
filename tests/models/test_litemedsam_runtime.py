"""LiteMedSAM through the exported runtimes (``runtime: onnxruntime / openvino / openvino+onnxruntime``,
:mod:`medrobust_lib.models.onnx_engine`): equal to the official script as the PyTorch modules are
(masks identical, logits within 1e-4), a fine-tuned checkpoint exported under its own key and equal
to its PyTorch logits, the fallback to PyTorch (one warning line) for a broken export and for
weights that changed since loading, and the suite option."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from medrobust_lib.config.segmentation import SegModelConfig
from medrobust_lib.models import onnx_engine
from medrobust_lib.models.factory import build_segmenter
from medrobust_lib.models.litemedsam import LiteMedSamSegmenter, load_litemedsam, packaged_checkpoint
from medrobust_lib.models.sam import read_state_dict
from tests.models.litemedsam_inputs import Item
from tests.models.test_litemedsam import _check_official, _one_per_modality_and_the_odd


@pytest.fixture(scope="session")
def exports(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One export cache for the session: the release is exported once per runtime."""
    return tmp_path_factory.mktemp("exports")


@pytest.fixture(scope="session")
def reference() -> LiteMedSamSegmenter:
    return load_litemedsam(runtime="pytorch")


@pytest.fixture(scope="session")
def ort_model(exports: Path) -> LiteMedSamSegmenter:
    m = load_litemedsam(runtime="onnxruntime", cache_dir=exports)
    assert m.precision == "fp32-onnxruntime"  # exported (about 5 s) and checked against PyTorch here
    # the export leaves the model in eval mode: the decoder's export wrapper once put it in training
    # mode, so the next no-grad call ran PyTorch with BatchNorm on batch statistics
    assert not any(mod.training for mod in m.sam.modules()) and m.engine_ready()
    return m


@pytest.fixture(scope="session")
def ov_model(exports: Path) -> LiteMedSamSegmenter:
    m = load_litemedsam(runtime="openvino", cache_dir=exports)
    assert m.precision == "fp32-openvino"
    return m


@pytest.fixture(scope="session")
def split_model(exports: Path) -> LiteMedSamSegmenter:
    """``runtime: auto`` on the CPU: the encoder through OpenVINO, the decoder through ONNX Runtime."""
    m = load_litemedsam(runtime="auto", cache_dir=exports)
    assert m.runtime == onnx_engine.SPLIT_RUNTIME and m.precision == "fp32-openvino+onnxruntime"
    assert m._engine is not None
    assert (m._engine.encoder.runtime, m._engine.decoder.runtime) == ("openvino", "onnxruntime")
    return m


def test_the_official_fixture_through_the_split_runtime(split_model: LiteMedSamSegmenter, items: list[Item],
                                                        official: dict[str, np.ndarray]) -> None:
    """What ``auto`` runs: masks identical, logits within 1e-4 of the official script's, on every
    other item of the default run's 16 (all 66 in the slow test below)."""
    picked = _one_per_modality_and_the_odd(items)[::2]
    _check_official(split_model, items, official, picked)
    assert split_model.precision == "fp32-openvino+onnxruntime"


def test_the_exported_decoder_groups_each_images_boxes(ort_model: LiteMedSamSegmenter,
                                                       reference: LiteMedSamSegmenter) -> None:
    """``decode_images`` through the exported graph (one embedding per call, 4 boxes per call) equals
    the PyTorch path box for box: boxes of three images interleaved, one image with 6 boxes (two
    calls), one with none; each box's logits in its own place."""
    x = torch.rand(3, 3, 256, 256, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        emb = reference.sam.image_encoder(x)
    g = torch.Generator().manual_seed(6)
    xy = torch.rand(8, 2, generator=g) * 180
    boxes = torch.cat([xy, xy + 8 + torch.rand(8, 2, generator=g) * 60], dim=1)
    owner = torch.tensor([2, 0, 0, 2, 0, 0, 0, 0])
    with torch.no_grad():
        ref = reference.decode_images(emb, owner, boxes).numpy()
        got = ort_model.decode_images(emb, owner, boxes).numpy()
        paired = ort_model.decode_low(emb[owner], boxes).numpy()  # one box per call
    assert ort_model.engine_ready() and got.shape == ref.shape == (8, 1, 256, 256)
    assert np.abs(ref).max() > 5  # real logits
    np.testing.assert_allclose(got, ref, atol=1e-4, rtol=1e-5)
    np.testing.assert_allclose(paired, ref, atol=1e-4, rtol=1e-5)
    assert np.array_equal(got > 0, ref > 0)


def test_the_official_fixture_through_onnx_runtime(ort_model: LiteMedSamSegmenter, items: list[Item],
                                                   official: dict[str, np.ndarray]) -> None:
    """The default run's 16 items that the split runtime's test leaves out (so the two exported
    runtimes cover all 16; all 66 each in the slow test below): masks identical, logits within 1e-4
    of the official script's, and the official Dice through the scoring path."""
    calls = ort_model.n_encoder_calls
    picked = _one_per_modality_and_the_odd(items)[1::2]
    _check_official(ort_model, items, official, picked)
    assert ort_model.n_encoder_calls == calls + len(picked) and ort_model.precision == "fp32-onnxruntime"
    scored = picked[::2]  # the scoring path (on-device counts of the same logits) on half of them
    res = ort_model.score([(items[k].image, items[k].boxes, items[k].mask) for k in scored], batch_size=4)
    np.testing.assert_array_equal(res.dice, official["dice"][scored])


@pytest.mark.slow
@pytest.mark.parametrize("runtime", ["onnxruntime", "openvino", "openvino+onnxruntime"])
def test_all_66_items_equal_the_official_script(runtime: str, request: pytest.FixtureRequest, items: list[Item],
                                                official: dict[str, np.ndarray]) -> None:
    """The 54 demo test images and 12 odd sizes, through each runtime (about 40 s each on 2 cores;
    OpenVINO, the alternative runtime, is checked on LiteMedSAM here only: its runner is also in
    ``tests/models/test_onnx_engine.py``)."""
    model = request.getfixturevalue({"onnxruntime": "ort_model", "openvino": "ov_model"}.get(runtime, "split_model"))
    _check_official(model, items, official, list(range(len(items))))


def _fine_tune(tmp_path: Path) -> Path:
    """A LiteMedSAM "fine-tune": the release's weights moved by seeded noise (about 2 % of each
    tensor's spread), saved as a project checkpoint folder."""
    g = torch.Generator().manual_seed(7)
    sd = {}
    for k, v in read_state_dict(packaged_checkpoint()).items():
        if v.is_floating_point() and v.numel() > 1 and "running_" not in k:
            v = v + 0.02 * v.std() * torch.randn(v.shape, generator=g)
        sd[k] = v.contiguous()
    folder = tmp_path / "ft"
    folder.mkdir()
    save_file(sd, str(folder / "model.safetensors"))
    return folder


def test_a_fine_tuned_checkpoint_exports_under_its_own_key_and_matches_pytorch(
        tmp_path: Path, exports: Path, ort_model: LiteMedSamSegmenter, items: list[Item]) -> None:
    folder = _fine_tune(tmp_path)
    ref = load_litemedsam(folder, runtime="pytorch")
    assert ort_model.engine_ready()  # the release's graphs: loaded (from this process or the cache) first
    before = set(exports.iterdir())
    ft = load_litemedsam(folder, runtime="onnxruntime", cache_dir=exports)
    assert ft.precision == "fp32-onnxruntime" and ft.source_sha256 != ort_model.source_sha256
    # the key follows the checkpoint: the fine-tune got an export of its own (the same key would have
    # reused the release's graph, loaded in this process, and written nothing)
    new = [p for p in set(exports.iterdir()) - before if p.name.startswith("image_encoder-onnxruntime-")]
    assert len(new) == 1
    picked = [25, next(k for k, it in enumerate(items) if it.name.startswith("odd/"))]
    images, boxes = [items[k].image for k in picked], [items[k].boxes for k in picked]
    a, b = ref.predict_logits(images, boxes), ft.predict_logits(images, boxes)
    release = ort_model.predict_logits(images[:1], boxes[:1])[0]
    assert np.abs(release - b[0]).max() > 1e-2  # the fine-tune's graph, not the release's
    for x, y in zip(a, b, strict=True):
        np.testing.assert_allclose(y, x, rtol=1e-5, atol=1e-4)
        assert ((x > 0) == (y > 0)).mean() > 0.9999


def test_a_broken_cached_export_falls_back_to_pytorch_with_one_warning(
        tmp_path: Path, exports: Path, ort_model: LiteMedSamSegmenter, reference: LiteMedSamSegmenter,
        items: list[Item], caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    assert ort_model._engine is not None
    cache = tmp_path / "exports"
    for graph in (ort_model._engine.encoder, ort_model._engine.decoder):  # the release's two exports
        shutil.copytree(graph.path.parent, cache / graph.path.parent.name)
    enc = cache / ort_model._engine.encoder.path.parent.name
    data = bytearray((enc / onnx_engine.MODEL_FILE).read_bytes())
    data[-64:-32] = b"\x7f" * 32  # weights only: a runtime would load this file and compute wrong numbers
    (enc / onnx_engine.MODEL_FILE).write_bytes(bytes(data))
    monkeypatch.setattr(onnx_engine, "_GRAPHS", onnx_engine.LRU(max_items=8))  # a new process: nothing loaded
    m = load_litemedsam(runtime="onnxruntime", cache_dir=cache)
    images, boxes = [items[3].image], [items[3].boxes]
    with caplog.at_level(logging.WARNING):
        got = m.predict_logits(images, boxes)
        again = m.score([(items[3].image, items[3].boxes, items[3].mask)])
        assert m.precision == "fp32"
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "\n" not in warnings[0].getMessage()
    assert "is broken" in warnings[0].getMessage() and "running PyTorch fp32 instead" in warnings[0].getMessage()
    for x, y in zip(reference.predict_logits(images, boxes), got, strict=True):
        np.testing.assert_array_equal(x, y)  # PyTorch itself: the same numbers as the reference
    assert np.isfinite(again.dice).all()
    assert not enc.exists() and any(".broken-" in p.name for p in cache.iterdir())


def test_a_decoder_that_cannot_be_laid_out_for_export_runs_pytorch_with_one_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """A decoder that is not segment-anything's (sam_decode_export refuses it) is an export failure
    like any other: one warning line, then PyTorch fp32."""
    from medrobust_lib.models import litemedsam

    def refuse(seg: object) -> None:
        raise ValueError("not segment-anything's mask upscaling: ['ConvTranspose2d', 'ReLU']")

    monkeypatch.setattr(litemedsam, "DecodeLowForExport", refuse)
    m = load_litemedsam(runtime="onnxruntime", cache_dir=tmp_path)
    with caplog.at_level(logging.WARNING):
        assert not m.engine_ready() and m.precision == "fp32"
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "cannot be exported channels last" in warnings[0] and "\n" not in warnings[0]


def test_changed_weights_gradients_and_autocast_run_pytorch(exports: Path, ort_model: LiteMedSamSegmenter) -> None:
    m = load_litemedsam(runtime="onnxruntime", cache_dir=exports)  # its graphs are the session's
    assert m.engine_ready()
    x = torch.rand(1, 3, 256, 256, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert m.encode(x).grad_fn is None
    xg = x.clone().requires_grad_()
    assert m.encode(xg).grad_fn is not None  # gradients (attacks, fine-tuning): PyTorch
    m.sam.train()
    assert not m.engine_ready()
    m.sam.eval()
    assert m.engine_ready()
    with torch.no_grad():
        m.sam.mask_decoder.iou_token.weight.add_(1.0)  # an optimiser step: the graphs are stale now
    assert not m.engine_ready() and m.precision == "fp32"
    with torch.no_grad():
        m.sam.mask_decoder.iou_token.weight.sub_(1.0)
    assert not m.engine_ready()  # written in place: never trusted again


def test_the_suite_option(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ckpt = packaged_checkpoint()
    seg = build_segmenter(SegModelConfig(id="lite", family="litemedsam", checkpoint="package"), ckpt,
                          cache_dir=tmp_path)
    assert (seg.runtime, seg.cache_dir, seg.autocast_dtype) == ("openvino+onnxruntime", tmp_path, None)  # auto, fp32
    seg = build_segmenter(SegModelConfig(id="lite", family="litemedsam", checkpoint="package", runtime="openvino",
                                         precision="auto"), ckpt, cache_dir=tmp_path)
    assert (seg.runtime, seg.autocast_dtype) == ("openvino", None)  # an exported runtime takes auto's fp32
    seg = build_segmenter(SegModelConfig(id="lite", family="litemedsam", checkpoint="package", precision="bf16"), ckpt)
    assert (seg.runtime, seg.precision) == ("pytorch", "bf16-autocast")
    monkeypatch.setattr(onnx_engine, "runtime_installed", lambda runtime: False)
    seg = build_segmenter(SegModelConfig(id="lite", family="litemedsam", checkpoint="package"), ckpt)
    assert seg.runtime == "pytorch"  # auto without ONNX Runtime or OpenVINO installed


@pytest.mark.parametrize("model, message", [
    ({"family": "sam", "arch": "tiny", "checkpoint": "trained", "runtime": "onnxruntime"},
     "runtime 'onnxruntime' exists for litemedsam only"),
    ({"family": "litemedsam", "checkpoint": "package", "runtime": "openvino", "device": "cuda"}, "runs on the CPU"),
    ({"family": "litemedsam", "checkpoint": "package", "runtime": "onnxruntime", "precision": "bf16"}, "runs fp32"),
    ({"family": "litemedsam", "checkpoint": "package", "runtime": "tflite"}, "runtime"),
])
def test_runtimes_a_model_cannot_have_are_refused(model: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SegModelConfig.model_validate({"id": "m", **model})


def test_validate_accepts_the_runtimes(tmp_path: Path) -> None:
    import yaml

    from medrobust_lib.tracks.validate import validate_suite

    models = [{"id": f"lite-{rt.replace('+', '-')}", "family": "litemedsam", "checkpoint": "package", "runtime": rt}
              for rt in ("auto", "pytorch", "onnxruntime", "openvino", "openvino+onnxruntime")]
    cfg = {"name": "lite", "modalities": ["ct"], "demo": {"enabled": True, "root": str(tmp_path / "demo")},
           "segmentation": {"models": models}}
    (tmp_path / "suite.yaml").write_text(yaml.safe_dump(cfg))
    report = validate_suite(tmp_path / "suite.yaml", n_load=1, root=tmp_path)
    assert report.errors == [], report.errors


def test_validate_names_a_runtime_that_is_not_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    import yaml

    from medrobust_lib.tracks.validate import validate_suite

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "openvino" else real(name, *a))
    cfg = {"name": "lite", "modalities": ["ct"], "demo": {"enabled": True, "root": str(tmp_path / "demo")},
           "segmentation": {"models": [{"id": "ov", "family": "litemedsam", "checkpoint": "package",
                                        "runtime": "openvino"},
                                       {"id": "split", "family": "litemedsam", "checkpoint": "package",
                                        "runtime": "openvino+onnxruntime"},
                                       {"id": "ort", "family": "litemedsam", "checkpoint": "package",
                                        "runtime": "onnxruntime"}]}}
    (tmp_path / "suite.yaml").write_text(yaml.safe_dump(cfg))
    report = validate_suite(tmp_path / "suite.yaml", n_load=1, root=tmp_path)
    assert report.errors == [f"segmentation model {m!r}: runtime {rt!r} needs openvino (make setup installs them; "
                             "runtime auto or pytorch runs without)"
                             for m, rt in (("ov", "openvino"), ("split", "openvino+onnxruntime"))]


def test_an_input_encoded_before_reuses_its_embedding(exports: Path, ort_model: LiteMedSamSegmenter) -> None:
    """The same encoder input (LiTS liver and tumour label the same slices) runs the exported encoder
    once; the kept embedding is the one it computed, and the caller's copy can be changed freely."""
    m = load_litemedsam(runtime="onnxruntime", cache_dir=exports)  # its own cache of embeddings
    assert m.engine_ready() and m._engine is not None
    runs = []
    encoder = m._engine.encoder

    def counting(*arrays: np.ndarray) -> list[np.ndarray]:
        runs.append(1)
        return encoder(*arrays)

    m._engine.encoder = counting  # type: ignore[assignment]
    g = torch.Generator().manual_seed(11)
    a, b = torch.rand(1, 3, 256, 256, generator=g), torch.rand(1, 3, 256, 256, generator=g)
    with torch.no_grad():
        first = m.encode(a).clone()
        m.encode(a).zero_()  # a hit hands out a copy: the kept embedding is not touched
        both = m.encode(torch.cat([a, b]))
        again = m.encode(a)
    assert len(runs) == 2  # a once, b once
    assert torch.equal(both[:1], first) and torch.equal(again, first)
    assert torch.equal(both[1:], torch.from_numpy(encoder(b.numpy())[0]))
    assert m.n_encoder_calls == 5  # calls counted as asked for (encoder runs: 2)
    m.clear_embedding_cache()  # what the bench does before each timed call
    with torch.no_grad():
        assert torch.equal(m.encode(a), first)
    assert len(runs) == 3
