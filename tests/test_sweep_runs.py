"""Sweeps run for real: ``detsweep launch``, ``status`` and ``resume`` on a local Ray cluster,
with ASHA, Optuna and PBT, a diverging trial, a killed training worker and a killed driver.

Trials are tiny (synthetic 128 px images, 20-40 steps), so most of each test is Ray
starting trials; every test runs its sweep once and checks all it can on it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import REPO, kill_session, run_cli
from .mlflow_checks import assert_no_secret, check_mlflow_runs, check_mlflow_ui, free_port, mlflow_server

QUICKSTART = REPO / "configs" / "quickstart.yaml"


def tiny_sweep(tmp_path: Path, search: str, num_steps: int = 20, every: int = 5, name: str = "tiny",
               scaling: str = "{}", data: str = "{train: {num_images: 16}, val: {num_images: 8}}",
               loop: int | None = None) -> Path:
    """A sweep file of tiny quickstart trials, evaluated and checkpointed ``every`` steps, a
    report every ``loop`` steps (default: ``every``), its results kept under ``tmp_path/ray``."""
    path = tmp_path / f"{name}.yaml"
    path.write_text(f"""
name: {name}
storage: {tmp_path / "ray"}
base:
  from: {QUICKSTART}
  data: {data}
  train: {{num_steps: {num_steps}, steps_per_loop: {loop or every}, eval_every: {every}, checkpoint_every: {every}}}
  optimizer:
    learning_rate: {{total_steps: {num_steps}, warmup_steps: 2, warmup_learning_rate: 0.00001}}
  scaling: {scaling}
search:
{search}
""")
    return path


def results_of(experiment: Path) -> dict[str, list[dict]]:
    """Every result Tune recorded, per trial id, in the order they arrived."""
    rows = {}
    for trial_dir in sorted(experiment.glob("trial_*")):
        lines = (trial_dir / "result.json").read_text().splitlines() if (trial_dir / "result.json").exists() else []
        rows[trial_dir.name.removeprefix("trial_")] = [json.loads(line) for line in lines if line.strip()]
    return rows


def launch_json(*args: str, cwd: Path, env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess, dict]:
    """``detsweep launch … --json`` in ``cwd``: MLflow's embedded default lands there."""
    result = run_cli("launch", *args, "--json", cwd=cwd, env=env)
    assert result.stdout.count("\n") == 1, f"--json must print one line, got:\n{result.stdout[-2000:]}"
    return result, json.loads(result.stdout)


def lr_of(trial: dict) -> float:
    return trial["config"]["optimizer.learning_rate.learning_rate_base"]


@pytest.fixture(scope="module")
def asha_sweep(tmp_path_factory) -> tuple[Path, Path, subprocess.CompletedProcess, dict]:
    """Ranked by the learning rate itself (train/lr, max), ASHA's decisions are known in
    advance: the two smallest rates lose at the first rung, wherever they arrive; the huge
    one diverges. Returns the sweep's folder, its file, and what ``launch --json`` gave."""
    tmp_path = tmp_path_factory.mktemp("asha")
    sweep = tiny_sweep(tmp_path, """
  metric: train/lr
  mode: max
  algorithm: grid
  num_samples: 1
  max_concurrent_trials: 2
  scheduler: {type: asha, grace_period: 5, reduction_factor: 2}
  space:
    optimizer.learning_rate.learning_rate_base: {grid: [0.02, 0.01, 1.0e+12, 0.0001, 0.00003]}
""")
    result, report = launch_json(str(sweep), cwd=tmp_path)
    return tmp_path, sweep, result, report


def test_asha_stops_the_weaker_trials_and_the_sweep_survives_a_diverging_one(asha_sweep):
    tmp_path, sweep, result, report = asha_sweep
    assert result.returncode == 1, result.stderr[-3000:]  # one trial errored
    by_lr = {lr_of(trial): trial for trial in report["trials"]}
    assert set(by_lr) == {0.02, 0.01, 1e12, 0.0001, 0.00003}

    assert by_lr[0.02]["status"] == "TERMINATED" and by_lr[0.02]["metrics"]["step"] == 20
    for weak in (0.0001, 0.00003):
        assert by_lr[weak]["status"] == "STOPPED" and by_lr[weak]["metrics"]["step"] < 20
    diverged = by_lr[1e12]
    assert diverged["status"] == "ERROR" and diverged["error"].startswith("loss is NaN/Inf at step")
    assert f"trial {diverged['trial_id']} failed: loss is NaN/Inf at step" in result.stderr

    ranked = [t["metrics"]["train/lr"] for t in report["trials"] if t["status"] != "ERROR"]
    assert ranked == sorted(ranked, reverse=True) and report["trials"][-1]["status"] == "ERROR"
    assert report["best"] == report["trials"][0]
    assert Path(report["best"]["checkpoint"], "meta.json").exists()  # a detsweep checkpoint, kept by Tune
    experiment = Path(report["path"])
    assert (experiment / "sweep.yaml").exists()
    for rows in results_of(experiment).values():  # Tune heard every loop, at training-step granularity
        assert [row["step"] for row in rows] == list(range(5, 5 * len(rows) + 1, 5))

    # status reads the same trials back, by folder or by sweep file, without starting anything
    for where in (report["path"], str(sweep)):
        status = run_cli("status", where, "--json")
        assert status.returncode == 0, status.stderr
        again = json.loads(status.stdout)
        assert {(t["trial_id"], t["status"]) for t in again["trials"]} == {(t["trial_id"], t["status"]) for t in report["trials"]}
    shown = run_cli("status", report["path"])
    assert "STOPPED" in shown.stdout and "ERROR" in shown.stdout and f"best trial {report['best']['trial_id']}" in shown.stdout

    # MLflow, embedded default: mlflow.db and mlartifacts/ in the working directory
    assert report["mlflow"]["tracking_uri"] == f"sqlite:///{tmp_path / 'mlflow.db'}"
    children = check_mlflow_runs(report, num_steps=20, every=5)
    for trial in report["trials"]:
        run = children[trial["trial_id"]]
        expected = {"TERMINATED": "FINISHED", "STOPPED": "KILLED", "ERROR": "FAILED"}[trial["status"]]
        assert run.info.status == expected, (trial, run.info.status)
        assert (run.data.tags.get("early_stopped") == "true") == (trial["status"] == "STOPPED")
    failed = children[diverged["trial_id"]]
    assert "loss is NaN/Inf at step" in failed.data.tags["detsweep.error"]
    assert (tmp_path / "mlartifacts" / "tiny").is_dir()


def test_the_mlflow_ui_shows_the_sweep_run_and_its_trials_runs_nested(asha_sweep, tmp_path):
    folder, _, _, report = asha_sweep
    check_mlflow_ui(report, cwd=folder, screenshot=tmp_path / "mlflow-ui.png")


def test_resume_with_retry_errored_runs_the_errored_trial_again_and_only_it(asha_sweep):
    """``resume --retry-errored`` of the ASHA sweep: its diverged trial runs again (and diverges
    again: a new end on its MLflow run); the trials that ended are left as they were."""
    from mlflow import MlflowClient

    folder, _, _, report = asha_sweep
    client = MlflowClient(report["mlflow"]["tracking_uri"])
    ended = {t["trial_id"]: client.get_run(t["mlflow_run_id"]).info.end_time for t in report["trials"]}
    rows = {trial_id: len(found) for trial_id, found in results_of(Path(report["path"])).items()}
    result = run_cli("resume", report["path"], "--retry-errored", "--no-register", "--json", cwd=folder)
    assert result.returncode == 1, result.stderr[-3000:]  # the retried trial failed again
    again = json.loads(result.stdout)
    assert {(t["trial_id"], t["status"]) for t in again["trials"]} == {(t["trial_id"], t["status"]) for t in report["trials"]}
    for trial in report["trials"]:
        run = client.get_run(trial["mlflow_run_id"])
        if trial["status"] == "ERROR":
            assert run.info.end_time > ended[trial["trial_id"]] and run.info.status == "FAILED"
            assert "loss is NaN/Inf at step" in run.data.tags["detsweep.error"]
        else:
            assert run.info.end_time == ended[trial["trial_id"]], trial  # not run again
    assert {trial_id: len(found) for trial_id, found in results_of(Path(report["path"])).items()} == rows


@pytest.mark.timeout(480)  # 2 min here; an evaluation whose step is never settled holds Ray Train 5 min
def test_asha_decides_on_evaluations_that_ran_beside_training(tmp_path):
    """``train.evaluation: async``: a Ray task evaluates each checkpoint while the trial trains
    on, and Tune gets the scores at the checkpoint's step. One trial at a time (each takes both
    CPUs: its worker and its evaluator), so ASHA's rung (step 20) has the first trial's score
    when the second arrives there: the second stops exactly when it scored lower. (At step 20
    the larger rate usually scores some recall and the smaller none; a tie lets both finish.)"""
    sweep = tiny_sweep(tmp_path, """
  metric: eval/AR100
  mode: max
  algorithm: grid
  num_samples: 1
  scheduler: {type: asha, grace_period: 20, reduction_factor: 2}
  space:
    optimizer.learning_rate.learning_rate_base: {grid: [0.02, 0.01]}
""", num_steps=30, every=10, loop=5)
    sweep.write_text(sweep.read_text().replace("checkpoint_every: 10}", "checkpoint_every: 0, evaluation: async}"))
    result, report = launch_json(str(sweep), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = results_of(Path(report["path"]))
    first, second = (next(t for t in report["trials"] if lr_of(t) == lr) for lr in (0.02, 0.01))
    for trial in (first, second):  # what the scheduler got: the evaluations, at their checkpoints' steps
        expected = [10, 20, 30] if trial["status"] == "TERMINATED" else [10, 20]
        assert [row["step"] for row in rows[trial["trial_id"]]] == expected, (trial["status"], rows[trial["trial_id"]])
        assert all("eval/AR100" in row and "eval_ema/AR100" in row for row in rows[trial["trial_id"]])
    at_rung = {t["trial_id"]: rows[t["trial_id"]][1]["eval/AR100"] for t in (first, second)}
    assert first["status"] == "TERMINATED"
    stopped = at_rung[second["trial_id"]] < at_rung[first["trial_id"]]
    assert second["status"] == ("STOPPED" if stopped else "TERMINATED"), (at_rung, second["status"])
    check_mlflow_runs(report, num_steps=30, every=5, eval_every=10)


def test_optuna_sweep_samples_with_a_seeded_tpe_and_logs_to_a_basic_auth_tracking_server(tmp_path, monkeypatch):
    import optuna

    sweep = tiny_sweep(tmp_path, """
  metric: train/loss
  mode: min
  num_samples: 2
  algorithm: optuna
  seed: 3
  space:
    optimizer.learning_rate.learning_rate_base: {distribution: log_uniform_values, min: 0.001, max: 0.02}
""", num_steps=10)
    password = "S3cret-for-detsweep-tests"
    with mlflow_server(tmp_path, admin_password=password) as uri:
        wrong = {"MLFLOW_TRACKING_URI": uri, "MLFLOW_TRACKING_USERNAME": "admin", "MLFLOW_TRACKING_PASSWORD": "wrong"}
        refused = run_cli("launch", str(sweep), cwd=tmp_path, env=wrong)
        assert refused.returncode == 2 and refused.stderr.strip() == (
            f"detsweep: error: MLFLOW_TRACKING_URI: the MLflow server at {uri} refused the credentials in "
            "MLFLOW_TRACKING_USERNAME/MLFLOW_TRACKING_PASSWORD (HTTP 401); expected a user it accepts")
        assert not (tmp_path / "ray").exists()  # refused before anything started

        right = {**wrong, "MLFLOW_TRACKING_PASSWORD": password}
        for name, value in right.items():  # for this test's own MlflowClient
            monkeypatch.setenv(name, value)
        result, report = launch_json(str(sweep), cwd=tmp_path, env=right)
        assert result.returncode == 0, result.stderr[-3000:]
        assert [t["status"] for t in report["trials"]] == ["TERMINATED", "TERMINATED"]
        assert report["mlflow"]["tracking_uri"] == uri
        check_mlflow_runs(report, num_steps=10, every=5)
        assert_no_secret(report, password, tmp_path)
    assert not (tmp_path / "mlflow.db").exists()  # everything went through the server
    # TPE starts with its seeded random sampler: the two trials get its first two draws.
    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=3))
    distribution = optuna.distributions.FloatDistribution(0.001, 0.02, log=True)
    expected = [study.ask({"x": distribution}).params["x"] for _ in range(2)]
    assert sorted(lr_of(t) for t in report["trials"]) == pytest.approx(sorted(expected))
    assert list(Path(report["path"]).glob("searcher-state-*.pkl"))  # the searcher is saved for resume


def test_pbt_exploit_continues_from_the_better_trials_checkpoint_with_a_well_defined_schedule(tmp_path):
    from detsweep.config.schema import LearningRateConfig
    from detsweep.optim import build_schedule
    from detsweep.trainables.trial import swept_values

    # Ranked by the learning rate itself, the 0.03 trial is on top at step 20 and the 0.001
    # trial copies it there: its weights, its config, a new EMA decay. Synchronous PBT makes
    # that certain: whichever trial gets to step 20 first waits for the other, so both have
    # a score when the exploit is decided. The next perturbation (step 40) is past the end.
    sweep = tiny_sweep(tmp_path, """
  metric: train/lr
  mode: max
  algorithm: grid
  num_samples: 1
  space:
    optimizer.learning_rate.learning_rate_base: {grid: [0.001, 0.03]}
  scheduler:
    type: pbt
    perturbation_interval: 20
    quantile_fraction: 0.5
    synch: true
    mutations:
      optimizer.moving_average_decay: {values: [0.99, 0.995, 0.999]}
""", num_steps=30, every=10)
    result, report = launch_json(str(sweep), "--no-register", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    experiment = Path(report["path"])
    assert (experiment / "pbt_global.txt").read_text().strip(), "PBT never exploited"
    # The exploiting trial kept its MLflow run; the swept values it took are metrics over steps.
    children = check_mlflow_runs(report, num_steps=30, every=10, pbt=True, registered=False)
    lr_path = "optimizer.learning_rate.learning_rate_base"
    exploiting_id, rows = next((trial_id, rows) for trial_id, rows in results_of(experiment).items()
                               if swept_values(rows[0]["config"], [lr_path])[lr_path] == 0.001)
    assert swept_values(rows[-1]["config"], [lr_path])[lr_path] == 0.03  # it took the better trial's config
    # Its MLflow run has every report: 0.001's schedule up to the exploit at step 20, then,
    # from the donor's step-20 checkpoint (never from step 0), 0.03's schedule to num_steps.
    from mlflow import MlflowClient

    client = MlflowClient(report["mlflow"]["tracking_uri"])
    run_id = children[exploiting_id].info.run_id
    rates = {m.step: m.value for m in client.get_metric_history(run_id, "train/lr")}
    assert sorted(rates) == [10, 20, 30], rates
    tree = rows[0]["config"]["trial"]["optimizer"]["learning_rate"]
    for step, base in ((10, 0.001), (20, 0.001), (30, 0.03)):
        schedule = build_schedule(LearningRateConfig.model_validate({**tree, "learning_rate_base": base}))
        assert rates[step] == pytest.approx(float(schedule(step - 1)), rel=1e-5), (step, rates)
    history = client.get_metric_history(run_id, f"hparams/{lr_path}")
    assert [m.value for m in sorted(history, key=lambda m: m.step)][-1] == pytest.approx(0.03)
    assert children[exploiting_id].data.params[lr_path] == "0.001"  # params keep the trial's first values


def test_a_killed_worker_and_a_tracking_server_outage_lose_no_step(tmp_path):
    """Mid-trial, the MLflow server goes away for 30 s and the training worker is killed.
    Ray Train restarts the worker from its checkpoint and the trial ends at exactly
    num_steps; what the trial logged while the server was away is retried and arrives once it
    is back; the trial keeps one MLflow run with every loop once, in order: loops of 2 steps,
    most of them past Ray Train (which polls its workers only every 10 s here) down the
    report channel. The steps trained twice are on the run, and none is older than the
    checkpoint the kill found."""
    sweep = tiny_sweep(tmp_path, "  num_samples: 1\n  metric: train/loss\n  mode: min\n", num_steps=40, every=10,
                       loop=2, scaling="{max_failures: 1}")
    port = free_port()
    with mlflow_server(tmp_path, port=port) as uri:
        launch = subprocess.Popen([sys.executable, "-m", "detsweep", "launch", str(sweep), "--json", "--no-register"],
                                  cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  start_new_session=True,
                                  env={**os.environ, "MLFLOW_TRACKING_URI": uri, "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "10"})
        assert wait_for_train_metric(uri) < 40
    down_at = time.monotonic()  # the server is stopped; the trial trains on
    try:
        checkpointed = kill_train_worker_after_a_checkpoint(tmp_path / "ray", session=launch.pid)
        time.sleep(max(0.0, 30 - (time.monotonic() - down_at)))  # the outage lasts 30 s
        with mlflow_server(tmp_path, port=port):
            stdout, stderr = launch.communicate(timeout=600)
            check_killed_worker_run(stdout, stderr, launch.returncode, checkpointed)
    finally:
        kill_session(launch)


def check_killed_worker_run(stdout: str, stderr: str, returncode: int, checkpointed: int) -> None:
    assert returncode == 0, stderr[-3000:]
    assert checkpointed < 40  # the kill landed mid-training
    assert "failed (" in stderr and "retrying in" in stderr  # a write hit the outage and was retried
    report = json.loads(stdout)
    trial = report["trials"][0]
    assert trial["status"] == "TERMINATED" and trial["metrics"]["step"] == 40
    steps = [row["step"] for row in next(iter(results_of(Path(report["path"])).values()))]
    assert steps == list(range(2, 41, 2))  # continued from the checkpoint: no step reported twice
    run = check_mlflow_runs(report, num_steps=40, every=2, eval_every=10, registered=False)[trial["trial_id"]]
    assert "detsweep.lost_writes" not in run.data.tags
    # Ray Train saw the dead worker and restarted the group once; what it trained again (if
    # the kill came after loops past the checkpoint had been passed on) is after that checkpoint.
    assert run.data.tags["detsweep.worker_failures"].startswith("1: "), run.data.tags
    replayed = run.data.tags.get("detsweep.replayed_steps")
    if replayed:
        [(first, last)] = [tuple(map(int, part.split("-"))) for part in replayed.split(", ")]
        assert checkpointed < first <= last < 40, (replayed, checkpointed)


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


def kill_train_worker_after_a_checkpoint(storage: Path, session: int, timeout_s: float = 300) -> int:
    """Once Ray Train has registered a checkpoint of the trial's run, SIGKILL its training
    worker (Ray names the process ``ray::RayTrainWorker…``), found among the processes of
    ``session`` only; returns the step of the latest checkpoint Ray Train had registered: the
    one a restart goes on from. (A checkpoint saved but not yet reported, for a poll that
    never came, is not one: a restart goes back before it.)"""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        registered = [step for path in storage.glob("*-train-*/checkpoint_manager_snapshot.json")
                      for step in registered_steps(path)]
        workers = [pid for pid in session_processes(session) if b"RayTrainWorker" in command_line(pid)]
        if registered and workers:
            os.kill(workers[0], signal.SIGKILL)
            return max(registered)
        time.sleep(0.5)
    raise AssertionError("no Ray Train worker with a registered checkpoint was found to kill in time")


def registered_steps(snapshot: Path) -> list[int]:
    """The steps of the checkpoints in Ray Train's checkpoint manager snapshot."""
    try:
        results = json.loads(snapshot.read_text())["checkpoint_results"]
    except (OSError, ValueError, KeyError):  # being written
        return []
    return [int(result["metrics"]["step"]) for result in results]


def session_processes(session: int) -> list[int]:
    """The processes of one session (``start_new_session``): what that command started, and only that."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # it ended while we looked
            continue
        if int(fields[3]) == session:  # after the name: state, ppid, pgrp, session
            pids.append(int(stat.parent.name))
    return pids


def command_line(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_a_killed_driver_is_finished_by_resume_without_restarting_checkpointed_trials(tmp_path):
    sweep = tiny_sweep(tmp_path, """
  metric: train/loss
  mode: min
  algorithm: grid
  num_samples: 1
  space:
    optimizer.learning_rate.learning_rate_base: {grid: [0.01, 0.02]}
""", num_steps=30, every=10)
    driver = subprocess.Popen([sys.executable, "-m", "detsweep", "launch", str(sweep)], cwd=tmp_path,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    experiment = tmp_path / "ray" / "tiny"
    try:
        wait_until_tune_state_names(experiment, "checkpoint_000000")
    finally:
        kill_session(driver)  # the driver and the local Ray cluster it started
    driver.wait()
    killed_at = time.time()

    unfinished = json.loads(run_cli("status", str(experiment), "--json").stdout)
    assert any(t["status"] not in ("TERMINATED", "STOPPED") for t in unfinished["trials"])

    result = run_cli("resume", str(experiment), "--json", "--no-register", cwd=REPO)  # MLflow is remembered
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["mlflow"]["tracking_uri"] == f"sqlite:///{tmp_path / 'mlflow.db'}"
    check_mlflow_runs(report, num_steps=30, every=10, registered=False)  # the same runs continued
    assert len(report["trials"]) == 2
    assert all(t["status"] == "TERMINATED" and t["metrics"]["step"] == 30 for t in report["trials"])
    for trial_id, rows in results_of(experiment).items():
        before = [row["step"] for row in rows if row["timestamp"] < killed_at]
        after = [row["step"] for row in rows if row["timestamp"] >= killed_at]
        if before:  # a trial that had reported went on from a checkpoint, not from step 0
            assert after == [] or after[0] > 10, (trial_id, before, after)


def wait_until_tune_state_names(experiment: Path, checkpoint: str, timeout_s: float = 300) -> None:
    """Until Tune's experiment state (what ``resume`` reads) holds a trial's ``checkpoint``:
    Tune pickles each trial's checkpoints into that JSON file, as hex."""
    needle = checkpoint.encode().hex()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for state in experiment.glob("experiment_state-*.json"):
            try:
                if needle in state.read_text():
                    return
            except OSError:  # being replaced
                pass
        time.sleep(0.5)
    raise AssertionError(f"Tune's experiment state never named a {checkpoint} in time")


def test_a_sweep_spreads_over_a_two_node_cluster_by_address_and_by_ray_job_submit(tmp_path):
    """A real two-node Ray cluster on this machine (a head and a second raylet, one CPU
    each): each trial's worker lands on its own node."""
    import ray
    from ray.cluster_utils import Cluster

    dashboard_port = free_port()
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "include_dashboard": True, "dashboard_port": dashboard_port})
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address)
        nodes = {node["NodeID"] for node in ray.nodes() if node["Alive"]}
        assert len(nodes) == 2
        search = "  num_samples: 2\n  metric: train/loss\n  mode: min\n"

        # validate --address sizes the sweep for that cluster (one CPU per node), not for this machine
        sized = tiny_sweep(tmp_path, search, name="sized")
        fits = run_cli("validate", str(sized), "--address", cluster.address, "--json")
        assert fits.returncode == 0 and json.loads(fits.stdout)["trials_at_once"] == 2, fits.stderr[-2000:]
        too_big = run_cli("validate", str(sized), "--address", cluster.address, "--set", "base.scaling.cpus_per_worker=2")
        assert too_big.returncode == 2 and too_big.stderr.strip() == (
            f"detsweep: error: {sized}: base.scaling.cpus_per_worker: found 2, expected <= 1 (the most CPUs any node has)")
        assert run_cli("validate", str(sized), "--set", "base.scaling.cpus_per_worker=2").returncode == 0  # fits here

        seen = watch_train_worker_nodes()
        result, report = launch_json(str(tiny_sweep(tmp_path, search, num_steps=10, name="by_address")),
                                     "--address", cluster.address, "--no-register", cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-3000:]
        assert [t["status"] for t in report["trials"]] == ["TERMINATED", "TERMINATED"]
        assert seen.stop() == nodes  # the two trials' workers ran on both nodes
        assert all(t["mlflow_run_id"] for t in report["trials"])  # logged from both nodes

        seen = watch_train_worker_nodes()
        job_db = f"sqlite:///{tmp_path / 'job.db'}"
        job = subprocess.run(
            [str(Path(sys.executable).parent / "ray"), "job", "submit", "--address", f"http://127.0.0.1:{dashboard_port}",
             "--runtime-env-json", json.dumps({"env_vars": {"MLFLOW_TRACKING_URI": job_db}}),
             "--", sys.executable, "-m", "detsweep", "launch", str(tiny_sweep(tmp_path, search, num_steps=10, name="by_job")),
             "--address", "auto", "--json", "--no-register"],
            capture_output=True, text=True, cwd=REPO, timeout=900)
        assert job.returncode == 0, (job.stdout + job.stderr)[-3000:]
        printed = [json.loads(line) for line in job.stdout.splitlines() if line.startswith('{"name"')]
        assert [t["status"] for t in printed[0]["trials"]] == ["TERMINATED", "TERMINATED"]
        assert printed[0]["mlflow"]["tracking_uri"] == job_db and (tmp_path / "job.db").exists()
        assert seen.stop() == nodes
    finally:
        ray.shutdown()
        cluster.shutdown()


class watch_train_worker_nodes:
    """Polls Ray's state API in the background for the nodes that run Ray Train workers."""

    def __init__(self):
        import threading

        self.nodes: set[str] = set()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        from ray.util.state import list_actors

        while not self._done.is_set():
            try:
                actors = list_actors(filters=[("class_name", "=", "RayTrainWorker"), ("state", "=", "ALIVE")])
                self.nodes.update(actor.node_id for actor in actors)
            except Exception:  # the state API can be briefly unavailable; the next poll will do
                pass
            self._done.wait(1.0)

    def stop(self) -> set[str]:
        self._done.set()
        self._thread.join()
        return self.nodes
