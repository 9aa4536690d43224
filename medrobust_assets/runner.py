"""Materialize a selection of the Definitions (``medrobust run`` / ``medrobust demo``), one run per
partition, shared by the assets of that partition that do not depend on each other
(:func:`batch_steps`), recorded in the instance configured by dagster.yaml so the runs show up in
the UI.

What runs and in which order comes from the Definitions' own asset graph (:func:`plan`: Dagster's
asset selection and its topological levels), never from a hand-written list. The Definitions are
those of the suite being run (:func:`medrobust_assets.definitions.definitions_for`), so every
partition they hold is one the suite asks for; a partition outside them is refused in one line
(:class:`PartitionRefused`).

The instance the runs are recorded in and the runner's run tags (orphaned runs marked failed):
:mod:`medrobust_assets.instance`. The demo's registry loop: :mod:`medrobust_lib.demo.registry_loop`,
driven by :func:`run_demo` with this runner's step passed in (:mod:`medrobust_assets.registry_demo`)."""

from __future__ import annotations

import builtins
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import dagster as dg

from medrobust_assets.definitions import definitions_for
from medrobust_assets.instance import clear_orphaned_runs, get_instance, runner_tags
from medrobust_assets.partitions import describe
from medrobust_assets.progress import Terminal, terminal
from medrobust_assets.registry_demo import REGISTRY_SENSOR_CURSOR, loop_steps
from medrobust_assets.tags import SUITE_NAME_TAG, run_job_name, run_tags
from medrobust_lib import runtime
from medrobust_lib.config import Suite
from medrobust_lib.demo.registry_loop import run_registry_loop
from medrobust_lib.paths import suite_paths
from medrobust_lib.progress import duration
from medrobust_lib.store.left_out import left_out, summary_lines
from medrobust_lib.store.writer_lock import suite_writer_lock

# Progress is printed by run_demo; Dagster's own event stream (a failed step's traceback included)
# stays in the instance and the UI: the console logger prints nothing below CRITICAL.
QUIET = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}


@dataclass(frozen=True)
class Step:
    """One run of the plan: an asset and one of its partitions (None: unpartitioned)."""

    key: dg.AssetKey
    partition: str | dg.MultiPartitionKey | None
    group: str
    level: int = 0
    """The asset's topological level in the graph (steps of one level do not depend on each other)."""
    partitions_def: dg.PartitionsDefinition | None = field(default=None, compare=False, repr=False)

    @property
    def label(self) -> str:
        name = self.key.to_user_string()
        return f"{name}[{self.partition}]" if self.partition is not None else name


def _partitions(pdef: dg.PartitionsDefinition | None, instance: dg.DagsterInstance
                ) -> list[str | dg.MultiPartitionKey | None]:
    """The partitions of one asset: every key of its partitions definition (built from the suite:
    its modalities, and the levels this asset is evaluated at); dynamic partitions are the ones
    the instance holds (the registry sensor adds them)."""
    if pdef is None:
        return [None]
    return list(pdef.get_partition_keys(dynamic_partitions_store=instance))


def plan(selection: dg.AssetSelection, definitions: dg.Definitions, instance: dg.DagsterInstance,
         partitions: Sequence[str] | None = None) -> list[Step]:
    """The runs that materialize ``selection`` of ``definitions`` (those of one suite), in
    dependency order, derived from the asset graph (topological levels; within a level, by asset
    key). Dynamic partitions that do not exist yet are simply absent. ``partitions``: only these
    partition keys (``ct``, ``ct|4``) of the partitioned assets; a key that no selected asset has
    is :class:`PartitionRefused`."""
    graph = definitions.resolve_asset_graph()
    wanted = selection.resolve(graph)
    steps: list[Step] = []
    for i, level in enumerate(graph.toposorted_asset_keys_by_level):
        for key in sorted(k for k in level if k in wanted):
            node = graph.get(key)
            for part in _partitions(node.partitions_def, instance):
                steps.append(Step(key, part, node.group_name or "default", i, node.partitions_def))
    if partitions is None:
        return steps
    known = {str(st.partition) for st in steps if st.partition is not None}
    for wanted_key in partitions:
        if wanted_key not in known:
            pdefs = {describe(st.partitions_def) for st in steps if st.partitions_def is not None}
            names = sorted({st.key.to_user_string() for st in steps if st.partitions_def is not None})
            raise PartitionRefused(f"partition {wanted_key!r} is not one of the suite's partitions of "
                                   f"{', '.join(names) or 'the selected assets'}: "
                                   f"{'; '.join(sorted(pdefs)) or 'they are not partitioned'}")
    return [st for st in steps if st.partition is None or str(st.partition) in set(partitions)]


class PartitionRefused(ValueError):
    """A partition key outside the partitions an asset of the suite has (a modality the suite
    does not evaluate, a level it does not perturb or this model is not evaluated at): one line
    naming the key, the asset(s) and the suite's partitions."""


def batch_steps(steps: list[Step]) -> list[list[Step]]:
    """The steps grouped into runs: one run materializes every step of one topological level that
    has the same partitions definition and the same partition (unpartitioned steps of a level
    share one run), as a Dagster run of several assets for one partition does. The steps of a
    level do not depend on each other, so each run only follows runs of earlier levels; each
    step's own seconds and outcome still come from the run's step events. A run costs Dagster a
    fixed share (run record, event-log shard, compute-log capture), so fewer runs make the demo
    faster. Runs are ordered by their first step in ``steps``."""
    runs: dict[tuple[int, int, str | None], list[Step]] = {}
    for st in steps:
        pdef_id = id(st.partitions_def) if st.partitions_def is not None else 0
        part = str(st.partition) if st.partition is not None else None
        runs.setdefault((st.level, pdef_id, part), []).append(st)
    return list(runs.values())


def parse_selection(tokens: list[str] | None, definitions: dg.Definitions) -> dg.AssetSelection:
    """``--select`` tokens: a group name or an asset key (``tiny-sam/clean_predictions``); a leading
    ``+`` adds everything upstream. None or empty: every asset. Raises ValueError naming the valid
    groups for an unknown token."""
    if not tokens:
        return dg.AssetSelection.all()
    graph = definitions.resolve_asset_graph()
    groups = sorted({graph.get(k).group_name or "default" for k in graph.get_all_asset_keys()})
    keys = {k.to_user_string() for k in graph.get_all_asset_keys()}
    sel: dg.AssetSelection | None = None
    for raw in tokens:
        tok, upstream = raw.lstrip("+"), raw.startswith("+")
        part: dg.AssetSelection
        if tok in groups:
            part = dg.AssetSelection.groups(tok)
        elif tok in keys:
            part = dg.AssetSelection.assets(dg.AssetKey.from_user_string(tok))
        else:
            raise ValueError(f"unknown group or asset {tok!r}; groups: {', '.join(groups)}")
        if upstream:
            part = part.upstream()
        sel = part if sel is None else sel | part
    assert sel is not None
    return sel


def _innermost(data: Any) -> Any:
    cause = data.error
    while cause.cause is not None:
        cause = cause.cause
    return cause


def _error_line(data: Any) -> str:
    cause = _innermost(data)
    return cause.message.strip().splitlines()[-1] if cause.message.strip() else cause.cls_name or "error"


USER_ERRORS = frozenset({"CheckpointMismatch", "SampleError", "GateInputError", "RegistryError", "ValidationError",
                         "QueryRefused", "NotConvertible", "MissingUpstream", "NotOurs"})
"""Project (and pydantic) exceptions that mean bad input, by class name (as Dagster records it)."""
INTERRUPTED = frozenset({"DagsterExecutionInterruptedError", "KeyboardInterrupt"})


def _is_user_error(cls_name: str | None) -> bool:
    """Bad input (a missing file, a bad value, a checkpoint that does not fit) rather than a bug."""
    if not cls_name:
        return False
    if cls_name in USER_ERRORS:
        return True
    cls = getattr(builtins, cls_name, None)
    return isinstance(cls, type) and issubclass(cls, (ValueError, LookupError, OSError))


@dataclass(frozen=True)
class Failure:
    """One failed step: the one-line ``cause``, the innermost error's class, the whole traceback."""

    cause: str
    cls_name: str
    traceback: str


def _failures(res: dg.ExecuteInProcessResult) -> dict[str, Failure]:
    out: dict[str, Failure] = {}
    for ev in res.get_step_failure_events():
        data = ev.step_failure_data
        if ev.step_key is not None and data is not None and data.error is not None:
            inner = _innermost(data)
            out.setdefault(ev.step_key, Failure(_error_line(data), inner.cls_name or "",
                                                data.error.to_string()))
    return out


def _step_failures(res: dg.ExecuteInProcessResult) -> dict[str, str]:
    """Failed step key -> one-line cause (the innermost error's last line)."""
    return {k: f.cause for k, f in _failures(res).items()}


def _step_seconds(res: dg.ExecuteInProcessResult) -> dict[str, float]:
    """Step key -> seconds of each successful step of the run."""
    out: dict[str, float] = {}
    for ev in res.get_step_success_events():
        data = ev.event_specific_data
        if ev.step_key is not None and data is not None:
            out[ev.step_key] = float(getattr(data, "duration_ms", 0.0) or 0.0) / 1000.0
    return out


def _log_failed_checks(res: dg.ExecuteInProcessResult, log: Callable[[str], None]) -> None:
    for ev in res.get_asset_check_evaluations():
        if ev.check_name == "error_share" and not ev.passed:
            share = ev.metadata.get("error_share")
            log(f"    error_share check FAILED for {ev.asset_key.to_user_string()} "
                f"({share.value if share is not None else '?'} errors): the partition is left out of the mart "
                "until re-run")


class StepFailed(RuntimeError):
    """A run of the plan failed: ``label`` (asset[partition]), ``cause`` (one line), ``run_id``;
    ``asset`` (the key alone), ``user_error`` (bad input, not a bug), ``interrupted`` (Ctrl-C) and
    the Dagster ``traceback`` (shown with ``medrobust --debug``)."""

    def __init__(self, label: str, cause: str, run_id: str, *, asset: str = "", cls_name: str = "",
                 traceback: str = "") -> None:
        super().__init__(f"materializing {label} failed: {cause} (full log: Dagster run {run_id})")
        self.label, self.cause, self.run_id = label, cause, run_id
        self.asset = asset or label.split("[", 1)[0]
        self.cls_name, self.traceback = cls_name, traceback
        self.user_error = _is_user_error(cls_name)
        self.interrupted = cls_name in INTERRUPTED


class StepJobs:
    """The jobs of a runner call over ``definitions`` (one suite's), one per set of asset keys,
    built once and reused for each partition (``dg.materialize`` builds the whole Definitions
    again for every run)."""

    def __init__(self, definitions: dg.Definitions) -> None:
        self.resources = dict(definitions.resources or {})
        self.assets = list(definitions.assets or [])
        self._jobs: dict[tuple[dg.AssetKey, ...], dg.JobDefinition] = {}
        self._steps = {a.node_def.name: a.key for a in self.assets  # step key (op name) -> its asset
                       if isinstance(a, dg.AssetsDefinition) and a.is_executable and len(a.keys) == 1}

    def materialize(self, keys: list[dg.AssetKey], partition: str | None, instance: dg.DagsterInstance,
                    tags: Mapping[str, str]) -> dg.ExecuteInProcessResult:
        """One run materializing ``keys`` (and their checks) for ``partition``, as ``dg.materialize``
        with ``selection=keys`` would; failures are in the result, not raised."""
        sel = tuple(keys)
        names = [k.to_user_string() for k in sel]
        suite_name = tags.get(SUITE_NAME_TAG, "")
        job = self._jobs.get(sel)
        if job is None:  # named after the suite and selection: the UI lists runs by job name
            name = run_job_name(suite_name, names)
            defs = dg.Definitions(jobs=[dg.define_asset_job(name, selection=list(sel))], assets=self.assets,
                                  resources=self.resources)
            job = self._jobs[sel] = defs.resolve_job_def(name)
        _check_partition(job, keys, partition, instance)
        return job.execute_in_process(run_config=QUIET, instance=instance, partition_key=partition,
                                      raise_on_error=False, tags={**tags, **run_tags(suite_name, names)})

    def asset_of_step(self, step_key: str) -> dg.AssetKey | None:
        """The asset a step of these jobs materializes (None: a step that is not an asset's own)."""
        return self._steps.get(step_key)


def _check_partition(job: dg.JobDefinition, keys: Sequence[dg.AssetKey], partition: str | dg.MultiPartitionKey | None,
                     instance: dg.DagsterInstance) -> None:
    """Refuse, in one line, a partition the job's assets do not have (Dagster's own refusal is a
    multi-line error raised from inside the run machinery)."""
    if partition is None:
        return
    names = ", ".join(k.to_user_string() for k in keys)
    pdef = job.partitions_def
    if pdef is None:
        raise PartitionRefused(f"{names} is not partitioned: no partition {str(partition)!r} to materialize")
    if str(partition) not in {str(k) for k in pdef.get_partition_keys(dynamic_partitions_store=instance)}:
        raise PartitionRefused(f"partition {str(partition)!r} is not one of the suite's partitions of {names}: "
                               f"{describe(pdef)}")


def run_plan(steps: list[Step], *, suite_path: str, instance: dg.DagsterInstance, definitions: dg.Definitions,
             log: Callable[[str], None] = print, source: str = "medrobust run",
             live: Callable[[str], None] | None = None) -> dict[str, float]:
    """Materialize the steps, several per run where they can share one (:func:`batch_steps`);
    every run is recorded in ``instance`` (so it shows in the UI). Prints one progress line per
    step with its own seconds, and a header when the asset groups of the runs change, with the
    overall progress (steps done of the plan, time spent). While a step runs, its own progress
    (images done / total, time left: :mod:`medrobust_assets.progress`) goes to ``log`` at most every
    15 s, or, given ``live`` (raw text to a TTY), onto one line rewritten in place. Returns the seconds
    spent per group (each run's wall time split over its steps in proportion to their seconds).
    Raises :class:`StepFailed` naming the first failed step."""
    term = Terminal(log, live=live is not None, write=live)

    def say(msg: str) -> None:
        term.close()  # a live line left open ends before the next line
        log(msg)

    with terminal(term):
        return _run_plan(steps, suite_path=suite_path, instance=instance, definitions=definitions, log=say,
                         source=source)


def _run_plan(steps: list[Step], *, suite_path: str, instance: dg.DagsterInstance, definitions: dg.Definitions,
              log: Callable[[str], None], source: str) -> dict[str, float]:
    shown = None
    seconds: dict[str, float] = {}
    jobs = StepJobs(definitions)
    n_done, n_all, t_start = 0, len(steps), time.perf_counter()
    for run in batch_steps(steps):
        t0 = time.perf_counter()
        partition = run[0].partition
        groups = " + ".join(dict.fromkeys(st.group for st in run))  # a run may span asset groups
        if groups != shown:
            shown = groups
            log(f"== {groups}  [{n_done}/{n_all} steps done, {duration(t0 - t_start)} elapsed]")
        res = jobs.materialize([st.key for st in run], partition, instance, runner_tags(source, suite_path))
        wall = time.perf_counter() - t0
        n_done += len(run)
        own = {jobs.asset_of_step(k): v for k, v in _step_seconds(res).items()}
        total = sum(own.get(st.key, 0.0) for st in run) or 1.0
        for st in run:
            if st.key not in own:
                continue
            dt = own[st.key]
            seconds[st.group] = seconds.get(st.group, 0.0) + wall * dt / total
            log(f"  {st.label:<48} {dt:6.1f} s")
        _log_failed_checks(res, log)
        for step_key, f in _failures(res).items():
            asset = jobs.asset_of_step(step_key)
            name = asset.to_user_string() if asset is not None else step_key
            raise StepFailed(f"{name}[{partition}]" if partition is not None else name, f.cause, res.run_id,
                             asset=name, cls_name=f.cls_name, traceback=f.traceback)
        if not res.success:
            raise StepFailed(run[0].label, "the run failed before its steps ran", res.run_id)
    return seconds


def stage_line(seconds: dict[str, float]) -> str:
    """``stage times: datasets 31 s, ...`` in the order the stages ran."""
    return "stage times: " + ", ".join(f"{g} {s:.0f} s" for g, s in seconds.items())


def run_suite(suite_path: str, select: list[str] | None = None, *, workers: int = 0,
              log: Callable[[str], None] = print, instance: dg.DagsterInstance | None = None,
              mlruns_dir: str = "mlruns", partitions: Sequence[str] | None = None,
              live: Callable[[str], None] | None = None) -> str:
    """Materialize the selected assets of a suite (default: all) in dependency order, over the
    suite's own Definitions (:func:`definitions_for`); ``partitions``: only these keys of the
    partitioned assets (:func:`plan`). ``live``: a TTY writer for the running step's progress line
    (:func:`run_plan`). Ends with what the results leave out of the means, counted with the reason
    (:func:`medrobust_lib.store.left_out.left_out`). Returns the mart path. Raises
    :class:`StepFailed` (one line: asset, partition, cause), :class:`PartitionRefused` or ValueError."""
    suite = runtime.load_suite(suite_path)
    definitions = definitions_for(suite, suite_path=suite_path, mlruns_dir=mlruns_dir, workers=workers)
    selection = parse_selection(select, definitions)
    with suite_writer_lock(suite.results_dir, log=log):  # one writer per suite: SuiteBusyError otherwise
        inst = instance or get_instance(suite)
        steps = plan(selection, definitions, inst, partitions)
        clear_orphaned_runs(inst, log)
        run_plan(steps, suite_path=suite_path, instance=inst, definitions=definitions, log=log, live=live)
    for line in summary_lines(left_out(suite.results_dir)):
        log(line)
    return suite.mart_path


def run_demo(suite_path: str, *, workers: int = 0, log: Callable[[str], None] = print,
             instance: dg.DagsterInstance | None = None, mlruns_dir: str = "mlruns", retrain: bool = False,
             live: Callable[[str], None] | None = None) -> str:
    """The offline demo: every asset of the suite's graph in dependency order (as
    :func:`run_suite`), then the registry loop (:func:`medrobust_lib.demo.registry_loop.run_registry_loop`)
    with the sensor evaluated as the daemon would and each of its runs materialized here, then the mart again.
    ``retrain``: train the demo models instead of copying the committed weights
    (``demo.retrain``). Returns the mart path. Holds the suite's writer lock throughout
    (:class:`SuiteBusyError` when another process writes)."""
    suite = runtime.load_suite(suite_path)
    with suite_writer_lock(suite.results_dir, log=log):
        return _run_demo(suite, suite_path, workers=workers, log=log, instance=instance, mlruns_dir=mlruns_dir,
                         retrain=retrain, live=live)


def _run_demo(suite: Suite, suite_path: str, *, workers: int, log: Callable[[str], None],
              instance: dg.DagsterInstance | None, mlruns_dir: str, retrain: bool,
              live: Callable[[str], None] | None = None) -> str:
    inst = instance or get_instance(suite)
    definitions = definitions_for(suite, suite_path=suite_path, mlruns_dir=mlruns_dir, workers=workers,
                                  retrain=retrain)
    steps = plan(dg.AssetSelection.all(), definitions, inst)
    clear_orphaned_runs(inst, log)
    seconds = run_plan(steps, suite_path=suite_path, instance=inst, definitions=definitions, log=log,
                       source="medrobust demo", live=live)
    jobs = StepJobs(definitions)

    def step(asset: str, partition: str | None) -> dg.ExecuteInProcessResult:
        t0 = time.perf_counter()
        st = Step(dg.AssetKey.from_user_string(asset), partition, "registry")
        res = jobs.materialize([st.key], partition, inst, runner_tags("medrobust demo", suite_path))
        if not res.success:
            f = next(iter(_failures(res).values()), Failure("the run failed before its steps ran", "", ""))
            raise StepFailed(st.label, f.cause, res.run_id, asset=asset, cls_name=f.cls_name, traceback=f.traceback)
        log(f"  {st.label:<48} {time.perf_counter() - t0:6.1f} s")
        _log_failed_checks(res, log)
        return res

    if suite.segmentation.finetune is not None:
        t0 = time.perf_counter()
        cursor_file = suite_paths(suite).dagster_state / REGISTRY_SENSOR_CURSOR
        run_registry_loop(suite, loop_steps(inst, mlruns_dir, cursor_file, step), log, mlruns_dir)
        seconds["registry loop"] = time.perf_counter() - t0
    log("== " + stage_line(seconds))
    for line in summary_lines(left_out(suite.results_dir)):
        log(line)
    return suite.mart_path
