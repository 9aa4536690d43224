#!/bin/sh
# Run a command as it runs on a CPU with AVX2 only (no AVX-512, AVX-VNNI or AMX), on an x86-64 Linux
# CPU that has more: builds tools/avx2_only/cpuid_mask.c with gcc (once, into $TMPDIR) and runs the
# command with it preloaded, so every library that chooses its kernels by `cpuid` chooses AVX2 ones.
# Needs the `cpuid_fault` CPU flag (Intel; KVM guests have it). Timing aid for issue 47, e.g.
#   tools/avx2_only/run.sh .venv/bin/python -m bench.litemedsam_bench --batches 1
#   tools/avx2_only/run.sh make demo
# CPUID_MASK_REPORT=1 prints how many cpuid instructions each process ran through the shim.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
grep -qw cpuid_fault /proc/cpuinfo || { echo "tools/avx2_only: this CPU has no cpuid_fault flag; cannot hide its features" >&2; exit 2; }
# one build per source version (its hash names the file), written under a temporary name and
# renamed into place, so concurrent first runs never preload a half-written library
sum=$(sha256sum "$here/cpuid_mask.c" | cut -c1-16)
out="${TMPDIR:-/tmp}/medrobust-avx2-only"
mkdir -p "$out"
so="$out/cpuid_mask-$sum.so"
if [ ! -f "$so" ]; then
    tmp=$(mktemp "$out/build.XXXXXX")
    gcc -O2 -Wall -shared -fPIC -o "$tmp" "$here/cpuid_mask.c" -ldl
    mv -f "$tmp" "$so"
fi
# glibc picks its string functions before the shim loads: tell it the same (AVX-512 off; glibc
# 2.36 knows no names for the AMX and VNNI bits, and uses none of them).
hwcaps="glibc.cpu.hwcaps=-AVX512F,-AVX512CD,-AVX512BW,-AVX512DQ,-AVX512VL"
GLIBC_TUNABLES="${GLIBC_TUNABLES:+$GLIBC_TUNABLES:}$hwcaps"
export GLIBC_TUNABLES
LD_PRELOAD="$so${LD_PRELOAD:+:$LD_PRELOAD}"
export LD_PRELOAD
exec "$@"
