"""Generated code never embeds a user string outside ``repr()`` (issue 44, finding 5): ``medrobust ui
--suite`` with a suite file named like the first entry of HOSTILE (three double quotes, then a call
to os.system) used to write a location module that ran ``touch`` on import."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from medrobust_assets.location_files import location_source

HOSTILE = ['inj""";import os;os.system("touch PWNED_UI");"""x.yaml', "a'b\nimport os\nos.system('x')\n.yaml",
           'back\\slash";__import__("os").system("touch P").yaml', "uni\u2028code\x00.yaml"]


@pytest.mark.parametrize("name", HOSTILE)
def test_a_hostile_suite_file_name_stays_one_string_literal(name: str, tmp_path: Path) -> None:
    path = tmp_path / name
    tree = ast.parse(location_source(path))
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    assert len(calls) == 1 and ast.unparse(calls[0].func) == "definitions_for_file"  # nothing else is called
    imports = [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]
    assert [ast.unparse(n) for n in imports] == ["from medrobust_assets.definitions import definitions_for_file"]
    assigns = {ast.unparse(n.targets[0]): n.value for n in tree.body if isinstance(n, ast.Assign)}
    assert set(assigns) == {"SUITE", "defs"} and ast.literal_eval(assigns["SUITE"]) == str(path)
