"""Which settings mattered (issue #77): PED-ANOVA on trials compared at one step, intervals from
a bootstrap, fANOVA beside it; on known answers, and the lines that say why there is none."""

from __future__ import annotations

import pytest

from bench.importance import LR, MOMENTUM, known_answer
from detsweep.sweeps.importance import MIN_TRIALS, sweep_importances
from detsweep.sweeps.spec import load_sweep
from detsweep.sweeps.study import study_trials

from .test_study import SPACE
from .tiny_sweeps import tiny_sweep


def test_the_setting_that_drives_the_metric_comes_first_with_its_interval_apart_from_the_noises(tmp_path):
    """160 trials compared: the learning rate's interval clear of the others' (with 40, measured
    here, it spans 0.09 to 0.95 and meets the seed's: the interval says the sweep cannot tell)."""
    sweep = load_sweep(tiny_sweep(tmp_path, SPACE))
    outcomes, curves = known_answer(240, deepest=10)
    [found] = sweep_importances(sweep, study_trials(sweep, outcomes, curves), resamples=100)
    # step 300 has 10 trials, step 200 has 160: compared there, the stopped ones left out
    assert (found.metric, found.step, found.trials, found.quantile) == ("eval/AP_best", 200, 160, 0.1)
    assert max(found.shares, key=found.shares.get) == LR and sum(found.shares.values()) == pytest.approx(1.0)
    assert found.intervals[LR][0] > max(found.intervals[name][1] for name in ("train.seed", "optimizer.type"))
    assert found.intervals[LR][0] <= found.shares[LR] <= found.intervals[LR][1]
    assert MOMENTUM in found.shares  # the momentum only momentum has, kept
    assert max(found.fanova, key=found.fanova.get) == LR and MOMENTUM not in found.fanova  # fANOVA: no conditionals


def test_a_minimised_metric_ranks_the_same_trials_as_its_maximised_negative(tmp_path):
    most = load_sweep(tiny_sweep(tmp_path, SPACE))
    least = load_sweep(tiny_sweep(tmp_path, SPACE.replace("mode: max", "mode: min"), name="least"))
    [up] = sweep_importances(most, study_trials(most, *known_answer(30)), resamples=20)
    [down] = sweep_importances(least, study_trials(least, *known_answer(30, sign=-1.0)), resamples=20)
    assert down.shares == pytest.approx(up.shares)
    assert all(down.intervals[name] == pytest.approx(up.intervals[name]) for name in up.intervals)
    [wrong] = sweep_importances(least, study_trials(least, *known_answer(30)), resamples=20)  # the worst trials' settings
    assert wrong.shares != pytest.approx(up.shares)


def test_each_objective_of_two_has_its_own_importances(tmp_path):
    sweep = load_sweep(tiny_sweep(tmp_path, SPACE.replace(
        "  metric: eval/AP_best\n  mode: max\n",
        "  objectives: [{metric: eval/AP_best, mode: max}, {metric: train/images_per_sec, mode: max}]\n")))
    outcomes, curves = known_answer(30)
    for trial in outcomes:  # the speed set by the momentum only
        speed = 100 * trial.config[MOMENTUM]
        trial.metrics["train/images_per_sec"] = speed
        curves[trial.trial_id]["train/images_per_sec"] = {step: speed for step in curves[trial.trial_id]["eval/AP_best"]}
    ap, speed = sweep_importances(sweep, study_trials(sweep, outcomes, curves), resamples=20)
    assert (ap.metric, speed.metric) == ("eval/AP_best", "train/images_per_sec")
    assert max(ap.shares, key=ap.shares.get) == LR and max(speed.shares, key=speed.shares.get) == MOMENTUM


def test_too_few_trials_at_one_step_and_a_pbt_sweep_get_one_line_and_no_number(tmp_path):
    sweep = load_sweep(tiny_sweep(tmp_path, SPACE))
    outcomes, curves = known_answer(MIN_TRIALS - 1)
    assert sweep_importances(sweep, study_trials(sweep, outcomes, curves)) == (
        "19 trials reached one evaluated step; importance needs 20 at one step")
    pbt = load_sweep(tiny_sweep(tmp_path, SPACE.replace("algorithm: random", "algorithm: random\n  scheduler: "
                                                        "{type: pbt, perturbation_interval: 5, mutations: "
                                                        "{optimizer.moving_average_decay: {values: [0.99, 0.999]}}}"),
                                 name="pbt"))
    assert sweep_importances(pbt, study_trials(pbt, *known_answer(30))) == (
        "importance needs trials that keep their values; a PBT sweep's trials change theirs as they train")


def test_the_figures_go_on_the_parent_run_as_metrics_a_table_and_a_picture(tmp_path):
    from mlflow import MlflowClient

    from detsweep.sweeps.importance import importance_figure, importance_rows
    from detsweep.sweeps.launch import log_importance

    sweep = load_sweep(tiny_sweep(tmp_path, SPACE))
    found = sweep_importances(sweep, study_trials(sweep, *known_answer(30)), resamples=20)
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run = client.create_run(client.create_experiment("importance", artifact_location=str(tmp_path / "artifacts")))
    log_importance(client, run.info.run_id, importance_rows(found), importance_figure(found))
    metrics = client.get_run(run.info.run_id).data.metrics
    assert metrics == pytest.approx({f"importance/eval/AP_best/{name}": share for name, share in found[0].shares.items()})
    assert sorted(a.path for a in client.list_artifacts(run.info.run_id)) == ["importance.csv", "importance.png"]
    table = client.download_artifacts(run.info.run_id, "importance.csv", str(tmp_path))
    header, *rows = open(table).read().splitlines()
    assert header == "objective,parameter,share,low,high,fanova,step,trials,quantile,resamples" and len(rows) == len(found[0].shares)
