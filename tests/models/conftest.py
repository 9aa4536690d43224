"""Fixtures shared by the LiteMedSAM tests (CPU and CUDA): the official script's outputs and
the 66 items they were computed on."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.models.litemedsam_inputs import (
    DEMO_N_PER_MODALITY,
    DEMO_SEED,
    OFFICIAL_FIXTURE,
    Item,
    all_items,
    fixture_items,
)


@pytest.fixture(scope="session")
def official() -> dict[str, np.ndarray]:
    """The arrays of ``fixtures/litemedsam_official.npz`` (``tools/litemedsam_official_fixtures.py``)."""
    with np.load(OFFICIAL_FIXTURE) as z:
        return {k: z[k] for k in z.files}


@pytest.fixture(scope="session")
def demo24(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo build (seed 0, 24 per modality) whose test split the fixture was computed on."""
    from medrobust_lib.demo import build_demo

    root = tmp_path_factory.mktemp("demo24")
    build_demo(root, seed=DEMO_SEED, n_per_modality=DEMO_N_PER_MODALITY)
    return root


@pytest.fixture(scope="session")
def items(demo24: Path, official: dict[str, np.ndarray]) -> list[Item]:
    """The 54 demo test images (as the official script got them: the fixture's uint8 inputs) and the
    12 odd sizes made from them: the items the official outputs were computed on."""
    return fixture_items(demo24, official)


@pytest.fixture(scope="session")
def built_items(demo24: Path) -> list[Item]:
    """The same items as this machine's demo build makes them (equal to :func:`items` up to float32
    rounding that depends on the CPU)."""
    return all_items(demo24)
