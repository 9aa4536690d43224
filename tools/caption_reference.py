"""One-off: official pycocoevalcap 1.2 tokens and scores for the caption fixture corpus.

Runs the real pipeline (pycocoevalcap's ``PTBTokenizer``, i.e. ``java -cp stanford-corenlp-3.4.1.jar
edu.stanford.nlp.process.PTBTokenizer -preserveLines -lowerCase`` plus its punctuation filter, then
``Bleu(4)``, ``Rouge()`` and ``Cider()``) on the corpus of ``tools/caption_corpus.py`` and writes

- ``tests/metrics/fixtures/caption_reference_corpus.json``: every sample with its expected tokens
  (as pycocoevalcap hands them to the scorers: one space-joined string per caption) and its
  BLEU-1..4, ROUGE-L and CIDEr-D, plus the corpus scores;
- ``tests/metrics/fixtures/caption_reference_subset.json``: the same for a subset scored on its own
  (what ``medrobust score caption`` must print for that subset's files).

Installs nothing: needs ``java`` on PATH and ``pycocoevalcap==1.2`` importable. Not run by
``make test``; the tests read the committed JSON. Usage: ``python tools/caption_reference.py``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from caption_corpus import build_corpus  # noqa: E402

OUT = ROOT / "tests" / "metrics" / "fixtures"
SUBSET_EVERY = 9  # every 9th sample forms the subset scored on its own


def official(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Tokens and scores of ``samples`` from pycocoevalcap (one tokenizer call for the references
    and one for the predictions, in sample order, as ``COCOEvalCap.evaluate`` does)."""
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.rouge.rouge import Rouge
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    gts = {s["id"]: [{"caption": r} for r in s["references"]] for s in samples}
    res = {s["id"]: [{"caption": s["prediction"]}] for s in samples}
    tok = PTBTokenizer()
    gts_t = tok.tokenize(gts)
    res_t = tok.tokenize(res)
    if set(gts_t) != set(gts) or set(res_t) != set(res):
        raise RuntimeError("PTBTokenizer lost captions (a line break other than \\n in the corpus?)")
    bleu, bleu_per = Bleu(4).compute_score(gts_t, res_t, verbose=0)
    rouge, rouge_per = Rouge().compute_score(gts_t, res_t)
    cider, cider_per = Cider().compute_score(gts_t, res_t)
    out_samples = []
    for i, s in enumerate(samples):
        sid = s["id"]
        row = {**s, "prediction_tokens": res_t[sid][0], "reference_tokens": gts_t[sid]}
        row.update({f"bleu_{k + 1}": float(bleu_per[k][i]) for k in range(4)})
        row.update(rouge_l=float(rouge_per[i]), cider_d=float(cider_per[i]))
        out_samples.append(row)
    corpus = {f"bleu_{k + 1}": float(bleu[k]) for k in range(4)}
    corpus.update(rouge_l=float(rouge), cider_d=float(cider))
    return {"corpus": corpus, "samples": out_samples}


def main() -> None:
    java = shutil.which("java")
    if java is None:
        raise SystemExit("java not found on PATH (e.g. apt-get install default-jre-headless)")
    try:
        import pycocoevalcap  # noqa: F401
    except ImportError as exc:
        raise SystemExit("pycocoevalcap is not installed (pip install pycocoevalcap==1.2)") from exc
    from importlib.metadata import version

    java_version = subprocess.run([java, "-version"], capture_output=True, text=True).stderr.splitlines()[0]
    meta = {
        "generator": "tools/caption_reference.py (corpus: tools/caption_corpus.py)",
        "pipeline": "pycocoevalcap PTBTokenizer (stanford-corenlp-3.4.1.jar PTBTokenizer -preserveLines "
                    "-lowerCase, punctuation filter) + Bleu(4), Rouge(), Cider()",
        "pycocoevalcap": version("pycocoevalcap"),
        "java": java_version,
    }
    samples = build_corpus()
    full = official(samples)
    subset = official([s for i, s in enumerate(samples) if i % SUBSET_EVERY == 0])
    OUT.mkdir(parents=True, exist_ok=True)
    for name, data in (("caption_reference_corpus.json", full), ("caption_reference_subset.json", subset)):
        path = OUT / name
        path.write_text(json.dumps({**meta, **data}, ensure_ascii=False, indent=0) + "\n", encoding="utf-8")
        n_str = sum(1 + len(s["references"]) for s in data["samples"])
        print(f"{path.relative_to(ROOT)}: {len(data['samples'])} samples, {n_str} strings, "
              f"{path.stat().st_size / 1e6:.2f} MB; corpus {data['corpus']}")


if __name__ == "__main__":
    main()
