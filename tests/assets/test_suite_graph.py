"""The asset graph is built from a suite object (``definitions_for``): two suites give two graphs in
one process, with no environment variable; partitions are the suite's modalities x levels (a
model over its own levels), and a partition outside them is refused in one line."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest
import yaml

from medrobust_assets.definitions import definitions_for, definitions_for_file
from medrobust_assets.runner import PartitionRefused, StepJobs, run_suite
from medrobust_lib import runtime

ROOT = Path(__file__).resolve().parents[2]


def _write(path: Path, **cfg: object) -> Path:
    base: dict[str, object] = {"results_dir": str(path.parent / "results"), "mart_path": str(path.parent / "m.duckdb"),
                               "demo": {"enabled": False}}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({**base, **cfg}))
    return path


def _keys(defs: dg.Definitions) -> set[str]:
    return {k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys()}


def _partition_keys(defs: dg.Definitions, key: str) -> set[str]:
    pdef = defs.resolve_asset_graph().get(dg.AssetKey.from_user_string(key)).partitions_def
    assert pdef is not None, key
    return {str(k) for k in pdef.get_partition_keys()}


@pytest.fixture()
def two_suites(tmp_path: Path) -> tuple[Path, Path]:
    a = _write(tmp_path / "a" / "a.yaml", name="suite-a", modalities=["ct", "mri"],
               perturbations={"levels": [1, 3]},
               segmentation={"models": [{"id": "seg-a", "family": "medsam", "checkpoint": str(tmp_path / "a.pth")},
                                        {"id": "seg-a3", "family": "medsam", "checkpoint": str(tmp_path / "a.pth"),
                                         "levels": [3]}]})
    b = _write(tmp_path / "b" / "b.yaml", name="suite-b", modalities=["fundus"],
               perturbations={"levels": [2, 4, 5]},
               segmentation={"models": [{"id": "seg-b", "family": "medsam", "checkpoint": str(tmp_path / "b.pth")}]})
    return a, b


def test_two_suites_give_two_graphs_in_one_process(two_suites: tuple[Path, Path],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MEDROBUST_SUITE", raising=False)
    a, b = (definitions_for_file(p) for p in two_suites)
    ka, kb = _keys(a), _keys(b)
    assert {"seg-a/clean_predictions", "seg-a/perturbed_predictions", "seg-a3/perturbed_predictions"} <= ka
    assert "seg-b/clean_predictions" in kb
    assert not {k for k in ka if k.startswith("seg-b/")} and not {k for k in kb if k.startswith("seg-a")}
    assert _partition_keys(a, "perturbed_samples") == {"ct|1", "ct|3", "mri|1", "mri|3"}
    assert _partition_keys(b, "perturbed_samples") == {"fundus|2", "fundus|4", "fundus|5"}
    assert _partition_keys(a, "clean_samples") == {"ct", "mri"} and _partition_keys(b, "clean_samples") == {"fundus"}
    # a model's assets cover only its own levels; the others every perturbed level of the suite
    assert _partition_keys(a, "seg-a3/perturbed_predictions") == {"ct|3", "mri|3"}
    assert _partition_keys(a, "seg-a/attack_predictions") == {"ct|1", "ct|3", "mri|1", "mri|3"}
    # each Definitions runs its own suite's file
    assert Path(a.resources["suite"].suite_path) == two_suites[0].resolve()  # type: ignore[index,union-attr]
    assert Path(b.resources["suite"].suite_path) == two_suites[1].resolve()  # type: ignore[index,union-attr]


def test_the_suite_is_parsed_once_per_path(two_suites: tuple[Path, Path]) -> None:
    runtime.reset()
    s1 = runtime.load_suite(two_suites[0])
    definitions_for_file(two_suites[0])
    definitions_for(runtime.load_suite(two_suites[0]))
    assert runtime.suite_parses() == 1 and runtime.load_suite(two_suites[0]) is s1
    runtime.load_suite(two_suites[1])
    assert runtime.suite_parses() == 2
    text = two_suites[0].read_text()  # an edited file is read again
    two_suites[0].write_text(text.replace("suite-a", "suite-a2"))
    assert runtime.load_suite(two_suites[0]).name == "suite-a2" and runtime.suite_parses() == 3


def test_a_suite_built_in_memory_plans_but_does_not_run(two_suites: tuple[Path, Path]) -> None:
    suite = runtime.load_suite(two_suites[1]).model_copy(update={"modalities": ["ct"]})
    defs = definitions_for(suite)  # not parsed from a file: no path to run from
    assert _partition_keys(defs, "clean_samples") == {"ct"}
    with pytest.raises(ValueError, match="built from a suite without its file"):
        defs.resources["suite"].load()  # type: ignore[index,union-attr]


def test_a_partition_outside_the_suite_is_refused_in_one_line(two_suites: tuple[Path, Path], tmp_path: Path) -> None:
    """Level 5 is not perturbed by suite-a, and seg-a3 is evaluated at level 3 only: the runner
    refuses both before any run starts, in one line naming the key and the suite's partitions."""
    inst = dg.DagsterInstance.ephemeral()
    with pytest.raises(PartitionRefused) as err:
        run_suite(str(two_suites[0]), ["perturbed_samples"], instance=inst, log=lambda _: None,
                  mlruns_dir=str(tmp_path / "mlruns"), partitions=["ct|5"])
    msg = str(err.value)
    assert "\n" not in msg and "'ct|5'" in msg and "perturbed_samples" in msg
    assert "modality (ct, mri) x severity (1, 3)" in msg
    assert inst.get_runs() == []

    defs = definitions_for_file(two_suites[0], mlruns_dir=str(tmp_path / "mlruns"))
    jobs = StepJobs(defs)
    ct1 = dg.MultiPartitionKey({"modality": "ct", "severity": "1"})
    with pytest.raises(PartitionRefused) as err:
        jobs.materialize([dg.AssetKey(["seg-a3", "perturbed_predictions"])], ct1, inst, {})
    msg = str(err.value)
    assert "\n" not in msg and msg == ("partition 'ct|1' is not one of the suite's partitions of "
                                       "seg-a3/perturbed_predictions: modality (ct, mri) x severity (3)")
    with pytest.raises(PartitionRefused, match=r"^partition 'fundus' is not one of the suite's partitions of "
                                               r"clean_samples: ct, mri$"):
        jobs.materialize([dg.AssetKey("clean_samples")], "fundus", inst, {})
    assert inst.get_runs() == []
    # Dagster itself refuses the key too (the UI never offers it): no asset accepts a level the suite excludes
    from dagster._core.errors import DagsterUnknownPartitionError

    with pytest.raises(DagsterUnknownPartitionError, match="ct|5"):
        dg.materialize(list(defs.assets or []), selection=["perturbed_samples"],
                       partition_key=dg.MultiPartitionKey({"modality": "ct", "severity": "5"}), instance=inst,
                       resources=defs.resources)


def test_no_module_reads_medrobust_suite() -> None:
    """No environment variable shapes the graph: the code never reads $MEDROBUST_SUITE."""
    files = [*ROOT.glob("medrobust_assets/**/*.py"), *ROOT.glob("medrobust_lib/**/*.py"), ROOT / "medrobust_cli.py",
             *ROOT.glob("deploy/**/*.py")]
    assert files and not [str(f) for f in files if "MEDROBUST_SUITE" in f.read_text()]


def test_the_cli_refuses_an_out_of_suite_partition_in_one_line(two_suites: tuple[Path, Path], tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from medrobust_cli import app

    root, home = tmp_path / "project", tmp_path / "dagster_home"
    root.mkdir()
    home.mkdir()
    monkeypatch.setenv("MEDROBUST_HOME", str(root))
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, ["run", "--suite", str(two_suites[0]), "--select", "perturbed_samples",
                                   "--partition", "ct|5"])
    lines = [ln for ln in (res.stdout + res.stderr).splitlines() if ln.strip()]
    assert res.exit_code == 2, lines
    assert lines == ["error: partition 'ct|5' is not one of the suite's partitions of perturbed_samples: "
                     "modality (ct, mri) x severity (1, 3)"]
