"""Write tests/fixtures/mce_reference.json: MedMNIST-C's own mCE code run on a small fixed set of
segmentation scores, the answers ``tests/store/test_analysis_views.py`` checks the mart's
``segmentation_mce`` / ``segmentation_mce_summary`` views against (within 1e-9).

Run at development time only (it needs the network): ``python tools/mce_reference.py``. It
``pip download``s the ``medmnistc`` wheel (no dependencies) into a temporary folder and runs the
``Evaluator`` of its ``medmnistc/eval.py`` (the code of francescodisalvo05/medmnistc-api): the
package's ``__init__`` imports the corruption code (Wand / ImageMagick), so only ``eval.py``'s source
is executed, in a namespace whose ``medmnistc.utils.baselines`` is a stub module holding the
baseline's errors (``BASELINES``), exactly as the package passes them. ``Evaluator.__init__`` needs
labels for its own metric, which is not used here: the per-level errors of each corruption and the
clean error are set on the instance and ``populate_summary`` (the published formulas) computes the
BE and RBE per corruption and their means.

The scores: two models (``model`` and ``baseline``), one dataset of three images, three corruption
types at levels 1-3 (every type covers every image, as MedMNIST-C's corruptions cover the whole
dataset, so the clean error of a type's rows is the dataset's); error = 1 - the mean IoU (and,
separately, 1 - the mean Dice) over the images, per level.
"""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
import tempfile
import types
import zipfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "fixtures" / "mce_reference.json"
PACKAGE = "medmnistc==0.1.0"
SOURCE = "medmnistc/eval.py"
DATASET = "medrobust_fixture"
IMAGES = ("s0", "s1", "s2")
TYPES = ("gaussian_noise", "hair", "motion_blur")
LEVELS = (1, 2, 3)


def scores() -> list[dict[str, Any]]:
    """The fixed result rows: (model, sample, type, level) -> IoU and Dice in [0, 1], clean rows at level 0.
    Chosen by hand (no random numbers): each model, type and level gets its own pattern."""
    rows: list[dict[str, Any]] = []
    clean = {"model": (0.82, 0.74, 0.66), "baseline": (0.70, 0.61, 0.55)}
    for m, (model, cl) in enumerate(clean.items()):
        for i, sample in enumerate(IMAGES):
            rows.append({"model": model, "sample_id": sample, "perturbation": "clean", "level": 0,
                         "iou": cl[i], "dice": round(2 * cl[i] / (1 + cl[i]), 6)})
            for t, ptype in enumerate(TYPES):
                for level in LEVELS:
                    iou = round(cl[i] - 0.035 * level * (t + 1) / (m + 1) - 0.01 * ((i + t + level) % 3), 6)
                    dice = round(2 * iou / (1 + iou) - 0.004 * ((i * level + t) % 4), 6)
                    rows.append({"model": model, "sample_id": sample, "perturbation": ptype, "level": level,
                                 "iou": iou, "dice": dice})
    return rows


def errors(rows: list[dict[str, Any]], model: str, metric: str) -> tuple[dict[str, list[float]], float]:
    """Per corruption the error (1 - mean ``metric`` over the images) at each level, and the clean error."""

    def err(ptype: str, level: int) -> float:
        vals = [r[metric] for r in rows if r["model"] == model and r["perturbation"] == ptype and r["level"] == level]
        return 1.0 - sum(vals) / len(vals)

    return {t: [err(t, lv) for lv in LEVELS] for t in TYPES}, err("clean", 0)


def load_evaluator(wheel: Path, baselines: dict[str, Any]) -> Any:
    """``Evaluator`` from the wheel's ``eval.py``, its ``BASELINES`` import answered by a stub module."""
    with zipfile.ZipFile(wheel) as z:
        source = z.read(SOURCE).decode()
    stub = types.ModuleType("medmnistc.utils.baselines")
    stub.BASELINES = baselines  # type: ignore[attr-defined]
    saved = {k: sys.modules.get(k) for k in ("medmnistc", "medmnistc.utils", "medmnistc.utils.baselines")}
    sys.modules["medmnistc"] = types.ModuleType("medmnistc")
    sys.modules["medmnistc.utils"] = types.ModuleType("medmnistc.utils")
    sys.modules["medmnistc.utils.baselines"] = stub
    try:
        namespace: dict[str, Any] = {"__name__": "medmnistc.eval"}
        exec(compile(source, f"{wheel.name}/{SOURCE}", "exec"), namespace)  # noqa: S102 - the reference's own code
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    return namespace["Evaluator"]


def reference(wheel: Path, rows: list[dict[str, Any]], metric: str) -> dict[str, Any]:
    """MedMNIST-C's BE / RBE per corruption and their means for ``model`` against ``baseline``."""
    base_errors, base_clean = errors(rows, "baseline", metric)
    model_errors, model_clean = errors(rows, "model", metric)
    baselines = {DATASET: {"raw_scores": {t: sum(v) / len(v) for t, v in base_errors.items()},
                           "clean_score": base_clean}}
    evaluator = load_evaluator(wheel, baselines)
    with tempfile.TemporaryDirectory() as out:
        ev = evaluator(DATASET, [[0], [1]], list(TYPES), out, "model", "binary-class")
        ev.corruption_errors = {t: list(v) for t, v in model_errors.items()}
        ev.clean_score = model_clean
        ev.output_log = {}
        ev.populate_summary()
    log = ev.output_log
    return {"be": {t: float(v) for t, v in log["be_scores"].items()},
            "rbe": {t: float(v) for t, v in log["rbe_scores"].items()},
            "mbe": float(log["metrics"]["be"]), "mrbe": float(log["metrics"]["rbe"])}


def download(dest: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", str(dest),
                    PACKAGE], check=True, stdout=subprocess.DEVNULL)
    wheels = sorted(dest.glob("medmnistc-*.whl"))
    if not wheels:
        raise FileNotFoundError(f"pip download gave no medmnistc wheel in {dest}")
    return wheels[0]


def main() -> int:
    rows = scores()
    with tempfile.TemporaryDirectory() as tmp:
        wheel = download(Path(tmp))
        out: dict[str, Any] = {"source": f"{PACKAGE} ({wheel.name}), {SOURCE}: Evaluator.populate_summary",
               "python": sysconfig.get_python_version(), "model": "model", "baseline": "baseline",
               "levels": list(LEVELS), "types": list(TYPES), "rows": rows,
               "iou": reference(wheel, rows, "iou"), "dice": reference(wheel, rows, "dice")}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {OUT.relative_to(ROOT)}: mBE IoU {out['iou']['mbe']:.6f}, mRBE IoU {out['iou']['mrbe']:.6f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
