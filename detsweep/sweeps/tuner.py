"""A validated sweep → a Ray Tune ``Tuner``: searcher, scheduler, and the trial trainable.

The objects are the ones Ray Tune users compose by hand: ``BasicVariantGenerator``,
``OptunaSearch`` (TPE, seeded) or ``TuneBOHB``, and ``FIFOScheduler``, ``ASHAScheduler``,
``PopulationBasedTraining`` or ``HyperBandForBOHB`` (and its one-bracket form,
``SuccessiveHalving``). ASHA and PBT measure time in training steps (``time_attr="step"``);
HyperBand and halving in reports of the objective, so their rungs fall on them.
"""

from __future__ import annotations

import math
from typing import Any

from ray import tune
from ray.tune.experiment import Trial
from ray.tune.schedulers import hyperband
from ray.tune.search import BasicVariantGenerator

from detsweep.adapters.ray import result_files
from detsweep.config.loader import set_path
from detsweep.tracking.trial_run import RunLink
from detsweep.trainables.trial import run_trial

from .experiment import storage_path
from .resources import TRIAL_DRIVER
from .retention import KeepCheckpoints
from .space import swept_paths
from .spec import Sweep, grid_of, in_reports, reports_every, trial_count

REPORTS = "hyperband/reports"  # HyperBand's time: how many reports of the metric a trial has made


def param_space(sweep: Sweep, tracking: RunLink) -> dict[str, Any]:
    """``{"trial": base tree with Tune domains at the space's paths, "point": grid, …}``; the
    rest is the same for every trial: what it reports on, where it stores, its MLflow parent."""
    tree = sweep.base.model_dump(mode="json")
    for dotted, parameter in sweep.search.space.items():
        if not parameter.is_grid:
            set_path(tree, dotted, parameter.domain())
    search = {"metric": sweep.search.metric, "mode": sweep.search.mode, "swept": swept_paths(sweep)}
    space: dict[str, Any] = {"trial": tree, "search": search, "storage": storage_path(sweep),
                             "tracking": tracking.to_dict()}
    if points := grid_of(sweep):
        space["point"] = tune.grid_search(points)
    return space


def searcher(sweep: Sweep, max_concurrent: int):
    """Optuna's TPE (seeded), BOHB (seeded) or Tune's random/grid generator; each holds
    ``max_concurrent`` trials at once, so no trial waits for Ray Train workers that cannot be placed."""
    search = sweep.search
    # A scheduler with a metric of its own takes Tune's metric and mode away: the model-based searchers get the objective here.
    objective = {"metric": search.metric, "mode": search.mode} if search.scheduler.metric else {}
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
    if search.scheduler.type == "halving":
        return _PausableVariants(random_state=search.seed, max_concurrent=max_concurrent)
    return BasicVariantGenerator(random_state=search.seed, max_concurrent=max_concurrent)


def scheduler(sweep: Sweep, max_concurrent: int | None = None):
    """``max_concurrent``: how many trials HyperBand may have running (none: no bound)."""
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
    if spec.pauses:
        # BOHB's HyperBand: trials pause at each rung (freeing their workers) until their bracket is
        # ranked, then the best resume from their checkpoint there and the rest stop.
        every = reports_every(sweep.base.train, sweep.search.metric)  # Tune hears a trial at the objective's reports
        options = {"metric": spec.metric, "mode": spec.mode, "reduction_factor": spec.reduction_factor,
                   "max_t": in_reports(spec.max_t or sweep.base.train.num_steps, every)}
        if spec.type == "halving":
            return SuccessiveHalving(max_concurrent, every, trials=trial_count(sweep),
                                     first_rung=in_reports(spec.grace_period, every), **options)
        return HyperBandForBOHB(max_concurrent, every, **options)
    return tune.schedulers.FIFOScheduler()


class _Bracket(hyperband._Bracket):
    """Tune's bracket, with two changes.

    - Its last rung is ``max_t``. Tune rounds a bracket's first rung down (max_t / eta^s) and
      multiplies up from there, so with 15 reports and a factor of 3 the survivors stopped at
      9: the trial a sweep returned had trained 60 % of its budget.
    - It is filled once its ``n`` trials have arrived, or once it has been ranked. Tune counts
      the trials still in it, and a trial of a bracket with no rung before max_t leaves it when
      it finishes: with fewer trials at once than such a bracket holds, it never filled, and
      every later trial of the sweep joined it and ran its whole budget (FIFO, and no result
      for BOHB's model). A bracket Tune ranked early (all its trials errored, say) takes no
      more: they would join past its first rung.
    """

    def filled(self) -> bool:
        return self.is_being_processed or len(self._all_trials) >= self._n0

    def successive_halving(self, metric: str, metric_op: float) -> tuple[list[Trial], list[Trial]]:
        good, bad = super().successive_halving(metric, metric_op)
        if self._halves == 0:
            self._r = self._cumul_r = self._max_t_attr
        return good, bad


class HyperBandForBOHB(tune.schedulers.HyperBandForBOHB):
    """Tune's, with five changes.

    - Time counts reports of the metric (one every ``every`` steps; ``max_t`` in those units).
      HyperBand's rungs fall at max_t / eta^s, and in steps most would fall between two reports:
      a trial that passed several would be ranked at each on the same value.
    - A paused trial resumes only while fewer than ``max_concurrent`` trials run. Tune starts
      whatever trial its scheduler picks, and a trial's own process asks for no CPU (its Ray
      Train workers do): unbounded, every trial of a ranked bracket would resume at once, and
      their workers queue for the CPUs of the few that fit.
    - Its brackets end at ``max_t`` and fill as trials arrive (see ``_Bracket``).
    - A trial stopped while paused is written to the experiment state. Tune (2.60) writes a
      trial there only on its actor's events, and a paused trial has no actor: the state would
      keep it PAUSED, an unfinished trial in a finished sweep, which ``resume`` would train on.
    - BOHB's model hears every result ranked at a rung, also that of a trial stopped on it.
    """

    def __init__(self, max_concurrent: int | None, every: int, **options: Any):
        super().__init__(time_attr=REPORTS, **options)
        self.max_concurrent, self.every = max_concurrent, every

    bracket_kind: type[_Bracket] = _Bracket

    def _create_bracket(self, s: int) -> _Bracket:
        return self.bracket_kind(time_attr=self._time_attr, max_trials=self._get_n0(s), init_t_attr=self._get_r0(s),
                                 max_t_attr=self._max_t_attr, eta=self._eta, s=s, stop_last_trials=self._stop_last_trials)

    def on_trial_result(self, tune_controller, trial: Trial, result: dict) -> str:
        # In place: Tune hands this same dict on to TuneBOHB, which learns only from the results
        # the scheduler marked with their budget (``hyperband_info``). It is Tune's flattened
        # copy, not what the trial's loggers see.
        result[REPORTS] = math.ceil(result["step"] / self.every)
        decision = super().on_trial_result(tune_controller, trial, result)
        if decision == self.STOP and "budget" in result["hyperband_info"]:
            # Tune hands a searcher only the results of trials that go on: without this, the model
            # never heard of a trial ranked out on its own report, nor of the last to reach max_t.
            tune_controller.search_alg.searcher.on_trial_result(trial.trial_id, result)
        return decision

    def choose_trial_to_run(self, tune_controller, allow_recurse: bool = True):
        busy = sum(trial.status in (Trial.RUNNING, Trial.PENDING) for trial in tune_controller.get_trials())
        if self.max_concurrent is not None and busy >= self.max_concurrent:
            return None
        return super().choose_trial_to_run(tune_controller, allow_recurse)

    def on_trial_remove(self, tune_controller, trial: Trial) -> None:
        super().on_trial_remove(tune_controller, trial)
        if trial.status == Trial.PAUSED:  # being stopped: TERMINATED before the state is next written
            # The wrapper Tune hands schedulers does not list this method; the controller has it.
            controller = getattr(tune_controller, "_tune_controller", tune_controller)
            controller._mark_trial_to_checkpoint(trial)


class _WholeSweep(_Bracket):
    """The one bracket: it keeps 1 in ``eta`` of the trials it ranks, not of those it was sized
    for, which would keep more than that once some errored."""

    def successive_halving(self, metric: str, metric_op: float) -> tuple[list[Trial], list[Trial]]:
        self._n = min(self._n, len(self._live_trials))
        return super().successive_halving(metric, metric_op)


class SuccessiveHalving(HyperBandForBOHB):
    """Synchronous successive halving of the whole sweep: one bracket holds every trial.

    Each trial trains to the first rung (the first report of the metric at or after
    ``grace_period`` steps) and pauses there, its workers freed. Once all have, the best 1 in
    ``reduction_factor`` (rounded up) go on from their checkpoints and the rest stop; again at
    factor, factor², … times that many reports, until the survivors reach ``max_t``. No trial
    passes a rung before every trial was ranked on it, where ASHA lets the first to arrive, and
    each later one best so far, go on: on detectors, whose early ranks are mostly noise, that
    is where ASHA spends (bench/RESULTS.md). HyperBand's machinery (pauses, resumes, the bound
    on trials at once, the changes above) does the work; this class gives the bracket its
    shape and ranks it only once it is whole.
    """

    bracket_kind = _WholeSweep

    def __init__(self, max_concurrent: int | None, every: int, trials: int, first_rung: int, **options: Any):
        super().__init__(max_concurrent, every, **options)
        rungs, rung = 0, first_rung
        while rung < self._max_t_attr:  # as the bracket moves its rung (hyperband._Bracket.successive_halving)
            rungs, rung = rungs + 1, int(rung * self._eta)
        # BOHB's HyperBand opens its largest bracket first, with s halvings: the only one here.
        self._s_max_1 = rungs + 1
        self._get_n0 = lambda s: trials
        self._get_r0 = lambda s: first_rung

    def _process_bracket(self, tune_controller, bracket: _Bracket) -> str:
        # Tune also ranks a bracket when a trial leaves it (errors, say) and when none runs: the
        # first trial paused at a rung would be ranked alone if the next one failed to start,
        # and every later trial would open a bracket of its own. Only a whole one is ranked.
        if bracket.filled() or tune_controller.search_alg.is_finished():
            return super()._process_bracket(tune_controller, bracket)
        return self.PAUSE


class _PausableVariants(BasicVariantGenerator):
    """Tune's random and grid generator, for a scheduler that pauses trials.

    A paused trial holds no workers, so it does not count against ``max_concurrent``: else
    the trials paused at the first rung would stop the generator from drawing the rest of
    the bracket, which would never fill. Tune's HyperBandForBOHB tells a searcher of pauses
    through ``search_alg.searcher``, which a generator does not have.
    """

    @property
    def searcher(self) -> _Pauses:
        return _Pauses(self._live_trials)


class _Pauses:
    """What HyperBandForBOHB calls on ``search_alg.searcher``: a trial's pauses, on the
    generator's count of live trials. A trial counts again from its unpausing on, a little
    before it starts: a trial ranked to go on is owed its slot."""

    def __init__(self, live: set[str]):
        self.live = live

    def on_pause(self, trial_id: str) -> None:
        self.live.discard(trial_id)

    def on_unpause(self, trial_id: str) -> None:
        self.live.add(trial_id)

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        """Nothing to learn: the draws are random or a grid."""


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
            time_budget_s=search.time_budget_s, search_alg=searcher(sweep, concurrent),
            scheduler=scheduler(sweep, concurrent),
            trial_name_creator=trial_name, trial_dirname_creator=trial_name, reuse_actors=runs is not None,
        ),
        run_config=tune.RunConfig(
            name=sweep.name, storage_path=storage_path(sweep), verbose=0, callbacks=[*result_files(), *retention(sweep), *(callbacks or [])],
            checkpoint_config=checkpoint_config(sweep),
        ),
    )
