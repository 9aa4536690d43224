"""tools/avx2_only: a command run through it sees a CPU with AVX2 only, and keeps its own SIGSEGV
handling (Python's faulthandler) for real faults."""

from __future__ import annotations

import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.litemedsam_bench import cpu_flags

RUN = Path(__file__).resolve().parents[2] / "tools" / "avx2_only" / "run.sh"


pytestmark = pytest.mark.skipif(
    platform.machine() != "x86_64" or shutil.which("gcc") is None or "cpuid_fault" not in cpu_flags(),
    reason="needs x86-64 Linux with the cpuid_fault flag and gcc")


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(RUN), sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


def test_libraries_choose_avx2_kernels() -> None:
    code = ("import torch, numpy\n"
            "from numpy._core._multiarray_umath import __cpu_features__ as f\n"
            "from medrobust_lib.models.precision import native_bf16\n"
            "print(torch.backends.cpu.get_cpu_capability(), f['AVX2'], f['AVX512F'], f['AVX512_SKX'], native_bf16('cpu'))")
    out = _run(code)
    assert out.returncode == 0, out.stderr
    capability, avx2, avx512f, skx, bf16 = out.stdout.split()
    assert capability in ("AVX2", "DEFAULT")
    assert (avx2, avx512f, skx, bf16) == ("True", "False", "False", "False")


def test_cpuid_after_the_program_took_sigsegv_and_real_faults_still_reach_its_handler() -> None:
    """faulthandler installs its own SIGSEGV handler and the main thread blocks SIGSEGV (inherited by
    new threads); a thread's cpuid (NumPy's feature probe at import) is still answered, masked, and a
    real fault afterwards still reaches faulthandler."""
    code = ("import faulthandler, signal, threading, ctypes\n"
            "faulthandler.enable()\n"
            "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGSEGV})\n"
            "seen = {}\n"
            "def probe():\n"
            "    from numpy._core._multiarray_umath import __cpu_features__ as f\n"
            "    seen['avx512f'] = f['AVX512F']\n"
            "t = threading.Thread(target=probe); t.start(); t.join()\n"
            "print(seen['avx512f'], flush=True)\n"
            "ctypes.string_at(0)\n")
    out = _run(code)
    assert out.stdout.split() == ["False"]
    assert out.returncode == -11
    assert "Fatal Python error: Segmentation fault" in out.stderr
    assert "line 10" in out.stderr  # faulthandler's traceback of the faulting line


def test_a_process_without_a_handler_dies_of_its_fault_or_a_sent_sigsegv() -> None:
    out = _run("import numpy, ctypes; print(numpy._core._multiarray_umath.__cpu_features__['AVX512F']); "
               "ctypes.string_at(0)")
    assert (out.stdout.split(), out.returncode) == (["False"], -11)
    out = _run("import os, signal; os.kill(os.getpid(), signal.SIGSEGV); print('survived')")
    assert (out.stdout, out.returncode) == ("", -11)
    out = _run("import os, signal; signal.signal(signal.SIGSEGV, signal.SIG_IGN); os.kill(os.getpid(), signal.SIGSEGV); "
               "import numpy; print(numpy._core._multiarray_umath.__cpu_features__['AVX512F'])")
    assert (out.stdout.split(), out.returncode) == (["False"], 0)  # ignored, and cpuid still masked
