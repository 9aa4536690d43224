"""``precision: auto``: bf16 autocast only where the device computes bf16 natively, fp32 elsewhere."""

from __future__ import annotations

import pytest
import torch

from medrobust_lib.config.segmentation import SegModelConfig
from medrobust_lib.models import precision as prec
from medrobust_lib.models.factory import build_segmenter
from medrobust_lib.models.litemedsam import LiteMedSamSegmenter, packaged_checkpoint


@pytest.mark.parametrize("avx512_bf16, amx, expected", [
    (False, False, "fp32"), (True, False, "bf16"), (False, True, "bf16"), (True, True, "bf16")])
def test_auto_takes_bf16_only_on_a_cpu_with_native_bf16(monkeypatch: pytest.MonkeyPatch, avx512_bf16: bool,
                                                        amx: bool, expected: str) -> None:
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx, raising=False)
    assert prec.resolve_precision("auto", "cpu") == expected
    # an explicit choice is kept whatever the hardware
    assert prec.resolve_precision("bf16", "cpu") == "bf16" and prec.resolve_precision("fp32", "cpu") == "fp32"


def test_a_torch_without_the_capability_probes_counts_as_no_native_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(torch.cpu, "_is_avx512_bf16_supported", raising=False)
    monkeypatch.delattr(torch.cpu, "_is_amx_tile_supported", raising=False)
    assert prec.native_bf16("cpu") is False and prec.resolve_precision("auto", "cpu") == "fp32"


def test_auto_on_cuda_follows_the_device_support(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert prec.resolve_precision("auto", "cuda:1") == "bf16"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert prec.resolve_precision("auto", "cuda") == "fp32"


def test_an_unknown_precision_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown precision 'fp16'; valid: fp32, bf16, auto"):
        prec.resolve_precision("fp16", "cpu")


@pytest.mark.parametrize("native", [False, True])
def test_the_model_records_the_arithmetic_auto_chose(monkeypatch: pytest.MonkeyPatch, native: bool) -> None:
    monkeypatch.setattr(prec, "native_bf16", lambda device: native)
    m = SegModelConfig(id="lite", family="litemedsam", checkpoint="package", precision="auto", runtime="pytorch")
    seg = build_segmenter(m, packaged_checkpoint())
    assert isinstance(seg, LiteMedSamSegmenter)
    assert seg.precision == ("bf16-autocast" if native else "fp32")
    assert seg.channels_last is native  # the channels-last encoder comes with autocast only
    # runtime auto (the default): fp32 goes to the exported graphs on the CPU, bf16 autocast stays in PyTorch
    seg = build_segmenter(m.model_copy(update={"runtime": "auto"}), packaged_checkpoint())
    assert seg.runtime == ("pytorch" if native else "openvino+onnxruntime")
    assert seg.autocast_dtype == (torch.bfloat16 if native else None)
