"""The demo's registry loop without Dagster: the orchestrator's steps are passed in, so a fake sensor,
evaluation and mart rebuild show what the loop asks for and in which order (training, degrading,
registering and the registry's tags are stubbed: no model is trained here)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from medrobust_lib.demo import registry_loop
from medrobust_lib.demo.registry_loop import GateOutcome, LoopSteps, run_registry_loop

NAME = "medrobust-seg-tiny-sam-lora"


def _suite() -> Any:
    ft = SimpleNamespace(base="tiny-sam", strategies=["full", "lora"])
    return SimpleNamespace(name="demo", seed=0, modalities=["ct"],
                           segmentation=SimpleNamespace(finetune=ft, models=[SimpleNamespace(id="tiny-sam",
                                                                                             checkpoint="trained")]))


@pytest.fixture()
def stubbed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[int, str]:
    """Registration hands out versions 2 and 3; ``verdicts`` (returned) are their gate tags."""
    versions = iter([2, 3])
    verdicts: dict[int, str] = {2: "PASS vs v1", 3: "FAIL vs v1"}
    monkeypatch.setattr(registry_loop, "strategy_dir", lambda suite, base, strategy: tmp_path / f"{base}-{strategy}")
    monkeypatch.setattr(registry_loop, "finetune_strategy", lambda suite, strategy, seed, out_dir: SimpleNamespace(
        checkpoint=str(out_dir / "model.safetensors"), val_dice=0.5))
    monkeypatch.setattr(registry_loop, "degrade_checkpoint", lambda src, dst, **kw: dst / "model.safetensors")
    monkeypatch.setattr(registry_loop, "register_version", lambda folder, name, tags, **kw: (next(versions), True))
    monkeypatch.setattr(registry_loop.model_registry, "version_tags",
                        lambda name, v, mlruns: {"medrobust.gate": verdicts[v]})
    return verdicts


def _steps(calls: list[str]) -> LoopSteps:
    ticks = iter([[f"{NAME}:1"], [f"{NAME}:2"], [f"{NAME}:3"]])

    def tick() -> list[str]:
        calls.append("tick")
        return next(ticks)

    def evaluate(key: str) -> GateOutcome:
        calls.append(f"evaluate {key}")
        return GateOutcome(not key.endswith(":3"), "verdict")

    return LoopSteps(sensor_tick=tick, evaluate=evaluate, rebuild_mart=lambda: calls.append("marts"))


def test_the_loop_runs_the_steps_it_is_given_in_order(stubbed: dict[int, str]) -> None:
    calls: list[str] = []
    lines: list[str] = []
    run_registry_loop(_suite(), _steps(calls), lines.append, "mlruns")
    assert calls == ["tick", f"evaluate {NAME}:1", "tick", f"evaluate {NAME}:2", "marts", "tick",
                     f"evaluate {NAME}:3"]
    assert f"    robustness_gate {NAME}:3: FAILED (verdict)" in lines
    assert any(line.startswith(f"  sensor-to-results latency for {NAME} v2") for line in lines)
    assert lines[-1] == "  gate verdicts: retrained v2: PASS vs v1; degraded v3: FAIL vs v1"


def test_a_degraded_copy_that_passes_stops_the_loop(stubbed: dict[int, str]) -> None:
    stubbed[3] = "PASS vs v1"
    with pytest.raises(RuntimeError, match="degraded v3 PASS vs v1"):
        run_registry_loop(_suite(), _steps([]), lambda line: None, "mlruns")
