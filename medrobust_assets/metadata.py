"""Small helpers to turn results into Dagster metadata, and the body every demo model asset shares
(:func:`install_or_train`)."""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import cv2
import dagster as dg
import pandas as pd

from medrobust_lib.demo.committed import Installed

COMMITTED_WEIGHTS = "committed (sha256 verified; medrobust demo --retrain trains them)"
"""The ``weights`` metadata of a demo model asset that installed the committed weights."""


def markdown_table(df: pd.DataFrame, max_rows: int = 60) -> dg.MetadataValue:
    if df.empty:
        return dg.MetadataValue.md("_no rows_")
    return dg.MetadataValue.md(df.head(max_rows).to_markdown(index=False, floatfmt=".3f"))


def image_md(path: str | Path, max_width: int = 640) -> dg.MetadataValue:
    """Inline a PNG (downscaled to ``max_width``, JPEG-encoded to keep the event log small)."""
    img = cv2.imread(str(path), cv2.IMREAD_COLOR)
    if img is None:
        return dg.MetadataValue.md(f"_image not readable: {path}_")
    if img.shape[1] > max_width:
        scale = max_width / img.shape[1]
        img = cv2.resize(img, (max_width, round(img.shape[0] * scale)), interpolation=cv2.INTER_AREA)
    ok, buf = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 80])
    data = base64.b64encode(buf.tobytes()).decode()
    return dg.MetadataValue.md(f"![{Path(path).name}](data:image/jpeg;base64,{data})\n\n`{path}`")


def install_or_train(context: dg.AssetExecutionContext, installed: Installed, *, what: str,
                     committed: Callable[[], Mapping[str, Any]],
                     train: Callable[[], Mapping[str, Any]]) -> dg.MaterializeResult:
    """The body of a demo model asset ("use the committed weights or train"). ``installed``: what
    :mod:`medrobust_lib.demo.committed` did (``install_sam``, ``install_vlm``, ...). When the
    committed weights were used (copied and sha256-verified), the metadata is ``weights`` =
    :data:`COMMITTED_WEIGHTS` followed by ``committed()``; else the asset's log gets
    ``"<what>: <why not>"`` (e.g. ``training tiny-sam: retraining was asked for``) and the metadata is
    ``train()`` without its None entries (no registered version when tracking is off)."""
    if installed.used:
        return dg.MaterializeResult(metadata={"weights": COMMITTED_WEIGHTS, **committed()})
    context.log.info(f"{what}: {installed.reason}")
    return dg.MaterializeResult(metadata={k: v for k, v in train().items() if v is not None})
