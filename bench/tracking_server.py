"""The cluster's tracking server: requests/s of detsweep's trials against the server that
``ray_cluster.yaml`` starts (``cluster/mlflow_server.sh``, MLflow's basic-auth app), as shipped
and with MLflow's default auth settings (no credential cache), one after the other.

    .venv/bin/python -m bench.tracking_server [--smoke] [--requests N]
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

from .common import REPO, Entry, Target, arguments, free_port, record

SCRIPT = REPO / "cluster" / "mlflow_server.sh"
CACHE = "auth_cache_ttl_seconds = 60\n"
USER = {"MLFLOW_TRACKING_USERNAME": "detsweep", "MLFLOW_TRACKING_PASSWORD": "Bench-pass-for-detsweep"}


def requests_per_second(script_text: str, requests: int, folder: Path) -> float:
    """Start the server from ``script_text`` in ``folder``; time ``requests`` of a trial's kinds
    (a batch of metrics, then a read of its run) as detsweep's user; stop the server."""
    from mlflow import MlflowClient

    script, secret, port = folder / "mlflow_server.sh", folder / "mlflow.env", free_port()
    script.write_text(script_text)
    secret.write_text("".join(f"{name}={value}\n" for name, value in {
        "MLFLOW_AUTH_ADMIN_PASSWORD": "Bench-admin-for-detsweep", "MLFLOW_FLASK_SERVER_SECRET_KEY": "bench", **USER,
    }.items()))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    # The script leaves the server (and its workers) running in its process group: stopped at the end.
    started = subprocess.Popen(["bash", str(script), str(folder / "server"), str(secret), str(port)], cwd=REPO,
                               env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        if started.wait(timeout=400) != 0:  # the script waits up to 300 s
            raise SystemExit(f"{SCRIPT} failed: {started.stdout.read().decode()[-2000:]}")
        with mock.patch.dict(os.environ, USER):  # MLflow's client reads its credentials there
            client = MlflowClient(f"http://127.0.0.1:{port}")
            run_id = client.create_run(client.create_experiment("bench")).info.run_id
            pairs, clock = requests // 2, time.perf_counter()
            for step in range(pairs):
                client.log_metric(run_id, "train/loss", 1.0 / (step + 1), step=step)
                client.get_run(run_id)
            return 2 * pairs / (time.perf_counter() - clock)
    finally:
        stop_group(started)


def stop_group(started: subprocess.Popen) -> None:
    """SIGKILL the script's process group (the server, its web workers, its job consumers) and
    wait until none is left: each server holds about 1.5 GB."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(started.pid, signal.SIGKILL)
    for _ in range(100):
        try:
            os.killpg(started.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    raise SystemExit(f"the tracking server's processes (group {started.pid}) outlived SIGKILL")


def main() -> None:
    parser = arguments(__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args()
    requests = 6 if args.smoke else args.requests
    shipped = SCRIPT.read_text()
    assert CACHE in shipped, f"{SCRIPT} no longer sets {CACHE.strip()}: update this benchmark"
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
