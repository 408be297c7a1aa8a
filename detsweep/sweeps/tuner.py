"""A validated sweep → a Ray Tune ``Tuner`` (searcher, scheduler, trial trainable), and its results.

The objects are the ones Ray Tune users compose by hand: ``BasicVariantGenerator`` or
``OptunaSearch`` (TPE, seeded), and ``FIFOScheduler``, ``ASHAScheduler`` or
``PopulationBasedTraining``, all measuring time in training steps (``time_attr="step"``).
"""

from __future__ import annotations

import copy
import math
import os
from dataclasses import dataclass
from typing import Any

from ray import tune

from detsweep.config.loader import set_path
from detsweep.trainables.trial import run_trial

from .resources import TRIAL_DRIVER
from .space import get_path, grid_points
from .spec import Sweep

def param_space(sweep: Sweep) -> dict[str, Any]:
    """``{"trial": base tree with Tune domains at the space's paths, "point": grid, …}``."""
    base = sweep.base.model_dump(mode="json")
    tree = copy.deepcopy(base)
    for dotted, parameter in sweep.search.space.items():
        if not parameter.is_grid:
            set_path(tree, dotted, parameter.domain())
    space: dict[str, Any] = {"trial": tree, "metric": sweep.search.metric, "storage": storage_path(sweep)}
    points = grid_points(sweep.search.space, base)
    if any(parameter.is_grid for parameter in sweep.search.space.values()):
        space["point"] = tune.grid_search(points)
    return space


def storage_path(sweep: Sweep) -> str | None:
    if sweep.storage is None or "://" in sweep.storage:
        return sweep.storage
    return os.path.abspath(os.path.join(sweep.path.parent, sweep.storage))


def searcher(sweep: Sweep, max_concurrent: int):
    """Optuna's TPE (seeded) or Tune's random/grid generator; both hold ``max_concurrent`` trials
    at once, so no trial waits for Ray Train workers that cannot be placed."""
    search = sweep.search
    if search.algorithm == "optuna":
        import optuna
        from ray.tune.search import ConcurrencyLimiter
        from ray.tune.search.optuna import OptunaSearch

        return ConcurrencyLimiter(OptunaSearch(sampler=optuna.samplers.TPESampler(seed=search.seed)), max_concurrent)
    from ray.tune.search import BasicVariantGenerator

    return BasicVariantGenerator(random_state=search.seed, max_concurrent=max_concurrent)


def scheduler(sweep: Sweep):
    spec = sweep.search.scheduler
    if spec.type == "asha":
        return tune.schedulers.ASHAScheduler(
            time_attr="step", max_t=spec.max_t or sweep.base.train.num_steps,
            grace_period=spec.grace_period, reduction_factor=spec.reduction_factor,
        )
    if spec.type == "pbt":
        mutations: dict[str, Any] = {}
        for dotted, parameter in spec.mutations.items():
            set_path(mutations, f"trial.{dotted}", parameter.values if parameter.values else parameter.domain())
        return tune.schedulers.PopulationBasedTraining(
            time_attr="step", perturbation_interval=spec.perturbation_interval,
            hyperparam_mutations=mutations, synch=False,
        )
    return tune.schedulers.FIFOScheduler()


def build_tuner(sweep: Sweep, max_concurrent: int) -> tune.Tuner:
    search = sweep.search
    concurrent = search.max_concurrent_trials or max_concurrent
    return tune.Tuner(
        tune.with_resources(run_trial, TRIAL_DRIVER),
        param_space=param_space(sweep),
        tune_config=tune.TuneConfig(
            metric=search.metric, mode=search.mode, num_samples=search.num_samples,
            time_budget_s=search.time_budget_s, search_alg=searcher(sweep, concurrent), scheduler=scheduler(sweep),
        ),
        run_config=tune.RunConfig(
            name=sweep.name, storage_path=storage_path(sweep),
            checkpoint_config=tune.CheckpointConfig(
                num_to_keep=2, checkpoint_score_attribute=search.metric, checkpoint_score_order=search.mode),
        ),
    )


@dataclass
class TrialOutcome:
    trial_id: str
    status: str  # TERMINATED, STOPPED (by the scheduler) or ERROR
    metrics: dict[str, Any]
    config: dict[str, Any]  # the swept values, by dotted path
    checkpoint: str | None
    error: str | None


def outcomes(results, sweep: Sweep) -> list[TrialOutcome]:
    """One outcome per trial, best first."""
    paths = list(sweep.search.space) + list(sweep.search.scheduler.mutations)
    rows = []
    for result in results:
        metrics = {k: v for k, v in (result.metrics or {}).items() if "/" in k or k == "step"}
        trial_id = (result.metrics or {}).get("trial_id") or os.path.basename(result.path or "")
        tree = copy.deepcopy(result.config.get("trial", {}))
        for dotted, value in result.config.get("point", {}).items():
            set_path(tree, dotted, value)
        swept = {dotted: get_path(tree, dotted) for dotted in paths}
        status = "ERROR" if result.error else (
            "STOPPED" if metrics.get("step", 0) < sweep.base.train.num_steps else "TERMINATED")
        rows.append(TrialOutcome(trial_id, status, metrics, swept,
                                 result.checkpoint.path if result.checkpoint else None,
                                 _one_line(result.error) if result.error else None))
    sign = -1 if sweep.search.mode == "max" else 1
    return sorted(rows, key=lambda row: sign * _number(row.metrics.get(sweep.search.metric)))


def _number(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not math.isnan(value) else math.inf


def _one_line(error: BaseException) -> str:
    cause = error
    while getattr(cause, "__cause__", None) is not None:
        cause = cause.__cause__
    lines = [line for line in str(cause).strip().splitlines() if line.strip()]
    for line in reversed(lines):  # Ray wraps the trial's error: keep its own last line
        if "TrialFailed:" in line:
            return line.split("TrialFailed:", 1)[1].strip()
    return lines[-1] if lines else type(cause).__name__
