"""Shared fixtures: small real images that ship inside installed wheels (no downloads)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import cv2
import numpy as np
import pytest
from skimage import data


def _resize(img: np.ndarray, size: int) -> np.ndarray:
    return np.asarray(cv2.resize(img, (size, size), interpolation=cv2.INTER_AREA), np.float32)


@pytest.fixture(scope="session")
def gray_image() -> np.ndarray:
    """float32 (128, 128) in [0, 1]: skimage's camera."""
    return _resize(data.camera().astype(np.float32) / 255.0, 128)


@pytest.fixture(scope="session")
def camera() -> np.ndarray:
    """float32 (256, 256) in [0, 1]: skimage's camera (the perturbation behaviour tests' image)."""
    return _resize(data.camera().astype(np.float32) / 255.0, 256)


@pytest.fixture(scope="session")
def rgb_image() -> np.ndarray:
    """float32 (128, 128, 3) in [0, 1]: skimage's retina crop."""
    return _resize(data.retina()[100:900, 100:900].astype(np.float32) / 255.0, 128)


@pytest.fixture(scope="session")
def square_sample() -> tuple[np.ndarray, np.ndarray]:
    """A textured gray image with a bright off-centre square and its mask."""
    rng = np.random.default_rng(0)
    img = (0.25 + 0.1 * rng.random((128, 128))).astype(np.float32)
    mask = np.zeros((128, 128), bool)
    mask[30:60, 70:100] = True
    img[mask] = 0.9
    return img, mask


@pytest.fixture(scope="session")
def demo_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small demo build (4 images per modality), shared by the whole session."""
    from medrobust_lib.demo import build_demo

    root = tmp_path_factory.mktemp("demo")
    build_demo(root, seed=0, n_per_modality=4)
    return root


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (``make test`` runs ``-n TEST_WORKERS``) each worker process gets its
    share of the cores for OpenMP / BLAS / OpenCV / torch (:func:`medrobust_lib.runtime.worker_threads`),
    set before any test imports torch: two workers each running two threads on two cores wait on
    each other's spin locks. Results do not change, only how many threads one worker runs."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers and os.environ.get("PYTEST_XDIST_WORKER"):
        from medrobust_lib import runtime

        runtime.limit_worker_threads(runtime.worker_threads(int(workers)))


@pytest.fixture(autouse=True)
def _no_location_pin() -> Iterator[None]:
    """Importing a code-location module (medrobust_assets.location) pins this process's resource
    paths (issue 44, finding 4); the pin would leak into later tests, so it is dropped after each."""
    yield
    resources = sys.modules.get("medrobust_assets.resources")
    if resources is not None:
        resources.unpin()


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """torch on one intra-op thread for a module (small tensor ops on a shared 2-core machine are
    10-100x slower with two threads); the previous count is restored afterwards."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session", autouse=True)
def _export_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """LiteMedSAM's ONNX exports of models built without a suite go to $MEDROBUST_EXPORT_CACHE
    (default ~/.cache/medrobust/exports): tests keep them in one folder of this session's (shared by
    the tests, and by the processes they start), never the user's cache."""
    import os

    old = os.environ.get("MEDROBUST_EXPORT_CACHE")
    os.environ["MEDROBUST_EXPORT_CACHE"] = str(tmp_path_factory.mktemp("exports"))
    yield
    if old is None:
        os.environ.pop("MEDROBUST_EXPORT_CACHE", None)
    else:
        os.environ["MEDROBUST_EXPORT_CACHE"] = old
