"""Sweeps on a real two-node Ray cluster on this machine (a head and a second raylet, one CPU
each), reached by ``--address`` and by ``ray job submit``: each trial's worker lands on its
own node. The cluster is started once for this module; its tests run different searches on it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest

from .conftest import REPO, run_bounded, run_cli, run_here, side_by_side
from .mlflow_checks import (
    assert_no_secret,
    check_mlflow_runs,
    cluster_mlflow_server,
    free_port,
    head_command,
    head_commands,
    secret_values,
)
from .tiny_sweeps import launch_json, lr_of, shapes_in_bucket, tiny_sweep

LR_PATH = "optimizer.learning_rate.learning_rate_base"


class TwoNodes:
    """A head and a second raylet, one CPU each, started as README says for a cluster started by
    hand: each raylet with the cluster's tracking server, the certificate to trust and
    detsweep's user (read from the trials' file) in its environment, and the S3 server's
    address, as a cloud's nodes reach their region's S3. ``stop`` takes both down and
    ``start`` brings up new ones."""

    def __init__(self, node_env: dict[str, str]):
        self.node_env = node_env
        self.running = False
        self.start()

    def start(self) -> None:
        import ray
        from ray.cluster_utils import Cluster

        from detsweep.tracking.backend import NO_TELEMETRY

        dashboard_port = free_port()
        with mock.patch.dict(os.environ, self.node_env):  # what each raylet, and so its workers, inherits
            for name in NO_TELEMETRY:  # a trial holds the telemetry choice only if its launch passed it on
                os.environ.pop(name, None)
            # Each node's dashboard agent on a port of its own: both would take Ray's default (52365),
            # the loser serves no HTTP, and ``ray job submit`` finds no agent when the head's lost.
            self._cluster = Cluster(initialize_head=True, head_node_args={
                "num_cpus": 1, "include_dashboard": True, "dashboard_port": dashboard_port,
                "dashboard_agent_listen_port": free_port()})
            self.running = True  # from here on there is something to stop
            self._cluster.add_node(num_cpus=1, dashboard_agent_listen_port=free_port())
        self._cluster.wait_for_nodes()
        self.session = Path(self._cluster.head_node.get_session_dir_path())
        # Connected only to read the nodes: the tests change this process's environment, and
        # glibc's setenv frees the array a connected driver's threads read with getenv (a
        # SIGSEGV in Ray's metrics thread, seen once in a full suite).
        ray.init(address=self._cluster.address)
        try:
            self.nodes: set[str] = {node["NodeID"] for node in ray.nodes() if node["Alive"]}
        finally:
            ray.shutdown()
        self.address, self.dashboard = self._cluster.address, f"http://127.0.0.1:{dashboard_port}"
        assert len(self.nodes) == 2

    def stop(self) -> None:
        self._cluster.shutdown()
        self.running = False


@pytest.fixture(scope="module")
def two_nodes(tracking_stack) -> Iterator[TwoNodes]:
    from detsweep.tracking.credentials import trial_credentials

    nodes = TwoNodes({**trial_credentials(tracking_stack.folder / "head" / "mlflow.env"),
                      "MLFLOW_TRACKING_SERVER_CERT_PATH": str(tracking_stack.authority), **tracking_stack.s3.env})
    try:
        yield nodes
    finally:
        if nodes.running:
            nodes.stop()


@pytest.fixture
def cluster(two_nodes) -> TwoNodes:
    """The module's two nodes, brought up again if a test took them down (as ``ray down``
    would) and a later test needs them."""
    if not two_nodes.running:
        two_nodes.start()
    return two_nodes


def test_validate_sizes_a_sweep_for_the_cluster_at_address_not_for_this_machine(cluster, tmp_path):
    sized = tiny_sweep(tmp_path, "  num_samples: 2\n  metric: train/loss\n  mode: min\n", name="sized")
    fits = run_cli("validate", str(sized), "--address", cluster.address, "--json")
    assert fits.returncode == 0 and json.loads(fits.stdout)["trials_at_once"] == 2, fits.stderr[-2000:]
    # a cluster started by hand: no cluster config says what it could grow to, and validate says so
    assert json.loads(fits.stdout)["sized_against"] == "the nodes alive"
    assert json.loads(fits.stdout)["notes"] == ["sizing trials against the nodes alive now: no cluster config was "
                                                "found (~/ray_bootstrap_config.yaml or --cluster-config FILE) to say "
                                                "what the cluster can grow to"]
    too_big = run_cli("validate", str(sized), "--address", cluster.address, "--set", "base.scaling.cpus_per_worker=2")
    assert too_big.returncode == 2 and too_big.stderr.strip() == (
        f"detsweep: error: {sized}: base.scaling.cpus_per_worker: found 2, expected <= 1 (the most CPUs any node alive "
        "has; for the node types an autoscaler can add: --cluster-config FILE)")
    assert run_cli("validate", str(sized), "--set", "base.scaling.cpus_per_worker=2").returncode == 0  # fits here


def test_without_an_address_detsweep_starts_its_own_cluster_beside_one_ray_start_started(cluster):
    """``ray.init()`` alone would join the cluster ``ray start`` last started here (this module's):
    detsweep's default is a local cluster of its own, and ``auto`` joins the running one. In
    either, an actor made as Ray Train makes its PlacementGroupCleaner and controller asks the
    State API of its own cluster whether it lives: Ray's own guess, inside a worker, is the
    cluster ``ray start`` started, which knows nothing of a local cluster's actors."""
    probe = """
import sys, ray
from detsweep.cluster import connect
from ray.train.v2._internal.state.util import is_actor_alive
connect(*sys.argv[1:])

@ray.remote(num_cpus=0, runtime_env={"env_vars": {"RAY_TRAIN_PROBE": "1"}})
class Probe:
    def lives(self):
        return is_actor_alive(ray.get_runtime_context().get_actor_id(), timeout=60)

print(len(ray.nodes()), ray.get(Probe.options(lifetime="detached").remote().lives.remote()))
"""
    own, joined = side_by_side([lambda: run_bounded([sys.executable, "-c", probe], timeout=300, cwd=REPO),
                                lambda: run_bounded([sys.executable, "-c", probe, "auto"], timeout=300, cwd=REPO)])
    assert (own.returncode, joined.returncode) == (0, 0), own.stderr[-2000:] + joined.stderr[-2000:]
    assert (own.stdout.splitlines()[-1], joined.stdout.splitlines()[-1]) == ("1 True", f"{len(cluster.nodes)} True")


def test_an_optuna_sweep_by_ray_address_runs_on_both_nodes_logs_to_the_cluster_files_tracking_server_and_outlives_the_cluster(
        cluster, tracking_stack, tmp_path, monkeypatch):
    """A seeded TPE search, launched on the cluster ``RAY_ADDRESS`` names with MLflow's telemetry
    off (``DO_NOT_TRACK``, which reaches every trial's processes), logged to the tracking server
    started as ``ray_cluster.yaml`` starts it (HTTPS with the head's certificate, basic auth,
    detsweep's user made from the trials' file, the head's secret from Secrets Manager; runs in
    PostgreSQL, artifacts in a bucket):
    nobody gets in without credentials, no client without the certificate; detsweep's
    credentials reach the trials on both nodes through each raylet's environment, and no
    secret shows in Ray's State API, in Ray's, MLflow's or detsweep's logs, or in any param,
    tag or artifact. A second launch of the sweep is refused
    and changes nothing. Then the cluster goes as ``ray down`` takes it (Ray, its results folder
    and the head's disk) and a new head's server comes up on the same database and bucket:
    every trial's metric history is whole, ``best`` ranks from MLflow alone and the checkpoint
    it ranked first (what ``finetune --from best:`` starts from; a fine-tune so:
    ``test_finetune.py``) comes through that server, and after ``mlflow gc`` the bucket holds
    the files of each trial's best and latest checkpoints only (of five each)."""
    import optuna
    import requests
    from mlflow import MlflowClient

    from detsweep.checkpoints import read_config, read_step
    from detsweep.tracking.checkpoint_models import checkpoints
    from detsweep.tracking.source import local_copy

    sweep = tiny_sweep(tmp_path, f"""
  metric: train/loss
  mode: min
  num_samples: 2
  algorithm: optuna
  seed: 3
  space:
    {LR_PATH}: {{distribution: log_uniform_values, min: 0.001, max: 0.02}}
""", num_steps=10, every=2, name="outlives")
    uri, secret, authority = tracking_stack.uri, tracking_stack.secret, tracking_stack.authority
    assert uri.startswith("https://")
    anonymous = requests.get(f"{uri}/api/2.0/mlflow/experiments/search", params={"max_results": 1}, timeout=30,
                             verify=str(authority))
    assert anonymous.status_code == 401, anonymous.text[:300]
    with pytest.raises(requests.exceptions.SSLError):  # a client that does not trust the cluster's authority
        requests.get(f"{uri}/health", timeout=30)
    right = tracking_stack.client_env
    untrusting = {**right, "MLFLOW_TRACKING_SERVER_CERT_PATH": ""}
    wrong = {**right, "MLFLOW_TRACKING_PASSWORD": "wrong"}
    refused, refused_wrong = side_by_side([
        lambda env=env: run_cli("launch", str(sweep), "--address", cluster.address, cwd=tmp_path, env=env)
        for env in (untrusting, wrong)])
    assert refused.returncode == 2 and refused.stderr.startswith(
        f"detsweep: error: MLFLOW_TRACKING_URI: the MLflow server at {uri} has a certificate this machine does not "
        "trust (certificate verify failed") and refused.stderr.strip().endswith(
        "expected MLFLOW_TRACKING_SERVER_CERT_PATH naming the certificate of the authority that signed it (the "
        "cluster's: README)") and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    refused = refused_wrong
    assert refused.returncode == 2 and refused.stderr.strip() == (
        f"detsweep: error: MLFLOW_TRACKING_URI: the MLflow server at {uri} refused the credentials in "
        "MLFLOW_TRACKING_USERNAME/MLFLOW_TRACKING_PASSWORD (HTTP 401); expected a user it accepts")
    assert not (tmp_path / "ray").exists()  # refused before anything started

    for name, value in right.items():  # for this test's own MlflowClient
        monkeypatch.setenv(name, value)
    # The cluster named by RAY_ADDRESS (as a job on the head finds it), and the telemetry choice
    # made where it launches: both reach every trial, on either node.
    seen = watch_train_worker_nodes(cluster.dashboard)
    result, report = launch_json(str(sweep), cwd=tmp_path,
                                 env={**right, "RAY_ADDRESS": cluster.address, "DO_NOT_TRACK": "true"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "detsweep: sizing trials against the nodes alive now: no cluster config was found" in result.stderr
    assert [t["status"] for t in report["trials"]] == ["TERMINATED", "TERMINATED"]
    assert seen.stop() == cluster.nodes  # the two trials' workers ran on both nodes of this cluster
    assert {kind for kind, _ in seen.do_not_track} == {"Trial", "RayTrainWorker"}, seen.do_not_track
    assert set(seen.do_not_track.values()) == {"true"}, seen.do_not_track
    # the writer's settings too, from each process's start: none adds a variable while Ray's threads run
    assert set(seen.max_retries.values()) == {"0"}, seen.max_retries
    assert report["mlflow"]["tracking_uri"] == uri
    check_mlflow_runs(report, num_steps=10, every=2)  # logged from both nodes, the best model registered
    for secret_value in secret_values(secret):
        assert_no_secret(report, secret_value, tmp_path)
    assert_nowhere_in_ray(cluster, secret_values(secret))
    logs = [*cluster.session.joinpath("logs").rglob("*"), tracking_stack.folder / "head" / "head-mlflow" / "server.log",
            *(tmp_path / "ray").rglob("*.log"), *(tmp_path / "ray").rglob("*.txt"), *(tmp_path / "ray").rglob("*.json"),
            *(tmp_path / "ray").rglob("study.journal")]  # the sweep's Optuna study, in its folder
    assert report["study"] and report["study"] in map(str, logs)
    assert_in_no_file(logs, secret_values(secret))
    assert not (tmp_path / "mlflow.db").exists()  # everything went through the server
    # TPE starts with its seeded random sampler: the two trials get its first two draws.
    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=3))
    distribution = optuna.distributions.FloatDistribution(0.001, 0.02, log=True)
    expected = [study.ask({"x": distribution}).params["x"] for _ in range(2)]
    assert sorted(lr_of(t) for t in report["trials"]) == pytest.approx(sorted(expected))
    assert list(Path(report["path"]).glob("searcher-state-*.pkl"))  # the searcher is saved for resume

    # The same sweep launched again: refused before anything starts, the first left as it was.
    client = MlflowClient(uri)
    experiment = report["mlflow"]["experiment_id"]
    runs_before, saved = len(client.search_runs([experiment])), (Path(report["path"]) / "sweep.yaml").read_text()
    again = run_cli("launch", str(sweep), "--address", cluster.address, cwd=tmp_path, env=right)
    assert again.returncode == 2 and again.stderr.strip() == (
        f"detsweep: error: {sweep}: name: found 'outlives', which already ran at {report['path']}; expected a new "
        f"name (--set name=NEW) or another storage, or to go on with it: detsweep resume {report['path']}")
    assert len(client.search_runs([experiment])) == runs_before
    assert (Path(report["path"]) / "sweep.yaml").read_text() == saved
    histories = {t["mlflow_run_id"]: metric_histories(client, t["mlflow_run_id"]) for t in report["trials"]}

    # `ray down`: Ray, the results folder and the head's MLflow folder go; a new head's server
    # (a certificate of its own; its start finds detsweep's user in the database: "password
    # set") serves what the first one logged.
    cluster.stop()
    shutil.rmtree(tmp_path / "ray")
    with cluster_mlflow_server(tmp_path / "new-head", secret, tracking_stack.s3.env) as new_head:
        new_uri, said = new_head.uri, new_head.said
        assert said.strip().endswith("MLflow user detsweep: password set"), said
        new = {**right, "MLFLOW_TRACKING_URI": new_uri, "MLFLOW_TRACKING_SERVER_CERT_PATH": str(new_head.authority)}
        for name, value in new.items():
            monkeypatch.setenv(name, value)
        client = MlflowClient(new_uri)
        assert {run_id: metric_histories(client, run_id) for run_id in histories} == histories
        assert all(len(h["train/loss"]) == 5 for h in histories.values())  # steps 2, 4, … 10 of each trial
        best = run_here("best", "outlives", "--json", cwd=tmp_path, env=new)
        assert best.returncode == 0, best.stderr[-2000:]
        ranked = json.loads(best.stdout)["trials"][0]
        assert ranked["run_id"] == report["best"]["mlflow_run_id"] and ranked["checkpoint"].startswith("models:/m-")
        # what `finetune --from best:outlives` starts from comes through the new server, from
        # the bucket (a fine-tune from `best:`, a CONFIG.yaml merged, results in a bucket:
        # test_finetune.py)
        with local_copy(ranked["checkpoint"], new_uri) as best_copy:  # the server serves its artifacts
            assert read_step(best_copy) == ranked["checkpoint_step"] and read_config(best_copy).model.backbone == "resnet_tiny"

        # mlflow gc, as the cluster file runs it hourly: the bucket keeps the files of the models
        # MLflow keeps (each trial's best and latest checkpoint and the registered
        # model) and of no deleted checkpoint
        [loop] = [c for c in head_commands("head_start_ray_commands") if "mlflow_server.sh gc" in c]
        gc = head_command(loop.split("do ")[1].split(";")[0], tmp_path / "new-head", int(new_uri.rsplit(":", 1)[1]),
                          new_head.secret_name)
        collected = run_bounded(["bash", "-c", gc], cwd=REPO, env={
            **os.environ, **tracking_stack.s3.env, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"})
        assert collected.returncode == 0, collected.stderr[-3000:]
        deleted = collected.stdout.count("Logged model with ID")
        assert deleted >= 6, collected.stdout  # 2 trials x 5 checkpoints, at most 2 x 2 kept
        kept = {model.model_id for model in client.search_logged_models([experiment])}
        stored = tracking_stack.s3.client().list_objects_v2(Bucket=tracking_stack.bucket, Prefix=f"mlflow/{experiment}/models/")
        in_bucket = {item["Key"].split("/")[3] for item in stored.get("Contents", [])}
        assert in_bucket == kept, (in_bucket, kept)
        for trial in report["trials"]:
            assert len(checkpoints(client, [experiment], trial["mlflow_run_id"], ready=False)) <= 2
        size = sum(item["Size"] for item in stored.get("Contents", []))
        print(f"bucket: {len(in_bucket)} models, {size / 1e6:.1f} MB after gc; {deleted} checkpoints' files removed")


def metric_histories(client, run_id: str) -> dict[str, list[tuple[int, float]]]:
    return {key: sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))
            for key in ("train/loss", "train/lr", "eval/AP_best")}


def assert_nowhere_in_ray(cluster: TwoNodes, hidden: list[str]) -> None:
    """None of ``hidden`` in what Ray's State API shows of the cluster's jobs, actors and tasks,
    with detail (their runtime environments among it)."""
    from ray.util.state import list_actors, list_jobs, list_tasks

    shown = [kind(address=cluster.dashboard, detail=True, limit=10_000, raise_on_missing_output=False)
             for kind in (list_actors, list_tasks)] + [list_jobs(address=cluster.dashboard, detail=True)]
    text = json.dumps(shown, default=str)
    assert "MLFLOW_TRACKING_USERNAME" not in text  # no job, actor or task carries the credentials
    assert len(text) > 10_000 and not [value for value in hidden if value in text]


def assert_in_no_file(paths: list[Path], hidden: list[str]) -> None:
    files = [path for path in paths if path.is_file()]
    assert len(files) > 20
    assert not [(path, value) for path in files for value in hidden if value.encode() in path.read_bytes()]


@pytest.mark.timeout(900)
def test_a_pbt_sweep_by_ray_job_submit_on_data_in_a_bucket_continues_from_the_better_trials_checkpoint_there(
        cluster, tracking_stack, tmp_path):
    """Submitted as a Ray job, a PBT sweep trains on a dataset that exists only in a bucket and
    keeps Tune's state and every checkpoint there. Ranked by the learning rate itself, the
    0.03 trial is on top at step 20 and the 0.001 trial copies it there: its weights (their
    fingerprint, logged where a run continues from a checkpoint), its config, a new EMA decay.
    Synchronous PBT makes that certain: whichever trial gets to step 20 first waits for the
    other, so both have a score when the exploit is decided. The next perturbation (step 40)
    is past the end. The best checkpoint is a bucket URI that ``status`` and registration read
    (``finetune`` and ``export`` read a bucket's checkpoint by ``source.local_copy``, read here
    for the donor's; a fine-tune from a run's checkpoint: ``test_finetune``), and no Ray Train
    run is left beside the sweep."""
    from mlflow import MlflowClient

    from detsweep.checkpoints import read_step
    from detsweep.config.schema import LearningRateConfig
    from detsweep.optim import build_schedule
    from detsweep.tracking.source import local_copy
    from detsweep.train.checkpoint import weights_fingerprint
    from detsweep.train.restore import load_trained_model
    from detsweep.trainables.trial import swept_values

    s3 = tracking_stack.s3
    bucket = s3.new_bucket("by-job")
    data = shapes_in_bucket(s3, tmp_path, bucket)
    dataset = f"{{format: coco, annotations: {data}/annotations.json, images: {data}/images}}"
    sweep = tiny_sweep(tmp_path, f"""
  metric: train/lr
  mode: max
  algorithm: grid
  num_samples: 1
  space:
    {LR_PATH}: {{grid: [0.001, 0.03]}}
  scheduler:
    type: pbt
    perturbation_interval: 20
    quantile_fraction: 0.5
    synch: true
    mutations:
      optimizer.moving_average_decay: {{values: [0.99, 0.995, 0.999]}}
""", num_steps=30, every=10, name="by_job", storage=f"s3://{bucket}/ray", data=f"{{train: {dataset}, val: {dataset}}}")
    seen = watch_train_worker_nodes(cluster.dashboard)
    job_db, cache = f"sqlite:///{tmp_path / 'job.db'}", tmp_path / "node-cache"
    job = run_bounded(
        [str(Path(sys.executable).parent / "ray"), "job", "submit", "--address", cluster.dashboard,
         "--runtime-env-json", json.dumps({"env_vars": {"MLFLOW_TRACKING_URI": job_db, "DETSWEEP_DATA_CACHE": str(cache)}}),
         # in the test's folder: a sweep in a bucket keeps its log where its driver runs
         "--", "sh", "-c", f'cd {tmp_path} && exec "$0" "$@"', sys.executable, "-m", "detsweep", "launch",
         str(sweep), "--address", "auto", "--json"],
        cwd=REPO)
    assert job.returncode == 0, (job.stdout + job.stderr)[-3000:]
    [report] = [json.loads(line) for line in job.stdout.splitlines() if line.startswith('{"name"')]
    assert report["path"] == f"s3://{bucket}/ray/by_job"
    assert [t["status"] for t in report["trials"]] == ["TERMINATED", "TERMINATED"]
    assert all(t["metrics"]["step"] == 30 and t["checkpoint"].startswith(f"{report['path']}/trial_")
               for t in report["trials"])
    assert report["mlflow"]["tracking_uri"] == job_db and (tmp_path / "job.db").exists()
    assert seen.stop() == cluster.nodes
    assert "16 images" in job.stdout, job.stdout[-5000:]
    # the nodes' copy of the images, keyed by the objects' ETags
    assert [copy.is_dir() for copy in (cache / "s3" / bucket / "datasets" / "shapes").glob("images@*")] == [True]
    # `status` of the sweep, and a fine-tune from a checkpoint the bucket lacks (refused)
    status = run_here("status", report["path"], "--json", cwd=tmp_path, env=s3.env)
    missing = run_cli("finetune", "--from", f"checkpoint:s3://{bucket}/ray/nothing", cwd=tmp_path, env=s3.env,
                      timeout=120)
    assert status.returncode == 0 and json.loads(status.stdout)["best"]["checkpoint"] == report["best"]["checkpoint"]
    assert (missing.returncode, missing.stderr) == (2, f"detsweep: error: --from checkpoint:s3://{bucket}/ray/nothing: "
                                                       f"s3://{bucket}/ray/nothing is not a detsweep checkpoint (expected "
                                                       "config.yaml and ckpt.index in it)\n")
    assert {key.split("/")[1] for key in s3.keys(bucket, "ray/")} - {""} == {"by_job"}, "a Ray Train run was left in the storage"

    assert s3.read(f"{report['path']}/pbt_global.txt").strip(), "PBT never exploited"
    # The exploiting trial kept its MLflow run; the swept values it took are metrics over steps.
    # The registered model reads its val images from the bucket.
    with mock.patch.dict(os.environ, s3.env):
        children = check_mlflow_runs(report, num_steps=30, every=10, pbt=True)
    # The exploiting trial is the one that started at 0.001: its run's params keep first values.
    # (Tune's result.json of that trial once held only the rows after the exploit.)
    [exploiting_id] = [trial_id for trial_id, run in children.items() if run.data.params[LR_PATH] == "0.001"]
    rows = [json.loads(line) for line in s3.read(f"{report['path']}/trial_{exploiting_id}/result.json").splitlines()]
    assert swept_values(rows[-1]["config"], [LR_PATH])[LR_PATH] == 0.03  # it took the better trial's config
    # Its MLflow run has every report: 0.001's schedule up to the exploit at step 20, then,
    # from the donor's step-20 checkpoint (never from step 0), 0.03's schedule to num_steps.
    client = MlflowClient(job_db)
    run_id = children[exploiting_id].info.run_id
    rates = {m.step: m.value for m in client.get_metric_history(run_id, "train/lr")}
    assert sorted(rates) == [10, 20, 30], rates
    tree = rows[0]["config"]["trial"]["optimizer"]["learning_rate"]
    for step, base in ((10, 0.001), (20, 0.001), (30, 0.03)):
        schedule = build_schedule(LearningRateConfig.model_validate({**tree, "learning_rate_base": base}))
        assert rates[step] == pytest.approx(float(schedule(step - 1)), rel=1e-5), (step, rates)
    history = client.get_metric_history(run_id, f"hparams/{LR_PATH}")
    assert [m.value for m in sorted(history, key=lambda m: m.step)][-1] == pytest.approx(0.03)
    # and the donor's weights: what its worker restored is what the donor's step-20 checkpoint holds
    [donor_id] = set(children) - {exploiting_id}
    restored = {key: [(m.step, m.value) for m in client.get_metric_history(run_id, key)]
                for key in ("restore/step", "restore/weights_l1")}
    with mock.patch.dict(os.environ, s3.env):
        [donor_20] = [meta.removesuffix("/meta.json") for meta in s3.keys(bucket, f"ray/by_job/trial_{donor_id}/")
                      if meta.endswith("/meta.json") and json.loads(s3.read(f"s3://{bucket}/{meta}"))["step"] == 20]
        with local_copy(f"s3://{bucket}/{donor_20}", job_db) as donor_checkpoint:
            assert read_step(donor_checkpoint) == 20
            donor_l1 = weights_fingerprint(load_trained_model(donor_checkpoint).model)
    assert restored == {"restore/step": [(30, 20)], "restore/weights_l1": [(30, pytest.approx(donor_l1, rel=1e-12))]}, restored


class watch_train_worker_nodes:
    """Polls Ray's state API in the background for the nodes that run Ray Train workers, and
    reads ``DO_NOT_TRACK`` (MLflow's telemetry off) and MLflow's retries in the environment each
    trial's process started with (Tune's trial actor, its Ray Train workers): ``do_not_track``
    and ``max_retries``, by class name and pid."""

    TRIAL_PROCESSES = ("Trial", "RayTrainWorker")  # detsweep names its trainable's class so (ending_on_stop)

    def __init__(self, dashboard: str):
        self.dashboard = dashboard
        self.nodes: set[str] = set()
        self.do_not_track: dict[tuple[str, int], str | None] = {}
        self.max_retries: dict[tuple[str, int], str | None] = {}
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        from ray.util.state import list_actors

        while not self._done.is_set():
            try:
                actors = list_actors(address=self.dashboard, filters=[("state", "=", "ALIVE")], limit=10_000)
            except Exception:  # the state API can be briefly unavailable; the next poll will do
                actors = []
            for actor in actors:
                if actor.class_name == "RayTrainWorker":
                    self.nodes.add(actor.node_id)
                if actor.class_name in self.TRIAL_PROCESSES and (actor.class_name, actor.pid) not in self.do_not_track:
                    with contextlib.suppress(OSError):  # it ended since
                        started_with = environment_of(actor.pid)  # as the process started: no later write shows
                        self.do_not_track[actor.class_name, actor.pid] = started_with.get("DO_NOT_TRACK")
                        self.max_retries[actor.class_name, actor.pid] = started_with.get("MLFLOW_HTTP_REQUEST_MAX_RETRIES")
            self._done.wait(1.0)

    def stop(self) -> set[str]:
        self._done.set()
        self._thread.join()
        return self.nodes


def environment_of(pid: int) -> dict[str, str]:
    """The environment of process ``pid`` (every node of this module's cluster runs on this machine)."""
    pairs = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0")
    return dict(pair.split("=", 1) for pair in pairs if "=" in pair)
