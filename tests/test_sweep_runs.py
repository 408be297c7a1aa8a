"""Sweeps run for real: ``detsweep launch``, ``status`` and ``resume`` on a local Ray cluster,
with ASHA on evaluations beside training and a diverging trial (the session's trained sweep,
``conftest.trained_sweep_launch``), and BOHB's HyperBand in a bucket resumed from the bucket
alone on another machine after its driver was killed twice. A time budget, on a terminal, stops a fine-tuning
sweep (``test_finetune.py``). Optuna and PBT run on the two-node cluster
(``test_two_node_cluster.py``); a trial whose worker's node is lost during a tracking
server's outage ends from its checkpoint in a bucket (``test_cluster_sweeps.py``).

Trials are tiny (synthetic 128 px images, 30-150 steps), so most of each test is Ray
starting trials; each sweep runs once, and its tests check all they can on it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import (
    REPO,
    cli_environment,
    foreign_lines,
    run_cli,
    run_here,
)
from .mlflow_checks import check_mlflow_runs, check_mlflow_ui
from .tiny_sweeps import lr_of, results_in_bucket, results_of, shapes_in_bucket, tiny_sweep


def test_asha_stops_the_weaker_trials_and_the_sweep_survives_a_diverging_one(trained_sweep_launch):
    """The session's trained sweep (``conftest.trained_sweep_launch``): ASHA stops the trial
    that hardly learns at its rung, and the one at 1e12 diverges in its first loop: the sweep
    ranks the others, says why that one failed, and exits 1."""
    folder, sweep, result, report = trained_sweep_launch
    assert result.returncode == 1, result.stderr[-3000:]  # one trial errored
    by_lr = {lr_of(trial): trial for trial in report["trials"]}
    assert set(by_lr) == {0.04, 0.00001, 1e12}

    assert by_lr[0.04]["status"] == "TERMINATED" and by_lr[0.04]["metrics"]["step"] == 150
    assert by_lr[0.00001]["status"] == "STOPPED" and by_lr[0.00001]["metrics"]["step"] == 75
    diverged = by_lr[1e12]
    assert diverged["status"] == "ERROR" and diverged["error"].startswith("loss is NaN/Inf at step")
    assert f"trial {diverged['trial_id']} failed: loss is NaN/Inf at step" in result.stderr
    assert f"trial {diverged['trial_id']} errored: loss is NaN/Inf at step" in result.stderr  # as it happened
    error_file = Path(report["path"], f"trial_{diverged['trial_id']}", "error.txt")
    assert f"(full log: {error_file})" in result.stderr and error_file.is_file()
    # the console has detsweep's lines only; Ray's, Tune's and the workers' are in the sweep's log
    assert not foreign_lines(result.stderr), foreign_lines(result.stderr)
    [log] = Path(report["path"], "logs").glob("launch-*.log")
    assert "RayTrainWorker" in log.read_text() and f"logs: {log} " in result.stderr

    ranked = [t["metrics"]["eval/AP_best"] for t in report["trials"] if t["status"] != "ERROR"]
    assert ranked == sorted(ranked, reverse=True) and report["trials"][-1]["status"] == "ERROR"
    assert report["best"] == report["trials"][0] == by_lr[0.04]
    assert Path(report["best"]["checkpoint"], "meta.json").exists()  # a detsweep checkpoint, kept by Tune
    assert (Path(report["path"]) / "sweep.yaml").exists()
    # (that Tune hears every loop, not only the milestones: test_cluster_sweeps' lost node)

    # status reads the same trials back, by folder, by sweep file, or by name under
    # ~/ray_results (where a sweep without `storage` goes), without starting anything
    home = folder / "home"
    (home / "ray_results").mkdir(parents=True)
    (home / "ray_results" / "source").symlink_to(report["path"])
    *statuses, shown = [*[run_here("status", where, "--json", env=env)
                          for where, env in ((report["path"], None), (str(sweep), None), ("source", {"HOME": str(home)}))],
                        run_here("status", report["path"])]
    for status in statuses:
        assert status.returncode == 0, status.stderr
        again = json.loads(status.stdout)
        assert {(t["trial_id"], t["status"]) for t in again["trials"]} == {(t["trial_id"], t["status"]) for t in report["trials"]}
    assert "STOPPED" in shown.stdout and "ERROR" in shown.stdout and f"best trial {report['best']['trial_id']}" in shown.stdout

    # MLflow, embedded default: mlflow.db and mlartifacts/ in the working directory
    from mlflow import MlflowClient

    assert report["mlflow"]["tracking_uri"] == f"sqlite:///{folder / 'mlflow.db'}"
    client = MlflowClient(report["mlflow"]["tracking_uri"])
    for trial in report["trials"]:
        run = client.get_run(trial["mlflow_run_id"])
        expected = {"TERMINATED": "FINISHED", "STOPPED": "KILLED", "ERROR": "FAILED"}[trial["status"]]
        assert run.info.status == expected, (trial, run.info.status)
        assert (run.data.tags.get("early_stopped") == "true") == (trial["status"] == "STOPPED")
    failed = client.get_run(diverged["mlflow_run_id"])
    assert "loss is NaN/Inf at step" in failed.data.tags["detsweep.error"]
    # the stopped trial's run ended as ASHA stopped it (by the driver: sweeps/closing.py), before
    # the next trial's run began (one trial at a time), not at the sweep's end
    assert client.get_run(by_lr[0.00001]["mlflow_run_id"]).info.end_time < failed.info.start_time
    # a diverged training ends its run: Ray Train did not restart its workers (max_failures 2),
    # whose last checkpoint would only diverge again
    assert "detsweep.worker_failures" not in failed.data.tags, failed.data.tags
    assert (folder / "mlartifacts" / "source").is_dir()


def test_the_mlflow_ui_shows_the_trials_nested_with_their_metric_cost_and_datasets_and_the_champion(trained_sweep):
    folder, report = trained_sweep
    check_mlflow_ui(report, cwd=folder, screenshots=REPO / "test-output" / "mlflow-ui")  # kept for people to look at


def test_resume_with_retry_errored_runs_the_errored_trial_again_and_only_it(trained_sweep):
    """``resume --retry-errored`` of the session's trained sweep: its diverged trial runs again
    (and diverges again: a new end on its MLflow run); the trials that ended are left as they
    were."""
    from mlflow import MlflowClient

    folder, report = trained_sweep
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


def test_asha_decides_on_evaluations_that_ran_beside_training(trained_sweep):
    """``train.evaluation: async`` (the session's trained sweep, ``conftest.trained_sweep``): a
    Ray task evaluates each checkpoint while the trial trains on, and Tune gets the scores at
    the checkpoint's step, though the trial reports every 25 steps. ASHA decides on the val
    loss, a real number (recall often ties at 0, and a tie stops nothing): the first trial
    learns at 0.04, the second hardly at all at 0.00001, so at step 75 its loss is far the
    higher and it stops there. Each trial's MLflow run holds every loop, its checkpoints and
    its node's system metrics; the best checkpoint is registered."""
    _, report = trained_sweep
    rows = results_of(Path(report["path"]))
    first, second = (next(t for t in report["trials"] if lr_of(t) == lr) for lr in (0.04, 0.00001))
    # what the scheduler got: the evaluations, at their checkpoints' steps; the second's end at the rung
    assert [row["step"] for row in rows[first["trial_id"]]] == [75, 150], rows[first["trial_id"]]
    assert [row["step"] for row in rows[second["trial_id"]]] == [75], rows[second["trial_id"]]
    for trial in (first, second):
        assert all("eval/loss" in row and "eval_ema/loss" in row for row in rows[trial["trial_id"]])
    at_rung = {t["trial_id"]: rows[t["trial_id"]][0]["eval/loss"] for t in (first, second)}
    assert at_rung[second["trial_id"]] > at_rung[first["trial_id"]], at_rung  # what ASHA saw: the rule's reason
    assert (first["status"], second["status"]) == ("TERMINATED", "STOPPED"), at_rung
    check_mlflow_runs(report, num_steps=150, every=25, eval_every=75, system_metrics=True)


def saved_state(experiment: str) -> list:
    """The trials in Tune's saved experiment state (what a resume reads), at a folder or a
    bucket's URI; none before it is written."""
    from ray.tune import ExperimentAnalysis

    try:
        return ExperimentAnalysis(experiment).trials
    except (ValueError, OSError):  # not written yet (missing, or a bucket's not found), or mid-write (bad JSON)
        return []


def saved_trials(experiment: str) -> dict[str, tuple[str, int]]:
    """Each trial's status and last step in Tune's saved experiment state."""
    return {trial.trial_id: (trial.status, (trial.last_result or {}).get("step", 0)) for trial in saved_state(experiment)}


def checkpointed_steps(experiment: str) -> dict[str, int]:
    """Each trial's step at its latest checkpoint in Tune's saved experiment state (what a resume
    restores from). A reported checkpoint reaches that state after its result does: Tune records
    the result, then saves the trial in a task of its own."""
    return {trial.trial_id: trial.latest_checkpoint_result.metrics.get("step", 0)
            for trial in saved_state(experiment) if trial.latest_checkpoint_result}


@pytest.mark.upgrade_check
@pytest.mark.timeout(900)
def test_bohb_resumed_from_its_bucket_alone_after_its_driver_died_with_trials_waiting_and_after_a_ranking_ranks_the_bracket_once(
        s3, tmp_path, monkeypatch):
    """``algorithm: bohb``: HyperBand counts reports (3 here, one every 10 steps); with a factor
    of 3 its largest bracket holds 3 trials, ranks them at their first report, keeps 1 and
    trains it to the end. Two trials at a time: the first two pause at step 10 and wait for
    the third. The sweep's data and results are in a bucket. The driver is killed while they
    wait; ``status`` of the bucket's URI says trials did not end. Nothing of the first machine
    is used again (another folder, an empty data cache, its logs gone) but its MLflow (a
    cluster's server would be elsewhere too): ``resume`` of the bucket's URI finds the sweep's
    MLflow by itself. It is killed again once the bracket was ranked and the trial it kept
    trained past step 10 and its checkpoint there was saved. Each ``resume`` rebuilds the bracket from the trials and the searcher
    from its saved state: the waiting trials are not started before the ranking, the bracket
    is ranked once (the lower loss at step 10 goes on from its own checkpoint there, on the
    same MLflow run, which says what it restored; the others stop where they paused and never
    train again), and a resume of the finished sweep trains nothing."""
    import shutil

    from mlflow import MlflowClient

    from detsweep.tracking import TrialStatus

    from .conftest import kill_session, wait_until

    bucket = s3.new_bucket("bohb")
    data = shapes_in_bucket(s3, tmp_path, bucket)
    dataset = f"{{format: coco, annotations: {data}/annotations.json, images: {data}/images}}"
    sweep = tiny_sweep(tmp_path, """
  metric: train/loss
  mode: min
  algorithm: bohb
  seed: 0
  num_samples: 3
  max_concurrent_trials: 2
  scheduler: {type: hyperband, reduction_factor: 3}
  space:
    optimizer.learning_rate.learning_rate_base: {distribution: log_uniform_values, min: 0.01, max: 0.04}
""", num_steps=30, every=10, storage=f"s3://{bucket}/ray", data=f"{{train: {dataset}, val: {dataset}}}")
    experiment = f"s3://{bucket}/ray/tiny"
    for name, value in s3.env.items():  # this process reads Tune's state in the bucket (not connected to Ray)
        monkeypatch.setenv(name, value)
    first, second = tmp_path / "first-machine", tmp_path / "second-machine"
    first.mkdir()
    second.mkdir()

    def killed_once(command: list[str], machine: Path, condition, what: str) -> dict[str, tuple[str, int]]:
        # Tune's state reaches the bucket every 2 s (Tune's TUNE_GLOBAL_CHECKPOINT_S; at least
        # 10 s by default): the kill follows what the test waits for sooner, nothing else changes
        env = {**s3.env, "DETSWEEP_DATA_CACHE": str(machine / "cache"), "TUNE_GLOBAL_CHECKPOINT_S": "2"}
        driver = subprocess.Popen([sys.executable, "-m", "detsweep", *command], cwd=machine, env=cli_environment(env),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            wait_until(lambda: condition(saved_trials(experiment)), 400, what)
        finally:
            kill_session(driver)
            driver.wait()
        return saved_trials(experiment)

    waiting = killed_once(["launch", str(sweep), "--no-register"], first, lambda saved: sum(
        state == ("PAUSED", 10) for state in saved.values()) >= 2, "two trials were not saved paused at the rung")
    assert len(waiting) <= 3 and not any(step > 10 for _, step in waiting.values()), waiting
    shutil.rmtree(first / "cache")  # the machine's copy of the data, and its logs, are gone
    shutil.rmtree(first / "logs", ignore_errors=True)
    unfinished = run_here("status", experiment, "--json", cwd=second, env=s3.env)
    shown = {t["trial_id"]: (t["status"], t["metrics"].get("step", 0)) for t in json.loads(unfinished.stdout)["trials"]}
    # each trial as the dead driver left it: two paused at the rung, the third waiting, running, or (had it
    # reported before the kill) ranked with them, which status calls STOPPED
    assert shown == {trial_id: (TrialStatus.of(state, step, 30), step) for trial_id, (state, step) in waiting.items()}, shown

    # killed once a checkpoint past the rung is saved: killed between its result and its checkpoint,
    # a resume trains that step again from the rung's checkpoint, as it should (seen once)
    ranked = killed_once(["resume", experiment, "--no-register"], second,
                         lambda saved: any(step >= 20 for step in checkpointed_steps(experiment).values()),
                         "no trial's checkpoint past the rung was saved after the first resume")
    [kept] = [trial_id for trial_id, (_, step) in ranked.items() if step >= 20]
    stopped = [trial_id for trial_id in ranked if trial_id != kept]
    assert len(ranked) == 3 and [ranked[trial_id] for trial_id in stopped] == [("TERMINATED", 10)] * 2, ranked
    on_second = {**s3.env, "DETSWEEP_DATA_CACHE": str(second / "cache")}
    finished = run_cli("resume", experiment, "--json", "--no-register", cwd=second, env=on_second)
    assert finished.returncode == 0, finished.stderr[-3000:]
    report = json.loads(finished.stdout)
    assert report["mlflow"]["tracking_uri"] == f"sqlite:///{first / 'mlflow.db'}"  # remembered, not this folder's
    assert not (second / "mlflow.db").exists()
    assert {t["trial_id"]: (t["status"], t["metrics"]["step"]) for t in report["trials"]} == {
        trial_id: ("TERMINATED", 30) if trial_id == kept else ("STOPPED", 10) for trial_id in ranked}
    rows = results_in_bucket(s3, experiment)
    at_10 = {trial_id: found[0]["train/loss"] for trial_id, found in rows.items()}
    assert min(at_10, key=at_10.get) == kept, at_10  # the ranking's rule
    assert {trial_id: [row["step"] for row in found] for trial_id, found in rows.items() if trial_id != kept} == {
        trial_id: [10] for trial_id in stopped}  # stopped at the rung, never trained again
    assert [row["step"] for row in rows[kept]] == [10, 20, 30]  # each once: no step trained again from an older checkpoint
    check_mlflow_runs(report, num_steps=30, every=10, registered=False)  # every step once on each run
    client = MlflowClient(report["mlflow"]["tracking_uri"])
    by_id = {trial["trial_id"]: trial for trial in report["trials"]}
    restored = [metric.value for metric in client.get_metric_history(by_id[kept]["mlflow_run_id"], "restore/step")]
    if waiting.get(kept) == ("PAUSED", 10):  # it waited at the rung: on from its checkpoint there
        assert restored[:1] == [10], restored
    # (the last to reach the rung, ranked on its own report, went on without a pause)
    # (none, if it had reached step 30 before the second kill was saved)
    assert restored == sorted(restored) and all(step >= 10 for step in restored), restored  # never from 0
    assert all(client.get_run(by_id[trial_id]["mlflow_run_id"]).data.tags["early_stopped"] == "true"
               for trial_id in stopped)
    # resumed when finished: HyperBand's brackets rebuilt from the trials, nothing trains again
    again = run_cli("resume", experiment, "--json", "--no-register", cwd=second, env=on_second)
    assert again.returncode == 0, again.stderr[-3000:]
    assert {t["trial_id"]: (t["status"], t["metrics"]["step"]) for t in json.loads(again.stdout)["trials"]} == {
        trial_id: ("TERMINATED", 30) if trial_id == kept else ("STOPPED", 10) for trial_id in ranked}
    assert results_in_bucket(s3, experiment) == rows, results_in_bucket(s3, experiment)  # not a row more
