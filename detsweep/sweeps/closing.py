"""Each trial's MLflow run closed as Tune completes the trial, by the sweep's driver.

A trial that trains to the end closes its own run (FINISHED); one that a scheduler stops
cannot: its process cannot tell a stop from a pause (Tune pauses a trial by stopping its
actor too), and Tune ends it. So the driver does, as Tune completes the trial (stopped
early or finished) or sees it fail: KILLED with ``early_stopped`` for a stop, FAILED with
its reason, and each trial's cost on its run. A paused trial is not complete: its run stays
RUNNING, without ``early_stopped``, until it ends. Tune's loop thread only queues the
writes; a writer thread sends them (retried while the server is away), so the sweep's end
(``tracking/sweep_run.py:close_sweep_run``) has only what is left to close: trials a time
budget cut, or an interrupted driver's.
"""

from __future__ import annotations

from typing import Any

from ray import tune

from detsweep.config import ScalingConfig
from detsweep.errors import failure_reason
from detsweep.tracking.sweep_run import TrialStatus, end_trial_run
from detsweep.tracking.trial_run import RunLink, find_trial_run
from detsweep.trainables.trial import INFEASIBLE

from .experiment import trial_cost
from .progress import latest_error

DRAIN_S = 120.0  # how long the sweep's end waits for the closes still queued


class RunCloser(tune.Callback):
    """Closes a trial's run as Tune completes it or sees it fail; ``on_experiment_end`` waits
    for what is queued (the sweep's end then reads the runs as the closes left them)."""

    def __init__(self, link: RunLink, num_steps: int, scaling: ScalingConfig):
        self.link, self.num_steps, self.scaling = link, num_steps, scaling
        self._writer = self._client = None  # made at the first close; never pickled with the callback

    def __getstate__(self) -> dict:  # Tune pickles its callbacks into the experiment's state
        return {**self.__dict__, "_writer": None, "_client": None}

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        self.close(trial, None)

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        self.close(trial, failure_reason(latest_error(trial)))

    def on_experiment_end(self, trials, **info) -> None:
        if self._writer is not None:
            self._writer.close(DRAIN_S)  # what is lost is closed again by the sweep's end
            self._writer = None

    def ended(self, trial, error: str | None) -> dict[str, Any]:
        """The trial as the sweep's end describes it to ``end_trial_run``. Tune calls
        ``on_trial_complete`` before it sets the trial's status: complete is TERMINATED."""
        result = trial.last_result or {}
        step = int(result.get("step", 0))
        infeasible = result.get(INFEASIBLE)
        status = TrialStatus.ERROR if error is not None else TrialStatus.of(
            TrialStatus.TERMINATED, step, self.num_steps, bool(infeasible))
        return {"status": status, "metrics": {"step": step}, "infeasible": infeasible, "error": error,
                "cost": trial_cost(float(result.get("time_total_s", 0.0)), self.scaling)}

    def close(self, trial, error: str | None) -> None:
        """Queue the writes that end ``trial``'s run as it ended (``error``: why it failed)."""
        from mlflow import MlflowClient

        from detsweep.tracking.writer import RetryingWriter

        if self._writer is None:
            self._writer, self._client = RetryingWriter(), MlflowClient(self.link.uri)
        ended, client, link = self.ended(trial, error), self._client, self.link

        def write() -> None:
            run = find_trial_run(client, link, trial.trial_id)
            if run is not None:  # else the trial never opened it
                end_trial_run(client, run, ended)

        self._writer.submit(f"closing trial {trial.trial_id}'s run", write)
