"""A sweep as an Optuna study, whatever searcher and scheduler ran it.

Optuna's study is the form a sweep's trials take outside Tune: optuna-dashboard opens it,
Optuna's importance evaluators read it, and a team can load it beside studies of its own.
Each trial becomes a frozen trial: its swept values under their dotted paths, with the
distributions the sweep drew them from (a value a trial does not use, a momentum where the
optimizer has none, is left out); each objective's value; every evaluation an intermediate
value keyed by its **step**. A multi-objective study takes no intermediate values: there,
each objective's per-step values are a user attribute (``steps/<metric>``). A trial the
scheduler stopped is PRUNED at its last step; one that failed, or was never trained for its
architecture, is FAIL with the reason as an attribute; each carries its Tune trial id, its
MLflow run and its seed.

The study is Optuna's journal over a file, written in a scratch folder and moved into place
whole: a journal file takes a lock while it is written, which a bucket cannot hold.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState

from detsweep.tracking.sweep_run import TrialStatus

from .experiment import Curves, SweepResults, TrialOutcome
from .space import Parameter, is_used
from .spec import Sweep

STUDY_FILE = "study.journal"
STEPS = "steps/"  # a multi-objective study's per-step values: user attribute "steps/<metric>"
PRIMITIVE = (type(None), bool, int, float, str)


def study_trials(sweep: Sweep, outcomes: list[TrialOutcome], curves: Curves,
                 run_ids: Mapping[str, str] | None = None) -> list[FrozenTrial]:
    """Each of ``outcomes`` as a frozen trial of ``sweep``'s study (see the module's docstring);
    ``curves``: each trial's objectives by step; ``run_ids``: each trial's MLflow run."""
    parameters = swept_parameters(sweep)
    base = sweep.base.model_dump(mode="json")
    assignments = {outcome.trial_id: {path: as_choice(value) for path, value in outcome.config.items()
                                      if path in parameters and is_used(path, outcome.config, base)}
                   for outcome in outcomes}
    distributions = {path: covering(parameter_distribution(parameter),
                                    [values[path] for values in assignments.values() if path in values])
                     for path, parameter in parameters.items()}
    objectives = sweep.search.ranked_on
    trials = []
    for outcome in outcomes:
        params = assignments[outcome.trial_id]
        steps = curves.get(outcome.trial_id, {})
        state, values, reason = _ending(outcome, objectives, steps)
        attributes = {"trial_id": outcome.trial_id, "seed": int(params.get("train.seed", sweep.base.train.seed)),
                      "mlflow_run_id": (run_ids or {}).get(outcome.trial_id), **reason}
        intermediate = {}
        if len(objectives) == 1:
            intermediate = steps.get(objectives[0].metric, {})
        else:
            attributes |= {f"{STEPS}{o.metric}": {str(step): value for step, value in steps.get(o.metric, {}).items()}
                           for o in objectives}
        trials.append(optuna.trial.create_trial(
            state=state, values=values, params=params,
            distributions={path: distributions[path] for path in params},
            user_attrs=attributes, intermediate_values=intermediate))
    return trials


def study_of(sweep: Sweep, results: SweepResults, run_ids: Mapping[str, str] | None = None) -> list[FrozenTrial]:
    """The frozen trials of the sweep's ``results``; ``run_ids`` where the results know none."""
    return study_trials(sweep, results.outcomes, results.curves, run_ids or results.run_ids)


def _ending(outcome: TrialOutcome, objectives: list, steps: dict[str, dict[int, float]]) -> tuple:
    """The trial's state, its values, and the attribute that says why it has none."""
    if outcome.status == TrialStatus.INFEASIBLE:
        return TrialState.FAIL, None, {"infeasible": outcome.infeasible}
    if outcome.status == TrialStatus.ERROR:
        return TrialState.FAIL, None, {"error": outcome.error}
    if outcome.status in (TrialStatus.PENDING, TrialStatus.RUNNING, TrialStatus.PAUSED):
        return TrialState.RUNNING, None, {}
    if outcome.status == TrialStatus.STOPPED:
        # as Optuna's own tell: a pruned trial's value is its last intermediate one
        last = steps.get(objectives[0].metric, {})
        return TrialState.PRUNED, [last[max(last)]] if len(objectives) == 1 and last else None, {}
    values = [_number(outcome.metrics.get(objective.metric)) for objective in objectives]
    missing = [o.metric for o, value in zip(objectives, values) if value is None]
    if missing:
        return TrialState.FAIL, None, {"error": f"trained to the end without {', '.join(missing)}"}
    return TrialState.COMPLETE, values, {}


def swept_parameters(sweep: Sweep) -> dict[str, Parameter]:
    """The parameters a sweep varies: its space's (constants left out), then PBT's mutations."""
    search = sweep.search
    varied = {path: p for path, p in search.space.items() if "value" not in p.model_fields_set}
    return varied | {path: p for path, p in search.scheduler.mutations.items() if path not in varied}


def parameter_distribution(parameter: Parameter) -> BaseDistribution:
    """The Optuna distribution a sweep's parameter draws from (a normal one: see :func:`covering`)."""
    choices = parameter.values if parameter.values is not None else parameter.grid
    if choices is not None:
        return CategoricalDistribution([as_choice(choice) for choice in choices])
    low, high = parameter.min, parameter.max
    if parameter.distribution == "int_uniform":
        return IntDistribution(int(low), int(high))
    if parameter.distribution == "log_uniform_values":
        return FloatDistribution(low, high, log=True)
    if parameter.distribution == "q_uniform" and _on_steps(low, high, parameter.q):
        return FloatDistribution(low, high, step=parameter.q)
    if parameter.distribution == "normal":  # unbounded: four standard deviations, widened to what was drawn
        return FloatDistribution(parameter.mu - 4 * parameter.sigma, parameter.mu + 4 * parameter.sigma)
    return FloatDistribution(low, high)


def covering(distribution: BaseDistribution, values: list[Any]) -> BaseDistribution:
    """``distribution`` widened to hold ``values``: PBT perturbs values past their range, a
    normal distribution has none, Tune's ``quniform`` rounds past its bounds."""
    if isinstance(distribution, CategoricalDistribution):
        extra = [value for value in values if value not in distribution.choices]
        return CategoricalDistribution([*distribution.choices, *dict.fromkeys(extra)]) if extra else distribution
    numbers = [value for value in values if isinstance(value, (int, float))]
    low, high = min([distribution.low, *numbers]), max([distribution.high, *numbers])
    if (low, high) == (distribution.low, distribution.high):
        return distribution
    if isinstance(distribution, IntDistribution):
        return IntDistribution(int(low), int(high), log=distribution.log)
    step = distribution.step if distribution.step and _on_steps(low, high, distribution.step) else None
    return FloatDistribution(low, high, log=distribution.log and low > 0, step=step)


def as_choice(value: Any) -> Any:
    """A value as an Optuna choice: itself when Optuna can hold it, else its JSON (a whole schedule)."""
    return value if isinstance(value, PRIMITIVE) else json.dumps(value, sort_keys=True)


def write_study(sweep: Sweep, trials: list[FrozenTrial], out: Path) -> Path:
    """The study as Optuna's journal file at ``out``, made in a scratch folder beside it and
    moved into place whole (a study written before is replaced only by a finished one)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".study-", dir=out.parent) as scratch:
        journal = Path(scratch) / STUDY_FILE
        storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(journal)))
        new_study(sweep, trials, storage)
        os.replace(journal, out)
    return out


def new_study(sweep: Sweep, trials: list[FrozenTrial], storage=None) -> optuna.Study:
    """``sweep``'s study holding ``trials``, in ``storage`` (default: memory)."""
    with quiet_optuna():
        study = optuna.create_study(storage=storage, study_name=sweep.name,
                                    directions=[direction(o.mode) for o in sweep.search.ranked_on])
        study.set_metric_names([o.metric for o in sweep.search.ranked_on])  # the dashboard's names for them
        study.add_trials(trials)
    return study


@contextlib.contextmanager
def quiet_optuna() -> Iterator[None]:
    """Optuna without its INFO lines ("A new study created …") and its experimental warnings
    (``set_metric_names``, since 3.2): the commands' output is detsweep's."""
    level = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            yield
    finally:
        optuna.logging.set_verbosity(level)


def read_study(path: Path) -> optuna.Study:
    """The study a journal file holds (its only one)."""
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(path)))
    [summary] = optuna.get_all_study_summaries(storage)
    return optuna.load_study(study_name=summary.study_name, storage=storage)


def direction(mode: str) -> str:
    return "maximize" if mode == "max" else "minimize"


def _on_steps(low: float, high: float, step: float) -> bool:
    count = (high - low) / step
    return math.isclose(count, round(count), abs_tol=1e-9)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None

