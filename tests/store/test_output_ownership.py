"""The project never replaces or deletes a file or folder it did not create (issue 44, finding 3):
a mart_path naming the suite file, a README or a mask; an api.cache_path naming an existing file;
a demo.root holding folders of the demo's names that a demo build did not write. Each is refused
in one line and left byte for byte as it was; validate says so too; the project's own outputs
(a mart, a cache, a demo folder) are still rebuilt in place."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import pytest
import yaml

from medrobust_lib.demo.build import build_demo, check_demo_root, own_entries
from medrobust_lib.models.cache import ResponseCache
from medrobust_lib.ownership import NotOurs, check_cache_target, check_mart_target
from medrobust_lib.store.marts import build_mart
from medrobust_lib.tracks.validate import validate_suite


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


@pytest.mark.parametrize("content", [b"name: mine\nmodalities: [ct]\n", b"# README\n", b"\x89PNG\r\n\x1a\nmask"])
def test_a_mart_path_naming_someone_elses_file_is_refused_and_left_alone(tmp_path: Path, content: bytes) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(content)
    before = _sha(victim)
    with pytest.raises(NotOurs, match=r"mart_path .* already exists and medrobust did not create it"):
        build_mart(tmp_path / "results", victim)
    assert _sha(victim) == before


def test_the_projects_own_mart_is_rebuilt_in_place(tmp_path: Path) -> None:
    mart = tmp_path / "m.duckdb"
    build_mart(tmp_path / "results", mart)
    check_mart_target(mart)  # a mart: ours
    build_mart(tmp_path / "results", mart)  # replaced by the next build, as always
    import duckdb

    other = tmp_path / "other.duckdb"
    con = duckdb.connect(str(other))
    con.execute("create table mine as select 1 as x")
    con.close()
    with pytest.raises(NotOurs, match="without the mart's tables"):
        check_mart_target(other)


def test_an_api_cache_path_naming_another_file_is_refused_not_moved_aside(tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    with pytest.raises(NotOurs, match=r"api.cache_path .* \(not an SQLite database\)"):
        ResponseCache(notes)
    assert notes.read_text() == "my notes\n" and sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
    db = tmp_path / "theirs.sqlite"
    con = sqlite3.connect(str(db))
    con.execute("create table patients (id integer)")
    con.commit()
    con.close()
    with pytest.raises(NotOurs, match="other tables: patients"):
        check_cache_target(db)
    ours = tmp_path / "cache.sqlite"
    ResponseCache(ours)
    check_cache_target(ours)  # the cache itself: ours


def test_a_demo_root_with_foreign_folders_of_the_demo_names_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "mydata"
    (root / "records").mkdir(parents=True)
    (root / "records" / "labels.csv").write_text("precious\n")
    with pytest.raises(NotOurs, match=r"demo.root .* holds records, which the demo did not build"):
        build_demo(root, n_per_modality=4)
    assert (root / "records" / "labels.csv").read_text() == "precious\n"
    built = tmp_path / "demo"
    build_demo(built, n_per_modality=4)
    check_demo_root(built)  # built by the demo: ours, rebuilt in place
    build_demo(built, n_per_modality=4, force=True)
    assert "records" in own_entries()


def test_validate_reports_an_output_path_that_is_not_ours(tmp_path: Path) -> None:
    (tmp_path / "data" / "images").mkdir(parents=True)
    suite = tmp_path / "s.yaml"
    suite.write_text(yaml.safe_dump({"name": "own", "modalities": ["ct"], "demo": {"enabled": False},
                                     "mart_path": str(suite),
                                     "datasets": [{"name": "d", "modality": "ct", "format": "folder",
                                                   "root": str(tmp_path / "data"), "options": {"mask_dir": None}}]}))
    report = validate_suite(suite, n_load=0, root=tmp_path)
    assert any("mart_path" in e and "did not create it" in e for e in report.errors), report.errors


def test_validate_refuses_a_demo_root_holding_foreign_folders(tmp_path: Path) -> None:
    """``medrobust validate`` makes the demo build's own first check (the demo root), so a suite whose
    demo.root would delete a user's ``records/`` fails validate, not the run."""
    from typer.testing import CliRunner

    from medrobust_cli import app

    root = tmp_path / "mine"
    (root / "records").mkdir(parents=True)
    (root / "records" / "notes.txt").write_text("my notes")
    suite = tmp_path / "s.yaml"
    suite.write_text(yaml.safe_dump({"name": "own", "modalities": ["ct"],
                                     "demo": {"enabled": True, "root": str(root)}}))
    res = CliRunner().invoke(app, ["validate", "--suite", str(suite), "--load", "0"])
    assert res.exit_code == 2, res.output
    assert "holds records, which the demo did not build" in res.output
    assert (root / "records" / "notes.txt").read_text() == "my notes"
