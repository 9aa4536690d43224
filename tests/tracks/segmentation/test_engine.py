"""The evaluation loop with the batched on-device scoring and the worker feed keeps the reference
results: fast vs reference engine per condition, and the per-row numbers of the pre-feed path
(regenerate, ``predict``, host metrics)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from safetensors.torch import save_file

from medrobust_lib.config import Suite, load_suite
from medrobust_lib.config.segmentation import PromptConfig
from medrobust_lib.models.sam import arch_for, build_sam
from medrobust_lib.perturb import regen_cache
from medrobust_lib.perturb.engine import regenerate
from medrobust_lib.prompts import prompt_boxes
from medrobust_lib.store import results
from medrobust_lib.tracks import feed
from medrobust_lib.tracks.datasets import build_clean_index
from medrobust_lib.tracks.feed import (
    _tasks,
    clean_sample,
    clean_samples,
    default_workers,
    regenerate_stream,
    resolve_workers,
    sample_major,
)
from medrobust_lib.tracks.perturbed import build_perturbed, read_manifest
from medrobust_lib.tracks.segmentation.evaluate import (
    _score,
    evaluate_attacks,
    evaluate_clean,
    evaluate_perturbed,
)
from medrobust_lib.tracks.segmentation.model import load_model, model_config
from tests.suite_helpers import write_suite


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory, demo_root: Path) -> Suite:
    root = tmp_path_factory.mktemp("segengine")
    model = build_sam(arch_for("tiny", "sam"), seed=11)
    ckpt = root / "tiny.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(ckpt))
    seg = {"models": [{"id": "ref", "arch": "tiny", "checkpoint": str(ckpt), "engine": "reference", "batch_size": 3},
                      {"id": "fast", "arch": "tiny", "checkpoint": str(ckpt), "engine": "fast", "batch_size": 5}],
           "split": "all", "attacks": {"kinds": ["fgsm"], "max_samples": 2}, "feed_workers": 1}
    s = load_suite(write_suite(root, demo_root, modalities=["ct"], segmentation=seg,
                               perturbations={"include": ["gaussian_noise", "rotation"], "split": "all",
                                              "calibration_subset": 2, "levels": [3]}))
    build_clean_index(s, "ct")
    build_perturbed(s, "ct", 3)
    return s


def test_fast_engine_keeps_reference_results_per_condition(suite: Suite) -> None:
    for mid in ("ref", "fast"):
        evaluate_clean(suite, mid, "ct")
        p = evaluate_perturbed(suite, mid, "ct", 3)
        assert p.n_failed == 0 and p.clean_cache_misses == 0 and p.clean_cache_hits == p.n_rows
        evaluate_attacks(suite, mid, "ct", 3)
    df = results.read_table(suite.results_dir, "segmentation_results")
    means = df.groupby(["model", "condition", "perturbation"])[["iou", "dice"]].mean()
    ref, fast = means.loc["ref"], means.loc["fast"]
    assert list(ref.index) == list(fast.index) and len(ref) == 4  # clean, 2 perturbations, fgsm
    assert float((ref - fast).abs().to_numpy().max()) <= 1e-3
    assert df["iou"].std() > 0.01  # the random model's masks are not degenerate


def test_rows_equal_the_per_image_reference_path(suite: Suite) -> None:
    """Every perturbed row equals regenerate -> predict -> host metrics (the loop before the feed)."""
    m = model_config(suite, "ref")
    model = load_model(suite, m)
    evaluate_perturbed(suite, "ref", "ct", 3)
    got = results.read_partition(suite.results_dir, "segmentation_results",
                                 {"model": "ref", "run": "perturbation", "modality": "ct", "level": 3})
    samples = clean_samples(suite, "ct", "all")
    want = []
    for r in read_manifest(suite, "ct", 3).to_dict("records"):
        s = samples[(r["dataset"], r["sample_id"])]
        out = regenerate(r, s)
        boxes = prompt_boxes(s, PromptConfig(), mask=out.mask)
        prob = model.predict([out.image], [boxes])[0]
        want.append((r["sample_id"], r["perturbation"], _score(prob, out.mask).iou, _score(prob, out.mask).dice))
    w = pd.DataFrame(want, columns=["sample_id", "perturbation", "iou", "dice"]).set_index(["sample_id", "perturbation"])
    g = got.set_index(["sample_id", "perturbation"]).loc[w.index]
    # the engine predicts in batches of 3, the reference path one image at a time: oneDNN's batched
    # convolutions round differently (probabilities within 6e-8), which can flip a pixel sitting at
    # the 0.5 threshold, i.e. move IoU / Dice by about one pixel over the union (here < 1e-4)
    np.testing.assert_allclose(g["iou"].to_numpy(), w["iou"].to_numpy(), rtol=0, atol=1e-4)
    np.testing.assert_allclose(g["dice"].to_numpy(), w["dice"].to_numpy(), rtol=0, atol=1e-4)
    assert (g["iou"].to_numpy() == w["iou"].to_numpy()).mean() >= 0.75  # most rows bit-identical


def test_feed_is_bit_exact_and_ordered_with_workers(suite: Suite) -> None:
    rows = read_manifest(suite, "ct", 3).to_dict("records")
    local = list(regenerate_stream(suite, "ct", "all", rows, workers=0))
    regen_cache.clear()  # the workers regenerate every row themselves
    pooled = list(regenerate_stream(suite, "ct", "all", rows, workers=1, prefetch=2, chunk=3))
    assert len(local) == len(pooled) == len(rows)
    samples = clean_samples(suite, "ct", "all")
    for r, a, b in zip(rows, local, pooled, strict=True):
        assert np.array_equal(a.image, b.image) and np.array_equal(a.mask, b.mask)
        want = regenerate(r, samples[(r["dataset"], r["sample_id"])])
        assert np.array_equal(a.image, want.image)


def test_feed_serves_a_later_model_from_the_regeneration_cache(suite: Suite, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second stream over a partition in the same process (another model) sends no task to the
    workers: every output comes from the parent's cache, the same objects, bit-exact."""
    rows = read_manifest(suite, "ct", 3).to_dict("records")
    regen_cache.clear()
    first = list(regenerate_stream(suite, "ct", "all", rows, workers=1, chunk=3))
    assert regen_cache.stats()["entries"] == len(rows)
    pool = feed._pool(1)
    monkeypatch.setattr(pool, "submit", lambda *a, **k: pytest.fail("a cached task was sent to a worker"))
    second = list(regenerate_stream(suite, "ct", "all", rows, workers=1, chunk=3))
    assert all(a is b for a, b in zip(first, second, strict=True)) and len(second) == len(rows)
    in_process = list(regenerate_stream(suite, "ct", "all", rows, workers=0))
    assert all(a is b for a, b in zip(first, in_process, strict=True))


def test_feed_tasks_group_one_sample() -> None:
    rows = [{"dataset": "d", "sample_id": sid, "k": k} for k, sid in enumerate(["b", "a", "b", "a", "a", "c"])]
    order = sample_major(rows)
    assert [rows[i]["sample_id"] for i in order] == ["a", "a", "a", "b", "b", "c"]
    assert [rows[i]["k"] for i in order] == [1, 3, 4, 0, 2, 5]
    tasks = _tasks([rows[i] for i in order], chunk=2)
    assert [[r["sample_id"] for r in t] for t in tasks] == [["a", "a"], ["a"], ["b", "b"], ["c"]]


@pytest.mark.parametrize(("cores", "device", "expected"), [
    (2, "cpu", 0), (1, "cpu", 0), (2, "cuda", 1), (1, "cuda", 1), (3, "cpu", 2), (16, "cuda", 15)])
def test_default_workers_leave_a_small_cpu_to_torch(monkeypatch: pytest.MonkeyPatch, cores: int, device: str,
                                                    expected: int) -> None:
    """A CPU model on <= 2 cores regenerates in-process (a worker would take a core from torch's
    threads); otherwise, and always for CUDA, all cores but the model's, at least one."""
    monkeypatch.setattr("medrobust_lib.tracks.feed.os.cpu_count", lambda: cores)
    assert default_workers(device) == expected
    assert resolve_workers(None, device) == expected and resolve_workers(3, device) == 3


def test_clean_samples_are_loaded_once_per_process(suite: Suite) -> None:
    a = clean_samples(suite, "ct", "all")
    assert clean_samples(suite, "ct", "all") is a
    for key, s in a.items():  # the workers' single-sample path reads the same samples
        one = clean_sample(suite, "ct", "all", key)
        assert one.content_hash() == s.content_hash()
        assert clean_sample(suite, "ct", "all", key) is one
    with pytest.raises(KeyError, match="no clean sample"):
        clean_sample(suite, "ct", "all", ("nope", "x"))
    assert clean_samples(suite, "ct", "train") is not a  # another split is another entry


def test_feed_rejects_bad_settings(suite: Suite) -> None:
    with pytest.raises(ValueError, match="prefetch"):
        list(regenerate_stream(suite, "ct", "all", [], prefetch=0))
