"""Ray Tune's real searchers and schedulers, as a sweep file builds them, on trials that report
known curves instead of training: what each decides is known in advance, in seconds."""

from __future__ import annotations

import pytest
import ray
from ray import tune

from detsweep.sweeps import load_sweep
from detsweep.sweeps.tuner import build_tuner, scheduler, searcher
from detsweep.tracking.trial_run import RunLink
from detsweep.trainables.trial import swept_values

from .conftest import REPO

LR = "optimizer.learning_rate.learning_rate_base"


def lr_reported(config: dict) -> None:
    """Steps 10 to 40, each reporting the trial's learning rate as its loss and as its AP: a
    scheduler on ``train/loss`` (min) and one on ``eval/AP_best`` (max) decide the opposite."""
    [rate] = swept_values(config, [LR]).values()
    for step in (10, 20, 30, 40):
        tune.report({"step": step, "train/loss": rate, "eval/AP_best": rate})


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    yield
    ray.shutdown()


def sweep_with(write, tmp_path, search: str):
    return load_sweep(write("sweep.yaml", f"""
name: known-curves
storage: {tmp_path / "ray"}
base:
  from: {REPO / "configs" / "quickstart.yaml"}
  train: {{num_steps: 40, steps_per_loop: 10, eval_every: 10, checkpoint_every: 0}}
search:
  metric: eval/AP_best
  mode: max
  max_concurrent_trials: 1
{search}"""))


def test_asha_decides_on_its_own_metric_and_mode_not_on_the_objective(local_ray, write, tmp_path):
    """One trial at a time, in grid order: the first (lowest rate, so lowest loss) passes every
    rung; each later one has a higher loss than all before it and stops at the first rung. On
    the objective (AP, max) the same trials would all go on."""
    sweep = sweep_with(write, tmp_path, f"""
  algorithm: grid
  num_samples: 1
  scheduler: {{type: asha, grace_period: 10, reduction_factor: 2, metric: train/loss, mode: min}}
  space:
    {LR}: {{grid: [0.01, 0.02, 0.08, 0.04]}}
""")
    results = build_tuner(sweep, 1, RunLink("sqlite:///unused.db", "0", None), runs=lr_reported).fit()
    assert not results.errors
    steps = {swept_values(result.config, [LR])[LR]: result.metrics["step"] for result in results}
    assert steps == {0.01: 40, 0.02: 10, 0.08: 10, 0.04: 10}


def test_tpe_optimises_the_objective_while_asha_stops_on_the_loss(local_ray, write, tmp_path):
    sweep = sweep_with(write, tmp_path, f"""
  algorithm: optuna
  seed: 0
  num_samples: 3
  scheduler: {{type: asha, grace_period: 10, reduction_factor: 2, metric: train/loss, mode: min}}
  space:
    {LR}: {{distribution: log_uniform_values, min: 0.01, max: 0.08}}
""")
    built = searcher(sweep, 1).searcher, scheduler(sweep)
    assert (built[0].metric, built[0].mode, built[1].metric) == ("eval/AP_best", "max", "train/loss")
    results = build_tuner(sweep, 1, RunLink("sqlite:///unused.db", "0", None), runs=lr_reported).fit()
    assert not results.errors and len(results) == 3  # Tune accepted the two metrics (it refuses a mix-up)
