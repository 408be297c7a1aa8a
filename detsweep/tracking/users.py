"""detsweep's user on a tracking server running MLflow's basic-auth app: made, or its password
set anew, by the admin once the server answers (:mod:`.server` starts the cluster's)."""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import requests

from .backend import CERT_PATH


def wait_for_server(uri: str, pid: int | None = None, authority: Path | None = None, timeout_s: float = 300) -> None:
    """Until ``uri`` answers (with a certificate ``authority`` signed, for HTTPS); a server process
    (``pid``) that ended will not. Minutes on a busy machine: each of MLflow's web workers
    imports MLflow and checks both databases' schemas."""
    deadline = time.monotonic() + timeout_s
    while True:
        if pid is not None and not _alive(pid):
            raise SystemExit(f"{uri}: the MLflow server (pid {pid}) ended before it answered; see its log")
        try:
            if requests.get(f"{uri}/health", timeout=5, verify=str(authority) if authority else True).status_code == 200:
                return
        except requests.exceptions.SSLError as error:  # answering, with another certificate: waiting cannot help
            raise SystemExit(f"{uri}: the MLflow server's certificate was not signed by {authority} ({error})") from None
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


def ensure_user(uri: str, admin: tuple[str, str], username: str, password: str, authority: Path | None = None) -> str:
    """Create ``username`` with ``password``, or set that password if the user exists, as the
    admin, through MLflow's own client of the basic-auth app; returns what was done: "created"
    or "password set"."""
    from mlflow.exceptions import MlflowException

    # where MLflow's REST client reads them
    said = {"MLFLOW_TRACKING_USERNAME": admin[0], "MLFLOW_TRACKING_PASSWORD": admin[1]}
    if authority:
        said[CERT_PATH] = str(authority)
    # MLflow's server app, imported on the way, warns of starlette's future on stderr: not ours to say.
    with warnings.catch_warnings(), _environment(said):
        warnings.simplefilter("ignore")
        from mlflow.server import get_app_client

        client = get_app_client("basic-auth", tracking_uri=uri)
        try:
            client.get_user(username)
        except MlflowException as missing:
            if missing.error_code != "RESOURCE_DOES_NOT_EXIST":
                raise
            client.create_user(username, password)
            return "created"
        client.update_user_password(username, password)
        return "password set"


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
