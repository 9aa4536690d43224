"""The reference overlay's attacks are the reference's: ``pipeline.py`` as ``jobgpu_with_finetune.sh``
runs it attacks at levels 1, 2, 3 (eps 2, 4, 6 /255, PGD 3, 5, 7 iterations of eps / iterations
from a random start) beside corruption levels 1, 3, 5. The fixture
(``fixtures/attacks_reference.json``, ``python -m tools.reference_protocol_fixtures <checkout>
--only attacks``) holds the levels parsed from the job script by ``pipeline.py``'s own parser and
the step rule read off ``fgsm_attack`` / ``pgd_attack`` run on a stand-in model; here medrobust's
attacks are run on the same stand-in and read the same way."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from medrobust_lib.attacks.linf import AttackSetting, fgsm, pgd, torch_generator_for
from medrobust_lib.config import Suite, load_suite

ROOT = Path(__file__).resolve().parents[2]
REF = json.loads((Path(__file__).parent / "fixtures" / "attacks_reference.json").read_text())


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory) -> Suite:
    tmp = tmp_path_factory.mktemp("ref_attacks")
    shutil.copy(ROOT / "configs" / "reference_protocol.yaml", tmp / "reference_protocol.yaml")
    body = {"overlays": ["reference_protocol.yaml"], "modalities": ["ct"],
            "segmentation": {"models": [{"id": "medsam", "family": "medsam", "checkpoint": "/w/medsam.pth"}]}}
    (tmp / "suite.yaml").write_text(yaml.safe_dump(body))
    return load_suite(tmp / "suite.yaml")


def test_the_fixture_is_the_job_scripts_protocol() -> None:
    # every pipeline.py call of the job script (fine-tuned and pretrained) attacks at 1, 2, 3
    assert [c["levels"] for c in REF["pipeline_calls"]] == [[1, 2, 3], [1, 2, 3]]
    assert REF["levels"] == [1, 2, 3] and REF["attack_types"] == ["fgsm", "pgd"]
    assert [REF["by_level"][str(lv)]["epsilon_255"] for lv in REF["levels"]] == pytest.approx([2, 4, 6])


def test_overlay_attacks_at_the_reference_levels_apart_from_the_corruption_levels(suite: Suite) -> None:
    assert suite.perturbations.levels == [1, 3, 5]
    assert suite.attack_levels_for("medsam") == REF["levels"] == suite.attack_levels()
    assert suite.segmentation.attacks.kinds == REF["attack_types"]
    assert suite.levels_for("segmentation.medsam") == [1, 3, 5]  # the corruptions keep theirs


@pytest.mark.parametrize("kind", ["fgsm", "pgd"])
def test_overlay_attack_settings_equal_the_reference(suite: Suite, kind: str) -> None:
    for lv in suite.attack_levels_for("medsam"):
        ref = REF["by_level"][str(lv)]
        got = AttackSetting.for_level(kind, lv, step_size_factor=suite.segmentation.attacks.step_size_factor)
        assert got.epsilon == pytest.approx(ref["epsilon"], abs=1e-15)
        assert got.steps == ref[kind]["steps"]
        assert got.step_size == pytest.approx(ref[kind]["step_size"], abs=1e-12)
        assert got.random_start == ref[kind]["random_start"]


class _Linear:
    """The fixture's stand-in: a loss linear in the image with a fixed +-1 gradient sign; records
    every image it is given."""

    def __init__(self, w: torch.Tensor) -> None:
        self.w, self.inputs = w, []  # type: ignore[var-annotated]

    def forward_logits(self, images: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
        self.inputs.append(images.detach().clone())
        return images * self.w

    def loss(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return logits.sum()


def _trace(setting: AttackSetting) -> dict[str, Any]:
    """Read medrobust's attack as the fixture reads the reference's (tools/reference_protocol_fixtures.py)."""
    g = torch.Generator().manual_seed(0)
    w = torch.where(torch.rand(1, 3, 16, 16, generator=g) < 0.5, -1.0, 1.0).double()
    x = torch.full((1, 3, 16, 16), 0.5, dtype=torch.float64)
    model = _Linear(w)
    boxes, target = torch.tensor([[0.0, 0.0, 8.0, 8.0]]), torch.zeros(1, 1, 16, 16)
    if setting.kind == "fgsm":
        adv = fgsm(model, x, boxes, target, setting.epsilon)
    else:
        adv = pgd(model, x, boxes, target, setting.epsilon, setting.steps, setting.step_size, setting.random_start,
                  torch_generator_for(0, "ref", setting.level))
    ins = model.inputs
    steps = [float((b - a).abs().max()) for a, b in zip(ins, [*ins[1:], adv], strict=True)]
    return {"steps": len(ins), "step_size": steps[0] if setting.kind == "fgsm" else max(steps[1:] or steps),
            "random_start": bool((ins[0] - x).abs().max() > 0), "max_abs_perturbation": float((adv - x).abs().max())}


@pytest.mark.parametrize("kind", ["fgsm", "pgd"])
def test_overlay_attacks_run_the_reference_step_rule(suite: Suite, kind: str) -> None:
    """Run, not only configured: the same steps, step size and budget as the reference's functions."""
    for lv in suite.attack_levels_for("medsam"):
        ref = REF["by_level"][str(lv)][kind]
        got = _trace(AttackSetting.for_level(kind, lv, step_size_factor=suite.segmentation.attacks.step_size_factor))
        assert got["steps"] == ref["steps"] and got["random_start"] == ref["random_start"]
        assert got["step_size"] == pytest.approx(ref["step_size"], abs=1e-12)
        assert got["max_abs_perturbation"] == pytest.approx(ref["max_abs_perturbation"], abs=1e-12)


def test_reference_attacks_in_train_mode_are_not_reproduced() -> None:
    """The reference attacks with ``model.train()`` (dropout, batch statistics live); medrobust
    attacks in eval mode (docs/differences-from-reference.md)."""
    assert all(REF["by_level"][lv][k]["train_mode"] for lv in REF["by_level"] for k in ("fgsm", "pgd"))
