"""``python -m detsweep.tracking.users URI [SERVER_PID]``: on a tracking server running MLflow's basic-auth
app, make sure the user named in ``MLFLOW_TRACKING_USERNAME`` exists with the password in
``MLFLOW_TRACKING_PASSWORD``, acting as the admin (``MLFLOW_AUTH_ADMIN_USERNAME``, default
``admin``, and ``MLFLOW_AUTH_ADMIN_PASSWORD``). The cluster's head runs it once its server
is up (``cluster/mlflow_server.sh``); run again, it sets the password anew."""

from __future__ import annotations

import os
import sys
import time

import requests

USERS = "/api/2.0/mlflow/users"


def wait_for_server(uri: str, pid: int | None = None, timeout_s: float = 300) -> None:
    """Until ``uri`` answers; a server process (``pid``) that ended will not. Minutes on a busy
    machine: each of MLflow's web workers imports MLflow and checks both databases' schemas."""
    deadline = time.monotonic() + timeout_s
    while True:
        if pid is not None and not _alive(pid):
            raise SystemExit(f"{uri}: the MLflow server (pid {pid}) ended before it answered; see its log")
        try:
            if requests.get(f"{uri}/health", timeout=5).status_code == 200:
                return
        except requests.RequestException:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"{uri}: no MLflow server answered in {timeout_s:.0f} s")
        time.sleep(1)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return not _zombie(pid)


def _zombie(pid: int) -> bool:
    try:
        return open(f"/proc/{pid}/stat").read().split(") ")[1].startswith("Z")
    except OSError:  # no /proc here: trust kill's answer
        return False


def ensure_user(uri: str, admin: tuple[str, str], username: str, password: str) -> str:
    """Create ``username`` with ``password``, or set that password if the user exists; returns
    what was done: "created" or "password set"."""
    session = requests.Session()
    session.auth = admin
    found = session.get(f"{uri}{USERS}/get", params={"username": username}, timeout=30)
    if found.status_code == 404:
        session.post(f"{uri}{USERS}/create", json={"username": username, "password": password},
                     timeout=30).raise_for_status()
        return "created"
    found.raise_for_status()
    session.patch(f"{uri}{USERS}/update-password", json={"username": username, "password": password},
                  timeout=30).raise_for_status()
    return "password set"


def main(argv: list[str]) -> None:
    uri, pid = argv[0], int(argv[1]) if len(argv) > 1 else None
    admin = (os.environ.get("MLFLOW_AUTH_ADMIN_USERNAME", "admin"), os.environ["MLFLOW_AUTH_ADMIN_PASSWORD"])
    username, password = os.environ["MLFLOW_TRACKING_USERNAME"], os.environ["MLFLOW_TRACKING_PASSWORD"]
    wait_for_server(uri, pid)
    print(f"MLflow user {username}: {ensure_user(uri, admin, username, password)}")


if __name__ == "__main__":
    main(sys.argv[1:])
