"""The shipped suite YAMLs validate (the demo and the real-data example)."""

from __future__ import annotations

from pathlib import Path

import pytest

from medrobust_lib.config import load_suite
from medrobust_lib.config.vlm import vlm_config
from medrobust_lib.data.dataset import DatasetConfig
from medrobust_lib.models.api_vlm import ApiVLMConfig
from medrobust_lib.tracks.segmentation.evaluate import seg_config

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", ["demo.yaml", "example_real.yaml"])
def test_suites_validate(name: str) -> None:
    suite = load_suite(ROOT / "configs" / name)
    seg = seg_config(suite)
    assert seg.models and len({m.id for m in seg.models}) == len(seg.models)
    for d in suite.datasets:
        DatasetConfig(**d)
    vlm = vlm_config(suite)
    assert vlm.models and len({m.id for m in vlm.models}) == len(vlm.models)
    ids = {m.id for m in vlm.models}
    for m in vlm.models:
        assert m.base is None or m.base in ids
        if m.kind == "api":
            cfg = ApiVLMConfig(**m.api)  # the api block maps 1:1 onto the adapter's config
            assert cfg.api_key_env and "key" not in {k.lower() for k in m.api}


def test_unknown_fields_are_rejected(tmp_path: Path) -> None:
    p = tmp_path / "bad.yaml"
    p.write_text("perturbations: {levls: [1]}\n")
    with pytest.raises(ValueError, match="levls"):
        load_suite(p)
