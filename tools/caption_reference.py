"""One-off: official pycocoevalcap 1.2 tokens and scores for the caption fixture corpus.

Runs the real pipeline (pycocoevalcap's ``PTBTokenizer``, i.e. ``java -cp stanford-corenlp-3.4.1.jar
edu.stanford.nlp.process.PTBTokenizer -preserveLines -lowerCase`` plus its punctuation filter, then
``Bleu(4)``, ``Rouge()`` and ``Cider()``) on the corpus of ``tools/caption_corpus.py`` and writes

- ``tests/metrics/fixtures/caption_reference_corpus.json``: every sample with its expected tokens
  (as pycocoevalcap hands them to the scorers: one space-joined string per caption) and its
  BLEU-1..4, ROUGE-L and CIDEr-D, plus the corpus scores;
- ``tests/metrics/fixtures/caption_reference_subset.json``: the same for a subset scored on its own
  (what ``medrobust score caption`` must print for that subset's files).

``--unicode-table`` instead regenerates ``medrobust_lib/metrics/ptb_unicode.py``, the character
classes ``[:letter:]``, ``[:digit:]``, ``[:uppercase:]`` of the lexer compiled into the 3.4.1 jar
(Unicode 6.2, BMP): it starts from the current Unicode ``L``/``Nd``/``Lu`` of the ``regex`` module,
tokenizes ``x<c>x`` for every BMP character ``c`` with Java and with the Python port, and takes out
(or adds) the characters where they disagree (Java deletes letters and digits added to Unicode
later; U+1885/U+1886 were letters then). Also writes
``tests/metrics/fixtures/caption_reference_unicode.json`` (Java's output for those characters and a
sample of others) for the tests.

Installs nothing: needs ``java`` on PATH and ``pycocoevalcap==1.2`` importable. Not run by
``make test``; the tests read the committed JSON. Usage: ``python -m tools.caption_reference
[--unicode-table]``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from tools.caption_corpus import build_corpus

ROOT = Path(__file__).resolve().parents[1]

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


def java_lines(lines: list[str]) -> list[str]:
    """The raw output lines of pycocoevalcap's Java command for the document ``"\\n".join(lines)``."""
    from pycocoevalcap.tokenizer import ptbtokenizer

    jar = Path(ptbtokenizer.__file__).parent / ptbtokenizer.STANFORD_CORENLP_3_4_1_JAR
    with tempfile.NamedTemporaryFile("wb", suffix=".txt", delete=False) as f:
        f.write("\n".join(lines).encode())
    try:
        out = subprocess.run(["java", "-cp", str(jar), "edu.stanford.nlp.process.PTBTokenizer", "-preserveLines",
                              "-lowerCase", f.name], capture_output=True, check=True).stdout.decode()
    finally:
        Path(f.name).unlink()
    got = out.split("\n")
    if len(got) != len(lines):
        raise RuntimeError(f"Java returned {len(got)} lines for {len(lines)}")
    return got


def _ranges(cps: list[int]) -> list[str]:
    """Regex class items (``\\uXXXX`` or ``\\uXXXX-\\uYYYY``) covering the sorted code points."""
    out: list[str] = []
    i = 0
    while i < len(cps):
        j = i
        while j + 1 < len(cps) and cps[j + 1] == cps[j] + 1:
            j += 1
        out.append(f"\\u{cps[i]:04x}" + (f"-\\u{cps[j]:04x}" if j > i else ""))
        i = j + 1
    return out


def _class_source(name: str, items: list[str]) -> str:
    lines, cur = [], "["
    for it in items:
        if len(cur) + len(it) > 92:
            lines.append(cur)
            cur = ""
        cur += it
    lines.append(cur + "]")
    return f"{name} = (\n" + "".join(f'    r"{x}"\n' for x in lines) + ")"


def unicode_table() -> None:
    """Regenerate ``medrobust_lib/metrics/ptb_unicode.py`` and its test fixture (see module doc)."""
    import types

    import regex

    base = {"LETTER_CLASS": r"[\p{L}&&[\x00-\uffff]]", "UPPERCASE_CLASS": r"[\p{Lu}&&[\x00-\uffff]]",
            "DIGIT_CLASS": r"[\p{Nd}&&[\x00-\uffff]]"}
    fake = types.ModuleType("medrobust_lib.metrics.ptb_unicode")
    fake.__dict__.update(base)
    sys.modules["medrobust_lib.metrics.ptb_unicode"] = fake  # the port with the regex module's classes
    from medrobust_lib.metrics.ptb_lexer import tokenize_lines

    breaks = set("\n\r\x0b\x0c\x85\u2028\u2029")
    cps = [c for c in range(0x10000) if not 0xD800 <= c <= 0xDFFF and chr(c) not in breaks]
    lines = [f"x{chr(c)}x" for c in cps]
    java = java_lines(lines)
    port = tokenize_lines(lines)
    differ = [c for c, j, p in zip(cps, java, port, strict=True) if j != p]
    deleted = {c for c in differ if java[cps.index(c)] == "x x"}
    joined = {c for c in differ if java[cps.index(c)] == f"x{chr(c).lower()}x"}
    if deleted | joined != set(differ):
        raise RuntimeError(f"unexpected Java output for {sorted(set(differ) - deleted - joined)[:10]}")
    classes: dict[str, list[int]] = {}
    for name, pat in base.items():
        rx = regex.compile(pat, regex.V1)
        members = {c for c in cps if rx.fullmatch(chr(c))} - deleted
        if name == "LETTER_CLASS":
            members |= joined
        classes[name] = sorted(members)
    body = [
        '"""Character classes of Stanford PTBLexer 3.4.1 (JFlex [:letter:], [:uppercase:], [:digit:]; BMP).',
        "",
        "Generated by ``python -m tools.caption_reference --unicode-table`` (do not edit): the regex module's",
        f"(version {regex.__version__}) L/Lu/Nd, minus the {len(deleted)} characters the Java tokenizer deletes",
        f"(added to Unicode after 6.2), plus the {len(joined)} it still treats as letters.",
        '"""',
        "",
    ]
    for name, points in classes.items():
        body.append(_class_source(name, _ranges(points)))
    text = "\n".join(body) + "\n"
    (ROOT / "medrobust_lib" / "metrics" / "ptb_unicode.py").write_text(text, encoding="utf-8")
    rng_sample = cps[::37]
    probe = sorted(set(differ) | set(rng_sample))
    fixture = {"generator": "tools/caption_reference.py --unicode-table", "java_output_of_x_c_x":
               [[c, java[cps.index(c)]] for c in probe]}
    (OUT / "caption_reference_unicode.json").write_text(json.dumps(fixture, ensure_ascii=False) + "\n",
                                                        encoding="utf-8")
    print(f"{len(deleted)} deleted, {len(joined)} joined; {len(probe)} probe characters written")


def main() -> None:
    java = shutil.which("java")
    if java is None:
        raise SystemExit("java not found on PATH (e.g. apt-get install default-jre-headless)")
    if "--unicode-table" in sys.argv[1:]:
        unicode_table()
        return
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
