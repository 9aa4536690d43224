"""No file of the project points to a repository path that does not exist, or outside the repository.

Scanned: every tracked or new (not ignored) text file: code, tests, configs, tools, deploy files,
docs/ and the README. Checked:

- every mention of a Markdown file by a path (``dir/name.md``) or by a document's upper-case name
  (``README.md``, ``CHANGELOG.md``) names a file that exists, relative to the repository root or to
  the mentioning file's folder (a bare lower-case ``name.md`` is usually a file a command writes, such
  as ``summary.md``, and is not checked);
- every ``docs/...`` path exists;
- every relative Markdown link (``[text](target)``) in a ``.md`` file resolves from that file;
- nothing points outside the repository: no ``../shared`` path, no ``DESIGN.md`` (the design document
  is ``docs/design.md``).

Pages that other branches are adding at the same time are listed in :data:`PENDING`; the test stops
accepting a mention of one as soon as nothing in the tree mentions it any more (see the last test).
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".cfg", ".ini", ".txt", ".sh", ".json", ".tpl", ".j2"}
TEXT_NAMES = {"Makefile", "Dockerfile", "run"}
MAX_BYTES = 1_000_000
# docs pages being written on other branches of issue 33 at the same time as this test (merge, then
# delete the name here: test_pending_pages_are_still_pending fails once a page exists)
PENDING: set[str] = set()

MD_MENTION = re.compile(r"(?<![\w./<>*{}$-])((?:[\w.-]+/)+[\w-]+\.md|[A-Z][A-Z0-9_-]*\.md)(?![\w/])")
DOCS_PATH = re.compile(r"(?<![\w./-])(docs/[\w./-]*[\w/])")
MD_LINK = re.compile(r"\]\(([^)\s]+)\)")
OUTSIDE = re.compile(r"\.\./shared|\bDESIGN\.md\b")


def _project_files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, check=True,
                             capture_output=True, text=True).stdout.splitlines()
        paths = [ROOT / p for p in out]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: walk the tree
        skip = {".git", ".venv", "var", "mlruns", "node_modules", "__pycache__"}
        paths = [p for p in ROOT.rglob("*") if not skip & set(p.relative_to(ROOT).parts)]
    return sorted(p for p in paths if p.is_file() and (p.suffix in TEXT_SUFFIXES or p.name in TEXT_NAMES)
                  and "fixtures" not in p.relative_to(ROOT).parts and p.stat().st_size <= MAX_BYTES)


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return
    yield from enumerate(text.splitlines(), 1)


def _exists(ref: str, source: Path, root: Path) -> bool:
    ref = ref.split("#", 1)[0].rstrip("/")
    if not ref or ref in PENDING:
        return True
    return (root / ref).exists() or (source.parent / ref).exists()


def _is_url_context(line: str, start: int) -> bool:
    """The match is part of a URL or a host name (``github.com/...``, ``https://...``)."""
    head = line[:start]
    token = re.split(r"[\s(\[`'\"<]", head)[-1]
    return "://" in token or bool(re.search(r"\w\.(com|org|io|net|ai)/", token + line[start:start + 1]))


def _broken(path: Path, root: Path = ROOT) -> list[str]:
    """One line per broken reference in ``path`` (``file:line: what``)."""
    bad: list[str] = []
    rel = path.relative_to(root)
    for no, line in _lines(path):
        if OUTSIDE.search(line):
            bad.append(f"{rel}:{no}: points outside the repository: {line.strip()[:120]}")
        refs = [(m.group(1), m.start(1)) for m in MD_MENTION.finditer(line)]
        refs += [(m.group(1), m.start(1)) for m in DOCS_PATH.finditer(line)]
        for ref, start in refs:
            if _is_url_context(line, start) or ref.endswith(("DESIGN.md",)):
                continue
            if not _exists(ref, path, root):
                bad.append(f"{rel}:{no}: {ref} does not exist")
        if path.suffix == ".md":
            for m in MD_LINK.finditer(line):
                target = m.group(1)
                if re.match(r"^[a-z]+:", target) or target.startswith("#"):
                    continue
                if not _exists(target, path, root):
                    bad.append(f"{rel}:{no}: link target {target} does not exist")
    return bad


def test_every_referenced_repository_path_exists() -> None:
    files = _project_files()
    assert any(p.name == "README.md" for p in files) and any(p.suffix == ".py" for p in files)
    bad = [b for p in files if p != Path(__file__).resolve() for b in _broken(p)]
    assert not bad, "references to paths that do not exist:\n" + "\n".join(bad)


def test_code_points_to_the_design_page() -> None:
    """The design document the code cites is in the repository, with the sections it is cited by."""
    page = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    cited: set[str] = set()
    for p in _project_files():
        for _, line in _lines(p):
            cited.update(re.findall(r"docs/design\.md, section (\d+)", line))
    assert cited, "nothing cites docs/design.md by section (the pattern changed?)"
    for n in sorted(cited):
        assert re.search(rf"^## {n}\. ", page, re.M), f"docs/design.md has no section {n}"


@pytest.mark.parametrize("bad_line, expected", [
    ("see DESIGN.md section 5", "outside"),
    ("see ../shared/DESIGN.md", "outside"),
    ("see docs/nowhere.md", "does not exist"),
    ("see CHANGES.md", "does not exist"),
    ("the table in `docs/missing/`", "does not exist"),
    ("[a page](nowhere.md)", "does not exist"),
])
def test_the_checker_finds_broken_references(tmp_path: Path, bad_line: str, expected: str) -> None:
    """The checker is not vacuous: each kind of broken reference is reported, on its line only."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "real.md").write_text("x")
    f = tmp_path / "page.md"
    f.write_text(f"fine: docs/real.md, README.md and [ok](docs/real.md) is here\n{bad_line}\n")
    (tmp_path / "README.md").write_text("x")
    bad = _broken(f, tmp_path)
    assert len(bad) >= 1 and all(":2:" in b for b in bad), bad
    assert any(expected in b for b in bad), bad


def test_pending_pages_are_still_pending() -> None:
    """A page of :data:`PENDING` that now exists must leave the list, so that its mentions are checked."""
    arrived = sorted(p for p in PENDING if (ROOT / p).exists())
    assert not arrived, f"these pages exist now: remove them from PENDING in {Path(__file__).name}: {arrived}"
