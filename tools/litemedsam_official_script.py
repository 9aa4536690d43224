"""Shared by the one-off LiteMedSAM fixture tools: load the official ``CVPR24_LiteMedSAM_infer.py``
of a ``bowang-lab/MedSAM`` checkout (branch LiteMedSAM) as its authors run it, without its main loop."""

from __future__ import annotations

import runpy
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def _checkout_first_on_path(repo: Path) -> Iterator[None]:
    """The checkout's own top-level modules (``segment_anything``, ``tiny_vit_sam``) importable for
    the block, ahead of the installed ones, as the authors run the script from its folder; the
    path is restored afterwards (the modules imported stay in ``sys.modules``). This is the
    third-party checkout, never the project: the project's packages come from the editable install."""
    saved = list(sys.path)
    sys.path[:0] = [str(repo)]
    try:
        yield
    finally:
        sys.path[:] = saved


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
    for name in [m for m in sys.modules if m == "segment_anything" or m.startswith("segment_anything.")]:
        del sys.modules[name]  # the repository's own segment_anything, not the installed one
    with _checkout_first_on_path(repo), warnings.catch_warnings():
        # the checkout's tiny_vit_sam.py imports timm.models.layers and timm.models.registry, which
        # timm deprecates with a FutureWarning at import; third-party code run as published, so
        # only those two modules' FutureWarnings are silenced, for this import only
        warnings.filterwarnings("ignore", category=FutureWarning, module=r"timm\.models\.(layers|registry)\b")
        g = runpy.run_path(str(script), run_name="litemedsam_official")
    g["save_overlay"] = False  # the script's flag is store_true with default True: switch the figures off here
    return g
