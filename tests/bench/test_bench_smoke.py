"""Every bench/ script at a tiny size, so a bench cannot silently break again (issue 34).

Each script runs as ``make bench`` / the docs run it: ``python -m bench.<script>`` from the repository
root in a fresh interpreter, at the smallest sizes its arguments allow;
the test checks its exit status and a line of its output. Scripts that need a CUDA device are run
on their CPU path where they have one (``gpu_seg_bench``), and otherwise checked for their
argument parsing and their clear "no CUDA device" exit. Two scripts need a finished ``make demo``
(``seg_bench``, ``registry_loop_bench``: minutes of demo state and a Dagster daemon): their
argument parsing and imports are checked. No timings are asserted.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
CUDA = False
try:
    import torch

    CUDA = torch.cuda.is_available()
except ImportError:  # pragma: no cover - torch is a core dependency
    pass


def run_script(name: str, *args: str, cwd: Path | None = None, timeout: float = 600,
               check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "PYTHONUNBUFFERED": "1"}  # the root on the path: ``cwd`` may be elsewhere
    proc = subprocess.run([sys.executable, "-m", f"bench.{Path(name).stem}", *args], cwd=cwd or ROOT, env=env,
                          text=True, capture_output=True, timeout=timeout)
    if check:
        assert proc.returncode == 0, f"{name} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def _load(name: str) -> ModuleType:
    """Import ``bench/<name>`` as a module (registered, so its dataclasses resolve)."""
    spec = importlib.util.spec_from_file_location(f"_bench_{Path(name).stem}", BENCH / name)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


SMOKED_ELSEWHERE = {"litemedsam_bench.py": "tests/bench/test_gpu_seg_bench_litemedsam.py"}
"""Bench modules whose smoke test lives in another file (the LiteMedSAM rows of gpu_seg_bench.py)."""
NOT_SCRIPTS = {"__init__.py", "timing.py"}
"""The package and its shared helpers (``timing``: run by gpu_seg_bench's and litemedsam_bench's smoke tests)."""


def test_every_bench_script_has_a_smoke_test() -> None:
    names = set(re.findall(r'"(\w+\.(?:py|sh))"', Path(__file__).read_text()))
    names |= {n for n, f in SMOKED_ELSEWHERE.items() if (Path(__file__).parents[2] / f).is_file()}
    scripts = {p.name for p in BENCH.iterdir() if p.suffix in (".py", ".sh")} - NOT_SCRIPTS
    assert scripts <= names, f"bench scripts without a smoke test: {sorted(scripts - names)}"


@pytest.mark.slow  # a whole tiny bench run (3-6 s); .ci/run runs it
def test_calibration_evals_bench_tiny(tmp_path: Path) -> None:
    rows_path = tmp_path / "rows.parquet"
    out = run_script("calibration_evals_bench.py", "--work", str(tmp_path / "w"), "--workers", "1",
                     "--modalities", "ct", "--include", "gaussian_noise", "--no-real-labels",
                     "--save-rows", str(rows_path)).stdout
    evals = float(re.search(r"evals_per_output: ([0-9.]+)", out).group(1))  # type: ignore[union-attr]
    # every output costs at least one SSIM evaluation; 10 or more means the calibration search regressed
    assert 1.0 <= evals < 10.0, out
    # the printed figures are those of the grid it built: one ok row per sample and level, all counted
    n = int(re.search(r"^  outputs: (\d+)$", out, re.M).group(1))  # type: ignore[union-attr]
    rows = pd.read_parquet(rows_path)
    assert n == len(rows) > 0 and set(rows["perturbation"]) == {"gaussian_noise"}
    assert not rows.duplicated(["dataset", "sample_id", "level"]).any()
    assert abs(rows["n_ssim_evals"].mean() - evals) < 1e-3, out


@pytest.mark.slow  # a whole tiny bench run (3-6 s); .ci/run runs it
def test_perturb_bench_tiny_from_a_fresh_root(tmp_path: Path) -> None:
    # the bench builds and indexes its own demo suite (make bench after a fresh clone)
    out = run_script("perturb_bench.py", "--suite-root", str(tmp_path / "suite"), "--demo-root",
                     str(tmp_path / "demo"), "--n-per-modality", "4", "--max-per-dataset", "1", "--modalities", "ct",
                     "--levels", "3", "--reps", "1", "--large-size", "64", "--large-images", "1",
                     "--large-types", "gaussian_noise", "--save-rows", str(tmp_path / "rows.parquet")).stdout
    assert "## Per type" in out and "gaussian_noise" in out
    assert re.search(r"all outputs \(\d+\): [\d.]+ SSIM evals/output", out)
    assert "## 64 px, level 3" in out
    # comparing a run with its own rows: every output the same strength and the same bytes
    out = run_script("perturb_bench.py", "--suite-root", str(tmp_path / "suite"), "--demo-root",
                     str(tmp_path / "demo"), "--n-per-modality", "4", "--max-per-dataset", "1", "--modalities", "ct",
                     "--levels", "3", "--reps", "1", "--large-size", "0",
                     "--compare-rows", str(tmp_path / "rows.parquet")).stdout
    n = int(re.search(r"- outputs compared: (\d+)", out).group(1))  # type: ignore[union-attr]
    assert n > 0 and f"- same strength, same bytes: {n}" in out and "- strength changed: 0" in out


@pytest.mark.slow  # exports LiteMedSAM's decoder twice (about 10 s); .ci/run runs it
def test_decoder_layout_bench_tiny() -> None:
    out = run_script("decoder_layout_bench.py", "--rounds", "1", "--prompts", "2", "--runtimes", "onnxruntime").stdout
    rows = [[c.strip() for c in ln.split("|")[1:-1]] for ln in out.splitlines() if ln.startswith("| onnxruntime |")]
    assert [r[1] for r in rows] == ["reference", "tokens"], out
    for r in rows:  # both graphs within the product's export check of PyTorch's decode_low
        assert float(r[5]) <= 1e-4 + 1e-5 * float(r[6]) and float(r[6]) > 1, out
    assert int(rows[0][7]) != int(rows[1][7]), out  # two different graphs, not one exported twice


def test_decoder_layout_bench_arguments_are_checked() -> None:
    for args in (["--prompts", "0"], ["--rounds", "0"], ["--runtimes", "tensorrt"]):
        proc = run_script("decoder_layout_bench.py", *args, check=False)
        assert proc.returncode == 2 and "error:" in proc.stderr, (args, proc.stderr)


@pytest.mark.slow  # a whole tiny bench run (3-6 s); .ci/run runs it
def test_full_grid_bench_tiny() -> None:
    """Two models on one calibration, the perturbed outputs regenerated by two feed workers."""
    out = run_script("full_grid_bench.py", "--n-images", "2", "--size", "64", "--model", "sam-tiny,sam-tiny",
                     "--levels", "1", "--types", "gaussian_noise", "rotation", "--batch-size", "2", "--device", "cpu",
                     "--workers", "2").stdout
    assert out.count("calibration: 2 chunks, 4 outputs") == 1
    assert out.count("## model sam-tiny on cpu") == 2
    for stage in ("calibration (CPU)", "clean forward + score", "perturbed: regenerate (2 proc) + forward + score",
                  "fgsm (levels [1])", "pgd (levels [1])"):
        assert out.count(f"| {stage} |") == 2
    assert "extrapolated to 1000 images" in out and "host total for 1000 images" in out


@pytest.mark.slow  # a whole tiny bench run (3-6 s); .ci/run runs it
def test_full_grid_bench_torch_engine_tiny() -> None:
    """``--engine torch`` on the CPU: device types calibrated by the device engine, the host-only
    type by the host engine, the perturbed stage fed as device batches."""
    out = run_script("full_grid_bench.py", "--n-images", "2", "--size", "48", "--model", "sam-tiny",
                     "--levels", "2", "--types", "gaussian_noise", "rotation", "jpeg_compression", "--batch-size", "2",
                     "--device", "cpu", "--engine", "torch", "--engine-batch", "3").stdout
    assert "calibration (torch engine on cpu): 2 device types, 4 outputs" in out
    assert "1 host types (jpeg_compression), 2 outputs" in out
    for stage in ("calibration (torch on cpu)", "perturbed: regenerate (device engine) + forward + score"):
        assert f"| {stage} | 6 |" in out
    assert "on one device for 1000 images" in out


def test_full_grid_feed_workers_give_the_in_process_outputs() -> None:
    """The pooled feed (spawned workers, bounded prefetch) yields exactly what regeneration in
    the calling process does, in the same order."""
    if str(BENCH) not in sys.path:  # by its own name: spawned feed workers import it (they get sys.path)
        sys.path.insert(0, str(BENCH))
    import full_grid_bench as grid
    samples = {f"{grid.DATASET}_ct": grid.synthetic_samples(3, 48, "ct")}
    _, pairs = grid.calibrate_grid(samples, ["gaussian_noise", "rotation"], [2], workers=1, subset=2)
    inline = list(grid.regenerate_feed(pairs, workers=0))
    pooled = list(grid.regenerate_feed(pairs, workers=2, prefetch=1))
    assert len(inline) == len(pooled) == len(pairs) == 6
    for (s1, im1, m1), (s2, im2, m2) in zip(inline, pooled, strict=True):
        assert s1.sample_id == s2.sample_id
        assert np.array_equal(im1, im2) and np.array_equal(m1, m2)


def test_full_grid_bench_unknown_model_is_a_clear_error() -> None:
    proc = run_script("full_grid_bench.py", "--n-images", "1", "--size", "32", "--types", "gaussian_noise",
                      "--levels", "1", "--model", "nope", "--device", "cpu", check=False)
    assert proc.returncode != 0 and "unknown --model 'nope'" in proc.stderr


def test_api_bench_tiny() -> None:
    out = run_script("api_bench.py", "--n", "4", "--delay-ms", "1").stdout
    assert "concurrency  8" in out and re.search(r"cached, second run:\s+0 HTTP calls", out)


def test_mart_bench_tiny() -> None:
    out = run_script("mart_bench.py", "--rows", "3000", "--threads", "1").stdout
    assert "data: 3,000 rows" in out


@pytest.mark.slow  # a whole tiny bench run (3-6 s); .ci/run runs it
def test_runner_bench_tiny() -> None:
    out = run_script("runner_bench.py", "--assets", "1", "--partitions", "1").stdout
    assert "ratio batched / reference" in out


@pytest.mark.slow  # a whole tiny bench run (3-6 s); .ci/run runs it
def test_defs_load_bench_tiny() -> None:
    proc = run_script("defs_load_bench.py", "--reps", "1", "--goal-s", "600", check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "## Definitions load" in proc.stdout and "Goal: definitions load under 600 s: met" in proc.stdout


@pytest.mark.slow  # a whole tiny bench run (3-6 s); .ci/run runs it
def test_taxonomy_bench_tiny() -> None:
    out = run_script("taxonomy_bench.py", "--n", "1", "--paraphrases", "1", "--image-size", "32").stdout
    assert "vision once" in out


@pytest.mark.slow  # a whole tiny bench run (3-6 s); .ci/run runs it
def test_vlm_bench_tiny() -> None:
    out = run_script("vlm_bench.py", "--n", "2", "--batch-size", "2", "--max-new-tokens", "2").stdout
    assert "answers/s" in out or "answers" in out


@pytest.mark.slow  # a whole tiny bench run (3-6 s); .ci/run runs it
def test_gpu_seg_bench_cpu_path_tiny() -> None:
    out = run_script("gpu_seg_bench.py", "--archs", "tiny", "--iters", "1", "--batch", "1", "--skip-e2e", "--quick",
                     "--no-compile").stdout
    assert "### tiny at 256 px" in out and "peak memory" in out


@pytest.mark.parametrize("name", ["gpu_sam_bench.py", "gpu_finetune_bench.py"])
def test_gpu_only_benches_parse_and_exit_clearly_without_cuda(name: str) -> None:
    assert "--batch" in run_script(name, "--help").stdout
    if not CUDA:
        proc = run_script(name, "--batch", "1", "--steps" if "finetune" in name else "--iters", "1", check=False)
        assert proc.returncode != 0 and "no CUDA device" in proc.stderr


def test_gpu_mask_agreement_models_run_on_cpu() -> None:
    # no arguments and no CPU path: import it and run its model on the CPU as main() does on CUDA
    from medrobust_lib.models.sam import SamSegmenter

    mod = _load("gpu_mask_agreement.py")
    m = mod.model(mod.SMALL)
    assert any("rel_pos" in n and float(p.detach().abs().sum()) > 0 for n, p in m.named_parameters())
    ref = SamSegmenter(m, "sam", "r", "0", device="cpu", engine="reference")
    g = torch.Generator().manual_seed(0)
    x = torch.rand((1, 3, 128, 128), generator=g)
    with torch.no_grad():
        logits = ref.forward_logits(x, torch.tensor([[10.0, 10.0, 90.0, 90.0]]))
    assert logits.shape == (1, 1, 128, 128) and bool(torch.isfinite(logits).all())


@pytest.mark.parametrize("name", ["seg_bench.py", "registry_loop_bench.py"])
def test_demo_state_benches_parse_their_arguments(name: str) -> None:
    assert "--suite" in run_script(name, "--help").stdout


def test_gpu_session_script_is_valid_bash_naming_existing_benches() -> None:
    script = BENCH / "gpu_session.sh"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    text = script.read_text()
    named = re.findall(r"(bench/\w+\.py|tests/[\w/]+\.py)", text)
    named += [f"bench/{m}.py" for m in re.findall(r"-m bench\.(\w+)", text)]  # python -m bench.<name>
    assert named and all((ROOT / n).is_file() for n in named)


def test_synthetic_grid_images_are_deterministic() -> None:
    mod = _load("full_grid_bench.py")
    a, ma = mod.synthetic_image(3, 64, False)
    b, mb = mod.synthetic_image(3, 64, False)
    assert a.dtype == np.float32 and a.shape == (64, 64) and np.array_equal(a, b) and np.array_equal(ma, mb)
    assert ma.any() and a[ma].mean() > a[~ma].mean()  # the lesion is brighter than the background
