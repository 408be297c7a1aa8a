"""The multi-objective parts, on numbers a hand computation gives: non-dominated fronts, the
hypervolume, the front handed over, and ASHA's rungs ranked by non-dominated sort
(``sweeps/pareto_asha.py``) beside Tune's own ASHA on the same results."""

from __future__ import annotations

import random

import pytest
from ray.tune.schedulers import ASHAScheduler

from detsweep.evaluation.objectives import Constraint, Objective, broken, fronts, hypervolume
from detsweep.sweeps.pareto_asha import ParetoASHA
from detsweep.tracking.front import Candidate, pareto_front

from .test_schedulers import stub_trials

AP, LATENCY = Objective("eval/AP_best", "max"), Objective("serve/latency_ms", "min")


def test_fronts_and_hypervolume_are_what_a_hand_computation_gives():
    # (AP, latency): A and B and D trade one for the other; C is beaten by A on both
    values = {"A": (0.30, 50.0), "B": (0.10, 10.0), "C": (0.25, 50.0), "D": (0.20, 30.0)}
    points = [(AP.as_min(ap), LATENCY.as_min(ms)) for ap, ms in values.values()]
    assert fronts(points) == [[0, 1, 3], [2]]
    # up to AP 0 and 60 ms, the front's staircase: 0.1 x 10 (A alone) + 0.1 x 30 (A, D) + 0.1 x 50 (all)
    assert hypervolume([points[i] for i in (0, 1, 3)], (0.0, 60.0)) == pytest.approx(9.0)
    assert hypervolume([points[i] for i in (0, 1, 3)], (0.0, 60.0)) == hypervolume(points, (0.0, 60.0))
    assert hypervolume([(1.0, 2.0, 3.0)], (2.0, 4.0, 6.0)) == pytest.approx(1 * 2 * 3)
    assert hypervolume([(1.0, 5.0)], (2.0, 4.0)) == 0.0  # not better than the reference everywhere: adds nothing

    candidates = [Candidate(name, f"run-{name}", {"model.image_size": ms}, {AP.metric: ap, LATENCY.metric: ms})
                  for name, (ap, ms) in values.items()]
    front = pareto_front(candidates, [AP, LATENCY], {AP.metric: 0.0, LATENCY.metric: None})
    assert [c.trial_id for c in front.front] == ["A", "D", "B"]  # best AP first
    assert front.reference == {AP.metric: 0.0, LATENCY.metric: 50.0}  # the worst latency of the trials, as stated
    assert front.hypervolume == pytest.approx(0.1 * 20 + 0.1 * 40)  # B: 40 ms below the reference, D: 20
    assert [front.place(name) for name in "ABCD"] == ["1 of 3", "3 of 3", None, "2 of 3"]
    rows = front.csv().splitlines()
    assert rows[0] == "trial_id,place,eval/AP_best,serve/latency_ms,model.image_size,mlflow_run_id"
    assert rows[1:] == ["A,1 of 3,0.3,50.0,50.0,run-A", "B,3 of 3,0.1,10.0,10.0,run-B", "D,2 of 3,0.2,30.0,30.0,run-D",
                        "C,,0.25,50.0,50.0,run-C"]


def test_a_constraint_says_which_bound_a_cost_breaks():
    bounds = [Constraint.parse("serve/latency_ms <= 20", "c"), Constraint.parse("serve/params < 1e6", "c")]
    assert broken(bounds, {"serve/latency_ms": 20.0, "serve/params": 5e5}) is None
    assert broken(bounds, {"serve/latency_ms": 31.5, "serve/params": 2e6}) == (
        "serve/latency_ms is 31.5, expected <= 20; serve/params is 2e+06, expected < 1e+06")


def decisions(scheduler, arrivals: list[tuple[str, dict]]) -> dict[str, str]:
    """What ``scheduler`` decides of each trial's one result, the trials arriving in order."""
    trials = {trial.trial_id: trial for trial in stub_trials(*dict(arrivals))}
    for trial in trials.values():
        scheduler.on_trial_add(None, trial)
    return {name: scheduler.on_trial_result(None, trials[name], result) for name, result in arrivals}


def test_the_rung_keeps_a_fast_slow_to_converge_trial_that_ranking_on_ap_alone_stops():
    """At the first rung (step 10, a factor of 3), a big model (A, 50 ms) leads on AP, a second
    big one (C) trails it, and a small one (B, 10 ms) converges slower. Tune's ASHA on AP keeps
    only A; ranked by non-dominated sort, B is on the first front (nothing faster scores better)
    and goes on, while C, beaten by A on both, stops."""
    arrivals = [("A", {"step": 10, AP.metric: 0.30, LATENCY.metric: 50.0}),
                ("C", {"step": 10, AP.metric: 0.25, LATENCY.metric: 50.0}),
                ("B", {"step": 10, AP.metric: 0.10, LATENCY.metric: 10.0})]
    on_ap = ASHAScheduler(time_attr="step", metric=AP.metric, mode="max", max_t=101, grace_period=10, reduction_factor=3)
    assert decisions(on_ap, arrivals) == {"A": "CONTINUE", "C": "STOP", "B": "STOP"}
    both = ParetoASHA([AP, LATENCY], max_t=101, grace_period=10, reduction_factor=3)
    assert decisions(both, arrivals) == {"A": "CONTINUE", "C": "STOP", "B": "CONTINUE"}
    assert both.rungs == [10, 30, 90]


@pytest.mark.parametrize("eta", [2, 3])
def test_on_one_objective_the_rungs_decide_as_tunes_asha_but_for_its_interpolation(eta):
    """Fronts of one objective are its distinct values: the rule is ASHA's by rank. Tune's ASHA
    cuts at a percentile of the earlier values, interpolated between two of them: the two may
    differ only for a trial whose value lies between that cutoff and the nearest earlier value.
    40 trials reach the first two rungs in a random order."""
    import numpy as np

    rng = random.Random(eta)
    arrivals = [(f"t{i}", {"step": step, AP.metric: rng.random()}) for step in (10, 10 * eta) for i in range(40)]
    ours = ParetoASHA([AP], max_t=1000, grace_period=10, reduction_factor=eta)
    tunes = ASHAScheduler(time_attr="step", metric=AP.metric, mode="max", max_t=1000, grace_period=10,
                          reduction_factor=eta)
    trials = {trial.trial_id: trial for trial in stub_trials(*{name for name, _ in arrivals})}
    for trial in trials.values():
        ours.on_trial_add(None, trial)
        tunes.on_trial_add(None, trial)
    stopped, earlier, differ, agree = set(), {10: [], 10 * eta: []}, 0, 0
    for name, result in arrivals:
        if name in stopped:
            continue
        value, rung = result[AP.metric], result["step"]
        decided = ours.on_trial_result(None, trials[name], result)
        if decided != tunes.on_trial_result(None, trials[name], result):
            differ += 1
            cutoff = np.percentile(earlier[rung], (1 - 1 / eta) * 100)
            assert not [v for v in earlier[rung] if min(value, cutoff) < v < max(value, cutoff)], (name, result)
        else:
            agree += 1
        earlier[rung].append(value)
        if decided == "STOP":
            stopped.add(name)
    assert 0 < len(stopped) < 40 and differ < agree / 5, (differ, agree)


def lr_and_heads_reported(config: dict) -> None:
    """AP rises with the learning rate; latency with the head's depth: the two objectives."""
    from ray import tune

    from detsweep.trainables.trial import swept_values

    values = swept_values(config, [LR, HEADS])
    for step in (10, 20, 30, 40):
        tune.report({"step": step, "eval/AP_best": values[LR] * step, "serve/latency_ms": 10.0 + 5 * values[HEADS]})


LR, HEADS = "optimizer.learning_rate.learning_rate_base", "model.head_conv_layers"


def test_optuna_searches_every_objective_under_the_rung_ranking(ray_driver, write, tmp_path):
    """``objectives`` with Optuna and ASHA: Tune takes the sweep with no single metric, Optuna's
    study has a direction per objective and hears both values of every trial at its end, and
    the scheduler is the rung ranking by non-dominated sort."""
    from optuna.study import StudyDirection
    from optuna.trial import TrialState

    from detsweep.sweeps import load_sweep
    from detsweep.sweeps.tuner import build_tuner
    from detsweep.tracking.trial_run import RunLink

    from .conftest import REPO

    sweep = load_sweep(write("sweep.yaml", f"""
name: two-objectives
storage: {tmp_path / "ray"}
base:
  from: {REPO / "configs" / "quickstart.yaml"}
  train: {{num_steps: 40, steps_per_loop: 10, eval_every: 10, checkpoint_every: 0}}
search:
  objectives: [{{metric: eval/AP_best, mode: max}}, {{metric: serve/latency_ms, mode: min}}]
  algorithm: optuna
  seed: 0
  num_samples: 4
  max_concurrent_trials: 1
  scheduler: {{type: asha, grace_period: 10, reduction_factor: 2}}
  space:
    {LR}: {{distribution: log_uniform_values, min: 0.01, max: 0.08}}
    {HEADS}: {{values: [0, 2]}}
"""))
    # each architecture's cost, as measure_architectures hands it over (metric names hold "/",
    # which Optuna's conversion of the space refuses in a key)
    costs = {"0": {"serve/latency_ms": 10.0, "serve/size_mb": 10.6, "serve/params": 2562175.0}}
    tuner = build_tuner(sweep, 1, RunLink("sqlite:///unused.db", "0", None), runs=lr_and_heads_reported,
                        serving=costs)
    results = tuner.fit()
    assert not results.errors and len(results) == 4
    searcher = tuner._local_tuner._tune_config.search_alg.searcher
    study = searcher._ot_study
    assert study.directions == [StudyDirection.MAXIMIZE, StudyDirection.MINIMIZE]
    told = [trial.values for trial in study.trials if trial.state == TrialState.COMPLETE]
    ended = [[r.metrics["eval/AP_best"], r.metrics["serve/latency_ms"]] for r in results]
    assert len(told) == 4 and all(a == pytest.approx(b) for a, b in zip(sorted(told), sorted(ended), strict=True))
    assert isinstance(tuner._local_tuner._tune_config.scheduler, ParetoASHA)
