#!/usr/bin/env bash
# Materialize medrobust assets on SLURM through the Dask executor.
#
#   deploy/slurm/launch.sh SELECTION [PARTITION]
#   deploy/slurm/launch.sh perturbed_samples 'ct|3'
#
# Run it from a login node (or inside a small CPU allocation) that can call sbatch, with the
# project and its .venv on a filesystem the compute nodes share. This process is the Dagster
# run worker and the Dask scheduler; each Dask worker is a SLURM job (deploy/slurm/jobqueue.yaml).
set -euo pipefail

SELECTION="${1:?usage: launch.sh SELECTION [PARTITION]}"
PARTITION="${2:-}"

cd "$(dirname "$0")/../.."
export MEDROBUST_ROOT="$PWD"
# the Dask executor needs a persistent instance that workers reach: the project's dagster.yaml
# (SQLite under var/dagster) unless DAGSTER_HOME points elsewhere (e.g. a Postgres instance)
export DAGSTER_HOME="${DAGSTER_HOME:-$MEDROBUST_ROOT}"
export MLFLOW_DISABLE_TELEMETRY=true

# a private dask config folder holding only jobqueue.yaml
DASK_CONFIG="$(mktemp -d)"
export DASK_CONFIG
trap 'rm -rf "$DASK_CONFIG"' EXIT
cp deploy/slurm/jobqueue.yaml "$DASK_CONFIG/"
mkdir -p var/slurm-logs
# TLS credentials of this run's scheduler and workers: readable by you only
mkdir -p var/dask-tls && chmod 700 var/dask-tls
# the project (and var/cache) lives on a shared filesystem: SQLite WAL is unsafe there
export MEDROBUST_CACHE_JOURNAL_MODE="${MEDROBUST_CACHE_JOURNAL_MODE:-DELETE}"

args=(asset materialize
  --python-file deploy/slurm/definitions_dask.py
  --working-directory "$MEDROBUST_ROOT"
  --config deploy/slurm/dask_executor.yaml
  --select "$SELECTION")
if [[ -n "$PARTITION" ]]; then
  args+=(--partition "$PARTITION")
fi
.venv/bin/dagster "${args[@]}"
