"""The suite's split shares (``splits``) and where fine-tunes are evaluated (``finetune.eval.split``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from medrobust_lib.config import load_suite
from medrobust_lib.config.suite import SplitFractions
from medrobust_lib.data.splits import SPLIT_FRACTIONS, split_for
from medrobust_lib.tracks.datasets import EvalSamples

IDS = [f"case_{i:04d}" for i in range(2000)]


def test_the_default_shares_are_the_house_split() -> None:
    assert SplitFractions().as_tuple() == SPLIT_FRACTIONS and SplitFractions().is_default()
    assert all(split_for("ds", i, SplitFractions().as_tuple()) == split_for("ds", i) for i in IDS)


def test_80_20_has_no_validation_and_its_test_split_is_inside_the_house_one() -> None:
    ref = SplitFractions(train=0.8, val=0.0, test=0.2).as_tuple()
    got = {i: split_for("ds", i, ref) for i in IDS}
    assert set(got.values()) == {"train", "test"}
    assert 0.17 < sum(v == "test" for v in got.values()) / len(IDS) < 0.23
    assert all(split_for("ds", i) == "test" for i, v in got.items() if v == "test")  # one hash, a later cut


@pytest.mark.parametrize("shares,match", [
    ({"train": 0.8, "val": 0.1, "test": 0.2}, "sum to 1"),
    ({"train": 1.0, "val": 0.0, "test": 0.0}, "test split may not be empty"),
    ({"train": 1.2, "val": -0.4, "test": 0.2}, "greater than or equal to 0"),
])
def test_bad_shares_are_refused(shares: dict[str, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SplitFractions(**shares)


def test_eval_samples_skip_the_other_splits_by_the_suites_shares() -> None:
    ref = SplitFractions(train=0.8, val=0.0, test=0.2).as_tuple()
    ev = EvalSamples("test", {}, {}, {}, frozenset(), ref)
    for i in IDS[:300]:
        reason = ev.reason(("ds", i))
        assert (reason is None) == (split_for("ds", i, ref) != "test")


def _suite(tmp_path: Path, seg: dict[str, object]) -> Path:
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump({"demo": {"enabled": True}, "segmentation": {
        "models": [{"id": "tiny-sam", "arch": "tiny"}], **seg}}))
    return p


def test_fine_tunes_may_be_evaluated_on_test_only(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"finetune\.eval\.split"):
        load_suite(_suite(tmp_path, {"finetune": {"base": "tiny-sam", "eval": {"split": "val"}}}))


def test_fine_tunes_run_on_their_split(tmp_path: Path) -> None:
    from medrobust_lib.config.segmentation import FinetuneEval
    from medrobust_lib.tracks.finetune.strategy_runs import evaluation_suite

    s = load_suite(_suite(tmp_path, {"split": "all", "finetune": {"base": "tiny-sam", "eval": {"split": "test"}}}))
    ft = s.segmentation.finetune
    assert ft is not None
    moved = evaluation_suite(s, ft.eval)
    assert moved.segmentation.split == "test" and s.segmentation.split == "all"
    assert evaluation_suite(s, FinetuneEval()) is s
