"""`medrobust score caption` prints pycocoevalcap 1.2's scores (committed by tools/caption_reference.py)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from medrobust_cli import app

SUBSET = json.loads(
    (Path(__file__).resolve().parents[1] / "metrics" / "fixtures" / "caption_reference_subset.json").read_text(encoding="utf-8")
)
METRICS = ("bleu_1", "bleu_2", "bleu_3", "bleu_4", "rouge_l", "cider_d")


def _write(path: Path, records: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return path


def test_score_caption_cli_equals_official_scores(tmp_path: Path) -> None:
    samples = SUBSET["samples"]
    refs = _write(tmp_path / "refs.jsonl", [{"id": s["id"], "references": s["references"]} for s in samples])
    preds = _write(tmp_path / "preds.jsonl", [{"id": s["id"], "prediction": s["prediction"]} for s in samples])
    res = CliRunner().invoke(app, ["score", "caption", "--predictions", str(preds), "--references", str(refs)])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["n"] == len(samples) and out["n_invalid_lines"] == 0
    for m in METRICS:
        assert abs(out[m] - SUBSET["corpus"][m]) <= 1e-9, (m, out[m], SUBSET["corpus"][m])
