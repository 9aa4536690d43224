#!/bin/sh
# Runs once, when the Postgres data volume is empty (docker-entrypoint-initdb.d): one server,
# three databases, "dagster" (Dagster runs, events, schedules), "mlflow" (tracking + registry)
# and "mlflow_auth" (the MLflow basic-auth users and permissions), all owned by $POSTGRES_USER.
# Idempotent: an existing database is left alone.
set -eu
for db in dagster mlflow mlflow_auth; do
  psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname postgres <<SQL
SELECT 'CREATE DATABASE $db OWNER "$POSTGRES_USER"'
WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = '$db')\gexec
SQL
done
