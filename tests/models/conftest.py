"""Fixtures shared by the LiteMedSAM tests (CPU and CUDA): the official script's outputs and
the 66 items they were computed on."""

from __future__ import annotations

import numpy as np
import pytest

from tests.models.litemedsam_inputs import DEMO_N_PER_MODALITY, DEMO_SEED, OFFICIAL_FIXTURE, Item, all_items


@pytest.fixture(scope="session")
def official() -> dict[str, np.ndarray]:
    """The arrays of ``fixtures/litemedsam_official.npz`` (``tools/litemedsam_official_fixtures.py``)."""
    with np.load(OFFICIAL_FIXTURE) as z:
        return {k: z[k] for k in z.files}


@pytest.fixture(scope="session")
def items(tmp_path_factory: pytest.TempPathFactory) -> list[Item]:
    """The 54 demo test images and 12 odd sizes the official outputs were computed on."""
    from medrobust_lib.demo import build_demo

    root = tmp_path_factory.mktemp("demo24")
    build_demo(root, seed=DEMO_SEED, n_per_modality=DEMO_N_PER_MODALITY)
    return all_items(root)
