"""Small helpers to turn results into Dagster metadata."""

from __future__ import annotations

import base64
from pathlib import Path

import cv2
import dagster as dg
import pandas as pd


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
