"""The cluster's MLflow tracking server, as ``cluster/mlflow_server.sh`` runs it on the head:

    python -m detsweep.tracking.server start FOLDER SECRET_FILE PORT
    python -m detsweep.tracking.server gc FOLDER SECRET_FILE PORT

The secret file is read as data (``KEY=VALUE`` lines, ``#`` comments), never run. It holds
the admin's password, the app's session key and detsweep's user, and where the runs live:

- ``MLFLOW_BACKEND_STORE_URI`` (``postgresql://user:password@host:5432/mlflow``, e.g. RDS)
  and ``MLFLOW_ARTIFACTS_DESTINATION`` (``s3://bucket/mlflow``): runs, registered models
  and checkpoints outside the cluster, so ``ray down`` loses nothing; users and permissions
  live in the same database. MLflow reads both from its environment: they are on no command
  line and in no log.
- neither: a try-it-out mode, a sqlite file and the artifacts under FOLDER on the head, which
  die with the cluster; the start says so in one line.

Everything in the file becomes the server's environment (``AWS_*`` for a bucket reached
with keys rather than the head's instance profile). ``start`` returns once the server
answers and detsweep's user exists. ``gc`` removes the files of what was deleted (the
checkpoints a trial no longer keeps): MLflow's deletion only marks them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from .users import ensure_user, wait_for_server

REQUIRED = ("MLFLOW_AUTH_ADMIN_PASSWORD", "MLFLOW_FLASK_SERVER_SECRET_KEY", "MLFLOW_TRACKING_USERNAME",
            "MLFLOW_TRACKING_PASSWORD")
STORES = ("MLFLOW_BACKEND_STORE_URI", "MLFLOW_ARTIFACTS_DESTINATION")
# A credential checked once is trusted for 60 s (MLflow's auth cache, off by default): every
# request otherwise pays a scrypt hash of the password: 0.37 s per request here against
# 0.06 s with the cache, and a sweep's trials make hundreds of requests (bench/RESULTS.md).
AUTH_INI = """[mlflow]
default_permission = READ
database_uri = {database}
admin_username = admin
authorization_function = mlflow.server.auth:authenticate_request_basic_auth
auth_cache_ttl_seconds = 60
"""


def read_secret(path: Path) -> dict[str, str]:
    """``KEY=VALUE`` lines as data: no shell expansion, quotes around a value dropped."""
    values = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, equals, value = line.removeprefix("export ").partition("=")
        if not equals or not key.strip().isidentifier():
            raise SystemExit(f"{path}:{number}: found a line that is not KEY=VALUE")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        values[key.strip()] = value
    missing = [key for key in REQUIRED if not values.get(key)]
    if missing:
        raise SystemExit(f"{path}: found no {', '.join(missing)}; expected every one of {', '.join(REQUIRED)}")
    given = [key for key in STORES if values.get(key)]
    if len(given) == 1:
        raise SystemExit(f"{path}: found {given[0]} alone; expected both of {' and '.join(STORES)} "
                         "(runs and their artifacts outside the cluster) or neither (both on the head)")
    return values


def server_environment(folder: Path, secret: dict[str, str]) -> dict[str, str]:
    """The server's environment: the secret file's values and, without a database, the head's own stores."""
    env = {**os.environ, **secret, "MLFLOW_DISABLE_TELEMETRY": "true",
           # MLflow's job runner (GenAI judges, trace roll-ups: nothing detsweep uses) stays off: its 8
           # processes held 1.3 GB here and the server answered after 18-20 s with them, 13-14 s without.
           "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
           "MLFLOW_AUTH_CONFIG_PATH": str(folder / "basic_auth.ini")}
    if not secret.get("MLFLOW_BACKEND_STORE_URI"):
        env |= {"MLFLOW_BACKEND_STORE_URI": f"sqlite:///{folder / 'mlflow.db'}",
                "MLFLOW_ARTIFACTS_DESTINATION": str(folder / "artifacts")}
    return env


def write_auth_config(folder: Path, database: str) -> None:
    """Users and permissions in the runs' database (their own tables): the file may hold its
    password, so only this user reads it."""
    path = folder / "basic_auth.ini"
    path.unlink(missing_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as out:
        out.write(AUTH_INI.format(database=database.replace("%", "%%")))


def start(folder: Path, secret_file: Path, port: int) -> subprocess.Popen:
    """Start the server and make detsweep's user; returns the server's process, left running."""
    secret = read_secret(secret_file)
    folder.mkdir(parents=True, exist_ok=True)
    env = server_environment(folder, secret)
    write_auth_config(folder, env["MLFLOW_BACKEND_STORE_URI"])
    if not secret.get("MLFLOW_BACKEND_STORE_URI"):
        print(f"detsweep: MLflow keeps its runs in {folder} on this node: they die with the cluster (ray down); "
              f"set {' and '.join(STORES)} in {secret_file} to keep them outside it", flush=True)
    with (folder / "server.log").open("a") as log:
        # nohup: the server outlives the shell that started it (ray up's SSH session)
        server = subprocess.Popen(["nohup", sys.executable, "-m", "mlflow", "server", "--app-name", "basic-auth",
                                   "--host", "0.0.0.0", "--port", str(port), "--serve-artifacts"],
                                  stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env)
    uri = f"http://127.0.0.1:{port}"
    try:
        wait_for_server(uri, server.pid)
    except SystemExit:
        print((folder / "server.log").read_text(errors="replace")[-2000:], file=sys.stderr)
        raise
    done = ensure_user(uri, ("admin", secret["MLFLOW_AUTH_ADMIN_PASSWORD"]), secret["MLFLOW_TRACKING_USERNAME"],
                       secret["MLFLOW_TRACKING_PASSWORD"])
    print(f"MLflow user {secret['MLFLOW_TRACKING_USERNAME']}: {done}", flush=True)
    return server


def collect(folder: Path, secret_file: Path, port: int) -> None:
    """``mlflow gc`` in this process, so the database's URI stays off every command line: the
    files of deleted checkpoints (and runs) go, through the server's artifact proxy, as admin."""
    from mlflow.cli import gc

    env = server_environment(folder, read_secret(secret_file))
    os.environ.update({key: env[key] for key in (*STORES, "MLFLOW_AUTH_ADMIN_PASSWORD")} | {
        "MLFLOW_TRACKING_URI": f"http://127.0.0.1:{port}", "MLFLOW_TRACKING_USERNAME": "admin",
        "MLFLOW_TRACKING_PASSWORD": env["MLFLOW_AUTH_ADMIN_PASSWORD"]})
    os.environ.update({key: value for key, value in env.items() if key.startswith("AWS_")})
    gc.main(["--backend-store-uri", env["MLFLOW_BACKEND_STORE_URI"]], standalone_mode=False)


def main(argv: list[str]) -> None:
    commands = {"start": start, "gc": collect}
    if len(argv) != 4 or argv[0] not in commands:
        raise SystemExit("usage: python -m detsweep.tracking.server start|gc FOLDER SECRET_FILE PORT")
    commands[argv[0]](Path(argv[1]), Path(argv[2]), int(argv[3]))


if __name__ == "__main__":
    main(sys.argv[1:])
