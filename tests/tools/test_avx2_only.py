"""tools/avx2_only: a command run through it sees a CPU with AVX2 only, and keeps its own SIGSEGV
handling (Python's faulthandler) for real faults."""

from __future__ import annotations

import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

RUN = Path(__file__).resolve().parents[2] / "tools" / "avx2_only" / "run.sh"


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8")
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


pytestmark = pytest.mark.skipif(
    platform.machine() != "x86_64" or shutil.which("gcc") is None or "cpuid_fault" not in _cpu_flags(),
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


def test_real_faults_still_reach_the_programs_handler() -> None:
    code = "import ctypes, faulthandler; faulthandler.enable(); ctypes.string_at(0)"
    out = _run(code)
    assert out.returncode == -11
    assert "Fatal Python error: Segmentation fault" in out.stderr
    assert "line 1" in out.stderr  # faulthandler's traceback of the faulting line


def test_a_process_without_a_handler_dies_of_its_fault() -> None:
    out = _run("import ctypes; ctypes.string_at(0)")
    assert out.returncode == -11
