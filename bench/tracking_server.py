"""The cluster's tracking server: requests/s of detsweep's trials against the server that
``ray_cluster.yaml`` starts (``cluster/mlflow_server.sh``, MLflow's basic-auth app), as shipped
and with MLflow's default auth settings (no credential cache), one after the other.

    .venv/bin/python -m bench.tracking_server [--smoke] [--requests N]
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

from .common import Entry, Target, arguments, free_port, record

CACHE = "auth_cache_ttl_seconds = 60\n"
USER = {"MLFLOW_TRACKING_USERNAME": "detsweep", "MLFLOW_TRACKING_PASSWORD": "Bench-pass-for-detsweep"}


def smoke_servers() -> None:
    """The smoke's servers (``--smoke``, here and in ``bench.tracking_load``) run two web workers,
    not MLflow's default four: four importing MLflow at once on 2 cores answered 3 s later, at
    every start (the suite's time is counted). Two still share the requests, as the shipped four do."""
    os.environ.setdefault("MLFLOW_WORKERS", "2")


def requests_per_second(auth_ini: str, requests: int, folder: Path) -> float:
    """Start the server as ``cluster/mlflow_server.sh`` does (``detsweep.tracking.server``) with
    ``auth_ini`` as its auth settings, in ``folder``; time ``requests`` of a trial's kinds (a
    batch of metrics, then a read of its run) as detsweep's user; stop the server."""
    from mlflow import MlflowClient

    from detsweep.tracking import server

    credentials, port = folder / "mlflow.env", free_port()
    credentials.write_text("".join(f"{name}={value}\n" for name, value in USER.items()))
    path = {"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    with mock.patch.object(server, "AUTH_INI", auth_ini), mock.patch.dict(os.environ, path):
        started = server.start(folder / "server", credentials, port)  # the head's own admin: a try-it-out server
    try:
        with mock.patch.dict(os.environ, USER):  # MLflow's client reads its credentials there
            client = MlflowClient(f"http://127.0.0.1:{port}")
            run_id = client.create_run(client.create_experiment("bench")).info.run_id
            pairs, clock = requests // 2, time.perf_counter()
            for step in range(pairs):
                client.log_metric(run_id, "train/loss", 1.0 / (step + 1), step=step)
                client.get_run(run_id)
            return 2 * pairs / (time.perf_counter() - clock)
    finally:
        stop_tree(started.pid)


def stop_tree(pid: int) -> None:
    """SIGKILL the server and every process it started (its web workers) and wait until none
    is left: each server holds about 1.5 GB."""
    import psutil

    with contextlib.suppress(psutil.NoSuchProcess):
        root = psutil.Process(pid)
        family = [root, *root.children(recursive=True)]
        for process in family:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        _, alive = psutil.wait_procs(family, timeout=10)
        if alive:
            raise SystemExit(f"the tracking server's processes {[p.pid for p in alive]} outlived SIGKILL")


def main() -> None:
    parser = arguments(__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args()
    requests = 6 if args.smoke else args.requests
    if args.smoke:
        smoke_servers()
    from detsweep.tracking.server import AUTH_INI as shipped

    assert CACHE in shipped, f"detsweep/tracking/server.py no longer sets {CACHE.strip()}: update this benchmark"
    with tempfile.TemporaryDirectory() as scratch:
        rates = {}
        for name, text in (("MLflow's default (no credential cache)", shipped.replace(CACHE, "")),
                           ("as shipped (credentials cached 60 s)", shipped)):
            folder = Path(scratch, str(len(rates)))
            folder.mkdir()
            rates[name] = requests_per_second(text, requests, folder)
    default, ours = rates.values()
    record("tracking_server", Entry(
        title="The cluster's tracking server with basic auth: requests/s (bench/tracking_server.py)",
        settings={"script": "cluster/mlflow_server.sh", "requests": requests},
        rows=[["server", "requests/s", "vs MLflow's default"], *[[name, rate, rate / default]
                                                                 for name, rate in rates.items()]],
        targets=[Target("as shipped vs MLflow's default", ">= 2", ours / default, ours / default >= 2)],
        notes=["One client, requests one after the other: a metric logged, then its run read, as a trial's "
               "driver and the sweep's checks do. Without the cache the server hashes the password (scrypt) "
               "at every request."],
    ), args.out)


if __name__ == "__main__":
    main()
