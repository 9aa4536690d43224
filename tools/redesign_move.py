"""One-off: move modules to the house plan (docs/design.md, section 2) and rewrite every reference.

Idempotent: a move whose source is gone and target exists is skipped; references are rewritten in
every tracked text file (Python imports in all their forms, dotted paths in strings such as
``mock.patch`` targets, and slash paths in docs). Run from the repository root:
``python tools/redesign_move.py``; then ``ruff check --fix`` sorts the rewritten imports.

It has been applied to main; the maps name the final homes (the three schema modules merged into
``store/schema.py``, where the VLM and taxonomy ``COLUMN_NAMES`` are ``VLM_COLUMN_NAMES`` and
``TAXONOMY_COLUMN_NAMES``: rename those by hand in code written against the old layout).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

MODULE_MOVES: dict[str, str] = {
    # config
    "medrobust_lib.config": "medrobust_lib.config.suite",
    "medrobust_lib.pipeline.vlm_config": "medrobust_lib.config.vlm",
    # demo
    "medrobust_lib.pipeline.vlm_train_demo": "medrobust_lib.demo.vlm_train",
    "medrobust_lib.pipeline.taxonomy_train": "medrobust_lib.demo.taxonomy_train",
    "medrobust_lib.data.demo.records": "medrobust_lib.demo.records",
    "medrobust_lib.data.demo.layouts": "medrobust_lib.demo.layouts",
    "medrobust_lib.data.demo.geometry": "medrobust_lib.demo.geometry",
    "medrobust_lib.data.demo.sources": "medrobust_lib.demo.sources",
    "medrobust_lib.data.demo.generators": "medrobust_lib.demo.generators",
    "medrobust_lib.data.demo.build": "medrobust_lib.demo.build",
    "medrobust_lib.data.demo.backgrounds": "medrobust_lib.demo.backgrounds",
    "medrobust_lib.data.demo.manifest": "medrobust_lib.demo.manifest",
    "medrobust_lib.data.demo": "medrobust_lib.demo",
    # report figures
    "medrobust_lib.pipeline.reports": "medrobust_lib.tracks.perturbed_checks",
    "medrobust_lib.report.gallery": "medrobust_lib.report.figures.gallery",
    "medrobust_lib.report.paper_figures": "medrobust_lib.report.figures.paper",
    "medrobust_lib.report.style": "medrobust_lib.report.figures.style",
    "medrobust_lib.perturb.feed": "medrobust_lib.tracks.feed",
    # store schemas
    "medrobust_lib.pipeline.strategy_schema": "medrobust_lib.store.schema",
    "medrobust_lib.pipeline.vlm_schema": "medrobust_lib.store.schema",
    "medrobust_lib.taxonomy.schema": "medrobust_lib.store.schema",
    # tracks
    "medrobust_lib.pipeline.datasets": "medrobust_lib.tracks.datasets",
    "medrobust_lib.pipeline.perturbed": "medrobust_lib.tracks.perturbed",
    "medrobust_lib.pipeline.strategies": "medrobust_lib.tracks.finetune.strategies",
    "medrobust_lib.pipeline.gate": "medrobust_lib.tracks.finetune.gate",
    "medrobust_lib.pipeline.strategy_report": "medrobust_lib.tracks.finetune.ranking",
    "medrobust_lib.pipeline.segmentation": "medrobust_lib.tracks.segmentation.evaluate",
    "medrobust_lib.pipeline.seg_report": "medrobust_lib.tracks.segmentation.stats",
    "medrobust_lib.pipeline.taxonomy": "medrobust_lib.tracks.taxonomy.evaluate",
    "medrobust_lib.pipeline.taxonomy_report": "medrobust_lib.tracks.taxonomy.stats",
    "medrobust_lib.pipeline.vlm": "medrobust_lib.tracks.vlm.evaluate",
    "medrobust_lib.pipeline.vlm_report": "medrobust_lib.tracks.vlm.stats",
    "medrobust_lib.pipeline.vlm_runner": "medrobust_lib.tracks.vlm.runner",
}
"""Old dotted module -> new dotted module. A package maps its ``__init__``."""

_ITEMS = ("VLMItem", "LoadedItems", "load_items", "box_in_sample", "prompt_for", "records_config", "YESNO_SUFFIX",
          "CAPTION_PROMPT", "GROUNDING_SUFFIX", "_sid")
_SEG_CFG = ("SegModelConfig", "SegTrainConfig", "AttackSuiteConfig", "SegmentationConfig", "ATTACK_KINDS")
_FT_CFG = ("LoraOptions", "FinetuneTrain", "FinetuneEval", "GateOptions", "FinetuneConfig")
_TX_CFG = ("TaxonomyConfigEntry", "TaxonomyConfig")
SYMBOL_MOVES: dict[tuple[str, str], str] = {
    **{("medrobust_lib.config.vlm", n): "medrobust_lib.tracks.vlm.items" for n in _ITEMS},
    **{(m, n): "medrobust_lib.config.segmentation" for n in _SEG_CFG
       for m in ("medrobust_lib.tracks.segmentation.evaluate", "medrobust_lib.pipeline.segmentation")},
    **{(m, n): "medrobust_lib.config.segmentation" for n in _FT_CFG
       for m in ("medrobust_lib.tracks.finetune.strategies", "medrobust_lib.pipeline.strategies")},
    **{(m, n): "medrobust_lib.config.taxonomy" for n in _TX_CFG
       for m in ("medrobust_lib.tracks.taxonomy.evaluate", "medrobust_lib.pipeline.taxonomy")},
    ("medrobust_lib.tracks.datasets", "ensure_demo"): "medrobust_lib.demo.build",
    ("medrobust_lib.pipeline.datasets", "ensure_demo"): "medrobust_lib.demo.build",
    ("medrobust_lib.data.demo.records", "RECORD_FILES"): "medrobust_lib.paths",
    ("medrobust_lib.demo.records", "RECORD_FILES"): "medrobust_lib.paths",
}
"""(module, name) -> the module that defines ``name`` now (imports of it are rewritten)."""

TEST_MOVES: dict[str, str] = {
    "tests/pipeline/test_gate.py": "tests/tracks/finetune/test_gate.py",
    "tests/pipeline/test_strategy_report.py": "tests/tracks/finetune/test_ranking.py",
    "tests/data/test_demo.py": "tests/demo/test_demo.py",
}

NEW_PACKAGES = [
    "medrobust_lib/config", "medrobust_lib/demo", "medrobust_lib/report/figures", "medrobust_lib/tracks",
    "medrobust_lib/tracks/finetune", "medrobust_lib/tracks/segmentation", "medrobust_lib/tracks/taxonomy",
    "medrobust_lib/tracks/vlm", "tests/tracks", "tests/tracks/finetune", "tests/demo",
]
PACKAGE_DOCS = {
    "medrobust_lib/config": '"""Typed suite configuration: ``Suite`` and one module per section."""\n',
    "medrobust_lib/tracks": '"""One sub-package per asset family; one public function per asset (no Dagster)."""\n',
    "medrobust_lib/tracks/finetune": '"""Fine-tuning strategies: training per strategy, ranking, registry evaluation, gate."""\n',
    "medrobust_lib/tracks/segmentation": '"""Segmentation track: clean, perturbed and adversarial evaluation and its statistics."""\n',
    "medrobust_lib/tracks/taxonomy": '"""Safety taxonomy track: paraphrase and image-removal predictions, quadrants, statistics."""\n',
    "medrobust_lib/tracks/vlm": '"""Vision-language track: VQA, captioning, grounding predictions and their statistics."""\n',
    "medrobust_lib/report/figures": '"""Every plot the project draws."""\n',
    "tests/tracks": "", "tests/tracks/finetune": "", "tests/demo": "",
}


def _path(mod: str, package: bool) -> Path:
    p = Path(*mod.split("."))
    return p / "__init__.py" if package else p.with_suffix(".py")


def _is_package(mod: str) -> bool:
    return _path(mod, True).exists()


def _git(*args: str) -> None:
    subprocess.run(["git", *args], check=True)


def move_files() -> None:
    for d in NEW_PACKAGES:
        Path(d).mkdir(parents=True, exist_ok=True)
    for old, new in MODULE_MOVES.items():
        if old == "medrobust_lib.data.demo":
            src = _path(old, True)
            dst = Path("medrobust_lib/demo/__init__.py")
        else:
            src, dst = _path(old, False), _path(new, False)
        if src.exists() and not dst.exists():
            dst.parent.mkdir(parents=True, exist_ok=True)
            _git("mv", str(src), str(dst))
    for src_s, dst_s in TEST_MOVES.items():
        src, dst = Path(src_s), Path(dst_s)
        if src.exists() and not dst.exists():
            dst.parent.mkdir(parents=True, exist_ok=True)
            _git("mv", str(src), str(dst))
    for d, doc in PACKAGE_DOCS.items():
        init = Path(d) / "__init__.py"
        if not init.exists():
            init.write_text(doc)
    config_init = Path("medrobust_lib/config/__init__.py")
    if not config_init.read_text().strip().endswith("load_suite"):
        config_init.write_text(
            PACKAGE_DOCS["medrobust_lib/config"] + "\nfrom medrobust_lib.config.suite import "
            "DemoConfig, PerturbationConfig, Suite, load_suite\n\n"
            '__all__ = ["DemoConfig", "PerturbationConfig", "Suite", "load_suite"]\n'
        )
    for leftover in ("medrobust_lib/pipeline", "medrobust_lib/data/demo", "tests/pipeline"):
        d = Path(leftover)
        if d.exists():
            rest = [p for p in d.rglob("*") if p.is_file() and p.name != "__init__.py" and "__pycache__" not in p.parts]
            if rest:
                print(f"warning: {d} still holds {[str(p) for p in rest]}", file=sys.stderr)
            else:
                subprocess.run(["git", "rm", "-q", "-r", "--ignore-unmatch", str(d)], check=True)
                subprocess.run(["rm", "-rf", str(d)], check=True)


# longest first so that e.g. pipeline.vlm_config is rewritten before pipeline.vlm
_ORDERED = sorted(MODULE_MOVES.items(), key=lambda kv: -len(kv[0]))
# medrobust_lib.config stays importable as a package (re-exports): only rewrite deeper references
_KEEP_AS_PACKAGE = {"medrobust_lib.config"}
_FROM_IMPORT = re.compile(r"^(?P<indent>[ \t]*)from (?P<pkg>medrobust_lib(?:\.\w+)*) import (?P<names>\([^)]*\)|[^\n#]+)", re.M)


def _split_names(names: str) -> list[tuple[str, str | None]]:
    body = names.strip()
    if body.startswith("("):
        body = body[1:-1]
    out: list[tuple[str, str | None]] = []
    for part in body.replace("\n", " ").split(","):
        part = part.strip()
        if not part:
            continue
        bits = part.split(" as ")
        out.append((bits[0].strip(), bits[1].strip() if len(bits) > 1 else None))
    return out


def _rewrite_from_imports(text: str, this_module: str = "") -> str:
    """``from medrobust_lib.pipeline import vlm as v`` -> ``from medrobust_lib.tracks.vlm import evaluate as v``."""

    def repl(m: re.Match[str]) -> str:
        pkg, indent = m.group("pkg"), m.group("indent")
        names = _split_names(m.group("names"))
        moved = [(n, a) for n, a in names if f"{pkg}.{n}" in MODULE_MOVES]
        new_pkg = MODULE_MOVES.get(pkg, pkg) if pkg not in _KEEP_AS_PACKAGE else pkg
        symbols = [(n, a) for n, a in names if (SYMBOL_MOVES.get((pkg, n)) or SYMBOL_MOVES.get((new_pkg, n)))
                   not in (None, this_module)]
        if not moved and not symbols:
            return m.group(0)
        lines = []
        kept = [(n, a) for n, a in names if (n, a) not in moved and (n, a) not in symbols]
        if kept:
            lines.append(f"{indent}from {pkg} import " + ", ".join(n if a is None else f"{n} as {a}" for n, a in kept))
        by_dest: dict[str, list[str]] = {}
        for n, a in symbols:
            dest = SYMBOL_MOVES.get((pkg, n)) or SYMBOL_MOVES[(new_pkg, n)]
            by_dest.setdefault(dest, []).append(n if a is None else f"{n} as {a}")
        for dest, ns in by_dest.items():
            lines.append(f"{indent}from {dest} import " + ", ".join(ns))
        for n, a in moved:
            new = MODULE_MOVES[f"{pkg}.{n}"]
            parent, leaf = new.rsplit(".", 1)
            lines.append(f"{indent}from {parent} import {leaf} as {a or n}" if (a or n) != leaf
                         else f"{indent}from {parent} import {leaf}")
        return "\n".join(lines)

    return _FROM_IMPORT.sub(repl, text)


def rewrite_text(text: str, this_module: str = "") -> str:
    text = _rewrite_from_imports(text, this_module)
    for old, new in _ORDERED:
        if old in _KEEP_AS_PACKAGE:
            continue
        text = re.sub(rf"(?<![\w.]){re.escape(old)}(?![\w])", new, text)
        old_p, new_p = old.replace(".", "/"), new.replace(".", "/")
        if old == "medrobust_lib.data.demo":
            text = re.sub(rf"(?<![\w/]){re.escape(old_p)}(?=/|\b)", new_p, text)
        else:
            text = re.sub(rf"(?<![\w/]){re.escape(old_p)}\.py\b", new_p + ".py", text)
    for src_s, dst_s in TEST_MOVES.items():
        text = text.replace(src_s, dst_s)
        src_mod, dst_mod = (x.removesuffix(".py").replace("/", ".") for x in (src_s, dst_s))
        text = re.sub(rf"(?<![\w.]){re.escape(src_mod)}(?![\w])", dst_mod, text)
    return text


def rewrite_all() -> None:
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], check=True, capture_output=True,
                           text=True).stdout.split()
    for f in files:
        p = Path(f)
        if p.suffix not in {".py", ".md", ".yaml", ".yml", ".toml", ".cfg", ".txt"} or not p.exists():
            continue
        if p.name == "redesign_move.py":
            continue
        old = p.read_text()
        mod = ".".join(p.with_suffix("").parts).removesuffix(".__init__") if p.suffix == ".py" else ""
        new = rewrite_text(old, mod)
        if new != old:
            p.write_text(new)


if __name__ == "__main__":
    move_files()
    rewrite_all()
