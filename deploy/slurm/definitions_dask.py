"""medrobust's Definitions with the Dask executor, for a dask-jobqueue SLURM cluster.

deploy/slurm/launch.sh materializes from this file; everything except the executor comes from
``definitions_for`` (medrobust_assets/definitions.py) of :data:`SUITE`. Run config: deploy/slurm/dask_executor.yaml; worker jobs:
deploy/slurm/jobqueue.yaml (dask config ``jobqueue.slurm``).
"""

from pathlib import Path

import dagster as dg
from dagster_dask import dask_executor

from medrobust_assets.definitions import definitions_for_file

SUITE = Path(__file__).resolve().parents[2] / "configs" / "demo.yaml"
"""The suite whose graph this location serves: name your suite here (no environment variable
chooses it; paths inside the suite are relative to the project root)."""

defs = dg.Definitions.merge(definitions_for_file(SUITE), dg.Definitions(executor=dask_executor))
