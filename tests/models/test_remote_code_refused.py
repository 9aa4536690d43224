"""Issue 44, finding 2: a hostile model folder never runs its own code.

A folder whose ``config.json`` has ``auto_map`` pointing at an ``evil.py`` (which writes a marker
file when imported) is refused in one line before any loader runs, and every transformers loader
the library calls passes ``trust_remote_code=False``. Before, transformers asked on stdin whether
to run the folder's code and ``yes y | ...`` ran it. Each loader is run in a fresh interpreter
with stdin answering "y"."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

EVIL = """
import pathlib
pathlib.Path({marker!r}).write_text("the folder's code ran")
from transformers import PretrainedConfig
class EvilConfig(PretrainedConfig):
    model_type = "evil_vlm"
"""


def _hostile_folder(tmp_path: Path, where: str = "config.json") -> tuple[Path, Path]:
    folder = tmp_path / "hostile-model"
    folder.mkdir()
    marker = tmp_path / "MARKER"
    (folder / "evil.py").write_text(EVIL.format(marker=str(marker)))
    auto_map = {"AutoConfig": "evil.EvilConfig", "AutoModelForImageTextToText": "evil.EvilModel",
                "AutoProcessor": "evil.EvilProcessor", "AutoTokenizer": ["evil.EvilTokenizer", None]}
    config = {"model_type": "evil_vlm", "architectures": ["EvilModel"]}
    if where == "config.json":
        config["auto_map"] = auto_map
    (folder / "config.json").write_text(json.dumps(config))
    if where == "tokenizer_config.json":
        (folder / "tokenizer_config.json").write_text(json.dumps({"auto_map": auto_map, "model_max_length": 8}))
    return folder, marker


HF_VLM = "from medrobust_lib.models.hf_vlm import HFVisionLanguageModel as L; L(FOLDER)"


def _run(code: str, folder: Path) -> subprocess.CompletedProcess[str]:
    script = ("import sys\nFOLDER = sys.argv[1]\ntry:\n    " + code.replace("; ", "\n    ")
              + "\nexcept Exception as exc:\n    print('ERROR:', str(exc), file=sys.stderr)\n    sys.exit(3)\n")
    return subprocess.run([sys.executable, "-c", script, str(folder)], input="y\n" * 20, capture_output=True,
                          text=True, timeout=240, cwd=ROOT)


@pytest.mark.parametrize("where", ["config.json", "tokenizer_config.json"])
def test_a_folder_with_auto_map_is_refused_in_one_line_and_its_code_never_runs(tmp_path: Path, where: str) -> None:
    folder, marker = _hostile_folder(tmp_path, where)
    proc = _run(HF_VLM, folder)
    assert not marker.exists(), f"the folder's code ran: {proc.stderr[-2000:]}"
    assert proc.returncode == 3, proc.stderr[-2000:]
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("ERROR:") and "auto_map" in line and where in line, line
    assert proc.stderr.count("ERROR:") == 1 and "\n" not in line


def test_refuse_remote_code_names_the_file_in_one_line(tmp_path: Path) -> None:
    from medrobust_lib.models.remote_code import RemoteCodeRefused, refuse_remote_code

    folder, marker = _hostile_folder(tmp_path)
    with pytest.raises(RemoteCodeRefused) as err:
        refuse_remote_code(folder)
    msg = str(err.value)
    assert "\n" not in msg and "config.json" in msg and "auto_map" in msg and not marker.exists()
    clean = tmp_path / "clean"
    clean.mkdir()
    (clean / "config.json").write_text(json.dumps({"model_type": "llava"}))
    refuse_remote_code(clean)  # no auto_map: nothing to refuse


def test_every_transformers_loader_in_the_library_passes_trust_remote_code_false() -> None:
    """Every ``Auto*.from_pretrained`` call in the library names ``trust_remote_code=False``."""
    missing = []
    for path in sorted((ROOT / "medrobust_lib").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "from_pretrained" and isinstance(node.func.value, ast.Name)
                    and node.func.value.id.startswith("Auto")):
                continue
            kw = {k.arg: k.value for k in node.keywords}
            val = kw.get("trust_remote_code")
            if not (isinstance(val, ast.Constant) and val.value is False):
                missing.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not missing, missing
