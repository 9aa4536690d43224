"""The registry loop's expected gate verdicts (``registry_loop.check_gate_verdicts``): a degraded copy
must fail; a seed + 1 retrain must pass when the demo trained the base itself, and is a logged finding
when the base is a released model (LiteMedSAM in ``demo --full``)."""

from __future__ import annotations

import pytest

from medrobust_lib.demo.registry_loop import check_gate_verdicts

NAME = "medrobust-seg-litemedsam-lora"


@pytest.mark.parametrize("base_trained", [True, False])
def test_pass_then_fail_is_what_the_loop_expects(base_trained: bool) -> None:
    assert check_gate_verdicts(NAME, (2, "PASS vs v1"), (3, "FAIL vs v1"), base_trained=base_trained) is None


def test_a_failing_retrain_of_a_released_model_is_a_finding_not_an_error() -> None:
    finding = check_gate_verdicts(NAME, (2, "FAIL vs v1"), (3, "FAIL vs v1"), base_trained=False)
    assert finding is not None and f"{NAME} retrained with seed + 1 (v2: FAIL vs v1)" in finding


def test_a_failing_retrain_of_the_demo_trained_base_is_an_error() -> None:
    with pytest.raises(RuntimeError, match=r"retrained v2 FAIL vs v1, degraded v3 FAIL vs v1"):
        check_gate_verdicts(NAME, (2, "FAIL vs v1"), (3, "FAIL vs v1"), base_trained=True)


@pytest.mark.parametrize("base_trained", [True, False])
@pytest.mark.parametrize("degraded", ["PASS vs v1", ""])
def test_a_degraded_copy_that_is_not_failed_is_always_an_error(base_trained: bool, degraded: str) -> None:
    with pytest.raises(RuntimeError, match=f"degraded v3 {degraded or 'not gated'}"):
        check_gate_verdicts(NAME, (2, "PASS vs v1"), (3, degraded), base_trained=base_trained)
    with pytest.raises(RuntimeError, match=f"degraded v3 {degraded or 'not gated'}"):
        check_gate_verdicts(NAME, (2, "FAIL vs v1"), (3, degraded), base_trained=base_trained)
