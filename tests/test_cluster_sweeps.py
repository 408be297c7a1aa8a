"""Sweeps on the cluster we ship, with the real parts on loopback: Ray's own autoscaler
starting worker nodes from zero (the ``fake_multinode`` provider: real raylets), and results
and data in an S3 bucket (moto's server, started once for the run: ``conftest.s3``). A PBT
sweep on data in a bucket runs on the two-node cluster (``test_two_node_cluster.py``)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from bench.common import free_port

from .cluster_parts import WORKER_TYPE, AutoscalingCluster, autoscaling_cluster
from .conftest import REPO, foreign_lines, run_cli, run_here, side_by_side, wait_until, without_the_unread_preset
from .mlflow_checks import check_mlflow_runs
from .tiny_sweeps import tiny_sweep

COCO_GPU = REPO / "sweeps" / "coco_gpu.yaml"
CLUSTER_FILE = REPO / "ray_cluster.yaml"


def coco_in_bucket(s3, tmp_path: Path, bucket: str = "my-bucket") -> None:
    """A tiny COCO dataset at the four places ``coco_gpu.yaml`` names in its bucket."""
    shapes = tmp_path / "shapes"
    made = run_here("data", "synth", "--out", str(shapes), "--num-images", "4", "--image-size", "64",
                    "--classes", "2", "--seed", "1")
    assert made.returncode == 0, made.stderr
    s3.new_bucket(bucket)
    for split in ("train2017", "val2017"):
        s3.upload(shapes / "images", bucket, f"coco/{split}")
        s3.client().upload_file(str(shapes / "annotations.json"), bucket, f"coco/annotations/instances_{split}.json")


def test_the_shipped_sweep_is_sized_against_the_shipped_cluster_file_before_ray_up(s3, tmp_path):
    """``validate --cluster-config``: the node types the autoscaler can start (eight GPU
    workers of 8 CPUs and 1 GPU) size the trials, and the data is where the nodes will read it."""
    coco_in_bucket(s3, tmp_path)

    def validate(*overrides: str) -> subprocess.CompletedProcess:
        return run_here("validate", str(COCO_GPU), "--cluster-config", str(CLUSTER_FILE), "--json",
                        *[arg for o in overrides for arg in ("--set", o)], env=s3.env)

    # a folder of the nodes' own (staged there, or a shared filesystem) cannot be seen from here: a note
    staged_at = "base.data.val.images=/data/coco/val2017"
    refusals = {"base.scaling.cpus_per_worker=16": "base.scaling.cpus_per_worker: found 16, expected <= 8 (the most "
                                                   "CPUs any node type in ray_cluster.yaml has)",
                "base.scaling.gpus_per_worker=2": "base.scaling.gpus_per_worker: found 2, expected <= 1 (the most GPUs "
                                                  "any node type in ray_cluster.yaml has)",
                "base.data.val.images=s3://my-bucket/coco/val2018": "base.data.val.images: found "
                                                                    "'s3://my-bucket/coco/val2018', expected a file or "
                                                                    "folder there",
                "base.data.val.images=s3://no-such-bucket/coco/val2017": "base.data.val.images: found "
                                                                         "'s3://no-such-bucket/coco/val2017', expected "
                                                                         "a file or folder there"}
    checked, staged, *refused = [validate(*override) for override in [(), (staged_at,), *[(o,) for o in refusals]]]
    assert checked.returncode == 0, checked.stderr
    report = json.loads(checked.stdout)
    # 8 GPU nodes, 2 single-GPU workers a trial; the 0-CPU head holds none
    assert (report["trials_at_once"], report["sized_against"]) == (4, "ray_cluster.yaml")
    assert without_the_unread_preset(report["notes"]) == []
    for result, expected in zip(refused, refusals.values()):
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
        assert result.stderr == f"detsweep: error: {COCO_GPU}: {expected}\n"
    assert staged.returncode == 0, staged.stderr
    assert without_the_unread_preset(json.loads(staged.stdout)["notes"]) == [
        "left to the nodes, which must have it: base.data.val.images: /data/coco/val2017"]


def test_a_cluster_file_whose_node_type_declares_no_resources_is_one_line(write):
    config = yaml.safe_load(CLUSTER_FILE.read_text())
    config["available_node_types"]["gpu_worker"]["resources"] = {}
    cluster = write("cluster.yaml", yaml.safe_dump(config))
    result = run_cli("validate", str(COCO_GPU), "--cluster-config", str(cluster), timeout=120)
    assert (result.returncode, result.stderr) == (2, f"detsweep: error: {cluster}: available_node_types.gpu_worker."
                                                     'resources: found {}, expected what one node holds, e.g. {"CPU": 8, '
                                                     '"GPU": 1}\n')


def test_trials_at_once_follow_what_the_cluster_can_grow_to_within_its_max_workers(write):
    from detsweep.preflight.capacity import from_cluster_config
    from detsweep.sweeps.resources import trials_at_once
    from detsweep.sweeps.spec import load_sweep

    config = yaml.safe_load(CLUSTER_FILE.read_text())
    config["available_node_types"]["cpu_worker"] = {"resources": {"CPU": 16}, "min_workers": 0, "max_workers": 4,
                                                    "node_config": {}}
    sweep = load_sweep(COCO_GPU)
    for max_workers, expected in ((8, 4), (3, 1), (12, 4)):  # GPU nodes first: the CPU type holds no GPU worker
        config["max_workers"] = max_workers
        assert trials_at_once(sweep, from_cluster_config(write("c.yaml", yaml.safe_dump(config)))) == expected
    cpu_sweep = load_sweep(COCO_GPU, ["base.scaling.use_gpu=false"])  # 2 workers of 8 CPUs: 2 a CPU node, 1 a GPU node
    config["max_workers"] = 12
    assert trials_at_once(cpu_sweep, from_cluster_config(write("c.yaml", yaml.safe_dump(config)))) == (4 * 2 + 8) // 2


# --- a cluster that autoscales from zero worker nodes ------------------------------------


@pytest.fixture(scope="module")
def autoscaling_once(tmp_path_factory, s3) -> Iterator[AutoscalingCluster]:
    """One cluster for the module's tests; its nodes reach the S3 server as a cluster's nodes
    reach their region's S3."""
    with autoscaling_cluster(tmp_path_factory.mktemp("autoscaling"), env=s3.env) as cluster:
        yield cluster


@pytest.fixture
def autoscaling(autoscaling_once) -> AutoscalingCluster:
    """The module's cluster back at zero worker nodes: another test's nodes would be this
    one's head start. (Idle nodes go after 6 s; a test ends once its sweep has.)"""
    wait_until(lambda: not autoscaling_once.worker_nodes(), 120, "the last test's worker nodes were not removed")
    return autoscaling_once


def tiny_cluster_sweep(tmp_path: Path, name: str, search: str, storage: str | None = None,
                       data: str = "{train: {num_images: 16}, val: {num_images: 8}}", num_steps: int = 10,
                       every: int = 5, loop: int | None = None) -> Path:
    return tiny_sweep(tmp_path, search, num_steps, every, name, data=data, loop=loop, storage=storage)


TWO_TRIALS = """  metric: train/loss
  mode: min
  num_samples: 2
  space:
    optimizer.learning_rate.learning_rate_base: {distribution: log_uniform_values, min: 0.001, max: 0.02}
"""


# --- bounded checkpoints that PBT can still use -----------------------------------------


@pytest.mark.timeout(400)
def test_pbt_exploits_a_checkpoint_older_than_its_donors_newest_and_the_bucket_keeps_a_bounded_number(s3, tmp_path):
    """Real Tune PBT with detsweep's retention on a bucket (``tests/pbt_retention_probe.py``:
    checkpoints of a few bytes, so that only the bookkeeping is tested): the slow trial
    exploits the checkpoint the fast one had at its last perturbation after the fast one had
    written newer ones, and restores from it; each trial keeps the window PBT needs, not
    every checkpoint it wrote."""
    import collections
    import sys

    from .conftest import run_bounded
    from .pbt_retention_probe import STEPS, WINDOW

    bucket = s3.new_bucket("pbt-retention")
    log = tmp_path / "reports.jsonl"
    probe = run_bounded([sys.executable, "-m", "tests.pbt_retention_probe", f"s3://{bucket}/tune", str(log)],
                        cwd=REPO, env={**os.environ, **s3.env}, timeout=300)
    assert probe.returncode == 0, probe.stderr[-3000:]
    assert "could not delete" not in probe.stderr
    reports = [json.loads(line) for line in log.read_text().splitlines()]
    exploits = [(row, row["restored"]) for row in reports
                if row["restored"] and row["restored"]["owner"] != row["trial"]]
    assert exploits, "no trial exploited another"
    row, source = exploits[0]
    donor_had = max(r["step"] for r in reports if r["trial"] == source["owner"] and r["at"] < row["at"])
    assert donor_had > source["step"], (donor_had, source)  # newer ones were written before it was read
    assert row["step"] == source["step"] + 1

    written = collections.Counter(r["trial"] for r in reports)
    left = collections.Counter(key.split("/")[2] for key in s3.keys(bucket, "tune/pbt/") if key.endswith("/state.json"))
    assert len(left) == 2 and written[row["trial"]] < STEPS <= written[source["owner"]]  # one skipped ahead
    # the window, the best, and at most a checkpoint another trial's restart refers to
    assert all(count <= WINDOW + 3 for count in left.values()), (left, written)
    assert sum(left.values()) * 3 < sum(written.values())


# --- data and results in a bucket ---------------------------------------------------------

def test_a_sweep_in_a_bucket_that_does_not_exist_is_one_line_before_anything_starts(s3, tmp_path):
    """(A sweep in a bucket resumed from the bucket alone, on another machine:
    ``test_sweep_runs.py``'s BOHB sweep.)"""
    sweep = tiny_cluster_sweep(tmp_path, "cut", "  metric: train/loss\n  mode: min\n  num_samples: 1\n")
    nowhere = run_cli("launch", str(sweep), "--set", "storage=s3://no-such-bucket/ray", cwd=tmp_path, env=s3.env,
                      timeout=120)
    assert (nowhere.returncode, nowhere.stderr) == (2, f"detsweep: error: {sweep}: storage: found "
                                                       "'s3://no-such-bucket/ray', expected an existing bucket (there "
                                                       "is no bucket 'no-such-bucket')\n")
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "ray").exists()  # before MLflow or Ray started


def test_status_and_resume_of_a_sweep_in_a_bucket_nobody_answers_for_are_one_line(s3, tmp_path):
    """An S3 endpoint that does not answer is bad input, as for launch's storage: one line
    naming the URI and what failed, exit code 2, for ``status`` and ``resume`` alike."""
    away = s3.env | {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}"}
    status, resume = side_by_side([lambda: run_cli("status", "s3://sweeps/tiny", cwd=tmp_path, env=away, timeout=120),
                                   lambda: run_cli("resume", "s3://sweeps/tiny", cwd=tmp_path, env=away, timeout=120)])
    for result in (status, resume):
        lines = result.stderr.splitlines()
        assert result.returncode == 2 and len(lines) == 1, result.stderr
        assert lines[0].startswith("detsweep: error: sweep: found 's3://sweeps/tiny', expected a bucket this machine "
                                   "can reach (") and "NETWORK_CONNECTION" in lines[0], lines[0]
    assert not (tmp_path / "mlflow.db").exists()


# --- a node lost mid-trial ----------------------------------------------------------------


def actors_of(cluster: AutoscalingCluster, class_name: str) -> list:
    from ray.util.state import list_actors

    return list_actors(address=cluster.dashboard, filters=[("class_name", "=", class_name)], detail=True,
                       raise_on_missing_output=False)


def kill_raylet(node_id: str) -> None:
    """SIGKILL the raylet of ``node_id``, as a reclaimed spot instance vanishes: its workers go
    with it, and the cluster learns of it from missed health checks."""
    import psutil

    [raylet] = [process for process in psutil.process_iter(["cmdline"])
                if f"--node_id={node_id}" in (process.info["cmdline"] or [])]
    raylet.kill()


@pytest.mark.timeout(900)
def test_a_sweep_on_a_cluster_that_autoscales_from_zero_loses_a_node_mid_trial_and_its_tracking_server_and_no_step(
        autoscaling, s3, tmp_path):
    """The head trains nothing and no worker node is up. Without a cluster config the nodes
    alive are all there is: the sweep is refused in one line, nothing started. ``launch`` on
    the head (where ``ray up`` leaves the cluster config as ``~/ray_bootstrap_config.yaml``)
    sizes the sweep by the worker type, says what it waits for while the autoscaler adds nodes,
    and runs both trials at once on two new nodes. Once a checkpoint is in the bucket, the
    MLflow server goes away for 15 s and the node that holds one trial's training worker is
    killed. Each trial's own process and Ray Train's controller run on the head (the trial asks
    for the head's own resource), so the node took only the worker: Ray Train restarts it from
    that checkpoint on a worker node alive (one the autoscaler adds, or the other trial's once
    that one is done), and the trial ends at exactly num_steps.
    What the trials logged while the server was away is retried and arrives once it is back:
    each trial keeps one MLflow run with every loop once, in order (loops of 2 steps, most of
    them past Ray Train, which polls its workers only every 5 s here, down the report channel);
    the steps trained twice are on the restarted trial's run, and none is older than the
    checkpoint the kill found. Idle, the nodes go away."""
    import subprocess
    import sys

    from ray.util.state import list_placement_groups

    from .conftest import cli_environment, kill_session, time_left
    from .mlflow_checks import free_port, mlflow_server

    assert not autoscaling.worker_nodes()  # from zero
    bucket = s3.new_bucket("spot")
    sweep = tiny_cluster_sweep(tmp_path, "spot", TWO_TRIALS, storage=f"s3://{bucket}/ray", num_steps=40, every=10,
                               loop=2)
    refused = run_cli("launch", str(sweep), "--address", autoscaling.address, cwd=tmp_path,
                      env={**s3.env, **autoscaling.env}, timeout=300)
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert refused.stderr == (f"detsweep: error: {sweep}: base.scaling.cpus_per_worker: found 1, expected <= 0 (the "
                              "most CPUs any node alive has; for the node types an autoscaler can add: "
                              "--cluster-config FILE)\n")
    assert not s3.keys(bucket, "ray/") and not autoscaling.worker_nodes()

    head_home = tmp_path / "head-home"
    head_home.mkdir()
    (head_home / "ray_bootstrap_config.yaml").write_text(autoscaling.config.read_text())
    port = free_port()
    with mlflow_server(tmp_path, port=port) as uri:
        launch = subprocess.Popen(
            [sys.executable, "-m", "detsweep", "launch", str(sweep), "--address", autoscaling.address, "--json",
             "--no-register"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=cli_environment({**s3.env, **autoscaling.env, "HOME": str(head_home), "MLFLOW_TRACKING_URI": uri,
                                 "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "5"}),
            start_new_session=True)
        try:
            wait_for_train_metric(uri)
            wait_until(lambda: len(registered_steps_in_bucket(s3, bucket)) == 2, 400,
                       "Ray Train registered no checkpoint of each trial's run in the bucket")
        except BaseException:
            kill_session(launch)
            raise
    down_at = time.monotonic()  # the server is stopped; the trials train on
    try:
        workers = [actor for actor in actors_of(autoscaling, "RayTrainWorker") if actor.state == "ALIVE"]
        head = autoscaling.head_node()
        assert len(workers) == 2 and head not in {worker.node_id for worker in workers}, workers
        for kept in ("Trial", "TrainController"):  # each trial (ending_on_stop names its class so) and its controller
            assert {actor.node_id for actor in actors_of(autoscaling, kept) if actor.state == "ALIVE"} == {head}, kept
        # by construction, not by chance: each trial's placement asks for the head's own resource
        groups = list_placement_groups(address=autoscaling.dashboard, detail=True, raise_on_missing_output=False)
        assert any("node:__internal_head__" in bundle["unit_resources"] for group in groups
                   if group.state == "CREATED" for bundle in group.bundles)
        checkpointed = registered_steps_in_bucket(s3, bucket)
        # the worker of the trial furthest from its end: the other may be done before the kill lands
        killed, worker = min(((trial_of_worker(worker.pid), worker) for worker in workers),
                             key=lambda pair: checkpointed[pair[0]])
        kill_raylet(worker.node_id)
        time.sleep(max(0.0, 15 - (time.monotonic() - down_at)))  # the outage lasts 15 s: past the writer's 10 s backoff
        with mlflow_server(tmp_path, port=port):
            stdout, stderr = launch.communicate(timeout=time_left())
            assert launch.returncode == 0, stderr[-3000:]
            report = json.loads(stdout)
            check_restarted_trial(report, checkpointed, killed, s3)
    finally:
        kill_session(launch)
    # it waited for the autoscaler, and ran both trials side by side: two nodes of one CPU each
    waits = [line for line in stderr.splitlines() if line.startswith("waiting for ")]
    assert waits and all(line.endswith("trial worker(s): the autoscaler starts them") for line in waits), stderr
    assert any(f"node of type {WORKER_TYPE} " in line or f"nodes of type {WORKER_TYPE} " in line for line in waits)
    starts = [line for line in stderr.splitlines() if " started: " in line]
    first_report = next(i for i, line in enumerate(stderr.splitlines()) if " step 2/40" in line)
    assert len(starts) == 2 and all(stderr.splitlines().index(line) < first_report for line in starts), stderr
    # a write hit the outage and was retried: the trial's process said so, in the sweep's log
    [log] = (tmp_path / "logs").glob("launch-*.log")  # a sweep in a bucket keeps its log where it was launched
    assert "failed (" in log.read_text() and "retrying in" in log.read_text()
    assert not foreign_lines(stderr), foreign_lines(stderr)
    # the lost worker's successor: on a worker node still alive (a new one, or the other trial's once it was done)
    started_since = {actor.node_id for actor in actors_of(autoscaling, "RayTrainWorker")
                     if actor.actor_id not in {w.actor_id for w in workers}}
    assert started_since and not started_since & {worker.node_id, head}, (started_since, worker.node_id)
    wait_until(lambda: not autoscaling.worker_nodes(), 120, "the idle worker nodes were not removed")


# A trial's Ray Train run, in a folder or a key: <sweep>-train-<trial id>-<start>; the trial id captured.
TRIAL_RUN = r"-train-([^/]+?)-\d{8}-\d{6}"


def trial_of_worker(pid: int) -> str:
    """The trial whose Ray Train run the worker process ``pid`` trains: Ray Train makes each
    worker's working directory its run's, named ``<sweep>-train-<trial id>-<start>``."""
    import re

    import psutil

    return re.search(rf"{TRIAL_RUN}(?:/|$)", psutil.Process(pid).cwd())[1]


def check_restarted_trial(report: dict, checkpointed: dict[str, int], killed: str, s3) -> None:
    """Both trials ended at step 40, every loop on Tune's record once, one MLflow run each with
    every step, nothing lost; on the run of ``killed``, whose worker's node was lost, Ray Train's
    one restart, and what it trained twice after its checkpoint at ``checkpointed[killed]``."""
    from detsweep.tracking.trial_run import ReplayedSteps

    assert [(t["status"], t["metrics"]["step"]) for t in report["trials"]] == [("TERMINATED", 40)] * 2, report["trials"]
    bucket, prefix = report["path"].removeprefix("s3://").split("/", 1)
    for trial in report["trials"]:
        [result] = [key for key in s3.keys(bucket, prefix) if key.endswith(f"trial_{trial['trial_id']}/result.json")]
        rows = s3.client().get_object(Bucket=bucket, Key=result)["Body"].read().decode().splitlines()
        assert [json.loads(row)["step"] for row in rows] == list(range(2, 41, 2))  # no step twice, none missing
    runs = check_mlflow_runs(report, num_steps=40, every=2, eval_every=10, registered=False)
    assert not [run for run in runs.values() if "detsweep.lost_writes" in run.data.tags]
    # Ray Train saw the dead worker and restarted that trial's group once; what it trained again (if
    # loops past the checkpoint had been passed on before the kill) is after that checkpoint.
    # It can come in two ranges: a loop that ends in a checkpoint waits for Ray Train's poll,
    # while the loops after it pass down the channel; the node took the waiting one with it.
    restarts = {trial_id: run.data.tags["detsweep.worker_failures"] for trial_id, run in runs.items()
                if "detsweep.worker_failures" in run.data.tags}
    assert list(restarts) == [killed], (restarts, killed, checkpointed)
    tags = runs[killed].data.tags
    assert tags["detsweep.worker_failures"].startswith("1: "), tags
    replayed = ReplayedSteps.parse(tags.get("detsweep.replayed_steps", "")).ranges
    assert all(checkpointed[killed] < first <= last < 40 for first, last in replayed), (replayed, checkpointed)
    assert all(earlier[1] < later[0] for earlier, later in zip(replayed, replayed[1:])), replayed


def wait_for_train_metric(uri: str, timeout_s: float = 300) -> int:
    """The first training step a trial logged to the server at ``uri``."""
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        experiments = [experiment.experiment_id for experiment in client.search_experiments()]
        runs = client.search_runs(experiments, filter_string="tags.`detsweep.role` = 'trial'")
        steps = [m.step for run in runs for m in client.get_metric_history(run.info.run_id, "train/loss")]
        if steps:
            return min(steps)
        time.sleep(1)
    raise AssertionError("no trial logged a training step in time")


def registered_steps_in_bucket(s3, bucket: str) -> dict[str, int]:
    """By trial id, the last step of the checkpoints Ray Train's checkpoint manager has
    registered for the trial's run in ``bucket`` (its snapshot there): the ones a restart goes
    on from. (A checkpoint saved but not yet reported, for a poll that never came, is not one:
    a restart goes back before it.)"""
    import re

    steps: dict[str, int] = {}
    for key in s3.keys(bucket, "ray/"):
        run = re.search(rf"{TRIAL_RUN}/(?:.*/)?checkpoint_manager_snapshot\.json$", key)
        if run:  # a trial's Ray Train run: <sweep>-train-<trial id>-<start>
            body = s3.client().get_object(Bucket=bucket, Key=key)["Body"].read()
            try:
                found = [int(result["metrics"]["step"]) for result in json.loads(body)["checkpoint_results"]]
            except (ValueError, KeyError):  # being written
                continue
            if found:
                steps[run[1]] = max(steps.get(run[1], 0), *found)
    return steps


def test_a_failed_trial_of_a_sweep_in_a_bucket_names_its_traceback_by_the_buckets_uri(capsys):
    from detsweep.sweeps.commands import sweep_summary

    report = {"path": "s3://sweeps/ray/tiny", "metric": "train/loss", "best": None,
              "cost": {"cost/cpu_hours": 0.0, "cost/gpu_hours": 0.0},
              "trials": [{"trial_id": "a_00000", "status": "ERROR", "error": "loss is NaN/Inf at step 12",
                          "metrics": {}, "config": {}}]}
    assert sweep_summary(report, as_json=True, out=io.StringIO()) == 1
    assert capsys.readouterr().err == ("detsweep: trial a_00000 failed: loss is NaN/Inf at step 12 (full log: "
                                       "s3://sweeps/ray/tiny/trial_a_00000/error.txt)\n")
