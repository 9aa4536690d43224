"""Definitions load benchmark. Run: .venv/bin/python -m bench.defs_load_bench [--reps 5] [--goal-s 5]

Times loading ``medrobust_assets.location`` (the demo's Definitions) in a fresh interpreter (import, build the
repository, resolve every asset spec: what ``dagster dev``, a sensor tick or a run worker pays
before doing any work), ``--reps`` times, and reports the median next to two references measured
in the same run: a bare interpreter and ``import dagster``. Then runs ``python -X importtime`` once
and prints the ten most expensive imports (cumulative) and, for each heavy library that the load
pulls in, which module imported it. Exits 1 when the median exceeds ``--goal-s`` (the issue's
goal: under 5 s). Run from the repository root; no network.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Libraries that must stay out of the definitions import path (docs/design.md, section 7).
HEAVY = ("torch", "torchvision", "peft", "segment_anything", "transformers", "torchmetrics", "mlflow",
         "duckdb", "pandas", "pyarrow", "cv2", "scipy", "skimage", "matplotlib")

TIMED = "import time; t = time.perf_counter(); {body}; print(time.perf_counter() - t)"
CASES: dict[str, str] = {
    "python (no imports)": "pass",
    "import dagster": "import dagster",
    "definitions load": ("import medrobust_assets.location as d; "
                         "d.defs.get_repository_def(); d.defs.resolve_all_asset_specs()"),
}
REFERENCE = "import dagster"
TARGET = "definitions load"


@dataclass(frozen=True)
class Timing:
    """Median seconds over repetitions: measured inside the child, and wall clock incl. startup."""

    inner_s: float
    wall_s: float


def _env() -> dict[str, str]:
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "DAGSTER_DISABLE_TELEMETRY": "true"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def time_case(body: str, reps: int) -> Timing:
    """Run ``body`` in ``reps`` fresh interpreters; median in-child and wall-clock seconds."""
    inner, wall = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", TIMED.format(body=body)], cwd=ROOT, env=_env(),
                             capture_output=True, text=True, check=True, timeout=600)
        wall.append(time.perf_counter() - t0)
        inner.append(float(out.stdout.strip().splitlines()[-1]))
    return Timing(statistics.median(inner), statistics.median(wall))


@dataclass(frozen=True)
class ImportLine:
    """One ``-X importtime`` line: module, nesting depth (0 = imported directly), microseconds."""

    module: str
    depth: int
    self_us: int
    cumulative_us: int


_LINE = re.compile(r"^import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)\s*$")


def import_profile(statement: str) -> list[ImportLine]:
    """Parse ``python -X importtime -c statement`` (stderr), in the order Python printed it
    (children before their importer)."""
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", statement], cwd=ROOT, env=_env(),
                         capture_output=True, text=True, check=True, timeout=600)
    lines = []
    for raw in out.stderr.splitlines():
        m = _LINE.match(raw)
        if m:
            depth = (len(m.group(3)) - 1) // 2
            lines.append(ImportLine(m.group(4), depth, int(m.group(1)), int(m.group(2))))
    return lines


def importer_chain(lines: list[ImportLine], index: int) -> list[str]:
    """Modules from the top-level import down to ``lines[index]`` (Python prints a module after
    everything it imported, so the importer is the next line with a smaller depth)."""
    chain = [lines[index].module]
    depth = lines[index].depth
    for ln in lines[index + 1:]:
        if ln.depth < depth:
            chain.append(ln.module)
            depth = ln.depth
            if depth == 0:
                break
    return chain[::-1]


def heavy_importers(lines: list[ImportLine]) -> list[tuple[str, float, list[str]]]:
    """For each heavy library in the profile: (library, cumulative s, chain from the top-level
    import down to its first import)."""
    found = []
    for lib in HEAVY:
        for i, ln in enumerate(lines):
            if ln.module == lib:
                found.append((lib, ln.cumulative_us / 1e6, importer_chain(lines, i)))
                break
    return found


def _project_importer(chain: list[str]) -> str:
    """The last project module on the chain (the one whose import statement pulled the library in)."""
    ours = [m for m in chain if m.split(".")[0] in ("medrobust_assets", "medrobust_lib")]
    return ours[-1] if ours else chain[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--goal-s", type=float, default=5.0)
    args = ap.parse_args()

    # one untimed load first, so every timed repetition finds the same warm bytecode cache
    time_case(CASES[TARGET], 1)
    timings = {name: time_case(body, args.reps) for name, body in CASES.items()}
    ref = timings[REFERENCE]
    print(f"## Definitions load ({args.reps} fresh interpreters each, median; {sys.executable})\n")
    print("| case | in-process s | wall s (incl. interpreter start) | ratio to `import dagster` (wall) |")
    print("|---|---|---|---|")
    for name, t in timings.items():
        print(f"| {name} | {t.inner_s:.2f} | {t.wall_s:.2f} | {t.wall_s / ref.wall_s:.2f} |")
    target = timings[TARGET]
    ok = target.wall_s < args.goal_s
    print(f"\nGoal: definitions load under {args.goal_s:g} s: {'met' if ok else 'NOT met'} "
          f"(wall median {target.wall_s:.2f} s).\n")

    lines = import_profile("import medrobust_assets.location")
    print("## Top 10 imports by cumulative time (`-X importtime`, one run)\n")
    print("| module | cumulative s | self s |")
    print("|---|---|---|")
    for ln in sorted(lines, key=lambda x: -x.cumulative_us)[:10]:
        print(f"| {ln.module} | {ln.cumulative_us / 1e6:.3f} | {ln.self_us / 1e6:.3f} |")

    heavy = heavy_importers(lines)
    print("\n## Heavy libraries imported at definitions load\n")
    if not heavy:
        print("none of: " + ", ".join(HEAVY))
    else:
        print("| library | cumulative s | pulled in by | import chain |")
        print("|---|---|---|---|")
        for lib, secs, chain in heavy:
            print(f"| {lib} | {secs:.3f} | {_project_importer(chain)} | {' > '.join(chain)} |")
        absent = [h for h in HEAVY if h not in {h2 for h2, _, _ in heavy}]
        print(f"\nnot imported: {', '.join(absent) or 'none'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
