"""What ``detsweep launch`` prints while a sweep runs: a line per trial event, and the trial table.

Tune's own reporter prints every trial's whole config (80 rows here) and truncates the
swept columns; this prints what a sweep's user watches: the swept values, the step, the
metric, and why a trial ended.
"""

from __future__ import annotations

import time
from typing import Any, TextIO

from ray import tune

from detsweep import console
from detsweep.errors import failure_reason
from detsweep.trainables.trial import swept_values


def short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


class SweepProgress(tune.Callback):
    """One line when a trial starts, reports, ends or fails; the table every ``table_every_s``."""

    def __init__(self, paths: list[str], metric: str, num_steps: int, stream: TextIO | None = None,
                 table_every_s: float = 60.0):
        self.paths = paths
        self.metric = metric
        self.num_steps = num_steps
        self.stream = stream
        self.table_every_s = table_every_s
        self._last_table = time.monotonic()

    def _print(self, line: str) -> None:
        print(line, file=self.stream or console.out(), flush=True)

    def _label(self, trial) -> str:
        return trial.trial_id

    def on_trial_start(self, iteration, trials, trial, **info) -> None:
        values = swept_values(trial.config, self.paths)
        self._print(f"trial {self._label(trial)} started: " + "  ".join(
            f"{path.rsplit('.', 1)[-1]}={short(value)}" for path, value in values.items()))

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        parts = [f"step {result.get('step', 0)}/{self.num_steps}"]
        if "train/loss" in result and self.metric != "train/loss":
            parts.append(f"loss {result['train/loss']:.3f}")
        if self.metric in result:
            parts.append(f"{self.metric} {short(result[self.metric])}")
        self._print(f"trial {self._label(trial)} " + "  ".join(parts))

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        step = trial.last_result.get("step", 0)
        how = "finished" if step >= self.num_steps else "stopped early by the scheduler"
        self._print(f"trial {self._label(trial)} {how} at step {step}: "
                    f"{self.metric} {short(trial.last_result.get(self.metric))}")

    def on_trial_error(self, iteration, trials, trial, **info) -> None:

        self._print(f"trial {self._label(trial)} errored: {failure_reason(trial.get_error())}")

    def on_step_end(self, iteration, trials, **info) -> None:
        if time.monotonic() - self._last_table >= self.table_every_s:
            self._last_table = time.monotonic()
            self._print(self.table(trials))

    def table(self, trials) -> str:
        headers = ["trial", "status", "step", self.metric] + [path.rsplit(".", 1)[-1] for path in self.paths]
        rows = [[self._label(trial), trial.status, str(trial.last_result.get("step", "")),
                 short(trial.last_result.get(self.metric, ""))]
                + [short(value) for value in swept_values(trial.config, self.paths).values()]
                for trial in trials]
        widths = [max(len(row[i]) for row in [headers, *rows]) for i in range(len(headers))]
        lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip()
                 for row in [headers, *rows]]
        return "\n".join(lines)

