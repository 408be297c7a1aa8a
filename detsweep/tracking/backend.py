"""Where MLflow runs go, checked before anything trains.

``tracking.uri`` in the config, else ``$MLFLOW_TRACKING_URI``, else the embedded default:
``mlflow.db`` (sqlite) and the ``mlartifacts/`` folder in the working directory, which
``mlflow ui`` and the model registry read as they are. On a cluster, an MLflow server
with artifact proxying (``mlflow server --serve-artifacts``): no node needs a shared disk.
Credentials for a server with basic auth come from ``MLFLOW_TRACKING_USERNAME`` and
``MLFLOW_TRACKING_PASSWORD`` and go nowhere else: a trial on a cluster's node inherits them
from its raylet. An HTTPS server's certificate is checked against the authority
``MLFLOW_TRACKING_SERVER_CERT_PATH`` names, as MLflow's own client does.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from detsweep.config import TrackingConfig
from detsweep.errors import DetsweepError

EMBEDDED_DB = "mlflow.db"
EMBEDDED_ARTIFACTS = "mlartifacts"
CERT_PATH = "MLFLOW_TRACKING_SERVER_CERT_PATH"  # the authority an HTTPS server's certificate is checked against


@dataclass(frozen=True)
class Backend:
    uri: str  # absolute: trial processes run in other working directories, maybe on other nodes
    artifact_root: str | None  # where a new experiment keeps its artifacts (embedded only)
    source: str  # what chose the uri, for error messages

    @property
    def is_server(self) -> bool:
        return self.uri.startswith(("http://", "https://"))


def resolve_backend(tracking: TrackingConfig, cwd: Path | None = None) -> Backend:
    cwd = cwd or Path.cwd()
    if tracking.uri:
        uri, source = tracking.uri, "tracking.uri"
    elif os.environ.get("MLFLOW_TRACKING_URI"):
        uri, source = os.environ["MLFLOW_TRACKING_URI"], "MLFLOW_TRACKING_URI"
    else:
        return Backend(f"sqlite:///{cwd / EMBEDDED_DB}", (cwd / EMBEDDED_ARTIFACTS).as_uri(), "the embedded default")
    if uri.startswith("sqlite:///"):
        database = cwd / uri.removeprefix("sqlite:///")  # a relative path joins cwd; an absolute one stays
        return Backend(f"sqlite:///{database}", database.parent.joinpath(EMBEDDED_ARTIFACTS).as_uri(), source)
    if uri.startswith(("http://", "https://")):
        return Backend(uri, None, source)
    raise DetsweepError(f"{source}: found {uri!r}, expected an http(s):// MLflow server or a sqlite:/// file")


def backend_of(link) -> Backend:
    """The backend a sweep's runs already live on (``detsweep resume`` keeps writing there)."""
    return Backend(link.uri, None, "the sweep's MLflow tracking URI")


def check_backend(backend: Backend, timeout_s: float = 10.0) -> None:
    """Fail before training starts when the server does not answer or refuses the credentials."""
    if not backend.is_server:
        return
    import requests

    user, password = os.environ.get("MLFLOW_TRACKING_USERNAME"), os.environ.get("MLFLOW_TRACKING_PASSWORD")
    url = backend.uri.rstrip("/") + "/api/2.0/mlflow/experiments/search"
    try:
        answer = requests.get(url, params={"max_results": 1}, timeout=timeout_s, verify=_certificate(),
                              auth=(user, password or "") if user else None)
    except requests.exceptions.SSLError as error:
        raise DetsweepError(f"{backend.source}: the MLflow server at {backend.uri} has a certificate this machine "
                            f"does not trust ({_ssl_reason(error)}); expected {CERT_PATH} naming the certificate "
                            "of the authority that signed it (the cluster's: README)") from None
    except requests.RequestException as error:
        raise DetsweepError(f"{backend.source}: no MLflow server answers at {backend.uri} "
                            f"({type(error).__name__})") from None
    if answer.status_code in (401, 403):
        given = "the credentials in MLFLOW_TRACKING_USERNAME/MLFLOW_TRACKING_PASSWORD" if user else "no credentials"
        raise DetsweepError(f"{backend.source}: the MLflow server at {backend.uri} refused {given} "
                            f"(HTTP {answer.status_code}); expected a user it accepts")
    if answer.status_code != 200:
        raise DetsweepError(f"{backend.source}: {backend.uri} answered HTTP {answer.status_code} "
                            "to an MLflow API call; expected an MLflow tracking server")


def _certificate() -> str | bool:
    """What MLflow's own client verifies a server with."""
    return os.environ.get(CERT_PATH) or True


def _ssl_reason(error: Exception) -> str:
    import re

    found = re.search(r"certificate verify failed: [^'\")(]+", str(error))
    return found.group(0).strip() if found else "the TLS handshake failed"


def check_readable(backend: Backend) -> None:
    """For commands that read runs: a server that answers, or a sqlite file that exists
    (opening a missing one would create it, empty)."""
    check_backend(backend)
    database = backend.uri.removeprefix("sqlite:///")
    if not backend.is_server and not Path(database).is_file():
        raise DetsweepError(f"{backend.source}: no MLflow database at {database} "
                            "(expected the folder a sweep ran in, or MLFLOW_TRACKING_URI)")


def ui_command_line(backend: Backend, port: int) -> list[str]:
    """``mlflow ui`` on the embedded backend: its sqlite file, its artifact folder."""
    import sys

    command = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", backend.uri, "--port", str(port)]
    if backend.artifact_root:
        command += ["--artifacts-destination", backend.artifact_root]
    return command


# MLflow's anonymous usage telemetry is off where either is set ("true"); a trial on another
# node logs too, so the choice travels with it (clusters are often private).
NO_TELEMETRY = ("MLFLOW_DISABLE_TELEMETRY", "DO_NOT_TRACK")


# One retry policy for a trial's writes, its writer's, with a deadline: MLflow's own HTTP
# retries would hold a call for minutes in a back-off of their own. Unless the user set it.
WRITER_SETTINGS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"}


def use_writer_settings() -> None:
    """This process's MLflow calls under the writer's settings, unless the user set them. A
    process that connects to Ray calls this before it does (see trial_environment)."""
    for name, value in WRITER_SETTINGS.items():
        os.environ.setdefault(name, value)


def trial_environment() -> dict[str, str]:
    """What a trial process on any node takes from this one: the telemetry choice, if set, and
    the writer's settings. They are in its environment as it starts: a variable added later,
    while Ray's threads read theirs, can crash the process (glibc's ``setenv`` frees the array
    ``getenv`` reads). Not the server's credentials: a job's environment is shown by Ray's
    State API and dashboard, so each node's raylet holds them (``python -m
    detsweep.tracking.credentials``) and its workers inherit them; a local cluster's raylet is
    this process's child and inherits them too."""
    return ({name: os.environ[name] for name in NO_TELEMETRY if os.environ.get(name)}
            | {name: os.environ.get(name, value) for name, value in WRITER_SETTINGS.items()})
