"""medrobust's Definitions with the Kubernetes job executor (each step its own Kubernetes Job).

The Helm user deployment (deploy/helm/values.yaml) serves this file; everything except the
executor comes from ``definitions_for`` (medrobust_assets/definitions.py) of :data:`SUITE`. GPU
steps get a GPU through their op tags (``medrobust_assets.tags.GPU_OP_TAGS``); run config:
deploy/helm/k8s_job_executor.yaml.
"""

from pathlib import Path

import dagster as dg
from dagster_k8s import k8s_job_executor

from medrobust_assets.definitions import definitions_for_file

SUITE = Path(__file__).resolve().parents[2] / "configs" / "demo.yaml"
"""The suite whose graph this location serves: name your suite here (no environment variable
chooses it; paths inside the suite are relative to the project root)."""

defs = dg.Definitions.merge(definitions_for_file(SUITE), dg.Definitions(executor=k8s_job_executor))
