"""The perturbation gallery says what it shows: a title (dataset, sample, levels shown, how to read a
caption) above the grid; tiles whose SSIM missed the level's band carry the missed mark."""

from __future__ import annotations

import numpy as np

from medrobust_lib.perturb.gallery import (
    HEADER_H,
    MISSED_MARK,
    TILE,
    TITLE_LINE_H,
    GalleryCell,
    gallery_image,
    gallery_title,
)


def _cells() -> dict[str, dict[int, GalleryCell]]:
    img = np.full((32, 32), 0.5, np.float32)
    return {"blur": {2: GalleryCell(img, 0.85, True), 4: GalleryCell(img, 0.71, False)}}


def test_title_names_the_dataset_sample_and_levels_shown() -> None:
    lines = gallery_title("fundus_demo", "f_0003", [2, 4])
    assert lines[0] == "fundus_demo / f_0003: every type at levels L2, L4"
    assert MISSED_MARK in lines[1] and "band" in lines[1]


def test_title_lines_sit_above_the_grid() -> None:
    clean = np.zeros((32, 32), np.float32)
    plain = gallery_image(clean, _cells(), [2, 4])
    titled = gallery_image(clean, _cells(), [2, 4], gallery_title("d", "s", [2, 4]))
    assert plain.shape[0] == HEADER_H + TILE
    assert titled.shape[0] == plain.shape[0] + 2 * TITLE_LINE_H
    assert titled.shape[1] == plain.shape[1]
    assert (titled[: 2 * TITLE_LINE_H] < 128).any()  # the title is drawn
    np.testing.assert_array_equal(titled[2 * TITLE_LINE_H + HEADER_H:], plain[HEADER_H:])  # the grid is unchanged
