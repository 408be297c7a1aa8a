#!/usr/bin/env bash
# The cluster's MLflow tracking server, started by ray_cluster.yaml on the head:
#   mlflow_server.sh start FOLDER CREDENTIALS PORT [--head-secret SOURCE] [--tls AUTHORITY_CERT]
#   mlflow_server.sh gc FOLDER PORT [--head-secret SOURCE] [--tls AUTHORITY_CERT]
# MLflow's basic-auth app, over HTTPS with the certificate `tls` made at `ray up`; its runs in
# the database and its artifacts in the bucket the head's secret names (Secrets Manager,
# which only the head reads), so that they outlive the cluster; without them, in FOLDER on
# the head, and the start says they die with it. CREDENTIALS is detsweep's user, the file
# every node holds. Both are read as data, never run (detsweep/tracking/credentials.py).
# `start` returns once the server answers and detsweep's user exists; nothing secret is logged.
set -euo pipefail
exec python -m detsweep.tracking.server "$@"
