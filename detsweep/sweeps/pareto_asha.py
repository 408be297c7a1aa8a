"""ASHA for a sweep with several objectives (MO-ASHA's rule, Schmucker et al. 2021), as a Tune
``TrialScheduler`` that keeps its own state and decides CONTINUE or STOP in its hooks.

Its rungs are ASHA's: ``grace_period · reduction_factor^k`` steps, below ``max_t``. A trial
that reaches a rung is recorded there with its values of every objective, and goes on unless
at least 1 in ``reduction_factor`` (rounded up) of the trials recorded at that rung lie in
fronts better than its own, the fronts being the non-dominated sort of their values. Within a
front no trial is better than another, so a front is kept or cut whole; on one objective the
fronts are the distinct values and this is ASHA's rule. So a small, fast model that converges
slower than a big one is not stopped for its lower AP alone: nothing faster scores better.

Asynchronous as ASHA is: each trial is judged when it arrives, against those that arrived
before it (a trial that ended still counts at the rungs it reached); nothing pauses.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ray.tune.experiment import Trial
from ray.tune.schedulers import FIFOScheduler, TrialScheduler

from detsweep.evaluation.objectives import Objective, fronts


class ParetoASHA(FIFOScheduler):
    def __init__(self, objectives: Sequence[Objective], max_t: int, grace_period: int, reduction_factor: float,
                 time_attr: str = "step"):
        super().__init__()
        self.objectives, self.max_t, self.time_attr = list(objectives), max_t, time_attr
        self.eta = reduction_factor
        self.rungs: list[int] = []
        rung = float(grace_period)
        while rung < max_t:
            self.rungs.append(int(rung))
            rung *= reduction_factor
        self.recorded: dict[int, dict[str, tuple[float, ...]]] = {rung: {} for rung in self.rungs}

    def set_search_properties(self, metric: str | None, mode: str | None, **spec) -> bool:
        return True  # it ranks on its objectives, whatever Tune's one metric is

    def on_trial_result(self, tune_controller, trial: Trial, result: dict) -> str:
        point = self.point(result)
        if point is None or self.time_attr not in result:
            return TrialScheduler.CONTINUE
        if result[self.time_attr] >= self.max_t:
            return TrialScheduler.STOP
        reached = [rung for rung in self.rungs if result[self.time_attr] >= rung
                   and trial.trial_id not in self.recorded[rung]]
        if not reached:
            return TrialScheduler.CONTINUE
        rung = reached[-1]  # as ASHA: the highest rung it passed that has not judged it
        self.recorded[rung][trial.trial_id] = point
        return TrialScheduler.CONTINUE if self.keeps(rung, trial.trial_id) else TrialScheduler.STOP

    def point(self, result: dict) -> tuple[float, ...] | None:
        """The result's objectives, each on the less-is-better scale; None without all of them."""
        values = [result.get(objective.metric) for objective in self.objectives]
        if any(not isinstance(value, (int, float)) or math.isnan(value) for value in values):
            return None
        return tuple(objective.as_min(float(value)) for objective, value in zip(self.objectives, values, strict=True))

    def keeps(self, rung: int, trial_id: str) -> bool:
        """Whether fewer than 1 in ``eta`` (rounded up) of the trials at ``rung`` lie in better
        fronts than ``trial_id``'s."""
        ids = list(self.recorded[rung])
        sorted_fronts = fronts([self.recorded[rung][i] for i in ids])
        depth = next(k for k, front in enumerate(sorted_fronts) if ids.index(trial_id) in front)
        better = sum(len(front) for front in sorted_fronts[:depth])
        return better < math.ceil(len(ids) / self.eta)

    def debug_string(self) -> str:
        at = ", ".join(f"{rung}: {len(self.recorded[rung])}" for rung in self.rungs)
        return f"ParetoASHA over {', '.join(o.metric for o in self.objectives)}: trials at each rung {{{at}}}"
