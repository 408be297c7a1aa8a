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


def once_per_start(metrics: dict) -> dict:
    """The metrics of ``metrics`` that a run's start reports once (:data:`ONCE_PER_START`)."""
    return {key: value for key, value in metrics.items() if key.startswith(ONCE_PER_START)}


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
