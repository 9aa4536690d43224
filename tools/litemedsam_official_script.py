"""Shared by the one-off LiteMedSAM fixture tools: load the official ``CVPR24_LiteMedSAM_infer.py``
of a ``bowang-lab/MedSAM`` checkout (branch LiteMedSAM) as its authors run it, without its main loop."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path
from typing import Any


def load_official(repo: Path, ckpt: Path, work: Path) -> dict[str, Any]:
    """The script's globals (its functions and ``medsam_lite_model``), run from ``repo`` with the
    checkpoint ``ckpt`` on the CPU; ``work`` gets its in/out/png folders."""
    script = repo / "CVPR24_LiteMedSAM_infer.py"
    (work / "in").mkdir(exist_ok=True)
    (work / "out").mkdir(exist_ok=True)
    # the official script parses its arguments and builds the model at import; its main loop is
    # guarded by __name__ == '__main__', so run_path with another name defines everything else
    sys.argv = [str(script), "-i", str(work / "in"), "-o", str(work / "out"),
                "-lite_medsam_checkpoint_path", str(ckpt), "-device", "cpu", "-png_save_dir", str(work / "png")]
    sys.path.insert(0, str(repo))
    for name in [m for m in sys.modules if m == "segment_anything" or m.startswith("segment_anything.")]:
        del sys.modules[name]  # the repository's own segment_anything, not the installed one
    g = runpy.run_path(str(script), run_name="litemedsam_official")
    g["save_overlay"] = False  # the script's flag is store_true with default True: switch the figures off here
    return g
