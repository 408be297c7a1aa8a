"""The real parts a cluster uses, on loopback: an S3 API server (moto's standalone
``moto_server``, as Ray's own storage tests use), a PostgreSQL server (Debian's) for
MLflow's runs, and a Ray cluster whose worker nodes Ray's own autoscaler starts and stops
(its ``fake_multinode`` provider: every node it adds is a real raylet on this machine). Each
is started once and shared (``conftest.py``)."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

from bench.common import free_port

BIN = Path(sys.executable).parent


@dataclass(frozen=True)
class S3Server:
    endpoint: str

    @property
    def env(self) -> dict[str, str]:
        """What a process needs to reach it, as a user's would to reach AWS: pyarrow and boto3
        both read ``AWS_ENDPOINT_URL``; moto takes any credentials."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": "detsweep-tests",
                "AWS_SECRET_ACCESS_KEY": "detsweep-tests", "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id="detsweep-tests",
                            aws_secret_access_key="detsweep-tests", region_name="us-east-1")

    def new_bucket(self, name: str) -> str:
        self.client().create_bucket(Bucket=name)
        return name

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return [item["Key"] for page in pages for item in page.get("Contents", [])]

    def read(self, uri: str) -> str:
        """The text of the object at ``s3://bucket/key``."""
        bucket, key = uri.removeprefix("s3://").split("/", 1)
        return self.client().get_object(Bucket=bucket, Key=key)["Body"].read().decode()

    def upload(self, folder: Path, bucket: str, prefix: str) -> str:
        """Every file under ``folder`` to ``s3://bucket/prefix/…``; returns that URI."""
        client = self.client()
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                client.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(folder).as_posix()}")
        return f"s3://{bucket}/{prefix}"


@contextlib.contextmanager
def s3_server(log: Path) -> Iterator[S3Server]:
    port = free_port()
    server = subprocess.Popen([str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                              stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        endpoint = f"http://127.0.0.1:{port}"
        _wait_for(lambda: _answers(endpoint), 60, f"moto_server on port {port}")
        yield S3Server(endpoint)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
        server.wait()


@dataclass(frozen=True)
class TrackingStack:
    """A tracking server started as the cluster's head starts it, on a database and a bucket."""

    uri: str
    secret: dict[str, str]  # what its secret file holds
    s3: S3Server
    bucket: str  # its artifacts' bucket
    folder: Path  # the "head's" folders, the database's, the secret file
    said: str  # what its start printed
    authority: Path  # the certificate its clients trust

    @property
    def client_env(self) -> dict[str, str]:
        """What a client of the cluster holds: the server's address, the certificate to trust and
        detsweep's user, nothing of the bucket."""
        return {"MLFLOW_TRACKING_URI": self.uri, "MLFLOW_TRACKING_SERVER_CERT_PATH": str(self.authority),
                "MLFLOW_TRACKING_USERNAME": self.secret["MLFLOW_TRACKING_USERNAME"],
                "MLFLOW_TRACKING_PASSWORD": self.secret["MLFLOW_TRACKING_PASSWORD"]}


@contextlib.contextmanager
def postgres_server(folder: Path) -> Iterator[str]:
    """A throwaway PostgreSQL cluster (``initdb``, ``pg_ctl``) on a free loopback port, run as
    ``postgres`` when the tests run as root (its server refuses root); yields the URI of an
    empty database ``mlflow`` owned by a user with a password, as a managed database gives."""
    [bin_dir] = sorted(Path("/usr/lib/postgresql").glob("*/bin"))[-1:]
    as_owner = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    folder.mkdir(parents=True, exist_ok=True)
    password = secrets.token_urlsafe(16)
    (folder / "password").write_text(password)
    if as_owner:
        shutil.chown(folder, "postgres", "postgres")
        shutil.chown(folder / "password", "postgres", "postgres")
    port = free_port()
    env = {**os.environ, "PGPASSWORD": password}
    subprocess.run([*as_owner, str(bin_dir / "initdb"), "-D", str(folder / "data"), "-U", "detsweep", "-A",
                    "scram-sha-256", "--pwfile", str(folder / "password")], check=True, capture_output=True)
    subprocess.run([*as_owner, str(bin_dir / "pg_ctl"), "-D", str(folder / "data"), "-l", str(folder / "server.log"),
                    "-w", "-o", f"-p {port} -k {folder} -c listen_addresses=127.0.0.1", "start"],
                   check=True, capture_output=True)
    try:
        subprocess.run([str(bin_dir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "detsweep", "mlflow"],
                       check=True, capture_output=True, env=env)
        yield f"postgresql://detsweep:{password}@127.0.0.1:{port}/mlflow"
    finally:
        subprocess.run([*as_owner, str(bin_dir / "pg_ctl"), "-D", str(folder / "data"), "-m", "immediate", "stop"],
                       capture_output=True)


def _answers(url: str) -> bool:
    import urllib.request

    try:
        urllib.request.urlopen(url, timeout=2).close()
        return True
    except OSError:
        return False


def _wait_for(ready, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not ready():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not come up in {seconds:.0f} s")
        time.sleep(0.5)


WORKER_TYPE = "cpu_worker"


def fake_cluster_config(port: int, idle_minutes: float = 0.1) -> dict:
    """Shaped like ``ray_cluster.yaml``: a head that trains nothing (0 CPUs) and one worker
    type started from zero, scaled to this machine (a CPU each, at most two)."""
    commands = ("initialization_commands", "setup_commands", "head_setup_commands", "worker_setup_commands",
                "head_start_ray_commands", "worker_start_ray_commands")
    return {
        "cluster_name": "detsweep-tests", "max_workers": 2, "upscaling_speed": 1.0, "idle_timeout_minutes": idle_minutes,
        # The provider joins the nodes it adds to the head at this GCS address (default: port 6379).
        "provider": {"type": "fake_multinode", "use_node_id_as_ip": True, "disable_node_updaters": True,
                     "disable_launch_config_check": True, "gcs_address": f"127.0.0.1:{port}"},
        "auth": {}, "docker": {},
        "available_node_types": {
            # The fake provider's head is of this type, whatever the config calls it.
            "ray.head.default": {"resources": {"CPU": 0}, "node_config": {}, "max_workers": 0},
            WORKER_TYPE: {"resources": {"CPU": 1}, "node_config": {}, "min_workers": 0, "max_workers": 2},
        },
        "head_node_type": "ray.head.default",
        "file_mounts": {}, "cluster_synced_files": [], "file_mounts_sync_continuously": False,
        "rsync_exclude": [], "rsync_filter": [], **{key: [] for key in commands},
    }


# Ray 2.60 turns token authentication on for a cluster `ray start` starts wherever a token
# exists, and a local `ray.init` in an earlier test leaves one in the tests' home: the mode is
# set, for the cluster and for every client of it, rather than left to what ran before.
AUTH = {"RAY_AUTH_MODE": "disabled"}


@dataclass(frozen=True)
class AutoscalingCluster:
    address: str
    config: Path  # the cluster config its autoscaler runs on
    dashboard: str  # its State API's HTTP address
    env = AUTH  # what a client process needs to reach it

    def alive_nodes(self) -> list:
        """From the cluster's own State API over HTTP: this process never joins the cluster
        (``ray.init`` here would tie it to whatever Ray state earlier tests left), nor opens a
        GCS client (given the GCS's address, the State API does, and once that GCS is gone Ray
        ends this whole process at its next Ray call, 60 s later, with exit status 1)."""
        from ray.util.state import list_nodes

        return list_nodes(address=self.dashboard, filters=[("state", "=", "ALIVE")], detail=True,
                          raise_on_missing_output=False)

    def worker_nodes(self) -> list:
        return [node for node in self.alive_nodes() if not node.is_head_node]

    def head_node(self) -> str:
        [head] = [node.node_id for node in self.alive_nodes() if node.is_head_node]
        return head


@contextlib.contextmanager
def autoscaling_cluster(folder: Path, env: dict[str, str]) -> Iterator[AutoscalingCluster]:
    """``ray start --head --num-cpus=0 --autoscaling-config=…`` with the fake provider; every
    process it starts, the nodes its autoscaler adds included, is in the command's session and
    stopped with it at the end (``ray stop`` would stop every Ray cluster on the machine)."""
    port = free_port()
    config = folder / "cluster.yaml"
    config.write_text(yaml.safe_dump(fake_cluster_config(port)))
    # The autoscaler looks every 3 s: a node is seen to be missing a few seconds before it is added.
    with ray_start_head(folder, port, ["--num-cpus=0", f"--autoscaling-config={config}"],
                        {**env, "RAY_FAKE_CLUSTER": "1", "AUTOSCALER_UPDATE_INTERVAL_S": "3"}) as dashboard:
        yield AutoscalingCluster(f"127.0.0.1:{port}", config, dashboard)


@contextlib.contextmanager
def ray_start_head(folder: Path, port: int, flags: list[str], env: dict[str, str]) -> Iterator[str]:
    """``ray start --head --block`` on ``port`` with ``flags``, in a session of its own that is
    killed at the end; yields its dashboard's address once its State API answers."""
    dashboard_port = free_port()
    head = subprocess.Popen([str(BIN / "ray"), "start", "--head", "--block", f"--port={port}",
                             "--node-ip-address=127.0.0.1", f"--dashboard-port={dashboard_port}", *flags],
                            env={**os.environ, **env, **AUTH}, stdout=(folder / "head.log").open("w"),
                            stderr=subprocess.STDOUT, start_new_session=True)
    dashboard = f"http://127.0.0.1:{dashboard_port}"
    try:
        _wait_for(lambda: head.poll() is None and _gcs_up(port), 120, "the cluster's head")
        _wait_for(lambda: _answers_state(dashboard), 120, "the cluster's State API")
        yield dashboard
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(head.pid, signal.SIGKILL)
        head.wait()


def _answers_state(dashboard: str) -> bool:
    from ray.util.state import list_nodes

    try:
        return len(list_nodes(address=dashboard, filters=[("state", "=", "ALIVE")], raise_on_missing_output=False)) == 1
    except Exception:  # the dashboard that serves it is still starting
        return False


def _gcs_up(port: int) -> bool:
    import socket

    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        return True
    except OSError:
        return False
