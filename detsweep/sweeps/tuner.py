"""A validated sweep → a Ray Tune ``Tuner``: searcher, scheduler, and the trial trainable.

The objects are the ones Ray Tune users compose by hand: ``BasicVariantGenerator`` or
``OptunaSearch`` (TPE, seeded), and ``FIFOScheduler``, ``ASHAScheduler`` or
``PopulationBasedTraining``, all measuring time in training steps (``time_attr="step"``).
"""

from __future__ import annotations

import copy
from typing import Any

from ray import tune

from detsweep.config.loader import set_path
from detsweep.tracking.trial_run import RunLink
from detsweep.trainables.trial import run_trial

from .experiment import storage_path
from .resources import TRIAL_DRIVER
from .space import grid_points, swept_paths
from .spec import Sweep


def param_space(sweep: Sweep, tracking: RunLink) -> dict[str, Any]:
    """``{"trial": base tree with Tune domains at the space's paths, "point": grid, …}``; the
    rest is the same for every trial: what it reports on, where it stores, its MLflow parent."""
    base = sweep.base.model_dump(mode="json")
    tree = copy.deepcopy(base)
    for dotted, parameter in sweep.search.space.items():
        if not parameter.is_grid:
            set_path(tree, dotted, parameter.domain())
    search = {"metric": sweep.search.metric, "mode": sweep.search.mode, "swept": swept_paths(sweep)}
    space: dict[str, Any] = {"trial": tree, "search": search, "storage": storage_path(sweep),
                             "tracking": tracking.to_dict()}
    points = grid_points(sweep.search.space, base)
    if any(parameter.is_grid for parameter in sweep.search.space.values()):
        space["point"] = tune.grid_search(points)
    return space


def searcher(sweep: Sweep, max_concurrent: int):
    """Optuna's TPE (seeded) or Tune's random/grid generator; both hold ``max_concurrent`` trials
    at once, so no trial waits for Ray Train workers that cannot be placed."""
    search = sweep.search
    if search.algorithm == "optuna":
        import optuna
        from ray.tune.search import ConcurrencyLimiter
        from ray.tune.search.optuna import OptunaSearch

        # A scheduler with a metric of its own takes Tune's metric and mode away: TPE gets the objective here.
        objective = {"metric": search.metric, "mode": search.mode} if search.scheduler.metric else {}
        return ConcurrencyLimiter(OptunaSearch(sampler=optuna.samplers.TPESampler(seed=search.seed), **objective),
                                  max_concurrent)
    from ray.tune.search import BasicVariantGenerator

    return BasicVariantGenerator(random_state=search.seed, max_concurrent=max_concurrent)


def scheduler(sweep: Sweep):
    spec = sweep.search.scheduler
    if spec.type == "asha":
        # ASHA stops a trial whose step reaches max_t; one past the last step lets a trial
        # that runs to the end finish on its own instead of being killed at its last report.
        return tune.schedulers.ASHAScheduler(
            time_attr="step", metric=spec.metric, mode=spec.mode, max_t=spec.max_t or sweep.base.train.num_steps + 1,
            grace_period=spec.grace_period, reduction_factor=spec.reduction_factor,
        )
    if spec.type == "pbt":
        mutations: dict[str, Any] = {}
        for dotted, parameter in spec.mutations.items():
            set_path(mutations, f"trial.{dotted}", parameter.values if parameter.values else parameter.domain())
        return tune.schedulers.PopulationBasedTraining(
            time_attr="step", metric=spec.metric, mode=spec.mode, perturbation_interval=spec.perturbation_interval,
            quantile_fraction=spec.quantile_fraction,
            hyperparam_mutations=mutations, synch=spec.synch,
        )
    return tune.schedulers.FIFOScheduler()


def checkpoint_config(sweep: Sweep) -> tune.CheckpointConfig:
    """The two best checkpoints of each trial by the metric; under PBT all of them, because an
    exploit copies the checkpoint the donor had when it last ranked on top, which may be
    neither its best nor its latest by then."""
    if sweep.search.scheduler.type == "pbt":
        return tune.CheckpointConfig(num_to_keep=None)
    return tune.CheckpointConfig(num_to_keep=2, checkpoint_score_attribute=sweep.search.metric,
                                 checkpoint_score_order=sweep.search.mode)


def trial_name(trial) -> str:
    """``trial_<id>``: Tune's default prefixes the function's name, which says nothing here."""
    return f"trial_{trial.trial_id}"


def trainable():
    """What every trial runs; ``Tuner.restore`` needs the same object again."""
    return tune.with_resources(run_trial, TRIAL_DRIVER)


def build_tuner(sweep: Sweep, max_concurrent: int, tracking: RunLink, callbacks: list | None = None,
                runs: Any = None) -> tune.Tuner:
    """The sweep's Tuner; ``runs``: another trainable in place of detsweep's trial (one that
    reports recorded curves, say), under the same searcher, scheduler and space. Such a
    trainable holds no state between trials, so Tune reuses its actors: a trial then costs
    no process start."""
    search = sweep.search
    concurrent = search.max_concurrent_trials or max_concurrent
    # Tune hands its metric and mode to the searcher and the scheduler, and refuses both when
    # the scheduler has its own: then each is given what it decides on (see ``searcher``).
    objective = (None, None) if search.scheduler.metric else (search.metric, search.mode)
    return tune.Tuner(
        runs or trainable(),
        param_space=param_space(sweep, tracking),
        tune_config=tune.TuneConfig(
            metric=objective[0], mode=objective[1], num_samples=search.num_samples,
            time_budget_s=search.time_budget_s, search_alg=searcher(sweep, concurrent), scheduler=scheduler(sweep),
            trial_name_creator=trial_name, trial_dirname_creator=trial_name, reuse_actors=runs is not None,
        ),
        run_config=tune.RunConfig(
            name=sweep.name, storage_path=storage_path(sweep), verbose=0, callbacks=callbacks,
            checkpoint_config=checkpoint_config(sweep),
        ),
    )
