"""Where a run's start-up time goes, phase by phase, up to its first training step.

A trial's start is spread over processes: the Tune trial builds its trainer, Ray Train
starts the workers, each worker imports TensorFlow, reads its data, builds the model and
traces the train step. The clock travels with the run (in its ``TrainingRequest``) and each
process marks the end of its phases; the first report carries them as ``startup/<phase>_s``
metrics, beside the curves in MLflow and for ``bench/startup.py``. Marks are wall-clock
times, so phases that span processes are measured on one node's clock.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

# Metrics a run's every start reports once, on its first loop (with ``restore/*`` when it
# continued from a checkpoint). When that loop is a step trained before, which is dropped,
# they go on with the next step passed on.
ONCE_PER_START = ("startup/", "restore/")


class NewSteps:
    """Each step once, in order, though a restart goes back to a checkpoint and trains steps
    again: a step at or before the last one passed on is a replay, dropped, and the
    once-per-start metrics it brought go on with the next step passed on. The one rule for
    both places that pass steps on: the trial's merge of its reports (a worker group
    restarted within a run) and its MLflow run (a trial started again: PBT, a resumed sweep)."""

    def __init__(self, last: int = -1):
        self.last = last  # the last step passed on
        self.carried: dict = {}  # what dropped replays said once, for the next step passed on

    def admit(self, step: int, metrics: dict) -> dict | None:
        """The metrics to pass on as ``step``'s (with what was carried), or None for a replay."""
        if step <= self.last:
            self.carried |= {key: value for key, value in metrics.items() if key.startswith(ONCE_PER_START)}
            return None
        return {**self.carried, **metrics}

    def passed(self, step: int) -> None:
        """``step``'s metrics were passed on (written): the carried ones went with them."""
        self.last, self.carried = step, {}


@dataclass
class StartupClock:
    origin: float = field(default_factory=time.time)
    phases: dict[str, float] = field(default_factory=dict)  # phase → seconds, in the order they ended
    last: float | None = None

    def mark(self, phase: str) -> None:
        """End ``phase`` now: it lasted from the previous mark (or the origin) until now."""
        now = time.time()
        self.phases[phase] = now - (self.last if self.last is not None else self.origin)
        self.last = now

    def mark_once(self, phase: str) -> None:
        """End ``phase`` now unless it has ended before: marked after every loop, "first_loop" keeps the first."""
        if phase not in self.phases:
            self.mark(phase)

    def metrics(self) -> dict[str, float]:
        return {**{f"startup/{phase}_s": seconds for phase, seconds in self.phases.items()},
                "startup/total_s": sum(self.phases.values())}
