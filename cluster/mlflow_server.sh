#!/usr/bin/env bash
# The cluster's MLflow tracking server, started by ray_cluster.yaml on the head:
#   mlflow_server.sh FOLDER SECRET_FILE PORT
# MLflow's basic-auth app, its runs in the database and its artifacts in the bucket that the
# secret file names (MLFLOW_BACKEND_STORE_URI, MLFLOW_ARTIFACTS_DESTINATION), so that they
# outlive the cluster; without them, in FOLDER on the head, and the start says they die with
# it. The secret file is read as data, never run (detsweep/tracking/server.py says what it
# holds). Returns once the server answers and detsweep's user exists; nothing secret is logged.
set -euo pipefail
exec python -m detsweep.tracking.server start "$1" "$2" "$3"
