"""medrobust's Definitions with the Kubernetes job executor (each step its own Kubernetes Job).

The Helm user deployment (deploy/helm/values.yaml) serves this file; everything except the
executor comes from ``medrobust_assets.definitions``. GPU steps get a GPU through their op tags
(``medrobust_assets.tags.GPU_OP_TAGS``); run config: deploy/helm/k8s_job_executor.yaml.
"""

import dagster as dg
from dagster_k8s import k8s_job_executor

from medrobust_assets.definitions import defs as base_defs

defs = dg.Definitions.merge(base_defs, dg.Definitions(executor=k8s_job_executor))
