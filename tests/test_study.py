"""Every sweep an Optuna study (issue #77): its trials, whatever searcher and scheduler ran
them, as frozen trials Optuna reads back, written at the sweep's end and on demand."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import optuna
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState

from bench.importance import KNOWN_SEARCH
from detsweep.sweeps.experiment import TrialOutcome
from detsweep.sweeps.spec import load_sweep
from detsweep.sweeps.study import STUDY_FILE, read_study, study_trials, write_study
from detsweep.tracking.sweep_run import TrialStatus

from .conftest import run_cli, run_here, wait_until
from .tiny_sweeps import tiny_sweep

SPACE = KNOWN_SEARCH + "    data.augmentation.random_horizontal_flip: {value: 0.5}\n"  # a constant: no parameter


def outcome(trial_id: str, status: TrialStatus, values: dict, **fields) -> TrialOutcome:
    return TrialOutcome(trial_id, status, fields.pop("metrics", {}), values, None, fields.pop("error", None), {},
                        fields.pop("infeasible", None))


def test_a_sweeps_trials_become_frozen_trials_with_their_states_steps_distributions_and_attributes(tmp_path):
    sweep = load_sweep(tiny_sweep(tmp_path, SPACE))
    chosen = {"optimizer.momentum_optimizer_value": 0.9, "optimizer.learning_rate.learning_rate_base": 0.01,
              "train.seed": 3, "data.augmentation.random_horizontal_flip": 0.5}
    outcomes = [
        outcome("a", TrialStatus.TERMINATED, {**chosen, "optimizer.type": "momentum"},
                metrics={"eval/AP_best": 0.4, "step": 20}),
        outcome("b", TrialStatus.STOPPED, {**chosen, "optimizer.type": "adam"}, metrics={"eval/AP_best": 0.1, "step": 10}),
        outcome("c", TrialStatus.ERROR, {**chosen, "optimizer.type": "adam"}, error="loss is NaN/Inf at step 5"),
        outcome("d", TrialStatus.INFEASIBLE, {**chosen, "optimizer.type": "adam"}, infeasible="serve/ms > 9"),
    ]
    curves = {"a": {"eval/AP_best": {10: 0.2, 20: 0.4}}, "b": {"eval/AP_best": {5: 0.05, 10: 0.1}}}
    a, b, c, d = study_trials(sweep, outcomes, curves, {"a": "run-a"})
    assert (a.state, a.values, a.intermediate_values) == (TrialState.COMPLETE, [0.4], {10: 0.2, 20: 0.4})
    assert (b.state, b.values, b.intermediate_values) == (TrialState.PRUNED, [0.1], {5: 0.05, 10: 0.1})  # at its last step
    assert (c.state, c.values, c.user_attrs["error"]) == (TrialState.FAIL, None, "loss is NaN/Inf at step 5")
    assert (d.state, d.user_attrs["infeasible"]) == (TrialState.FAIL, "serve/ms > 9")
    assert a.user_attrs == {"trial_id": "a", "seed": 3, "mlflow_run_id": "run-a"} and b.user_attrs["mlflow_run_id"] is None
    # the momentum only momentum has; the constant is no parameter; log scales kept
    assert "optimizer.momentum_optimizer_value" in a.params and "optimizer.momentum_optimizer_value" not in b.params
    assert a.distributions == {
        "optimizer.type": CategoricalDistribution(["momentum", "adam"]),
        "optimizer.momentum_optimizer_value": FloatDistribution(0.8, 0.99),
        "optimizer.learning_rate.learning_rate_base": FloatDistribution(0.001, 0.1, log=True),
        "train.seed": IntDistribution(0, 9)}
    # written whole, and Optuna reads it back
    written = write_study(sweep, [a, b, c, d], tmp_path / "out" / STUDY_FILE)
    assert [p.name for p in written.parent.iterdir()] == [STUDY_FILE]  # no scratch folder or lock left
    study = read_study(written)
    assert (study.study_name, study.direction, study.metric_names) == ("tiny", optuna.study.StudyDirection.MAXIMIZE,
                                                                       ["eval/AP_best"])
    assert [t.state for t in study.trials] == [TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL, TrialState.FAIL]
    assert study.best_trial.user_attrs["trial_id"] == "a" and study.trials[1].intermediate_values == {5: 0.05, 10: 0.1}


def test_two_objectives_keep_each_ones_steps_as_attributes_and_values_out_of_range_widen_their_distribution(tmp_path):
    sweep = load_sweep(tiny_sweep(tmp_path, """
  algorithm: random
  num_samples: 2
  objectives: [{metric: eval/AP_best, mode: max}, {metric: train/images_per_sec, mode: max}]
  space:
    optimizer.learning_rate.learning_rate_base: {distribution: uniform, min: 0.01, max: 0.1}
    optimizer.learning_rate: {values: [{type: cosine, learning_rate_base: 0.04}, {type: constant, learning_rate: 0.01}]}
"""))
    schedule = {"type": "cosine", "learning_rate_base": 0.04}
    [trial] = study_trials(sweep, [outcome("a", TrialStatus.TERMINATED, {
        "optimizer.learning_rate.learning_rate_base": 0.3, "optimizer.learning_rate": schedule},
        metrics={"eval/AP_best": 0.3, "train/images_per_sec": 12.0})],
        {"a": {"eval/AP_best": {5: 0.1, 10: 0.3}, "train/images_per_sec": {5: 11.0, 10: 12.0}}})
    assert trial.values == [0.3, 12.0] and trial.intermediate_values == {}
    assert trial.user_attrs["steps/eval/AP_best"] == {"5": 0.1, "10": 0.3}
    assert trial.distributions["optimizer.learning_rate.learning_rate_base"] == FloatDistribution(0.01, 0.3)  # PBT-like
    assert trial.params["optimizer.learning_rate"] == json.dumps(schedule, sort_keys=True)  # a whole schedule as JSON
    study = read_study(write_study(sweep, [trial], tmp_path / STUDY_FILE))
    assert study.directions == [optuna.study.StudyDirection.MAXIMIZE] * 2 and len(study.best_trials) == 1


def test_the_trained_sweep_is_a_study_at_its_end_in_its_folder_and_on_its_parent_run_and_on_demand(
        trained_sweep, tmp_path):
    """The suite's ASHA sweep (one trial trained to the end, one stopped at its rung, one
    diverged): its study is in its folder and on its parent run, and optuna-dashboard serves
    it; ``detsweep study`` writes the same trials again, MLflow runs and all; a bucket is
    refused for --out. Its importance: the line that says three trials cannot tell."""
    from mlflow import MlflowClient

    folder, report = trained_sweep
    journal = folder / "ray" / "source" / STUDY_FILE
    assert report["study"] == str(journal)
    study = read_study(journal)
    by_state = {t.state: t for t in study.trials}
    assert sorted(t.state.name for t in study.trials) == ["COMPLETE", "FAIL", "PRUNED"]
    stopped = by_state[TrialState.PRUNED]
    assert max(stopped.intermediate_values) == 75 and stopped.value == stopped.intermediate_values[75]
    assert max(by_state[TrialState.COMPLETE].intermediate_values) == 150
    assert "NaN" in by_state[TrialState.FAIL].user_attrs["error"]
    runs = {t["trial_id"]: t["mlflow_run_id"] for t in report["trials"]}
    assert {t.user_attrs["trial_id"]: t.user_attrs["mlflow_run_id"] for t in study.trials} == runs
    client = MlflowClient(report["mlflow"]["tracking_uri"])
    assert STUDY_FILE in [a.path for a in client.list_artifacts(report["mlflow"]["parent_run_id"])]

    assert served(journal, tmp_path) == ("source", 3)

    again = tmp_path / "again.journal"
    result = run_cli("study", str(folder / "ray" / "source"), "--out", str(again), cwd=folder)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == f"{again}: 3 trials (1 complete, 1 fail, 1 pruned); open it with: optuna-dashboard {again}"
    assert [(t.state, t.params, t.user_attrs) for t in read_study(again).trials] == [
        (t.state, t.params, t.user_attrs) for t in study.trials]
    # MLflow alone (the name, with no folder under ~/ray_results): the same trials
    alone = run_here("study", "source", "--out", str(tmp_path / "alone.journal"), cwd=folder)
    assert alone.returncode == 0, alone.stderr[-3000:]
    assert [(t.state, t.params, t.distributions, t.values, t.intermediate_values, t.user_attrs)
            for t in read_study(tmp_path / "alone.journal").trials] == [
        (t.state, t.params, t.distributions, t.values, t.intermediate_values, t.user_attrs) for t in study.trials]
    # which settings mattered: three trials cannot tell, which the sweep's end said, as the command does
    too_few = "2 trials reached one evaluated step; importance needs 20 at one step"
    assert report["importance"] == too_few
    said = run_here("importance", str(folder / "ray" / "source"), "--json", cwd=folder)
    assert json.loads(said.stdout) == {"importance": None, "why": too_few}, said.stderr[-2000:]
    unknown = run_here("importance", "source", "--objective", "eval/AP50", cwd=folder)  # (MLflow's download bar before)
    assert unknown.returncode == 2 and unknown.stderr.strip().splitlines()[-1] == (
        "detsweep: error: --objective: found eval/AP50, expected one of the sweep's objectives: eval/AP_best")
    refused = run_cli("study", str(folder / "ray" / "source"), "--out", "s3://bucket/study.journal", cwd=folder)
    assert refused.returncode == 2 and refused.stderr.strip().splitlines()[-1].startswith("detsweep: error: --out: found s3://")


def served(journal: Path, tmp_path: Path) -> tuple[str, int]:
    """optuna-dashboard started on ``journal`` as it is: the study it serves, and its trials."""
    import requests

    from bench.common import free_port

    uri = f"http://127.0.0.1:{free_port()}"
    with (tmp_path / "dashboard.log").open("w") as log:  # wsgiref: gunicorn keeps a socket in ~
        server = subprocess.Popen([str(Path(sys.executable).parent / "optuna-dashboard"), str(journal), "--host",
                                   "127.0.0.1", "--port", uri.rsplit(":", 1)[1], "--server", "wsgiref"],
                                  stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        def answers() -> bool:
            try:
                return requests.get(f"{uri}/api/studies", timeout=2).status_code == 200
            except requests.RequestException:
                return False
        wait_until(answers, 60, f"optuna-dashboard answering ({(tmp_path / 'dashboard.log').read_text()[-500:]})")
        [summary] = requests.get(f"{uri}/api/studies", timeout=10).json()["study_summaries"]
        trials = requests.get(f"{uri}/api/studies/{summary['study_id']}", timeout=10).json()["trials"]
        return summary["study_name"], len(trials)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
