#!/usr/bin/env bash
# The cluster's MLflow tracking server, started by ray_cluster.yaml on the head:
#   mlflow_server.sh FOLDER SECRET_FILE PORT
# MLflow's basic-auth app in front of a sqlite store and proxied artifacts in FOLDER. The
# secret file (see README, "A cluster closed to strangers") holds the admin's password, the
# app's session key and detsweep's user: they become the server's environment and the
# user is created (or its password set) once the server answers. Nothing of it is logged.
# A credential checked once is trusted for 60 s (MLflow's auth cache, off by default): every
# request otherwise pays a scrypt hash of the password: 0.37 s per request here against
# 0.06 s with the cache, and a sweep's trials make hundreds of requests (bench/RESULTS.md).
# MLflow's job runner (GenAI judges, trace roll-ups: nothing detsweep uses) stays off: its 8
# processes held 1.3 GB here and the server answered after 18-20 s with them, 13-14 s without.
set -euo pipefail
folder=$1 secret=$2 port=$3
mkdir -p "$folder"
set -a  # MLFLOW_AUTH_ADMIN_PASSWORD, MLFLOW_FLASK_SERVER_SECRET_KEY, MLFLOW_TRACKING_USERNAME/PASSWORD
. "$secret"
set +a
cat > "$folder/basic_auth.ini" <<INI
[mlflow]
default_permission = READ
database_uri = sqlite:///$folder/basic_auth.db
admin_username = admin
authorization_function = mlflow.server.auth:authenticate_request_basic_auth
auth_cache_ttl_seconds = 60
INI
MLFLOW_AUTH_CONFIG_PATH="$folder/basic_auth.ini" MLFLOW_DISABLE_TELEMETRY=true MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false \
    nohup mlflow server \
    --app-name basic-auth --host 0.0.0.0 --port "$port" \
    --backend-store-uri "sqlite:///$folder/mlflow.db" \
    --artifacts-destination "$folder/artifacts" --serve-artifacts > "$folder/server.log" 2>&1 &
python -m detsweep.tracking.users "http://127.0.0.1:$port" $! || { tail -n 3 "$folder/server.log" >&2; exit 1; }
