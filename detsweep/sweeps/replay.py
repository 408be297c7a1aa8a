"""A sweep's searcher and scheduler, judged in seconds on recorded learning curves.

``detsweep replay CURVES|EXPERIMENT SWEEP.yaml`` runs the sweep's own Ray Tune searcher and scheduler
(``build_tuner``), but each trial reports a recorded curve instead of training: the one
recorded for the configuration it drew, or the nearest one (and the output says how many
were). Time runs in training steps, so that asynchronous decisions come in the order they
would have: a clock lets trials report one at a time in step order, the same on any
machine (``StepClock``), except under HyperBand and halving, whose trials pause and start
again in slots the clock cannot foresee (``tick_s`` of sleep per step there). Per seed it measures what a
sweep costs and what it returns; over seeds, their median and spread.

A curves file (JSON) holds the swept paths and, per recorded configuration, its reports::

    {"recorded": "2026-11-24, 2 cores", "paths": ["optimizer.learning_rate.learning_rate_base"],
     "trials": [{"config": {"optimizer.learning_rate.learning_rate_base": 0.04},
                 "reports": [{"step": 20, "train/loss": 1.2, "eval/AP_best": 0.01}, ...]}]}
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import statistics
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from ray import tune

from detsweep.errors import DetsweepError
from detsweep.tracking.trial_run import RunLink
from detsweep.trainables.trial import swept_values

from .space import swept_paths
from .spec import Sweep, reports_every, trial_count
from .tuner import build_tuner

TICK_S = 0.002  # seconds of replay per training step: 300 steps take 0.6 s


@dataclass(frozen=True)
class Curves:
    """Recorded trials: each one's swept values and its reports in step order."""

    paths: list[str]
    configs: list[dict[str, Any]]
    reports: list[list[dict[str, float]]]

    def final(self, index: int, metric: str) -> float:
        """The metric's last recorded value: what the configuration scores at its full budget."""
        return [report[metric] for report in self.reports[index] if metric in report][-1]

    def best_final(self, metric: str, mode: str) -> float:
        """The best full-budget value of ``metric`` among the recorded configurations."""
        return (max if mode == "max" else min)(self.final(index, metric) for index in range(len(self.configs)))

    def at_common_steps(self) -> dict[str, dict[int, list[float]]]:
        """Every recorded metric at every step all trials reported it: its values, in the
        order of the trials."""
        at: dict[str, dict[int, dict[int, float]]] = {}
        for index, reports in enumerate(self.reports):
            for report in reports:
                for metric, value in report.items():
                    if metric != "step" and isinstance(value, (int, float)):
                        at.setdefault(metric, {}).setdefault(int(report["step"]), {})[index] = float(value)
        return {metric: {step: [by_trial[index] for index in range(len(self.configs))]
                         for step, by_trial in sorted(steps.items()) if len(by_trial) == len(self.configs)}
                for metric, steps in sorted(at.items())}

    def nearest(self, values: dict[str, Any]) -> int:
        """The recorded configuration closest to ``values`` (log scale for positive numbers)."""
        def distance(index: int) -> float:
            total = 0.0
            for path in self.paths:
                mine, theirs = values[path], self.configs[index][path]
                if isinstance(mine, (int, float)) and isinstance(theirs, (int, float)):
                    if mine > 0 and theirs > 0:
                        total += abs(math.log(mine) - math.log(theirs))
                    else:
                        total += abs(mine - theirs)
                else:
                    total += float(mine != theirs)
            return total

        return min(range(len(self.configs)), key=distance)


def load_curves(source: str, sweep: Sweep) -> Curves:
    """Curves to replay ``sweep`` on: a curves file (``….json``), or the trials of a finished
    MLflow experiment (its name) that trained their whole budget. Checked against the sweep:
    the same swept paths, and every metric the sweep decides on recorded for every trial."""
    if sweep.search.scheduler.type == "pbt":
        raise DetsweepError(f"{sweep.path}: search.scheduler.type: found 'pbt', expected fifo, asha, hyperband or halving to replay "
                            "(a recorded curve cannot continue from another trial's weights)")
    needed = sorted({sweep.search.metric, sweep.search.decided_by[0]})
    if source.endswith(".json") or Path(source).is_file():
        where, (paths, trials) = source, _from_file(Path(source))
    else:
        where, (paths, trials) = f"experiment {source!r}", _from_experiment(source, sweep, needed)
    expected = swept_paths(sweep)
    if sorted(paths or []) != sorted(expected):
        raise DetsweepError(f"{where}: paths: found {paths}, expected the swept paths of {sweep.path}: {expected}")
    for number, (config, reports) in enumerate(trials):
        missing = [name for name in needed if not any(name in report for report in reports)]
        if missing or not all("step" in report for report in reports):
            raise DetsweepError(f"{where}: trials[{number}]: found no {', '.join(missing) or 'step'} in its reports, "
                                f"expected step, {' and '.join(needed)}")
        if set(config) != set(expected):
            raise DetsweepError(f"{where}: trials[{number}].config: found {sorted(config)}, expected values for {expected}")
    return Curves(expected, [config for config, _ in trials],
                  [sorted(reports, key=lambda report: report["step"]) for _, reports in trials])


def curves_file(curves: Curves, recorded: str, **about: Any) -> dict[str, Any]:
    """``curves`` as a curves file's contents (what :func:`load_curves` reads back), with
    ``recorded`` (when and where) and anything else worth keeping ``about`` them."""
    return {"recorded": recorded, **about, "paths": curves.paths,
            "trials": [{"config": config, "reports": reports} for config, reports in zip(curves.configs, curves.reports)]}


def _from_file(path: Path) -> tuple[list[str], list[tuple[dict, list]]]:
    from detsweep.evaluation.files import read_json

    data = read_json(str(path))
    if not isinstance(data, dict) or not data.get("trials"):
        raise DetsweepError(f"{path}: found no trials, expected {{\"paths\": [...], \"trials\": [...]}}")
    return data.get("paths"), [(trial.get("config") or {}, trial.get("reports") or []) for trial in data["trials"]]


def _from_experiment(name: str, sweep: Sweep, metrics: list[str]) -> tuple[list[str], list[tuple[dict, list]]]:
    from mlflow import MlflowClient

    from detsweep.tracking import resolve_backend
    from detsweep.tracking.backend import check_readable
    from detsweep.tracking.best import recorded_curves

    backend = resolve_backend(sweep.base.tracking)
    check_readable(backend)
    paths, trials = recorded_curves(MlflowClient(backend.uri), name, backend, metrics)
    if not trials:
        raise DetsweepError(f"experiment {name!r} at {backend.uri}: no trial trained its whole budget, "
                            f"expected full learning curves (a FIFO sweep's) to replay")
    return paths, trials


@contextlib.contextmanager
def _step_checkpoint(step: int | None) -> Iterator[tune.Checkpoint | None]:
    """A checkpoint that holds only ``step`` (Tune copies it into the trial's folder); None for None."""
    if step is None:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="detsweep-replay-step-") as folder:
        Path(folder, "step").write_text(str(step))
        yield tune.Checkpoint.from_directory(folder)


def _resumed_at(checkpoint: tune.Checkpoint | None) -> int:
    if checkpoint is None:
        return 0
    with checkpoint.as_directory() as folder:
        return int(Path(folder, "step").read_text())


class StepClock:
    """Replay time in training steps, the same on any machine: trials report in the order of
    their steps, one at a time.

    Tune tells the clock when it starts a trial (``start``, with its place in Tune's order)
    and when one ends (``leave``). A trial asks for its next report ``steps`` after its last
    (``until``) and waits until it is the earliest; ties go to the trial Tune made first
    (trial ids order nothing: a searcher's are random). Nobody moves while a live trial still
    decides its next step (Tune has not yet let it go on), nor while a slot is empty and
    trials are still to come: a trial started into a freed slot starts at the time it freed,
    and may report before the others. Should a wait outlast ``patience_s`` (a rule broken:
    none should), the earliest waiting trial goes, and ``late`` counts it.
    """

    def __init__(self, slots: int, trials: int, patience_s: float = 30.0):
        self.slots, self.trials, self.patience_s = slots, trials, patience_s
        self.now, self.late, self.stalled = 0, 0, False
        self.position: dict[str, int] = {}  # live trials: the time of their next (or last) report
        self.order: dict[str, int] = {}  # every trial started: its place in Tune's order
        self.waiting: set[str] = set()
        self.changed: asyncio.Condition | None = None  # made in the actor's event loop

    async def start(self, trial: str, place: int) -> None:
        async with self._condition():
            self.order.setdefault(trial, place)
            self.position.setdefault(trial, self.now)
            self.changed.notify_all()

    async def until(self, trial: str, steps: int) -> None:
        async with self._condition():
            self.position[trial] = self.position.get(trial, self.now) + steps  # its start may come later
            self.waiting.add(trial)
            self.changed.notify_all()
            try:
                await asyncio.wait_for(self.changed.wait_for(lambda: self._next(trial)), self.patience_s)
            except TimeoutError:
                self.stalled = True
                self.changed.notify_all()
                await self.changed.wait_for(lambda: self._next(trial))
            self.late += not self._settled()
            self.stalled = False
            self.waiting.discard(trial)
            self.now = max(self.now, self.position[trial])
            self.changed.notify_all()

    async def leave(self, trial: str) -> None:
        async with self._condition():
            self.position.pop(trial, None)
            self.changed.notify_all()

    def late_reports(self) -> int:
        return self.late

    def _condition(self) -> asyncio.Condition:
        self.changed = self.changed or asyncio.Condition()
        return self.changed

    def _settled(self) -> bool:
        live = set(self.position)
        return (live <= self.waiting and live <= set(self.order)
                and (len(live) >= self.slots or len(self.order) >= self.trials))

    def _next(self, trial: str) -> bool:
        candidates = set(self.position) if self._settled() else self.waiting if self.stalled else set()
        return bool(candidates) and trial == min(
            candidates, key=lambda other: (self.position[other], self.order.get(other, math.inf)))


_RemoteClock = ray.remote(num_cpus=0)(StepClock)


class _Lifecycle(tune.Callback):
    """Tells the clock of every trial Tune starts, in Tune's order, and of every one that ends
    (stopped, finished or failed)."""

    def __init__(self, clock):
        self.clock = clock

    def on_trial_start(self, iteration, trials, trial, **info) -> None:
        self.clock.start.remote(trial.trial_id, trials.index(trial))

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        self.clock.leave.remote(trial.trial_id)

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        self.clock.leave.remote(trial.trial_id)


class _Timeline(tune.Callback):
    """The steps every trial has reported so far, and that total when each trial first reported;
    how often a trial went on from a pause, and how often one reported a step it had already."""

    def __init__(self):
        self.steps: dict[str, int] = {}
        self.first_seen: dict[str, int] = {}
        self.resumed = self.reported_twice = 0

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        step = int(result["step"])
        self.reported_twice += step <= self.steps.get(trial.trial_id, 0)
        self.resumed += "resumed_at" in result
        self.steps[trial.trial_id] = step
        self.first_seen.setdefault(trial.trial_id, sum(self.steps.values()))


def replay_once(sweep: Sweep, curves: Curves, seed: int, tick_s: float = TICK_S,
                with_importance: bool = False, callbacks: list | None = None) -> dict[str, Any]:
    """One replayed sweep with ``seed``: steps spent against FIFO's on the same draws, the
    recorded final objective of the trial it returns, its regret against the best recorded;
    ``with_importance``: which settings mattered in it (:mod:`.importance`), as a sweep of
    this size would say. ``callbacks``: more of Tune's, as a sweep's driver has (its console,
    its run closer), to see them at work on the replay's trials."""
    metric, mode = sweep.search.metric, sweep.search.mode
    better = max if mode == "max" else min

    pauses = sweep.search.scheduler.pauses
    every = reports_every(sweep.base.train, metric)  # Tune hears a trial where it reports the objective
    concurrent = sweep.search.max_concurrent_trials or 2
    # HyperBand's trials pause and start again, in slots the clock cannot foresee; it ranks
    # whole brackets at once, so real time orders its decisions well enough (the same steps on
    # every seed: 42.5 % for BOHB's HyperBand, 31 % for halving from step 40 by 3).
    clock = None if pauses else _RemoteClock.remote(concurrent, trial_count(sweep))

    def recorded(config: dict) -> None:
        values = swept_values(config, curves.paths)
        index = curves.nearest(values)
        exact, step = int(values == curves.configs[index]), _resumed_at(tune.get_checkpoint())
        resumed = {"resumed_at": step} if step else {}
        last = curves.reports[index][-1]["step"]
        for report in curves.reports[index]:
            if report["step"] <= step:  # reported before a pause
                continue
            if report["step"] != last and not (every and report["step"] % every == 0):
                continue  # recorded, but not where this sweep reports
            if clock is None:
                time.sleep(tick_s * (report["step"] - step))
            else:
                ray.get(clock.until.remote(tune.get_context().get_trial_id(), report["step"] - step))
            step = report["step"]
            with _step_checkpoint(step if pauses else None) as checkpoint:
                tune.report({"curve": index, "exact": exact, **resumed, **report}, checkpoint=checkpoint)
            resumed = {}

    timeline = _Timeline()
    try:
        with tempfile.TemporaryDirectory(prefix="detsweep-replay-") as folder:
            seeded = dataclasses.replace(sweep, storage=folder,
                                         search=sweep.search.model_copy(update={"seed": seed, "time_budget_s": None}))
            runs = tune.with_resources(recorded, {"cpu": 0.01})  # concurrency is the searcher's to limit
            told = [timeline, *([_Lifecycle(clock)] if clock else []), *(callbacks or [])]
            results = build_tuner(seeded, concurrent, RunLink("sqlite:///unused.db", "0", None), told,
                                  runs=runs).fit()
            found = replayed_importance(f"{folder}/{seeded.name}", seeded) if with_importance else None
        late = ray.get(clock.late_reports.remote()) if clock else 0
    finally:
        if clock:
            ray.kill(clock)
    if results.errors:
        raise DetsweepError(f"the replay failed: {results.errors[0]}")
    trials = [(result.metrics["curve"], result.metrics, timeline.first_seen.get(result.metrics["trial_id"], 0))
              for result in results]
    returned = better(trials, key=lambda trial: trial[1][metric])  # ranked by the last value, as the sweep ranks
    best = curves.best_final(metric, mode)
    spent = sum(int(trial[1]["step"]) for trial in trials)
    fifo = sum(int(curves.reports[trial[0]][-1]["step"]) for trial in trials)
    chosen = curves.final(returned[0], metric)
    return {"seed": seed, "trials": len(trials), "steps": spent, "fifo_steps": fifo, "share_of_fifo": spent / fifo,
            "returned": chosen, "regret": abs(best - chosen), "steps_until_returned_seen": returned[2],
            "nearest": sum(1 for result in results if not result.metrics.get("exact", 1)),
            "resumed": timeline.resumed, "reported_twice": timeline.reported_twice, "out_of_order": late,
            **({"importance": found} if with_importance else {})}


def replayed_importance(path: str, sweep: Sweep) -> list[dict] | str:
    """The replayed sweep's importance rows (:func:`.importance.importance_rows`), or the line
    that says why there are none."""
    from .experiment import read_results
    from .importance import importance_rows, sweep_importances
    from .study import study_of

    found = sweep_importances(sweep, study_of(sweep, read_results(path, sweep)))
    return found if isinstance(found, str) else importance_rows(found)



def average_ranks(values: list[float]) -> list[float]:
    """1 for the smallest; tied values share the mean of their ranks."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for position in range(start, end + 1):
            ranks[order[position]] = (start + end) / 2 + 1
        start = end + 1
    return ranks


def spearman(xs: list[float], ys: list[float]) -> float | None:
    """Spearman's rank correlation (Pearson's on average ranks); None when either side is constant."""
    rx, ry = average_ranks(xs), average_ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx, syy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
    return sxy / math.sqrt(sxx * syy) if sxx and syy else None


def early_signal(curves: Curves, objective: str) -> dict[str, dict[int, float | None]]:
    """For every recorded metric at every step all trials reported it: its rank correlation
    with the trials' final ``objective``. A rung on a metric ranks real signal where it is
    far from 0 (negative for a loss against AP)."""
    finals = [curves.final(index, objective) for index in range(len(curves.configs))]
    return {metric: {step: spearman(values, finals) for step, values in steps.items()}
            for metric, steps in curves.at_common_steps().items()}


def replay(sweep: Sweep, curves: Curves, seeds: int = 1, tick_s: float = TICK_S,
           with_importance: bool = False, callbacks: list | None = None) -> dict[str, Any]:
    """``replay_once`` for ``seeds`` seeds from the sweep's own; their median, min and max."""
    first = sweep.search.seed or 0
    runs = [replay_once(sweep, curves, first + offset, tick_s, with_importance, callbacks) for offset in range(seeds)]
    keys = ["steps", "share_of_fifo", "returned", "regret", "steps_until_returned_seen"]
    summary = {name: {key: function([run[key] for run in runs]) for key in keys}
               for name, function in (("median", statistics.median), ("min", min), ("max", max))}
    return {"sweep": str(sweep.path), "recorded_trials": len(curves.configs), "metric": sweep.search.metric,
            "best_recorded": curves.best_final(sweep.search.metric, sweep.search.mode),
            "runs": runs, **summary, "early_signal": early_signal(curves, sweep.search.metric)}
