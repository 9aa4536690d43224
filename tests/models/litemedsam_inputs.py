"""The images and box prompts on which LiteMedSAM is checked against its official inference.

Shared by ``tools/litemedsam_official_fixtures.py`` (which runs the official script on them and
writes ``tests/models/fixtures/litemedsam_official.npz``) and ``tests/models/test_litemedsam.py``
(which runs the project's adapter on the same items): every test-split image of the default demo
build (seed 0, 24 per modality: 54 images of the 10 modalities), plus odd sizes and aspect
ratios made from some of them (grayscale and RGB, shrunk and enlarged).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from medrobust_lib.config.segmentation import PromptConfig
from medrobust_lib.data.dataset import DatasetConfig, index_dataset, load_sample
from medrobust_lib.data.splits import split_for
from medrobust_lib.prompts import prompt_boxes

DEMO_SEED = 0
DEMO_N_PER_MODALITY = 24
OFFICIAL_FIXTURE = Path(__file__).parent / "fixtures" / "litemedsam_official.npz"
"""The official script's outputs on the items (``tools/litemedsam_official_fixtures.py``)."""
ODD_SIZES: tuple[tuple[int, int], ...] = ((37, 300), (512, 97), (1000, 1000), (300, 37), (97, 512), (401, 173))
"""(height, width) of the resized extra items; each is made from a gray and from an RGB test image."""


@dataclass(frozen=True)
class Item:
    """``name``: ``<dataset>/<sample id>`` or ``odd/<h>x<w>/<gray|rgb>/<source>``. ``image``: float32
    (H, W) or (H, W, 3) in [0, 1]. ``boxes``: float32 (K, 4) pixel XYXY (the demo's evaluation
    prompt, the tight mask box). ``mask``: bool (H, W) ground truth."""

    name: str
    modality: str
    image: np.ndarray
    boxes: np.ndarray
    mask: np.ndarray


def demo_test_items(demo_root: Path) -> list[Item]:
    """Every test-split sample of the demo build at ``demo_root`` (built by the caller with
    :data:`DEMO_SEED` and :data:`DEMO_N_PER_MODALITY`) that has a non-empty mask, sorted by name."""
    from medrobust_lib.demo.manifest import DemoManifest

    manifest = DemoManifest.load(demo_root)
    out: list[Item] = []
    for ds in manifest.datasets:
        cfg = DatasetConfig(**ds.config())
        refs, _ = index_dataset(cfg)
        for ref in refs:
            if split_for(cfg.name, ref.sample_id) != "test":
                continue
            s = load_sample(cfg, ref)
            if s.mask is None or not s.mask.any():
                continue
            out.append(Item(f"{s.dataset}/{s.sample_id}", s.modality, np.asarray(s.image, np.float32),
                            prompt_boxes(s, PromptConfig()), np.asarray(s.mask, bool)))
    return sorted(out, key=lambda it: it.name)


def odd_items(items: list[Item]) -> list[Item]:
    """For each of :data:`ODD_SIZES`, the first grayscale and the first RGB item resized to it
    (image: cv2 INTER_AREA; mask: INTER_NEAREST; box: the resized mask's tight box)."""
    from medrobust_lib.data.boxes import mask_to_box

    gray = next(it for it in items if it.image.ndim == 2)
    rgb = next(it for it in items if it.image.ndim == 3)
    out: list[Item] = []
    for h, w in ODD_SIZES:
        for kind, src in (("gray", gray), ("rgb", rgb)):
            img = np.clip(cv2.resize(src.image, (w, h), interpolation=cv2.INTER_AREA), 0.0, 1.0).astype(np.float32)
            mask = cv2.resize(src.mask.astype(np.uint8), (w, h), interpolation=cv2.INTER_NEAREST).astype(bool)
            box = mask_to_box(mask)
            if box is None:
                continue
            out.append(Item(f"odd/{h}x{w}/{kind}/{src.name}", src.modality, img,
                            np.asarray(box, np.float32)[None, :], mask))
    return out


def all_items(demo_root: Path) -> list[Item]:
    """:func:`demo_test_items` followed by :func:`odd_items` (what the fixture tool runs the official
    script on)."""
    base = demo_test_items(demo_root)
    return base + odd_items(base)


def fixture_image(official: dict[str, np.ndarray], k: int) -> np.ndarray:
    """Demo item ``k``'s uint8 input as the official script got it, from the fixture: (H, W) for a
    grayscale item, (H, W, 3) for RGB."""
    h, w = (int(v) for v in official["shapes"][k])
    c = int(official["u8_channels"][k])
    flat = official["u8_data"][official["u8_offsets"][k]:official["u8_offsets"][k + 1]]
    return flat.reshape(h, w) if c == 1 else flat.reshape(h, w, c)


def fixture_items(demo_root: Path, official: dict[str, np.ndarray]) -> list[Item]:
    """:func:`all_items` on the official script's own inputs: each demo item's image is the fixture's
    uint8 input (float32, ``u8 / 255``, which ``to_uint8_rgb`` maps back exactly), its box and mask
    the demo build's; the odd items are made from those. The demo build alone is not byte-identical
    across CPUs (``tools/litemedsam_official_fixtures.py``)."""
    base = [Item(it.name, it.modality, (fixture_image(official, k).astype(np.float32) / np.float32(255.0)),
                 it.boxes, it.mask)
            for k, it in enumerate(demo_test_items(demo_root))]
    return base + odd_items(base)


def official_mask(official: dict[str, np.ndarray], k: int) -> np.ndarray:
    """Item ``k``'s official mask, bool (H, W), unpacked from the fixture's bit-packed masks."""
    h, w = (int(v) for v in official["shapes"][k])
    lo, hi = official["seg_offsets"][k], official["seg_offsets"][k + 1]
    return np.unpackbits(official["seg_bits"][lo:hi])[: h * w].reshape(h, w).astype(bool)
