"""``detsweep best``: a sweep's trials ranked from MLflow alone, so it works from any machine
that reaches the tracking server, without Ray's results folder.

An experiment may hold several sweeps (a sweep launched twice keeps its name); their trials
are ranked together. The metric and its mode default to those of the latest sweep.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from typing import Any

from detsweep.errors import DetsweepError
from detsweep.evaluation.objectives import Objective

from .backend import Backend
from .checkpoint_models import best_of, checkpoints, model_uri, step_of
from .pages import AT_ONCE, every_run, metric_histories
from .provenance import environment_of
from .trial_run import INFEASIBLE_TAG, ROLE_TAG, TRIAL_TAG

CURVE_METRICS = ("train/", "eval/", "eval_ema/")  # what a learning curve holds (not hparams/, system/, cost/)


@dataclass(frozen=True)
class RankedTrial:
    run: Any  # mlflow.entities.Run
    value: float | None
    swept: dict[str, Any]
    checkpoint: Any = None  # its best READY checkpoint by the ranking metric (a LoggedModel), if any
    rerun: dict[str, Any] | None = None  # its configuration trained again over seeds (detsweep rerun): mean, std, seeds

    @property
    def has_checkpoint(self) -> bool:
        return self.checkpoint is not None

    def to_dict(self) -> dict[str, Any]:
        run = self.run
        return {
            "run_id": run.info.run_id,
            "trial_id": run.data.tags.get(TRIAL_TAG),
            "status": run.info.status,
            "value": self.value,
            "swept": self.swept,
            "metrics": dict(run.data.metrics),
            "checkpoint": model_uri(self.checkpoint) if self.has_checkpoint else None,
            "checkpoint_step": step_of(self.checkpoint) if self.has_checkpoint else None,
            "environment": environment_of(run.data.tags),  # what the trial's process ran on
            "rerun": self.rerun,
        }


def find_experiment(client, name: str, backend: Backend):
    experiment = client.get_experiment_by_name(name)
    if experiment is None or experiment.lifecycle_stage == "deleted":
        raise DetsweepError(f"experiment {name!r}: not found at {backend.uri} (expected a sweep's name)")
    return experiment


def sweep_runs(client, experiment_id: str) -> list:
    """The experiment's sweeps, the latest first."""
    return every_run(client, [experiment_id], f"tags.`{ROLE_TAG}` = 'sweep'", order_by=["attributes.start_time DESC"])


@dataclass(frozen=True)
class Ranking:
    experiment: str
    tracking_uri: str
    metric: str
    mode: str
    parent_run_ids: list[str]
    trials: list[RankedTrial]  # the best first; trials without the metric last
    shown: int | None = None  # the first trials shown, their checkpoints looked up (None: all)

    def to_dict(self) -> dict[str, Any]:
        """What ``detsweep best --json`` prints: the trials shown, and how many were ranked."""
        fields = {k: getattr(self, k) for k in ("experiment", "tracking_uri", "metric", "mode", "parent_run_ids")}
        return fields | {"ranked": len(self.trials), "trials": [row.to_dict() for row in self.trials[:self.shown]]}


def rank_trials(client, name: str, backend: Backend, metric: str | None = None, mode: str | None = None,
                top: int | None = None) -> Ranking:
    """Every trial run of the experiment (read a page at a time), ranked by ``metric`` (default:
    the latest sweep's); the first ``top`` (all without it) shown, with their best checkpoints."""
    sweeps, swept_paths, trials, reruns = _sweeps_and_trials(client, name, backend)
    latest = sweeps[0].data.params if sweeps else {}
    metric = metric or latest.get("search.metric", "eval/AP_best")
    mode = mode or latest.get("search.mode", "max")
    ranked = [RankedTrial(run, _value(run, metric), _swept(run, swept_paths), None,
                          _rerun_mean(reruns.get(run.data.tags.get(TRIAL_TAG), []), metric)) for run in trials]
    sign = -1.0 if mode == "max" else 1.0
    ranked.sort(key=lambda row: (row.value is None, sign * row.value if row.value is not None else 0.0))
    shown = ranked[:top]
    saved = saved_checkpoints(client, [row.run for row in shown], every=top is None)
    ranked[:top] = [replace(row, checkpoint=best_of(saved.get(row.run.info.run_id, []), metric, mode)) for row in shown]
    return Ranking(name, backend.uri, metric, mode, [sweep.info.run_id for sweep in sweeps], ranked, top)


def saved_checkpoints(client, runs: list, every: bool = False) -> dict[str, list]:
    """The READY checkpoints of ``runs``, by run id: each run's looked up (in parallel), or,
    ``every``, the experiments' whole listing read a page at a time (fewer requests for all
    the trials of a sweep)."""
    from concurrent.futures import ThreadPoolExecutor

    saved: dict[str, list] = {}
    if every:
        for model in checkpoints(client, list({run.info.experiment_id for run in runs})):
            saved.setdefault(model.source_run_id, []).append(model)
        return saved
    with ThreadPoolExecutor(AT_ONCE) as pool:
        found = pool.map(lambda run: checkpoints(client, [run.info.experiment_id], run.info.run_id), runs)
        return {run.info.run_id: models for run, models in zip(runs, found)}


def _rerun_mean(runs: list, metric: str) -> dict[str, Any] | None:
    """The mean and standard deviation of ``metric`` over a configuration's finished reruns."""
    import statistics

    values = [value for run in runs if run.info.status == "FINISHED" and (value := _value(run, metric)) is not None]
    if not values:
        return None
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "seeds": len(values)}


def front_of(client, name: str, backend: Backend):
    """The Pareto front over the latest sweep's objectives, drawn from MLflow alone: among the
    experiment's trials trained to the end (FINISHED, not stopped early, not left untrained by
    a constraint) that logged every objective."""
    from .front import Candidate, pareto_front
    from .sweep_run import OBJECTIVES_TAG

    sweeps, paths, trials, _ = _sweeps_and_trials(client, name, backend)
    stated = next((json.loads(sweep.data.tags[OBJECTIVES_TAG]) for sweep in sweeps if OBJECTIVES_TAG in sweep.data.tags), None)
    if stated is None:
        raise DetsweepError(f"experiment {name!r} at {backend.uri}: no sweep of it has search.objectives, expected a "
                            "multi-objective sweep for --pareto (rank one metric without it)")
    objectives = [Objective(o["metric"], o["mode"]) for o in stated]
    candidates = [Candidate(run.data.tags.get(TRIAL_TAG), run.info.run_id, _swept(run, paths),
                            {o.metric: run.data.metrics[o.metric] for o in objectives})
                  for run in trials if _trained_to_the_end(run) and all(_value(run, o.metric) is not None for o in objectives)]
    return pareto_front(candidates, objectives, {o["metric"]: o.get("reference") for o in stated})


def _trained_to_the_end(run) -> bool:
    tags = run.data.tags
    return run.info.status == "FINISHED" and tags.get("early_stopped") != "true" and INFEASIBLE_TAG not in tags


def recorded_curves(client, name: str, backend: Backend, metrics: list[str]) -> tuple[list[str], list[tuple[dict, list]]]:
    """The experiment's swept paths, and for every trial that trained its whole budget
    (``train.num_steps``), its swept values and the histories of ``metrics`` and of every
    training and evaluation metric, merged by step: learning curves to replay. A trial stopped
    early or failed has no full curve: left out."""
    _, paths, trials, _ = _sweeps_and_trials(client, name, backend)
    first = metric_histories(client, [(run.info.run_id, metrics[0]) for run in trials])
    budget = {run.info.run_id: int(run.data.params.get("train.num_steps") or 0) for run in trials}
    full = [run for run in trials  # stopped early or failed: read no more of it
            if budget[run.info.run_id] and max(first[run.info.run_id, metrics[0]], default=-1) >= budget[run.info.run_id]]
    others = {run.info.run_id: sorted(({key for key in run.data.metrics if key.startswith(CURVE_METRICS)}
                                       | set(metrics[1:])) - {metrics[0]}) for run in full}
    read = first | metric_histories(client, [(run_id, metric) for run_id, names in others.items() for metric in names])
    curves = []
    for run in full:
        by_step: dict[int, dict[str, float]] = {}
        for metric in [metrics[0], *others[run.info.run_id]]:
            for step, value in read[run.info.run_id, metric].items():
                by_step.setdefault(step, {"step": step})[metric] = value
        swept = {path: _typed(value) for path, value in _swept(run, set(paths)).items()}
        curves.append((swept, [by_step[step] for step in sorted(by_step)]))
    return sorted(paths), curves


def _sweeps_and_trials(client, name: str, backend: Backend) -> tuple[list, set[str], list, dict[str, list]]:
    """The experiment's sweep runs (the latest first), the paths they swept, its trial runs, and
    its latest rerun's trial runs (``detsweep rerun``) by the source trial each trains again,
    apart: a rerun is neither ranked among the trials it measures again nor one of the sweeps
    (and two reruns, each with its own seeds and budget, are not pooled)."""
    from .sweep_run import RERUN_OF_TAG, RERUN_TRIAL_TAG
    from .trial_run import PARENT_TAG

    experiment = find_experiment(client, name, backend)
    every = sweep_runs(client, experiment.experiment_id)
    reruns = {sweep.info.run_id for sweep in every if RERUN_OF_TAG in sweep.data.tags}
    sweeps = [sweep for sweep in every if sweep.info.run_id not in reruns]
    paths = {key.removeprefix("space.") for sweep in sweeps for key in sweep.data.params if key.startswith("space.")}
    latest = {sweep.info.run_id: place for place, sweep in enumerate(every)}  # 0: the latest
    trials, again = [], {}
    for run in every_run(client, [experiment.experiment_id], f"tags.`{ROLE_TAG}` = 'trial'"):
        parent = run.data.tags.get(PARENT_TAG)
        if parent not in reruns:
            trials.append(run)
        elif RERUN_TRIAL_TAG in run.data.tags:
            again.setdefault(run.data.tags[RERUN_TRIAL_TAG], {}).setdefault(parent, []).append(run)
    again = {trial_id: by_parent[min(by_parent, key=latest.__getitem__)] for trial_id, by_parent in again.items()}
    if not trials:
        raise DetsweepError(f"experiment {name!r} at {backend.uri}: no trial runs (has a sweep of it run yet?)")
    return sweeps, paths, trials, again


def _typed(value: Any) -> Any:
    """A param as it was swept: MLflow keeps params as text."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return value


def _value(run, metric: str) -> float | None:
    value = run.data.metrics.get(metric)
    return None if value is None or math.isnan(value) else value


def _swept(run, paths: set[str]) -> dict[str, Any]:
    """The swept values: PBT's latest (``hparams/*`` metrics) where they changed, else the params."""
    values = {}
    for path in sorted(paths):
        if f"hparams/{path}" in run.data.metrics:
            values[path] = run.data.metrics[f"hparams/{path}"]
        elif path in run.data.params:
            values[path] = run.data.params[path]
    return values


