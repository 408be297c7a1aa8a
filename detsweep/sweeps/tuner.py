"""A validated sweep → a Ray Tune ``Tuner``: searcher, scheduler, and the trial trainable.

The objects are the ones Ray Tune users compose by hand: ``BasicVariantGenerator``,
``OptunaSearch`` (TPE, seeded) or ``TuneBOHB``, and ``FIFOScheduler``, ``ASHAScheduler`` or
``PopulationBasedTraining``; synchronous halving and BOHB's HyperBand are detsweep's own
schedulers on Tune's interface (:mod:`.rungs`). ASHA and PBT measure time in training steps
(``time_attr="step"``); HyperBand and halving in reports of the objective, so their rungs fall on them.
"""

from __future__ import annotations

from typing import Any

from ray import tune
from ray.tune.search import BasicVariantGenerator

from detsweep.adapters.ray import result_files
from detsweep.config.loader import set_path
from detsweep.tracking.trial_run import RunLink
from detsweep.trainables.trial import ending_on_stop, run_trial

from . import rungs
from .experiment import storage_path
from .pareto_asha import ParetoASHA
from .resources import TRIAL_DRIVER
from .retention import KeepCheckpoints
from .space import swept_paths
from .spec import Sweep, grid_of, in_reports, reports_every, trial_count


def param_space(sweep: Sweep, tracking: RunLink, serving: dict[str, dict[str, float]] | None = None) -> dict[str, Any]:
    """``{"trial": base tree with Tune domains at the space's paths, "point": grid, …}``; the
    rest is the same for every trial: what it reports on, where it stores, its MLflow parent,
    and what each architecture costs to serve (``serving``, with ``search.serving_cost``)."""
    tree = sweep.base.model_dump(mode="json")
    for dotted, parameter in sweep.search.space.items():
        if not parameter.is_grid:
            set_path(tree, dotted, parameter.domain())
    search = {"metric": sweep.search.metric, "mode": sweep.search.mode, "swept": swept_paths(sweep),
              "objectives": [o.metric for o in sweep.search.ranked_on], "constraints": sweep.search.constraints}
    space: dict[str, Any] = {"trial": tree, "search": search, "storage": storage_path(sweep),
                             "tracking": tracking.to_dict()}
    if points := grid_of(sweep):
        space["point"] = tune.grid_search(points)
    if serving:  # as pairs: a searcher flattens the space's keys on "/", which metric names hold
        space["serving"] = {key: list(metrics.items()) for key, metrics in serving.items()}
    return space


def search_and_scheduler(sweep: Sweep, max_concurrent: int):
    """The searcher and the scheduler, built together: a pausing scheduler (:mod:`.rungs`) tells
    its searcher of pauses, and halving's generator asks it how many trials hold a slot. Each
    searcher holds ``max_concurrent`` trials at once, so no trial waits for Ray Train workers
    that cannot be placed; a pausing scheduler resumes trials within the same bound."""
    spec, search = sweep.search.scheduler, sweep.search
    if not spec.pauses:
        return searcher(sweep, max_concurrent), scheduler(sweep)
    every = reports_every(sweep.base.train, search.metric)  # Tune hears a trial at the objective's reports
    options = {"metric": spec.metric, "mode": spec.mode, "eta": spec.reduction_factor, "every": every,
               "max_t": in_reports(spec.max_t or sweep.base.train.num_steps, every), "max_concurrent": max_concurrent}
    if spec.type == "halving":
        halving = rungs.halving(trials=trial_count(sweep), first_rung=in_reports(spec.grace_period, every), **options)
        return rungs.PacedVariants(halving, max_concurrent, random_state=search.seed), halving
    bohb = searcher(sweep, max_concurrent)
    return bohb, rungs.hyperband(bohb=bohb, **options)


def searcher(sweep: Sweep, max_concurrent: int):
    """Optuna's TPE (seeded), BOHB (seeded) or Tune's random/grid generator."""
    search = sweep.search
    # A scheduler with a metric of its own, or several objectives, take Tune's metric and mode
    # away: the model-based searchers get theirs here (Optuna: a list of each, its multi-objective search).
    objective = {"metric": search.metric, "mode": search.mode} if search.scheduler.metric else {}
    if search.objectives:
        objective = {"metric": [o.metric for o in search.objectives], "mode": [o.mode for o in search.objectives]}
    if search.algorithm == "bohb":
        from ray.tune.search.bohb import TuneBOHB

        # Not under a ConcurrencyLimiter: that would count the trials HyperBand paused as running,
        # and a bracket would wait for trials that are never drawn. TuneBOHB limits the running ones.
        return TuneBOHB(max_concurrent=max_concurrent, seed=search.seed, **objective)
    if search.algorithm == "optuna":
        import optuna
        from ray.tune.search import ConcurrencyLimiter
        from ray.tune.search.optuna import OptunaSearch

        return ConcurrencyLimiter(OptunaSearch(sampler=optuna.samplers.TPESampler(seed=search.seed), **objective),
                                  max_concurrent)
    return BasicVariantGenerator(random_state=search.seed, max_concurrent=max_concurrent)


def scheduler(sweep: Sweep):
    """FIFO, ASHA (on several objectives: :mod:`.pareto_asha`) or PBT (the pausing ones:
    :func:`search_and_scheduler`)."""
    spec = sweep.search.scheduler
    if spec.type == "asha" and sweep.search.objectives:
        return ParetoASHA(sweep.search.ranked_on, max_t=spec.max_t or sweep.base.train.num_steps + 1,
                          grace_period=spec.grace_period, reduction_factor=spec.reduction_factor)
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
    """The two best checkpoints of each trial by the metric; under PBT, Tune deletes none and
    :func:`retention` does, since an exploit copies the checkpoint the donor had when it last
    ranked on top, which may be neither its best nor its latest by then."""
    if sweep.search.scheduler.type == "pbt":
        return tune.CheckpointConfig(num_to_keep=None)
    return tune.CheckpointConfig(num_to_keep=2, checkpoint_score_attribute=sweep.search.metric,
                                 checkpoint_score_order=sweep.search.mode)


def retention(sweep: Sweep) -> list[tune.Callback]:
    """Under PBT, what bounds each trial's checkpoints without deleting one an exploit may still
    read (:mod:`.retention`)."""
    if sweep.search.scheduler.type != "pbt":
        return []
    train = sweep.base.train
    window = sweep.search.scheduler.perturbation_interval + train.checkpoint_every + reports_every(train, sweep.search.metric)
    return [KeepCheckpoints(sweep.search.metric, sweep.search.mode, window)]


def trial_name(trial) -> str:
    """``trial_<id>``: Tune's default prefixes the function's name, which says nothing here."""
    return f"trial_{trial.trial_id}"


def trainable():
    """What every trial runs; ``Tuner.restore`` needs the same object again."""
    return ending_on_stop(tune.with_resources(run_trial, TRIAL_DRIVER))


def build_tuner(sweep: Sweep, max_concurrent: int, tracking: RunLink, callbacks: list | None = None,
                runs: Any = None, serving: dict[str, dict[str, float]] | None = None) -> tune.Tuner:
    """The sweep's Tuner; ``runs``: another trainable in place of detsweep's trial (one that
    reports recorded curves, say), under the same searcher, scheduler and space. Such a
    trainable holds no state between trials, so Tune reuses its actors: a trial then costs
    no process start. ``serving``: each architecture's serving cost (:mod:`.serving`)."""
    search = sweep.search
    concurrent = search.max_concurrent_trials or max_concurrent
    # Tune hands its metric and mode to the searcher and the scheduler, and refuses both when
    # the scheduler has its own: then each is given what it decides on (see ``searcher``).
    objective = (None, None) if search.scheduler.metric or search.objectives else (search.metric, search.mode)
    search_alg, trial_scheduler = search_and_scheduler(sweep, concurrent)
    return tune.Tuner(
        runs or trainable(),
        param_space=param_space(sweep, tracking, serving),
        tune_config=tune.TuneConfig(
            metric=objective[0], mode=objective[1], num_samples=search.num_samples,
            time_budget_s=search.time_budget_s, search_alg=search_alg, scheduler=trial_scheduler,
            trial_name_creator=trial_name, trial_dirname_creator=trial_name, reuse_actors=runs is not None,
        ),
        run_config=tune.RunConfig(
            name=sweep.name, storage_path=storage_path(sweep), verbose=0, callbacks=[*result_files(), *retention(sweep), *(callbacks or [])],
            checkpoint_config=checkpoint_config(sweep),
        ),
    )
