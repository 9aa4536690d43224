"""Instance prompts: with ``per_component_boxes`` (or instance labels) every lesion gets its own box,
its own prediction and its own score, clean, perturbed (moved by spatial types) and attacked.

The oracle segmenter below fills each box prompt exactly: on two separated square lesions one box
per lesion reproduces the ground truth (Dice 1), while one box around both (what prediction did
before instance prompts were used) also fills the gap between them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import yaml

from medrobust_lib.config import Suite, load_suite
from medrobust_lib.config.segmentation import PromptConfig
from medrobust_lib.data.dataset import DatasetConfig, iter_dataset
from medrobust_lib.data.sample import Sample
from medrobust_lib.perturb.spec import get_perturbation
from medrobust_lib.prompts import prompt_boxes, prompt_targets
from medrobust_lib.seeding import rng_for
from medrobust_lib.store import pred_masks, results
from medrobust_lib.tracks.datasets import build_clean_index
from medrobust_lib.tracks.perturbed import build_perturbed
from medrobust_lib.tracks.segmentation.evaluate import (
    INSTANCES_TABLE,
    RESULTS_TABLE,
    evaluate_attacks,
    evaluate_clean,
    evaluate_perturbed,
)

SQUARES = [(10, 10, 20, 20), (40, 36, 52, 50)]  # (y0, x0, y1, x1), end exclusive


def _write_dataset(root: Path) -> Path:
    """A folder dataset: one 64 x 64 image with two separated square lesions."""
    (root / "images").mkdir(parents=True)
    (root / "masks").mkdir()
    img = np.full((64, 64), 60, np.uint8)
    mask = np.zeros((64, 64), np.uint8)
    for y0, x0, y1, x1 in SQUARES:
        img[y0:y1, x0:x1] = 200
        mask[y0:y1, x0:x1] = 255
    cv2.imwrite(str(root / "images" / "two.png"), img)
    cv2.imwrite(str(root / "masks" / "two.png"), mask)
    return root


class BoxOracle:
    """A segmenter whose probability map for a box is 1 inside the box, 0 outside."""

    checkpoint_hash = "oracle"
    precision = "fp32"

    def predict(self, images: list[np.ndarray], boxes: list[np.ndarray], batch_size: int = 8) -> list[np.ndarray]:
        out = []
        for im, bx in zip(images, boxes, strict=True):
            p = np.zeros((len(bx), *im.shape[:2]), np.float32)
            for k, (x0, y0, x1, y1) in enumerate(np.asarray(bx).reshape(-1, 4)):
                p[k, int(round(y0)) : int(round(y1)), int(round(x0)) : int(round(x1))] = 1.0
            out.append(p)
        return out


def _sample(root: Path, per_component: bool) -> Sample:
    cfg = DatasetConfig(name="two", modality="ct", format="folder", root=str(root), size=None,
                        per_component_boxes=per_component, options={"grayscale": True})
    (s,) = list(iter_dataset(cfg))
    assert isinstance(s, Sample)
    return s


def test_each_lesion_gets_its_own_box_and_the_union_is_exact(tmp_path: Path) -> None:
    root = _write_dataset(tmp_path / "data")
    s = _sample(root, per_component=True)
    assert s.instances is not None and int(s.instances.max()) == 2
    t = prompt_targets(s, PromptConfig())
    want = [[x0, y0, x1, y1] for y0, x0, y1, x1 in SQUARES]
    assert t.boxes.tolist() == want and t.ids.tolist() == [1, 2]
    assert prompt_boxes(s, PromptConfig()).tolist() == want
    (probs,) = BoxOracle().predict([s.image], [t.boxes])
    union = probs.max(axis=0) > 0.5
    assert np.array_equal(union, s.mask)  # one box per lesion: the oracle's union is the ground truth
    one = _sample(root, per_component=False)
    assert one.instances is None and len(prompt_boxes(one, PromptConfig())) == 1
    (p1,) = BoxOracle().predict([one.image], [prompt_boxes(one, PromptConfig())])
    assert (p1[0] > 0.5).sum() > s.mask.sum()  # one box over both fills the gap between them


def test_instance_labels_move_with_a_spatial_perturbation(tmp_path: Path) -> None:
    s = _sample(_write_dataset(tmp_path / "data"), per_component=True)
    spec = get_perturbation("rotation")
    out = spec.apply(s.image, 20.0, rng_for(0, "two", "x", "rotation"), mask=s.mask, boxes=s.boxes,
                     instances=s.instances)
    assert out.instances is not None and out.mask is not None
    assert np.array_equal(out.instances > 0, out.mask)  # the instances move with the mask's draw
    assert set(np.unique(out.instances)) == {0, 1, 2}
    t = prompt_targets(s, PromptConfig(), mask=out.mask, instances=out.instances)
    assert t.ids.tolist() == [1, 2] and t.n_instances == 2


def _suite(tmp_path: Path, data: Path) -> Suite:
    cfg = {"name": "inst", "seed": 0, "results_dir": str(tmp_path / "results"), "mart_path": str(tmp_path / "m.duckdb"),
           "workers": 1, "modalities": ["ct"], "demo": {"enabled": False},
           "datasets": [{"name": "two", "modality": "ct", "format": "folder", "root": str(data), "size": None,
                         "per_component_boxes": True, "evaluation_only": True, "options": {"grayscale": True}}],
           "perturbations": {"include": ["gaussian_noise", "translation"], "levels": [2], "split": "all",
                             "calibration_subset": 1},
           "segmentation": {"models": [{"id": "tiny", "family": "litemedsam", "checkpoint": "package"}],
                            "split": "all", "attacks": {"kinds": ["fgsm"]}}}
    (tmp_path / "suite.yaml").write_text(yaml.safe_dump(cfg))
    return load_suite(tmp_path / "suite.yaml")


@pytest.fixture()
def inst_suite(tmp_path: Path) -> Suite:
    suite = _suite(tmp_path, _write_dataset(tmp_path / "data"))
    build_clean_index(suite, "ct")
    build_perturbed(suite, "ct", 2)
    return suite


def test_rows_score_each_instance_clean_and_perturbed(inst_suite: Suite) -> None:
    s = inst_suite
    oracle: Any = BoxOracle()
    clean = evaluate_clean(s, "tiny", "ct", model=oracle)
    assert clean.n_rows == 1 and clean.mean_dice == 1.0
    evaluate_perturbed(s, "tiny", "ct", 2, model=oracle)
    rows = results.read_table(s.results_dir, RESULTS_TABLE)
    c = rows[rows["condition"] == "clean"].iloc[0]
    assert (c["n_prompts"], c["n_instances"], c["instance_dice"], c["dice"]) == (2, 2, 1.0, 1.0)
    inst = results.read_table(s.results_dir, INSTANCES_TABLE)
    ci = inst[inst["condition"] == "clean"].sort_values("instance")
    assert ci["instance"].tolist() == [1, 2] and ci["dice"].tolist() == [1.0, 1.0]
    assert ci["gt_area"].tolist() == [100, 168]
    pert = rows[rows["condition"] == "perturbation"]
    assert set(pert["perturbation"]) == {"gaussian_noise", "translation"}
    # the oracle's boxes follow the moved instances: each moved lesion is still found exactly
    moved = inst[(inst["perturbation"] == "translation") & (inst["status"] == "ok")]
    assert len(moved) >= 1 and (moved["dice"] == 1.0).all()
    assert (pert["n_prompts"] + 0 <= 2).all()
    # the union prediction of every row is stored and reads back as the oracle's union
    sha = c["pred_mask_sha256"]
    from medrobust_lib.paths import suite_paths

    assert pred_masks.get(suite_paths(s).pred_masks, sha).sum() == 268


def test_attacks_take_every_instance_in_one_pass(inst_suite: Suite) -> None:
    from medrobust_lib.models.sam import SamSegmenter, arch_for, build_sam

    s = inst_suite
    tiny = SamSegmenter(build_sam(arch_for("tiny", "sam"), seed=0), "sam", "tiny", "0")  # type: ignore[arg-type]
    summary = evaluate_attacks(s, "tiny", "ct", 2, model=tiny)
    assert summary.n_rows == 1 and summary.n_failed == 0
    rows = results.read_table(s.results_dir, RESULTS_TABLE)
    a = rows[rows["condition"] == "fgsm"].iloc[0]
    assert a["n_prompts"] == 2 and np.isfinite(a["instance_dice"])
    inst = results.read_table(s.results_dir, INSTANCES_TABLE)
    assert sorted(inst.loc[inst["condition"] == "fgsm", "instance"]) == [1, 2]
