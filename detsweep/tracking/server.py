"""The cluster's MLflow tracking server, as ``ray_cluster.yaml`` runs it on the head:

    python -m detsweep.tracking.server tls FOLDER AUTHORITY_CERT
    python -m detsweep.tracking.server start FOLDER CREDENTIALS PORT [--head-secret SOURCE] [--tls AUTHORITY_CERT]
    python -m detsweep.tracking.server gc FOLDER PORT [--head-secret SOURCE] [--tls AUTHORITY_CERT]

CREDENTIALS is the trials' file (detsweep's user); SOURCE the head's secret
(``secretsmanager:NAME`` or a file: the admin's password, the app's session key and where the
runs live; :mod:`.credentials` says why they are apart). Where the runs live:

- ``MLFLOW_BACKEND_STORE_URI`` (``postgresql://user:password@host:5432/mlflow``, e.g. RDS)
  and ``MLFLOW_ARTIFACTS_DESTINATION`` (``s3://bucket/mlflow``): runs, registered models
  and checkpoints outside the cluster, so ``ray down`` loses nothing; users and permissions
  live in the same database. MLflow reads both from its environment: they are on no command
  line and in no log.
- neither, or no head secret at all: a try-it-out mode, a sqlite file and the artifacts under
  FOLDER on the head, which die with the cluster; the start says so in one line.

``tls`` makes the head's certificate (:mod:`.tls`); ``start --tls`` serves HTTPS with it.
Everything in the head's secret becomes the server's environment (``AWS_*`` for a bucket
reached with keys rather than the head's instance profile). ``start`` returns once the
server answers and detsweep's user exists. ``gc`` removes the files of what was deleted (the
checkpoints a trial no longer keeps): MLflow's deletion only marks them.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from pathlib import Path

from detsweep.adapters.mlflow import collect_garbage

from . import credentials, tls
from .backend import CERT_PATH
from .users import ensure_user, wait_for_server

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


def read_head_secret(folder: Path, source: str | None) -> tuple[dict[str, str], bool]:
    """The head's secret, or the head's own where there is none (try-it-out); and whether it was found."""
    found = credentials.head_secret(source) if source else None
    if found is not None:
        return found, True
    folder.mkdir(parents=True, exist_ok=True)
    return credentials.generated_head_secret(folder), False


def where_runs_go(folder: Path, found: bool, source: str | None) -> str:
    """The try-it-out server's one line: where its runs are, and how to keep them."""
    stores = " and ".join(credentials.STORES)
    advice = (f"set {stores} in the head's secret {source}" if found else
              f"create the head's secret {source or 'secretsmanager:NAME (--head-secret)'} with {stores}")
    return (f"detsweep: MLflow keeps its runs in {folder} on this node: they die with the cluster (ray down); "
            f"{advice} to keep them outside it")


def server_environment(folder: Path, secret: dict[str, str]) -> dict[str, str]:
    """The server's environment: the head's secret and, without a database, the head's own stores."""
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
    credentials.write_file(folder / "basic_auth.ini", AUTH_INI.format(database=database.replace("%", "%%")).encode())


def server_command(port: int, certificates: Path | None) -> list[str]:
    """MLflow's basic-auth app on every interface; HTTPS with the head's certificate (uvicorn's own TLS)."""
    command = [sys.executable, "-m", "mlflow", "server", "--app-name", "basic-auth", "--host", "0.0.0.0",
               "--port", str(port), "--serve-artifacts"]
    if certificates:  # MLflow splits the options as a shell would
        command += ["--uvicorn-opts", shlex.join(["--ssl-keyfile", str(certificates / tls.SERVER_KEY),
                                                  "--ssl-certfile", str(certificates / tls.SERVER_CERT)])]
    return command


def local_uri(port: int, authority: Path | None) -> str:
    return f"{'https' if authority else 'http'}://127.0.0.1:{port}"


def start(folder: Path, credentials_file: Path, port: int, head_source: str | None = None,
          authority: Path | None = None) -> subprocess.Popen:
    """Start the server and make detsweep's user; returns the server's process, left running.
    With ``authority`` (the certificate ``tls`` made), HTTPS."""
    user = credentials.trial_credentials(credentials_file)
    if authority and not (folder / "tls" / tls.SERVER_CERT).exists():
        raise SystemExit(f"{folder / 'tls'}: found no certificate; expected the one `tls {folder} {authority}` makes")
    secret, found = read_head_secret(folder, head_source)
    env = server_environment(folder, secret)
    write_auth_config(folder, env["MLFLOW_BACKEND_STORE_URI"])
    if not secret.get("MLFLOW_BACKEND_STORE_URI"):
        print(where_runs_go(folder, found, head_source), flush=True)
    with (folder / "server.log").open("a") as log:
        # nohup: the server outlives the shell that started it (ray up's SSH session)
        server = subprocess.Popen(["nohup", *server_command(port, folder / "tls" if authority else None)],
                                  stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env)
    uri = local_uri(port, authority)
    try:
        wait_for_server(uri, server.pid, authority)
    except SystemExit:
        print((folder / "server.log").read_text(errors="replace")[-2000:], file=sys.stderr)
        raise
    done = ensure_user(uri, ("admin", secret["MLFLOW_AUTH_ADMIN_PASSWORD"]), user["MLFLOW_TRACKING_USERNAME"],
                       user["MLFLOW_TRACKING_PASSWORD"], authority)
    print(f"MLflow user {user['MLFLOW_TRACKING_USERNAME']}: {done}", flush=True)
    return server


def collect(folder: Path, port: int, head_source: str | None = None, authority: Path | None = None) -> None:
    """``mlflow gc`` in this process, so the database's URI stays off every command line: the
    files of deleted checkpoints (and runs) go, through the server's artifact proxy, as admin."""
    env = server_environment(folder, read_head_secret(folder, head_source)[0])
    os.environ.update({key: env[key] for key in credentials.STORES} | {
        "MLFLOW_TRACKING_URI": local_uri(port, authority), "MLFLOW_TRACKING_USERNAME": "admin",
        "MLFLOW_TRACKING_PASSWORD": env["MLFLOW_AUTH_ADMIN_PASSWORD"]})
    os.environ.update({key: value for key, value in env.items() if key.startswith("AWS_")})
    if authority:
        os.environ[CERT_PATH] = str(authority)
    collect_garbage(env["MLFLOW_BACKEND_STORE_URI"], os.environ["MLFLOW_TRACKING_URI"])


def make_certificate(folder: Path, authority: Path) -> None:
    made = tls.ensure_certificate(folder / "tls", authority, tls.addresses())
    print(f"MLflow's certificate: {'made' if made else 'kept'} ({authority} signs it)", flush=True)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m detsweep.tracking.server")
    commands = parser.add_subparsers(dest="command", required=True)
    certificate = commands.add_parser("tls", help="the head's certificate")
    certificate.add_argument("folder", type=Path)
    certificate.add_argument("authority", type=Path)
    for name in ("start", "gc"):
        command = commands.add_parser(name)
        command.add_argument("folder", type=Path)
        if name == "start":
            command.add_argument("credentials", type=Path, help="the trials' file: detsweep's user")
        command.add_argument("port", type=int)
        command.add_argument("--head-secret", help="secretsmanager:NAME or a file on the head")
        command.add_argument("--tls", type=Path, help="the authority's certificate: serve HTTPS")
    args = parser.parse_args(argv)
    if args.command == "tls":
        make_certificate(args.folder, args.authority)
    elif args.command == "start":
        start(args.folder, args.credentials, args.port, args.head_secret, args.tls)
    else:
        collect(args.folder, args.port, args.head_secret, args.tls)


if __name__ == "__main__":
    main(sys.argv[1:])
