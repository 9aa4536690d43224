"""medrobust's Definitions with the Dask executor, for a dask-jobqueue SLURM cluster.

deploy/slurm/launch.sh materializes from this file; everything except the executor comes from
``medrobust_assets.definitions``. Run config: deploy/slurm/dask_executor.yaml; worker jobs:
deploy/slurm/jobqueue.yaml (dask config ``jobqueue.slurm``).
"""

import dagster as dg
from dagster_dask import dask_executor

from medrobust_assets.definitions import defs as base_defs

defs = dg.Definitions.merge(base_defs, dg.Definitions(executor=dask_executor))
