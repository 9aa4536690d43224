"""The robustness regression gate on synthetic segmentation_results rows, and ``medrobust check``."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import cast

import pandas as pd
import pytest
from typer.testing import CliRunner

from medrobust_cli import app
from medrobust_lib.config.segmentation import GateThresholds
from medrobust_lib.store import results
from medrobust_lib.tracks.finetune.gate import (
    GateInputError,
    compare,
    render,
    resolve_ref,
    select_rows,
)
from medrobust_lib.tracks.segmentation.evaluate import RESULT_COLUMNS, RESULTS_TABLE

runner = CliRunner()
SAMPLES = [f"s{i:02d}" for i in range(12)]
PERTS = ("gaussian_blur", "gaussian_noise", "rotation")
LEVELS = (1, 3)
Extra = Mapping[tuple[str, int], Sequence[float]]


def shift(mean: float, n: int = 12) -> list[float]:
    """``n`` distinct values around ``mean`` (tied differences make scipy's Wilcoxon permute, slowly)."""
    return [mean + 0.001 * (i - (n - 1) / 2) for i in range(n)]


NOISY = [0.35 + 0.002 * i if i % 2 == 0 else -0.25 - 0.002 * i for i in range(12)]  # mean ~ +0.05, 6 up / 6 down


def make_rows(model: str, checkpoint: str, extra: Extra | None = None, samples: Sequence[str] = SAMPLES,
              attacks: bool = True) -> pd.DataFrame:
    """Clean + 3 perturbations x 2 levels (+ fgsm at level 1) for every sample; ``extra`` adds a
    per-sample drop to the IoU and Dice of one (perturbation, level)."""
    extra = extra or {}
    rows = []
    for i, sid in enumerate(samples):
        clean = 0.70 + 0.02 * i
        base = {"model": model, "checkpoint": checkpoint, "strategy": "pretrained", "dataset": "demo_ct",
                "modality": "ct", "sample_id": sid, "status": "ok", "clean_iou": clean, "clean_dice": clean + 0.1}
        rows.append({**base, "condition": "clean", "perturbation": "clean", "level": 0, "iou": clean,
                     "dice": clean + 0.1, "iou_drop": 0.0, "dice_drop": 0.0})
        groups = [("perturbation", p, lv) for p in PERTS for lv in LEVELS]
        groups += [("fgsm", "fgsm", 1)] if attacks else []
        for k, (cond, pert, lv) in enumerate(groups):
            drop = 0.04 * lv + 0.01 * (i % 4) + 0.005 * k + extra.get((pert, lv), [0.0] * len(samples))[i]
            rows.append({**base, "condition": cond, "perturbation": pert, "level": lv, "iou": clean - drop,
                         "dice": clean + 0.1 - drop, "iou_drop": drop, "dice_drop": drop})
    return pd.DataFrame(rows)


BASE = make_rows("base", "a" * 16)


def test_identical_candidate_passes() -> None:
    res = compare(make_rows("cand", "b" * 16), BASE)
    assert res.passed and res.failures == [] and res.n_unpaired == 0
    t = res.table
    assert len(t) == 1 + 6 + 1 + 2  # clean, 6 corruption groups, fgsm, overall corruptions + attacks
    assert set(t["kind"]) == {"clean", "corruption", "attack", "overall"}
    assert (t["iou_diff"] == 0).all() and (t["iou_p"] == 1).all() and (t["verdict"] == "ok").all()
    overall = t[(t["kind"] == "overall") & (t["condition"] == "perturbation")].iloc[0]
    assert overall["n_samples"] == 12 and overall["n_pairs"] == 72
    assert "PASS" in res.verdict


def test_larger_drop_on_one_condition_fails_naming_it() -> None:
    cand = make_rows("cand", "b" * 16, extra={("gaussian_noise", 3): shift(0.05)})
    res = compare(cand, BASE)
    assert not res.passed
    assert len(res.failures) == 1 and res.n_regressions == 1  # one group; the overall row stays under 0.01
    assert res.failures[0].startswith("perturbation gaussian_noise level 3 (n=12): IoU drop")
    assert "Dice drop" in res.failures[0]  # both metrics on the one line
    assert res.verdict.startswith("FAIL: 1 regression across 8 condition groups")
    row = res.table[(res.table["perturbation"] == "gaussian_noise") & (res.table["level"] == 3)].iloc[0]
    assert row["verdict"] == "FAIL" and row["iou_diff"] == pytest.approx(0.05)
    assert 0.045 < row["iou_ci_low"] < 0.05 < row["iou_ci_high"] < 0.055 and row["iou_q"] < 0.05
    assert (res.table["verdict"] == "FAIL").sum() == 1
    # a looser threshold lets it through
    assert compare(cand, BASE, GateThresholds(max_iou_drop_increase=0.06, max_dice_drop_increase=0.06)).passed
    # and a candidate that is better never fails
    assert compare(make_rows("c", "c" * 16, extra={("gaussian_noise", 3): shift(-0.05)}), BASE).passed


def test_clean_loss_fails() -> None:
    cand = make_rows("cand", "b" * 16)
    clean = cand["condition"] == "clean"
    cand.loc[clean, "iou"] -= shift(0.05)
    res = compare(cand, BASE)
    assert not res.passed and res.failures[0].startswith("clean (n=12): clean IoU")


def test_not_significant_or_too_few_pairs_passes() -> None:
    noisy = make_rows("cand", "b" * 16, extra={("rotation", 1): NOISY})
    res = compare(noisy, BASE)
    row = res.table[(res.table["perturbation"] == "rotation") & (res.table["level"] == 1)].iloc[0]
    assert row["iou_diff"] == pytest.approx(0.049) and row["iou_p"] > 0.05
    assert res.passed and row["verdict"] == "ok"
    few = SAMPLES[:3]
    res = compare(make_rows("cand", "b" * 16, {("rotation", 1): shift(0.05, 3)}, samples=few),
                  make_rows("base", "a" * 16, samples=few))
    assert res.passed and set(res.table["verdict"]) == {"too few pairs"}


def test_unpaired_and_failed_rows_are_counted() -> None:
    cand = make_rows("cand", "b" * 16)
    cand = cand[~((cand["sample_id"] == "s00") & (cand["perturbation"] == "rotation"))].copy()  # 2 rows missing
    cand.loc[(cand["sample_id"] == "s01") & (cand["perturbation"] == "gaussian_blur") & (cand["level"] == 1),
             "status"] = "mask_out_of_view"
    extra = make_rows("base", "a" * 16, samples=["s99"], attacks=False)
    base = pd.concat([BASE, extra], ignore_index=True)  # 7 rows of a sample the candidate lacks
    res = compare(cand, base)
    assert res.n_unpaired == 2 + 7 and res.n_excluded == {"candidate": 1, "baseline": 0}
    assert res.unpaired["side"].value_counts().to_dict() == {"baseline": 9}
    assert res.passed and any("unpaired" in n for n in res.notes)
    blur = res.table[(res.table["perturbation"] == "gaussian_blur") & (res.table["level"] == 1)].iloc[0]
    assert blur["n_pairs"] == 11
    out = json.loads(render(res, "json"))
    assert out["n_unpaired"] == 9 and len(out["unpaired"]) == 9 and out["passed"] is True


def test_bad_inputs_are_clear() -> None:
    with pytest.raises(GateInputError, match="lack columns"):
        compare(BASE.drop(columns=["iou_drop"]), BASE)
    with pytest.raises(GateInputError, match="pairing key"):
        compare(pd.concat([BASE, BASE]), BASE)
    res = compare(make_rows("c", "b" * 16, samples=["x1"]), BASE)
    assert not res.passed and "no paired rows" in res.failures[0]
    mixed = pd.concat([BASE, make_rows("base", "f" * 16, samples=["s99"])])
    with pytest.raises(GateInputError, match="2 checkpoints"):
        select_rows(mixed, "base", "baseline")
    assert len(select_rows(BASE, "a" * 16)) == len(BASE)
    assert len(select_rows(BASE, "a" * 64)) == len(BASE)  # the full file hash
    assert select_rows(BASE, "other").empty


def test_ci_including_zero_is_not_a_regression() -> None:
    """The one rule needs all three: here q < alpha and the mean difference beyond the threshold,
    but one sample's huge improvement pulls the bootstrap CI across 0, so it is not a regression."""
    from medrobust_lib.tracks.finetune.gate import is_regression

    extra = [0.05 + 0.001 * i for i in range(11)] + [-0.30]  # 11 samples ~0.05 worse, one 0.30 better
    r = {"kind": "corruption", "n_samples": 12, "iou_diff": 0.02, "iou_ci_low": -0.004, "iou_ci_high": 0.03,
         "iou_q": 0.01}
    th = GateThresholds()
    assert not is_regression(r, "iou", th)
    assert is_regression({**r, "iou_ci_low": 0.001}, "iou", th)
    assert not is_regression({**r, "iou_ci_low": 0.001, "iou_q": 0.06}, "iou", th)
    assert not is_regression({**r, "iou_ci_low": 0.001, "iou_diff": 0.009}, "iou", th)
    assert not is_regression({**r, "iou_ci_low": 0.001, "n_samples": 4}, "iou", th)
    clean = {"kind": "clean", "n_samples": 12, "iou_diff": -0.02, "iou_ci_low": -0.03, "iou_ci_high": -0.001,
             "iou_q": 0.01}
    assert is_regression(clean, "iou", th) and not is_regression({**clean, "iou_ci_high": 0.002}, "iou", th)
    res = compare(make_rows("cand", "b" * 16, extra={(p, lv): extra for p in PERTS for lv in LEVELS}), BASE)
    row = res.table[(res.table["perturbation"] == "gaussian_noise") & (res.table["level"] == 3)].iloc[0]
    # the Wilcoxon/BH side and the threshold say "worse"; the bootstrap CI includes 0
    assert row["iou_q"] < 0.05 and row["iou_diff"] > 0.02 and row["iou_ci_low"] < 0 < row["iou_ci_high"]
    assert row["verdict"] == "ok" and res.passed


def test_render_formats() -> None:
    res = compare(make_rows("cand", "b" * 16, extra={("gaussian_noise", 3): shift(0.05)}), BASE)
    text = render(res, "table")
    lines = text.splitlines()
    assert lines[0].startswith("FAIL: 1 regression") and lines[1].strip().startswith(
        "perturbation gaussian_noise level 3")
    assert "rotation" not in text  # only the failing conditions without --details
    full = render(res, "table", details=True)
    assert full.splitlines()[0] == lines[0] and "rotation" in full and "verdict" in full
    md = render(res, "markdown")
    assert md.startswith("### ❌ FAIL: 1 regression") and "rotation" not in md
    assert "<details>" in render(res, "markdown", details=True)
    ok = render(compare(make_rows("cand", "b" * 16), BASE), "markdown")
    assert ok.startswith("### ✅ PASS") and "\n- " not in ok


# ---- the CLI -----------------------------------------------------------------------------------

def write_results(res_dir: Path, df: pd.DataFrame) -> None:
    """Write rows in the pipeline's layout: model / run / modality / level partitions."""
    df = df.reindex(columns=list(RESULT_COLUMNS))
    run = df["condition"].map(lambda c: {"clean": "clean", "perturbation": "perturbation"}.get(c, "attack"))
    for key, g in df.groupby([df["model"], run, df["modality"], df["level"]]):
        model, r, modality, level = cast(tuple[str, str, str, int], key)
        part = {"model": model, "run": r, "modality": modality, "level": int(level)}
        results.write_chunk(results.chunk_path(res_dir, RESULTS_TABLE, part, "demo_ct"), g, "fp")


@pytest.fixture
def res_dir(tmp_path: Path) -> Path:
    d = tmp_path / "results"
    write_results(d, pd.concat([BASE, make_rows("good", "b" * 16),
                                make_rows("worse", "c" * 16, {("gaussian_noise", 3): shift(0.05)})]))
    return d


def test_cli_exit_codes(res_dir: Path) -> None:
    args = ["check", "--baseline", "base", "--results-dir", str(res_dir)]
    res = runner.invoke(app, [*args, "--candidate", "good"])
    assert res.exit_code == 0, res.output
    assert res.stdout.splitlines()[0].startswith("PASS")
    res = runner.invoke(app, [*args, "--candidate", "c" * 16])  # by stored checkpoint hash
    assert res.exit_code == 1, res.output
    assert "perturbation gaussian_noise level 3" in res.stdout and "FAIL" in res.stdout
    res = runner.invoke(app, [*args, "--candidate", "worse", "--max-iou-drop-increase", "0.1",
                              "--max-dice-drop-increase", "0.1"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, [*args, "--candidate", "worse", "--format", "json"])
    assert res.exit_code == 1
    out = json.loads(res.stdout)
    assert out["passed"] is False and out["n_regressions"] == 1 and len(out["failures"]) == 1
    assert out["n_unpaired"] == 0 and "CI of the difference excluding 0" in out["rule"]
    assert {r["kind"] for r in out["rows"]} == {"clean", "corruption", "attack", "overall"}
    assert "FAIL" in res.stderr


def test_cli_missing_side_and_bad_options(res_dir: Path) -> None:
    res = runner.invoke(app, ["check", "--candidate", "nope", "--baseline", "base", "--results-dir", str(res_dir)])
    assert res.exit_code == 2 and "candidate nope" in res.stderr and "evaluate it first" in res.stderr
    res = runner.invoke(app, ["check", "--candidate", "good", "--baseline", "base", "--results-dir", str(res_dir),
                              "--alpha", "1.5", "--min-pairs", "1"])
    assert res.exit_code == 2
    # one line naming each bad option as it is written on the command line
    assert "--alpha: Input should be less than 1 (got 1.5); --min-pairs: Input should be greater than or equal " \
           "to 2 (got 1)" in res.stderr


def test_models_uri_resolution(res_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """models:/ refs through a real SQLite MLflow registry: rows of the registry evaluation id are
    preferred, rows of the same checkpoint under another id are reused, a version without rows is
    an error under --no-evaluate, an unknown alias is exit 2."""
    from medrobust_lib.store.model_registry import register_checkpoint

    mlruns = tmp_path / "mlruns"
    monkeypatch.setenv("MEDROBUST_MLRUNS", str(mlruns))
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "model.safetensors").write_bytes(b"weights")
    digest = hashlib.sha256(b"weights").hexdigest()[:16]
    name = "medrobust-seg-tiny-sam-lora"
    uri = f"models:/{name}@candidate"
    assert register_checkpoint(ckpt, name, tags={"strategy": "lora"}).version == 1
    assert resolve_ref(uri) == digest and resolve_ref("base") == "base"
    args = ["--baseline", "base", "--results-dir", str(res_dir), "--mlruns", str(mlruns), "--no-evaluate"]
    res = runner.invoke(app, ["check", "--candidate", uri, *args])
    assert res.exit_code == 2 and "registry_evaluation" in res.stderr and digest in res.stderr
    write_results(res_dir, make_rows("tiny-sam-lora", digest))  # the strategy asset's rows: same weights
    res = runner.invoke(app, ["check", "--candidate", uri, *args])
    assert res.exit_code == 0, res.output
    assert "reusing the rows of tiny-sam-lora" in res.stderr
    # the registry evaluation's own rows win over the other id's (here: a worse copy)
    write_results(res_dir, make_rows(f"{name}-v1", digest, {("gaussian_noise", 3): shift(0.05)}))
    res = runner.invoke(app, ["check", "--candidate", f"models:/{name}/1", *args])
    assert res.exit_code == 1, res.output
    res = runner.invoke(app, ["check", "--candidate", uri.replace("@candidate", "@missing"), *args])
    assert res.exit_code == 2 and "no alias 'missing'" in res.stderr
