"""The analyses the papers draw (issue 46, item 9), as mart views, on hand-made result rows with known
answers: the modality-specific share among the worst types, IoU-vs-Dice rank agreement (against
``scipy.stats.spearmanr``), the reference's pooled Delta beside the per-type mean, and MedMNIST-C's
mCE / relative mCE (against the numbers its own ``medmnistc/eval.py`` computed:
tests/fixtures/mce_reference.json, written by tools/mce_reference.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pandas as pd
import pytest
from scipy.stats import spearmanr

from medrobust_lib.store import results
from medrobust_lib.store.marts import MART_TABLES, build_mart, connect_readonly
from medrobust_lib.store.views.common import GENERIC_FAMILIES

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "mce_reference.json"
SEG_COLUMNS = [c for c, _ in next(t.columns for t in MART_TABLES if t.name == "segmentation_results")]
MANIFEST_COLUMNS = [c for c, _ in next(t.columns for t in MART_TABLES if t.name == "perturbation_manifest")]
FAMILY = {"hair": "derm", "ghosting": "mri", "gaussian_noise": "noise", "beam_hardening": "ct", "rotation": "geometric",
          "motion_blur": "blur", "speckle_noise": "noise"}


def seg_row(model: str, sample: str, perturbation: str, level: int, iou: float, dice: float, clean_iou: float,
            clean_dice: float, **extra: Any) -> dict[str, Any]:
    r: dict[str, Any] = dict.fromkeys(SEG_COLUMNS)
    clean = perturbation == "clean"
    r.update(model=model, checkpoint="ck", strategy="pretrained", dataset="d", modality="ct", sample_id=sample,
             condition="clean" if clean else "perturbation", perturbation=perturbation, level=level, iou=iou,
             dice=dice, clean_iou=clean_iou, clean_dice=clean_dice, iou_drop=clean_iou - iou,
             dice_drop=clean_dice - dice, status="ok")
    r.update(extra)
    return r


def write_mart(tmp: Path, rows: list[dict[str, Any]], families: dict[str, str] = FAMILY) -> Path:
    """A mart built by :func:`build_mart` from ``rows`` (segmentation results) and a manifest giving each
    listed type its family (every output in its band)."""
    res = tmp / "results"
    df = pd.DataFrame(rows, columns=SEG_COLUMNS)
    results.write_chunk(results.chunk_path(res, "segmentation_results", {"part": "x"}, "d"), df, "fp")
    man = pd.DataFrame([{**dict.fromkeys(MANIFEST_COLUMNS), "sample_id": "s0", "dataset": "d", "modality": "ct",
                         "perturbation": t, "family": f, "level": 1, "band_reached": True, "status": "ok"}
                        for t, f in families.items()], columns=MANIFEST_COLUMNS)
    man["level"] = man["level"].astype("int32")
    results.write_chunk(results.chunk_path(res, "perturbation_manifest", {"part": "x"}, "d"), man, "fp")
    build_mart(res, tmp / "m.duckdb")
    return tmp / "m.duckdb"


@pytest.fixture()
def mart_con(tmp_path: Path) -> Iterator[Any]:
    cons: list[duckdb.DuckDBPyConnection] = []

    def open_mart(rows: list[dict[str, Any]], families: dict[str, str] = FAMILY) -> duckdb.DuckDBPyConnection:
        con = connect_readonly(write_mart(tmp_path / str(len(cons)), rows, families))
        cons.append(con)
        return con

    yield open_mart
    for c in cons:
        c.close()


def _drops_rows(model: str, iou_drops: dict[str, float], dice_drops: dict[str, float] | None = None,
                clean: tuple[float, float] = (0.8, 0.9)) -> list[dict[str, Any]]:
    """One image: its clean row and one row per type with the given drops (level 1)."""
    ci, cd = clean
    dice_drops = dice_drops or iou_drops
    rows = [seg_row(model, "s0", "clean", 0, ci, cd, ci, cd)]
    rows += [seg_row(model, "s0", t, 1, ci - d, cd - dice_drops[t], ci, cd) for t, d in iou_drops.items()]
    return rows


def test_generic_families_are_the_registry_types_that_apply_to_every_modality() -> None:
    import medrobust_lib.perturb  # noqa: F401 - registers every family
    from medrobust_lib.perturb.spec import get_perturbation, list_perturbations
    from medrobust_lib.types import ALL_MODALITIES

    specs = [get_perturbation(n) for n in list_perturbations()]
    assert specs
    for spec in specs:
        generic = set(spec.modalities) == set(ALL_MODALITIES)
        assert (spec.family in GENERIC_FAMILIES) == generic, (spec.name, spec.family, spec.modalities)


def test_modality_share_counts_modality_specific_types_among_the_top_k(mart_con: Any) -> None:
    # ranks by IoU drop: hair 1, ghosting 2, gaussian_noise 3, beam_hardening 4, rotation = motion_blur 5
    # (a tie), mystery 7 (not in the manifest)
    drops = {"hair": 0.30, "ghosting": 0.25, "gaussian_noise": 0.20, "beam_hardening": 0.15, "rotation": 0.10,
             "motion_blur": 0.10, "mystery": 0.05}
    con = mart_con(_drops_rows("m", drops))
    kinds = con.execute("select perturbation, generic from perturbation_types").df().set_index("perturbation")
    assert not kinds.loc["hair", "generic"] and kinds.loc["rotation", "generic"] and "mystery" not in kinds.index
    df = con.execute("select * from segmentation_modality_share where model = 'm' order by k").df()
    assert list(df["k"]) == [5, 10, 15] and (df["n_types"] == 7).all()
    k5 = df.iloc[0]
    # the tie at the 5th place keeps both types: 6 of them, 3 modality-specific
    assert (k5["n_top"], k5["n_specific"], k5["n_generic"], k5["n_unknown"]) == (6, 3, 3, 0)
    assert k5["share"] == pytest.approx(0.5) and k5["specific_types"] == "hair,ghosting,beam_hardening"
    k10 = df.iloc[1]  # every type; the unknown one is not in the share's denominator
    assert (k10["n_top"], k10["n_specific"], k10["n_generic"], k10["n_unknown"]) == (7, 3, 3, 1)
    assert k10["share"] == pytest.approx(0.5)
    assert df.iloc[2][["n_top", "n_specific"]].tolist() == [7, 3]


def test_modality_share_with_a_smaller_k(mart_con: Any) -> None:
    con = mart_con(_drops_rows("m", {"hair": 0.3, "gaussian_noise": 0.2, "rotation": 0.1, "ghosting": 0.05,
                                     "beam_hardening": 0.04, "motion_blur": 0.03}))
    k5 = con.execute("select * from segmentation_modality_share where k = 5").df().iloc[0]
    # top 5: hair, gaussian_noise, rotation, ghosting, beam_hardening -> 3 specific of 5
    assert (k5["n_top"], k5["n_specific"]) == (5, 3) and k5["share"] == pytest.approx(0.6)


def test_iou_dice_agreement_equals_scipy_spearman_with_ties(mart_con: Any) -> None:
    types = ["hair", "ghosting", "gaussian_noise", "beam_hardening", "rotation", "motion_blur", "speckle_noise"]
    iou = [0.10, 0.20, 0.20, 0.30, 0.05, 0.30, 0.12]
    dice = [0.15, 0.10, 0.25, 0.25, 0.05, 0.40, 0.25]
    rows = _drops_rows("m", dict(zip(types, iou, strict=True)), dict(zip(types, dice, strict=True)))
    # a second model whose Dice drop is the same for every type: no rank correlation (scipy: nan)
    rows += _drops_rows("flat", dict(zip(types, iou, strict=True)), dict.fromkeys(types, 0.1))
    con = mart_con(rows)
    df = con.execute("select * from segmentation_iou_dice_agreement").df().set_index("model")
    # the view's drops are the mart's means, so compare with scipy on those same numbers
    per = con.execute("select perturbation, iou_drop, dice_drop from segmentation_top_corruptions "
                      "where model = 'm' order by perturbation").df()
    expected = spearmanr(per["iou_drop"], per["dice_drop"]).statistic
    assert df.loc["m", "spearman_rho"] == pytest.approx(float(expected), abs=1e-12)
    assert df.loc["m", "n_types"] == 7 and df.loc["m", "worst_by_dice"] == "motion_blur"
    assert expected == pytest.approx(spearmanr(iou, dice).statistic, abs=1e-12)  # ties: average ranks
    assert pd.isna(df.loc["flat", "spearman_rho"])


def test_pooled_delta_beside_the_per_type_mean(mart_con: Any) -> None:
    # clean IoU 0.8 and 0.6; type hair on image s0 only (IoU 0.5), gaussian_noise on both (0.7, 0.4)
    rows = [seg_row("m", "s0", "clean", 0, 0.8, 0.9, 0.8, 0.9), seg_row("m", "s1", "clean", 0, 0.6, 0.7, 0.6, 0.7),
            seg_row("m", "s0", "hair", 1, 0.5, 0.6, 0.8, 0.9),
            seg_row("m", "s0", "gaussian_noise", 1, 0.7, 0.8, 0.8, 0.9),
            seg_row("m", "s1", "gaussian_noise", 1, 0.4, 0.5, 0.6, 0.7)]
    con = mart_con(rows)
    for view in ("segmentation_model_summary", "segmentation_model_summary_all"):
        s = con.execute(f"select * from {view} where model = 'm'").df().iloc[0]
        # per type (the project's rule): hair 0.3, gaussian_noise 0.15 -> 0.225
        assert s["corruption_iou_drop"] == pytest.approx(0.225)
        # pooled (the reference's rule): clean mean 0.7 - mean(0.5, 0.7, 0.4)
        assert s["corruption_iou_drop_pooled"] == pytest.approx(0.7 - 1.6 / 3)
        assert s["corruption_dice_drop_pooled"] == pytest.approx(0.8 - 1.9 / 3)


def _fixture() -> dict[str, Any]:
    return json.loads(FIXTURE.read_text(encoding="utf-8"))


def _fixture_rows(ref: dict[str, Any]) -> list[dict[str, Any]]:
    clean = {(r["model"], r["sample_id"]): r for r in ref["rows"] if r["perturbation"] == "clean"}
    out = []
    for r in ref["rows"]:
        c = clean[(r["model"], r["sample_id"])]
        out.append(seg_row(r["model"], r["sample_id"], r["perturbation"], r["level"], r["iou"], r["dice"], c["iou"],
                           c["dice"]))
    return out


def test_mce_equals_medmnistc_reference(mart_con: Any) -> None:
    ref = _fixture()
    con = mart_con(_fixture_rows(ref))
    per = con.execute("select * from segmentation_mce where model = $m and baseline = $b order by perturbation",
                      {"m": ref["model"], "b": ref["baseline"]}).df().set_index("perturbation")
    assert sorted(per.index) == sorted(ref["types"])
    for metric in ("iou", "dice"):
        for t in ref["types"]:
            assert per.loc[t, f"be_{metric}"] == pytest.approx(ref[metric]["be"][t], abs=1e-9), (metric, t)
            assert per.loc[t, f"rbe_{metric}"] == pytest.approx(ref[metric]["rbe"][t], abs=1e-9), (metric, t)
    s = con.execute("select * from segmentation_mce_summary where model = $m and baseline = $b",
                    {"m": ref["model"], "b": ref["baseline"]}).df().iloc[0]
    for metric in ("iou", "dice"):
        assert s[f"mce_{metric}"] == pytest.approx(ref[metric]["mbe"], abs=1e-9)
        assert s[f"relative_mce_{metric}"] == pytest.approx(ref[metric]["mrbe"], abs=1e-9)
    assert s["n_types"] == len(ref["types"]) and s["n_undefined"] == 0 and s["levels"] == "1,2,3"
    # against itself every ratio is 1
    own = con.execute("select * from segmentation_mce_summary where model = baseline").df()
    np.testing.assert_allclose(own[["mce_iou", "relative_mce_iou", "mce_dice", "relative_mce_dice"]].to_numpy(),
                               1.0, atol=1e-12)


def test_mce_compares_only_types_and_levels_both_models_have(mart_con: Any) -> None:
    ref = _fixture()
    rows = [r for r in _fixture_rows(ref)
            # the baseline lacks motion_blur at level 3 ...
            if not (r["model"] == "baseline" and r["perturbation"] == "motion_blur" and r["level"] == 3)]
    # ... and never saw hair2, a type of the model's only
    rows += [dict(r, perturbation="hair2") for r in rows if r["model"] == "model" and r["perturbation"] == "hair"]
    con = mart_con(rows)
    per = con.execute("select * from segmentation_mce where model = 'model' and baseline = 'baseline'").df()
    per = per.set_index("perturbation")
    assert "hair2" not in per.index and per.loc["motion_blur", "levels"] == "1,2"
    model_err = np.mean([1 - np.mean([r["iou"] for r in ref["rows"] if r["model"] == "model"
                                      and r["perturbation"] == "motion_blur" and r["level"] == lv]) for lv in (1, 2)])
    assert per.loc["motion_blur", "error_iou"] == pytest.approx(model_err, abs=1e-12)
    s = con.execute("select * from segmentation_mce_summary where model = 'model' and baseline = 'baseline'").df()
    assert s.iloc[0]["n_types"] == 3
