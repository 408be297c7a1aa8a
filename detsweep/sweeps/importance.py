"""Which settings mattered: each swept parameter's importance for each objective, with an
interval that says how much the sweep knows.

Under early stopping most trials never reach the end, and a trial stopped at step 75 is no
worse than one trained to 300 because its last value is lower. So trials are compared at one
step: the deepest evaluated step that at least :data:`MIN_TRIALS` of them reached, each valued
there. PED-ANOVA (Optuna's default evaluator) runs on a study derived from those values, its
trials COMPLETE at them (Optuna's evaluators read COMPLETE trials only), with a top quantile
that holds at least :data:`MIN_TOP` trials; resampling the trials (a bootstrap) gives each
importance an interval, which Optuna does not. fANOVA runs once beside it, a second opinion
without an interval.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
import optuna
from optuna.importance import FanovaImportanceEvaluator, PedAnovaImportanceEvaluator
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from .spec import Sweep
from .study import STEPS, new_study, quiet_optuna

MIN_TRIALS = 20  # trials compared at one step, at least
MIN_TOP = 5  # trials in PED-ANOVA's top quantile, at least
MAX_QUANTILE = 0.25
QUANTILE = 0.1  # PED-ANOVA's own default, when it holds MIN_TOP trials
RESAMPLES = 200
LEVEL = 0.9  # the intervals' coverage


@dataclass(frozen=True)
class Importance:
    """One objective's importances: each parameter's PED-ANOVA share (they sum to 1), its
    bootstrap interval over ``resamples`` draws, and fANOVA's share; from ``trials`` trials
    valued at ``step``."""

    metric: str
    step: int
    trials: int
    quantile: float
    resamples: int
    shares: dict[str, float]
    intervals: dict[str, tuple[float, float]]
    fanova: dict[str, float]


def ready_before_ray() -> None:
    """scikit-learn (fANOVA's forest) adds variables to ``os.environ`` as it is first imported,
    which can crash a process whose Ray threads read the environment at that moment (glibc's
    ``setenv`` frees the array they read): a driver that will say which settings mattered
    imports it before Ray starts."""
    import sklearn  # noqa: F401


class TooFew(Exception):
    """Too few trials at any evaluated step: the line says how many there are and how many it needs."""


def importances(study: optuna.Study, resamples: int = RESAMPLES, seed: int = 0,
                objective: str | None = None) -> list[Importance]:
    """Each objective's :class:`Importance` in ``study`` (:mod:`.study`'s form of a sweep), or
    ``objective``'s alone."""
    single = len(study.directions) == 1
    with quiet_optuna():
        return [one_objective(study.trials, metric, direction, single, resamples, seed)
                for metric, direction in zip(study.metric_names, study.directions) if objective in (None, metric)]


def one_objective(trials: list[FrozenTrial], metric: str, direction: optuna.study.StudyDirection, single: bool,
                  resamples: int, seed: int) -> Importance:
    curves = [(trial, steps_of(trial, metric, single)) for trial in trials]
    step, valued = common_step(curves)
    quantile = min(MAX_QUANTILE, max(QUANTILE, MIN_TOP / len(valued)))
    evaluator = PedAnovaImportanceEvaluator(target_quantile=quantile)
    # Optuna's target= ranks lower as better: a maximised metric is negated
    values = np.array([value for _, value in valued]) * (-1.0 if direction == StudyDirection.MAXIMIZE else 1.0)
    once = np.ones(len(valued), int)
    drawn = np.random.default_rng(seed).multinomial(len(valued), once / len(valued), size=resamples)
    study, owner = copies_study(valued, drawn.max(axis=0, initial=1))
    shares = _shares(study, owner, evaluator, values, once)
    resampled = [_shares(study, owner, evaluator, values, counts) for counts in drawn]
    tail = (1 - LEVEL) / 2
    intervals = {name: tuple(float(q) for q in np.quantile([r.get(name, 0.0) for r in resampled], [tail, 1 - tail]))
                 for name in shares}
    fanova = _shares(study, owner, FanovaImportanceEvaluator(seed=seed), values, once)
    return Importance(metric, step, len(valued), quantile, resamples, shares, intervals, fanova)


def steps_of(trial: FrozenTrial, metric: str, single: bool) -> dict[int, float]:
    """The trial's values of ``metric`` by step: its intermediate values, or with several
    objectives its ``steps/<metric>`` attribute."""
    if single:
        return dict(trial.intermediate_values)
    return {int(step): value for step, value in trial.user_attrs.get(f"{STEPS}{metric}", {}).items()}


def common_step(curves: list[tuple[FrozenTrial, dict[int, float]]]) -> tuple[int, list[tuple[FrozenTrial, float]]]:
    """The deepest evaluated step that at least :data:`MIN_TRIALS` trials reached, and each of
    those trials with its value there. A trial that failed counts at no step."""
    reached = [(trial, steps) for trial, steps in curves if trial.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    for step in sorted({step for _, steps in reached for step in steps}, reverse=True):
        valued = [(trial, steps[step]) for trial, steps in reached if math.isfinite(steps.get(step, math.nan))]
        if len(valued) >= MIN_TRIALS:
            return step, valued
    most = max((sum(step in steps for _, steps in reached) for step in {s for _, st in reached for s in st}), default=0)
    raise TooFew(f"{most} trials reached one evaluated step; importance needs {MIN_TRIALS} at one step")


def copies_study(valued: list[tuple[FrozenTrial, float]], copies: np.ndarray) -> tuple[optuna.Study, np.ndarray]:
    """A study holding ``copies[i]`` copies of each trial ``i`` of ``valued``, COMPLETE (Optuna's
    evaluators read no other state), and which trial each study trial copies, as (trial, copy)
    by trial number. A resample chooses its trials by ``target=`` alone (a NaN leaves a copy
    out), so the bootstrap builds no study of its own."""
    study = optuna.create_study()
    study.add_trials([optuna.trial.create_trial(params=trial.params, distributions=trial.distributions, value=value)
                      for (trial, value), count in zip(valued, copies) for _ in range(count)])
    owner = np.array([(index, copy) for index, count in enumerate(copies) for copy in range(count)])
    return study, owner


def _shares(study: optuna.Study, owner: np.ndarray, evaluator, values: np.ndarray,
            counts: np.ndarray) -> dict[str, float]:
    """``evaluator``'s importances (normalised) over ``counts[i]`` copies of each trial ``i``,
    valued at ``values[i]`` (lower is better); ``owner`` as :func:`copies_study` gives it."""
    def target(trial: FrozenTrial) -> float:
        index, copy = owner[trial.number]
        return values[index] if copy < counts[index] else math.nan

    with warnings.catch_warnings():
        # that target= ranks lower as better (known), and "importances will be equal" on a resample
        # that holds one kind of trial
        warnings.simplefilter("ignore")
        return dict(optuna.importance.get_param_importances(study, evaluator=evaluator, target=target, normalize=True))


def sweep_importances(sweep: Sweep, trials: list[FrozenTrial], resamples: int = RESAMPLES,
                      objective: str | None = None) -> list[Importance] | str:
    """The importances of ``sweep``'s study ``trials`` (``objective``'s alone, when given), or
    the one line that says why there are none."""
    if sweep.search.scheduler.type == "pbt":
        return ("importance needs trials that keep their values; a PBT sweep's trials change theirs as they train")
    try:
        return importances(new_study(sweep, trials), resamples, seed=sweep.search.seed or 0, objective=objective)
    except TooFew as too_few:
        return str(too_few)


def importance_lines(found: list[Importance]) -> list[str]:
    """Each objective's heading, then a parameter a line: share [interval], fANOVA's."""
    lines = []
    for each in found:
        lines.append(f"{each.metric}: {each.trials} trials compared at step {each.step}, PED-ANOVA on the top "
                     f"{each.quantile:.0%} ({LEVEL:.0%} interval over {each.resamples} resamples), fANOVA beside it")
        width = max(len(name) for name in each.shares)
        for name, share in each.shares.items():
            low, high = each.intervals[name]
            fanova = f"{each.fanova[name]:.2f}" if name in each.fanova else "-"
            lines.append(f"  {name:<{width}}  {share:.2f} [{low:.2f}, {high:.2f}]  fANOVA {fanova}")
    return lines


def importance_rows(found: list[Importance]) -> list[dict]:
    """One row per objective and parameter (``importance.csv``, ``--json``)."""
    return [{"objective": each.metric, "parameter": name, "share": share, "low": each.intervals[name][0],
             "high": each.intervals[name][1], "fanova": each.fanova.get(name), "step": each.step,
             "trials": each.trials, "quantile": each.quantile, "resamples": each.resamples} for each in found for name, share in each.shares.items()]


def importance_figure(found: list[Importance]):
    """Each objective's shares as bars, their intervals as whiskers."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(len(found), 1, figsize=(8, 1.2 + 0.45 * sum(len(f.shares) for f in found)),
                                   squeeze=False)
    for axis, each in zip(axes[:, 0], found):
        names = list(each.shares)[::-1]
        shares = [each.shares[name] for name in names]
        whiskers = [[share - each.intervals[name][0] for name, share in zip(names, shares)],
                    [each.intervals[name][1] - share for name, share in zip(names, shares)]]
        axis.barh(names, shares, xerr=np.maximum(whiskers, 0), color="tab:blue", capsize=3)
        axis.set_xlim(0, 1)
        axis.set_title(f"{each.metric}: {each.trials} trials at step {each.step} ({LEVEL:.0%} intervals)", fontsize=9)
    axes[-1, 0].set_xlabel("PED-ANOVA share of importance")
    figure.tight_layout()
    return figure
