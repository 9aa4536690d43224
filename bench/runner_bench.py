"""Runner overhead benchmark. Run: .venv/bin/python -m bench.runner_bench [--assets 5] [--partitions 8]

What a Dagster run costs the runner beyond the work itself, in the same process on the same
instance type as ``medrobust run`` (SQLite storage under a temporary ``DAGSTER_HOME``, compute
logs captured): ``--assets`` trivial assets sharing one partitions definition (each logs one
message and reports metadata, as the real assets do) are materialized for ``--partitions``
partitions twice:

- reference: one run per (asset, partition), as the runner did before;
- batched: :func:`medrobust_assets.runner.batch_steps` + :class:`~medrobust_assets.runner.StepJobs`,
  one run per partition for the assets of one level (what ``medrobust run`` / ``demo`` do now).

Prints milliseconds per materialized (asset, partition) for each and their ratio; no network.
"""


import argparse
import os
import tempfile
import time
from pathlib import Path

import dagster as dg

from medrobust_assets.runner import Step, StepJobs, batch_steps


def _assets(n: int, parts: dg.StaticPartitionsDefinition) -> list[dg.AssetsDefinition]:
    def make(i: int) -> dg.AssetsDefinition:
        @dg.asset(name=f"a{i}", partitions_def=parts)
        def _a(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
            context.log.info(f"partition {context.partition_key}")
            return dg.MaterializeResult(metadata={"rows": 1})

        return _a

    return [make(i) for i in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--assets", type=int, default=5)
    ap.add_argument("--partitions", type=int, default=8)
    args = ap.parse_args()
    keys = [f"p{i}" for i in range(2 * args.partitions)]
    parts = dg.StaticPartitionsDefinition(keys)
    assets = _assets(args.assets, parts)
    with tempfile.TemporaryDirectory() as home:
        (Path(home) / "dagster.yaml").write_text(
            f"storage:\n  sqlite:\n    base_dir: {home}/storage\ntelemetry:\n  enabled: false\n")
        os.environ["DAGSTER_HOME"] = home
        inst = dg.DagsterInstance.get()
        jobs = StepJobs(dg.Definitions(assets=assets))
        n = args.assets * args.partitions
        jobs.materialize([assets[0].key], keys[-1], inst, {})  # warm-up: imports, first shard
        t0 = time.perf_counter()
        for p in keys[: args.partitions]:
            for a in assets:
                assert jobs.materialize([a.key], p, inst, {}).success
        per_step = (time.perf_counter() - t0) / n
        steps = [Step(a.key, p, "bench", 0, parts) for a in assets for p in keys[args.partitions:]]
        runs = batch_steps(steps)
        t0 = time.perf_counter()
        for run in runs:
            assert jobs.materialize([s.key for s in run], run[0].partition, inst, {}).success
        batched = (time.perf_counter() - t0) / n
    print(f"{args.assets} assets x {args.partitions} partitions ({n} materializations)")
    print(f"reference, one run per (asset, partition): {1000 * per_step:7.1f} ms each ({n} runs)")
    print(f"batched, one run per partition:           {1000 * batched:7.1f} ms each ({len(runs)} runs)")
    print(f"ratio batched / reference: {batched / per_step:.2f}")


if __name__ == "__main__":
    main()
