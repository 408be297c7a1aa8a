"""The cluster's tracking stack under a sweep's writes: 200 trials' worth of params, metrics and
checkpoints from 8 concurrent Ray actors standing in for trials, through MLflow's basic-auth
server over HTTPS on PostgreSQL and an S3 bucket (moto's server), the server restarted twice mid-run.
Writes/s, each write's latency from submit to done, and lost writes as a trial's writer counts them.

    .venv/bin/python -m bench.tracking_load [--smoke] [--trials 200] [--actors 8] [--checkpoint-mb 20]

A trial writes as ``detsweep.tracking.trial_run`` does, every write through its own
``RetryingWriter``: its run (found by its tag when an earlier attempt made it, else made), 80
params in one batch, 10 metrics at each of 60 steps (a batch a step), 3 checkpoints
(``log_checkpoint``: a LoggedModel made, uploaded, READY, with its step's metrics) and its
run's end. It submits its next write as soon as the stack took the last one (one write in
flight per actor), so the latency is the stack's, retries included, never a queue's. Each
actor runs its share of the trials one after another. Afterwards every run is read back.

``--smoke``: 4 trials of 6 steps, 1 MB checkpoints, the server's two web workers
(``tracking_server.smoke_servers``). ``tracking_stack`` is the one place that
knows how the stack is started (``detsweep.tracking.server``'s API).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import ray

from detsweep.tracking.backend import CERT_PATH
from detsweep.tracking.writer import RetryingWriter

from .common import Entry, Target, arguments, free_port, record
from .tracking_server import smoke_servers, stop_tree

PARAMS, METRICS, CHECKPOINTS, RESTARTS = 80, 10, 3, 2
USER = {"MLFLOW_TRACKING_USERNAME": "detsweep", "MLFLOW_TRACKING_PASSWORD": "Bench-pass-for-detsweep"}
HEAD_SECRET = {"MLFLOW_AUTH_ADMIN_PASSWORD": "Bench-admin-for-detsweep", "MLFLOW_FLASK_SERVER_SECRET_KEY": "bench"}
BUCKET = "mlflow-artifacts"
SECRET_NAME = "detsweep/mlflow-head"  # the head's secret, in moto's Secrets Manager as in AWS's
WAIT_PER_WRITE_S = 300  # a write the stack never takes is left to the writer's close: the trial goes on
CLOSE_S = 120.0  # as TrialRun.finish gives its writer


@dataclass(frozen=True)
class Shape:
    trials: int
    steps: int
    checkpoint_mb: int

    @property
    def writes_per_trial(self) -> int:
        return 1 + 1 + self.steps + CHECKPOINTS + 1  # the run, its params, a batch a step, checkpoints, its end

    @property
    def checkpoint_steps(self) -> list[int]:
        return [self.steps * (n + 1) // CHECKPOINTS - 1 for n in range(CHECKPOINTS)]


class Stack:
    """A running tracking stack: the MLflow server's address, what a trial's process holds to
    reach it (its address, the certificate to trust, detsweep's user), and ``restart``."""

    def __init__(self, folder: Path, credentials: Path, head_secret: str, s3):
        import psutil

        from detsweep.tracking import server

        self.folder, self.credentials, self.head_secret, self.s3 = folder, credentials, head_secret, s3
        self.authority, self.port = folder / "ca.crt", free_port()
        server.make_certificate(folder / "head", self.authority)  # as the head's set-up does, once
        self.uri = f"https://127.0.0.1:{self.port}"
        self.client_env = {"MLFLOW_TRACKING_URI": self.uri, CERT_PATH: str(self.authority), **USER}
        port = s3.endpoint.rsplit(":", 1)[1]
        self.moto = next(p for p in psutil.Process().children() if "moto_server" in " ".join(p.cmdline())
                         and port in p.cmdline())
        self.server = self._start()

    def _start(self) -> subprocess.Popen:
        from detsweep.tracking import server

        # MLflow runs uvicorn from PATH; the head reaches Secrets Manager and the bucket (moto's) as AWS
        env = {"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", **self.s3.env}
        with mock.patch.dict(os.environ, env):
            return server.start(self.folder / "head", self.credentials, self.port, self.head_secret, self.authority)

    def restart(self) -> None:
        """SIGKILL the server and its web workers (a crash, requests in flight cut), then start it
        again on the same port, certificate and stores: the runs are in PostgreSQL, the files in S3."""
        stop_tree(self.server.pid)
        self.server = self._start()


@contextlib.contextmanager
def tracking_stack(folder: Path) -> Iterator[Stack]:
    """The cluster's stack, as ``tests/conftest.py``'s ``tracking_stack`` assembles it: S3 (moto)
    and PostgreSQL outside "the cluster", MLflow's basic-auth server on them over HTTPS, the
    trials' credentials in their file and the head's secret in Secrets Manager. ``folder`` must be
    readable by user postgres."""
    import boto3

    from tests.cluster_parts import postgres_server, s3_server

    with s3_server(folder / "s3.log") as s3, postgres_server(folder / "postgres") as database:
        head = {**HEAD_SECRET, "MLFLOW_BACKEND_STORE_URI": database,
                "MLFLOW_ARTIFACTS_DESTINATION": f"s3://{s3.new_bucket(BUCKET)}/mlflow"}
        boto3.client("secretsmanager", endpoint_url=s3.endpoint, region_name=s3.env["AWS_DEFAULT_REGION"],
                     aws_access_key_id="bench", aws_secret_access_key="bench").create_secret(
            Name=SECRET_NAME, SecretString="".join(f"{key}={value}\n" for key, value in head.items()))
        (folder / "mlflow.env").write_text("".join(f"{key}={value}\n" for key, value in USER.items()))
        (folder / "mlflow.env").chmod(0o600)
        stack = Stack(folder, folder / "mlflow.env", f"secretsmanager:{SECRET_NAME}", s3)
        try:
            yield stack
        finally:
            stop_tree(stack.server.pid)


def checkpoint_folder(folder: Path, megabytes: int) -> Path:
    """Shaped like a TensorFlow checkpoint: one data file of ``megabytes`` of random bytes (moto
    cannot compress them away), its index and the pointer file."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ckpt-1.data-00000-of-00001").write_bytes(os.urandom(megabytes * 2 ** 20))
    (folder / "ckpt-1.index").write_bytes(os.urandom(4096))
    (folder / "checkpoint").write_text('model_checkpoint_path: "ckpt-1"\n')
    return folder


@ray.remote(num_cpus=0, max_concurrency=2)  # a second thread answers written() while run() works
class Trials:
    """Trials one after another, each writing through a RetryingWriter of its own."""

    def __init__(self, experiment_id: str, shape: Shape, folder: str):
        from mlflow import MlflowClient

        self.client, self.experiment_id, self.shape = MlflowClient(), experiment_id, shape
        self.checkpoint = checkpoint_folder(Path(folder), shape.checkpoint_mb)
        self.latencies: list[tuple[str, float]] = []  # (kind, seconds from submit to done)
        self.attempts = 0  # calls made, retries included
        self.lost: list[str] = []

    def written(self) -> int:
        return len(self.latencies)

    def run(self, trials: list[int]) -> dict:
        for number in trials:
            self.lost += [f"trial {number}: {what}" for what in self.trial(number)]
        return {"latencies": self.latencies, "attempts": self.attempts, "lost": self.lost}

    def trial(self, number: int) -> list[str]:
        """One trial's writes; returns what its writer lost."""
        from mlflow.entities import Metric, Param

        writer, run = RetryingWriter(), {}
        self.write(writer, "run", "opening the run", lambda: run.update(id=self.open_run(number)))
        if "id" not in run:  # refused: nothing else can be written
            return writer.close(CLOSE_S)
        params = [Param(f"param/{n:02d}", str(n / 100)) for n in range(PARAMS)]
        self.write(writer, "params", "the params", lambda: self.client.log_batch(run["id"], params=params))
        for step in range(self.shape.steps):
            # stamped once, as a trial stamps its report: a retry sends the same points. Bound now:
            # a write left queued (WAIT_PER_WRITE_S) runs after the loop moved on.
            now = int(time.time() * 1000)
            points = [Metric(f"train/m{k}", 1 / (step + k + 1), now, step) for k in range(METRICS)]
            self.write(writer, "metrics", f"metrics at step {step}",
                       lambda points=points: self.client.log_batch(run["id"], metrics=points))
            if step in self.shape.checkpoint_steps:
                self.write(writer, "checkpoint", f"the checkpoint at step {step}",
                           lambda step=step, points=points: self.log_checkpoint(run["id"], step, points))
        self.write(writer, "run", "the run's end", lambda: self.client.set_terminated(run["id"]))
        return writer.close(CLOSE_S)

    def write(self, writer: RetryingWriter, kind: str, what: str, call: Callable[[], object]) -> None:
        """Submit ``call`` and wait until the stack took it, the writer refused it, or
        ``WAIT_PER_WRITE_S`` passed (then it stays queued: the writer's close decides)."""
        done, submitted, refused = threading.Event(), time.perf_counter(), len(writer.lost)

        def timed() -> None:
            self.attempts += 1
            call()
            self.latencies.append((kind, time.perf_counter() - submitted))
            done.set()

        writer.submit(what, timed)
        while not done.wait(1.0) and len(writer.lost) == refused and time.perf_counter() - submitted < WAIT_PER_WRITE_S:
            pass

    def open_run(self, number: int) -> str:
        """Found by its tag when an earlier attempt made it and the answer was lost (as TrialRun does)."""
        from detsweep.tracking.trial_run import TRIAL_TAG, RunLink, find_trial_run

        found = find_trial_run(self.client, RunLink(os.environ["MLFLOW_TRACKING_URI"], self.experiment_id, None),
                               f"bench-{number}")
        return found.info.run_id if found else self.client.create_run(
            self.experiment_id, run_name=f"trial-{number:03d}", tags={TRIAL_TAG: f"bench-{number}"}).info.run_id

    def log_checkpoint(self, run_id: str, step: int, points: list) -> None:
        from detsweep.tracking.checkpoint_models import log_checkpoint

        log_checkpoint(self.client, self.experiment_id, run_id, self.checkpoint, step, points)


def moto_memory(process) -> tuple[float, float]:
    """moto's resident MB, and the MB of objects it spooled to temporary files (deleted, open)."""
    spooled = 0
    for fd in Path(f"/proc/{process.pid}/fd").iterdir():
        with contextlib.suppress(OSError):  # closed meanwhile
            if os.readlink(fd).endswith("(deleted)"):
                spooled += fd.stat().st_size
    return process.memory_info().rss / 2 ** 20, spooled / 2 ** 20


def run_with_restarts(stack: Stack, actors: list, shares: list[list[int]], total_writes: int) -> dict:
    """Run every actor's share; restart the server when a third and two thirds of the writes
    are done (counted by writes, not trials, so both fall mid-run at any size)."""
    marks = [total_writes * (n + 1) // (RESTARTS + 1) for n in range(RESTARTS)]
    futures = [actor.run.remote(share) for actor, share in zip(actors, shares)]
    restarts, peak_rss, peak_spooled = [], 0.0, 0.0
    while len(ray.wait(futures, num_returns=len(futures), timeout=0.5)[0]) < len(futures):
        written = sum(ray.get([actor.written.remote() for actor in actors]))
        if len(restarts) < RESTARTS and written >= marks[len(restarts)]:
            print(f"restarting the MLflow server after {written} of {total_writes} writes", flush=True)
            stack.restart()
            restarts.append(written)
        rss, spooled = moto_memory(stack.moto)
        peak_rss, peak_spooled = max(peak_rss, rss), max(peak_spooled, spooled)
    return {"results": ray.get(futures), "restarts": restarts, "moto_rss_mb": peak_rss, "moto_spooled_mb": peak_spooled}


@dataclass(frozen=True)
class RunCheck:
    complete: bool  # every metric's history has each step once, in step order; the run has its params
    ready: int  # READY checkpoints at the expected steps
    pending: int  # PENDING ones: uploads a restart cut, then made again
    doubled: int  # READY ones at a step that already has one: a retry after the READY was written


def check_run(client, experiment_id: str, run, shape: Shape) -> RunCheck:
    from detsweep.tracking.checkpoint_models import checkpoints, is_ready, step_of

    histories = [client.get_metric_history(run.info.run_id, f"train/m{k}") for k in range(METRICS)]
    complete = len(run.data.params) == PARAMS and all(
        [m.step for m in sorted(history, key=lambda m: (m.timestamp, m.step))] == list(range(shape.steps))
        for history in histories)
    models = checkpoints(client, [experiment_id], run.info.run_id, ready=False)
    ready = [step_of(model) for model in models if is_ready(model)]
    return RunCheck(complete, len(set(ready) & set(shape.checkpoint_steps)), len(models) - len(ready),
                    len(ready) - len(set(ready)))


def check_runs(stack: Stack, experiment_id: str, shape: Shape) -> dict:
    from mlflow import MlflowClient

    client = MlflowClient(stack.uri)
    runs = client.search_runs([experiment_id], max_results=2 * shape.trials + 10)  # a run made twice shows
    with ThreadPoolExecutor(4) as pool:
        checked = list(pool.map(lambda run: check_run(client, experiment_id, run, shape), runs))
    pages = stack.s3.client().get_paginator("list_objects_v2").paginate(Bucket=BUCKET)
    return {"runs": len(runs), **{field: sum(getattr(c, field) for c in checked)
                                  for field in ("complete", "ready", "pending", "doubled")},
            "bucket_mb": sum(item["Size"] for page in pages for item in page.get("Contents", [])) / 2 ** 20}


def percentiles(seconds: list[float]) -> tuple[float, float]:
    import numpy

    return tuple(numpy.percentile(seconds, [50, 99]) * 1000) if seconds else (float("nan"), float("nan"))


def load(shape: Shape, actors: int) -> tuple[dict, dict, float]:
    """Start the stack, run the trials on ``actors`` Ray actors with two restarts, read the runs back."""
    from mlflow import MlflowClient

    folder = Path(tempfile.mkdtemp(prefix="detsweep-tracking-load-"))
    folder.chmod(0o755)  # postgres reads its folder in it
    try:
        with tracking_stack(folder) as stack, mock.patch.dict(os.environ, stack.client_env):
            experiment_id = MlflowClient(stack.uri).create_experiment("bench-tracking-load")
            ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
            try:
                # The actors inherit the server, certificate and user from the raylet, this process's
                # child, as trials do; MLflow's own retries off, as TrialRun: the writer retries.
                env = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"}
                pool = [Trials.options(runtime_env={"env_vars": env}).remote(experiment_id, shape,
                                                                             str(folder / f"ckpt-{n}"))
                        for n in range(actors)]
                ray.get([actor.written.remote() for actor in pool])  # started: their imports are not timed
                clock = time.perf_counter()
                ran = run_with_restarts(stack, pool, [list(range(shape.trials))[n::actors] for n in range(actors)],
                                        shape.trials * shape.writes_per_trial)
                wall = time.perf_counter() - clock
            finally:
                ray.shutdown()
            return ran, check_runs(stack, experiment_id, shape), wall
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    parser = arguments(__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--actors", type=int, default=8)
    parser.add_argument("--checkpoint-mb", type=int, default=20)
    args = parser.parse_args()
    shape = Shape(4, 6, 1) if args.smoke else Shape(args.trials, 60, args.checkpoint_mb)
    if args.smoke:
        smoke_servers()
    actors = min(args.actors, shape.trials)
    ran, checked, wall = load(shape, actors)
    latencies = [latency for result in ran["results"] for latency in result["latencies"]]
    lost = [what for result in ran["results"] for what in result["lost"]]
    retries = sum(result["attempts"] for result in ran["results"]) - len(latencies)
    expected_ready = shape.trials * CHECKPOINTS
    p50, p99 = percentiles([seconds for _, seconds in latencies])
    rows = [["figure", "value"], ["trials", shape.trials], ["writes done", len(latencies)],
            ["writes/s", len(latencies) / wall], ["latency p50 (ms)", p50], ["latency p99 (ms)", p99],
            ["lost writes", len(lost)], ["calls retried", retries],
            ["server restarts (after write n)", ", ".join(map(str, ran["restarts"])) or "none"],
            ["wall time (s)", wall],
            ["MB of checkpoints written", sum(k == "checkpoint" for k, _ in latencies) * shape.checkpoint_mb],
            ["runs complete (histories in step order, params)", f"{checked['complete']}/{shape.trials}"],
            ["checkpoints READY", f"{checked['ready']}/{expected_ready}"]]
    kinds = sorted({kind for kind, _ in latencies})
    by_kind = "\n".join(["| write | done | p50 ms | p99 ms |", "|---|---|---|---|"] + [
        "| {} | {} | {:.0f} | {:.0f} |".format(kind, len(s), *percentiles(s))
        for kind in kinds if (s := [seconds for k, seconds in latencies if k == kind])])
    targets = [Target("lost writes", "== 0", len(lost), not lost),
               Target("runs in the experiment", f"== {shape.trials}", checked["runs"], checked["runs"] == shape.trials),
               Target("runs with every metric history complete, in step order, and 80 params", f"== {shape.trials}",
                      checked["complete"], checked["complete"] == shape.trials),
               Target("checkpoints READY", f"== {expected_ready}", checked["ready"],
                      checked["ready"] == expected_ready),
               Target("server restarts mid-run", f"== {RESTARTS}", len(ran["restarts"]),
                      len(ran["restarts"]) == RESTARTS),
               Target("checkpoints left PENDING", "== 0", checked["pending"], checked["pending"] == 0),
               Target("checkpoints READY twice at one step", "== 0", checked["doubled"], checked["doubled"] == 0)]
    record("tracking_load", Entry(
        title=f"The cluster's tracking stack under {actors} trials' writes, restarted twice (bench/tracking_load.py)",
        settings={"trials": shape.trials, "actors": actors, "steps": shape.steps, "params": PARAMS, "metrics": METRICS,
                  "checkpoints": CHECKPOINTS, "checkpoint_mb": shape.checkpoint_mb, "tls": True},
        rows=rows, targets=targets,
        notes=[by_kind,
               "A write: one submit to a trial's RetryingWriter (a checkpoint is several requests: model, upload, "
               "READY, output); its latency runs from submit to done, retries across a restart included. One write "
               "in flight per actor. Restarts: SIGKILL of the server and its workers, then the shipped start.",
               "A checkpoint whose upload a restart cut is finished by the writer's retry in the same model "
               "(checkpoint_models.log_checkpoint): none is left PENDING or made twice (the targets).",
               f"moto: peak {ran['moto_rss_mb']:.0f} MB resident, {ran['moto_spooled_mb']:.0f} MB of objects in "
               f"temporary files (objects over 5 MB go to disk); {checked['bucket_mb']:.0f} MB in the bucket.",
               *([f"Lost: {'; '.join(lost[:20])}"] if lost else [])],
    ), args.out)
    missed = [target.what for target in targets if not target.met]
    if missed:
        raise SystemExit(f"tracking_load missed its targets: {', '.join(missed)}")


if __name__ == "__main__":
    main()
