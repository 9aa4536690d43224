"""Every shipped config passes ``medrobust validate``: the demo suites before their data is built (a
note says the run builds it), the reference overlay merged over the full demo (it is no suite of its
own), and the example suite once its data and weights exist where its variables point
(MEDROBUST_DATA, MEDROBUST_WEIGHTS; small files in the real layouts and checkpoint key formats)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from medrobust_lib.tracks.validate import validate_suite

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))


def _sam_state(embed: int, depth: int) -> dict[str, torch.Tensor]:
    """The keys and shapes validate reads of a SAM image encoder (patch embedding, block count)."""
    sd = {"image_encoder.patch_embed.proj.weight": torch.zeros(embed, 3, 16, 16)}
    sd.update({f"image_encoder.blocks.{i}.norm1.weight": torch.zeros(embed) for i in range(depth)})
    return sd


def _example_inputs(data: Path, weights: Path) -> None:
    from tests.integration.test_own_data_runs import _example_data

    _example_data(data)
    for rel in ("OmniMedVQA/QA_information/Open-access/ISIC2016.json", "psf_med/questions.jsonl",
                "ROCOv2/test_captions.csv", "MeCoVQA/MeCoVQA-G_test.json"):
        (data / rel).parent.mkdir(parents=True, exist_ok=True)
        (data / rel).write_text("")
    weights.mkdir(parents=True)
    torch.save(_sam_state(768, 12), weights / "medsam_vit_b.pth")
    torch.save({"model": _sam_state(768, 12)}, weights / "sam-med2d_b_model_only.pth")
    torch.save(_sam_state(768, 12), weights / "sam_vit_b_01ec64.pth")
    for folder in ("llava-med-v1.5-mistral-7b-hf", "medgemma-4b-it"):
        (weights / folder).mkdir()


def test_the_shipped_configs_are_the_ones_checked_here() -> None:
    assert [p.name for p in CONFIGS] == ["demo.yaml", "demo_full.yaml", "demo_reference.yaml", "example_real.yaml",
                                          "reference_protocol.yaml"]


@pytest.mark.parametrize("config", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_every_shipped_config_passes_validate(config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if config.name == "example_real.yaml":
        _example_inputs(tmp_path / "data", tmp_path / "weights")
        monkeypatch.setenv("MEDROBUST_DATA", str(tmp_path / "data"))
        monkeypatch.setenv("MEDROBUST_WEIGHTS", str(tmp_path / "weights"))
    report = validate_suite(config, n_load=1, root=tmp_path)  # a fresh project root: no demo built there
    assert report.ok, "\n".join(report.lines())
    if config.name != "example_real.yaml":
        assert any("demo data not built yet" in n for n in report.notes)
    if config.name == "reference_protocol.yaml":
        assert report.notes[0].startswith("an overlay (no name of its own): validated merged over")
    else:
        assert not any(n.startswith("an overlay") for n in report.notes)


def test_a_wrong_architecture_still_fails_the_example(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The example passes because its inputs are right, not because nothing is checked."""
    _example_inputs(tmp_path / "data", tmp_path / "weights")
    torch.save(_sam_state(1024, 24), tmp_path / "weights" / "sam_vit_b_01ec64.pth")  # a ViT-L where vit_b is named
    monkeypatch.setenv("MEDROBUST_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("MEDROBUST_WEIGHTS", str(tmp_path / "weights"))
    report = validate_suite(ROOT / "configs" / "example_real.yaml", n_load=1, root=tmp_path)
    assert not report.ok and any("sam-b" in e and "set arch: vit_l" in e for e in report.errors), report.errors
