"""Ray's undocumented parts (Ray 2.60) that detsweep relies on: Ray Train's settings that only
environment variables set, the priority of Ray's worker processes, the head node's own
resource, Tune's result loggers kept from losing rows when a trial starts again, and what
detsweep's schedulers (``sweeps/rungs.py``) need beyond Tune's scheduler interface: the order
Tune created its trials in, the budget TuneBOHB learns from, and a trial stopped while paused
written to the experiment's saved state.

Nothing here imports Ray when this module is imported: ``detsweep.cluster`` uses it before any
command has decided to start Ray.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

__all__ = ["HEAD_NODE_RESOURCE", "HIDE_GPUS_ON_ZERO", "POLL_INTERVAL", "bohb_budget", "creation_order", "result_files",
           "save_stopped_trial", "train_environment"]

# Ray's own resource of the head node (every Ray cluster has it, 1 unit): a task asking a
# fraction of it runs on the head.
HEAD_NODE_RESOURCE = "node:__internal_head__"

# Ray Train's settings, read from the environment of its controller and workers
# (``ray/train/v2/_internal/constants.py``; Ray Train passes these on from the driver).
POLL_INTERVAL = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"  # seconds between the controller's polls of its workers
START_TIMEOUT = "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"  # how long a worker group may wait for its resources
PRINT_PATCH = "RAY_TRAIN_ENABLE_PRINT_PATCH"  # every print in a worker routed through Ray Train's logger
PREEMPTION_WATCHER = "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"  # an actor per run that watches for spot preemption
# The niceness each Ray worker process gives itself as it starts (Ray's config ``worker_niceness``,
# 15 by default; Ray Jobs set 0 for their drivers the same way, ``job_manager.py``).
WORKER_NICENESS = "RAY_worker_niceness"
# Ray sets CUDA_VISIBLE_DEVICES for a process that holds GPUs; since Ray 2.4x it leaves the
# variable alone for one that asked for none unless this is 1 (``ray/_private/utils.py``,
# ``set_visible_accelerator_ids``): a CPU trial's worker or evaluator on a GPU node would see
# every GPU of the node, those Ray gave other trials included.
HIDE_GPUS_ON_ZERO = "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO"


def train_environment(local: bool) -> dict[str, str]:
    """The values detsweep gives Ray Train's settings and its workers' priority (environment
    variables every Ray worker gets), each the user's own where it is set."""
    ours = {
        # A trial stopped by a scheduler frees its workers' CPUs a little after it ends; the next
        # trial's workers wait for them instead of failing after Ray Train's default 60 s.
        START_TIMEOUT: "1800",
        # pycocotools' progress lines would fill the console at every evaluation: they go past
        # redirect_stdout only if print is not Ray Train's.
        PRINT_PATCH: "0",
        # The controller takes each worker's milestone report (an evaluation, a checkpoint) when
        # it polls, and a worker whose last one still waits blocks at its next: a fast GPU that
        # evaluates often would wait for Ray's 2 s, and a trial's end is seen a poll later. A poll
        # costs the controller one small call per worker.
        POLL_INTERVAL: "0.5",
        # A trial is the machine's main work. At Ray's nice 15 it yields to any other process (a
        # `detsweep train` beside two busy processes had not finished its first loop after 8
        # minutes); at 0 it shares the cores as any program does, as Ray's own daemons do.
        WORKER_NICENESS: "0",
        # A process that asked for no GPU sees none (CUDA_VISIBLE_DEVICES empty): only Ray's.
        HIDE_GPUS_ON_ZERO: "1",
    }
    if local:  # nothing to preempt on one machine: one process less per trial start
        ours[PREEMPTION_WATCHER] = "0"
    return {name: os.environ.get(name, value) for name, value in ours.items()}


def result_files() -> list:
    """Tune's ``result.json`` and ``progress.csv`` loggers, in place of its own (Tune adds its
    own only when these are missing), kept whole when a trial starts again in the same sweep:
    after a pause (HyperBand), an exploit (PBT) or a retried failure.

    Tune writes them in the driver's staging folder and copies that to the sweep's storage every
    few seconds. When a trial with a checkpoint starts again, its loggers first copy the stored
    file back over the staged one (``_restore_from_remote``), and a trial that ran since the last
    copy loses the rows it reported in between (a paused trial resumed 3 s later lost its first
    result here). Within a driver the staged file is the newer one; only a new driver (``detsweep
    resume``) starts without it, and then Tune's own copy is right."""
    json_results, csv_progress = _result_loggers()
    return [json_results(), csv_progress()]


@functools.cache
def _result_loggers() -> tuple[type, type]:
    from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback

    class KeepsTheStagedFile:
        def _restore_from_remote(self, file_name: str, trial) -> None:
            if not Path(trial.local_path, file_name).exists():
                super()._restore_from_remote(file_name, trial)

    class JsonResults(KeepsTheStagedFile, JsonLoggerCallback):
        """``result.json``, as Tune writes it, without losing rows to a restart."""

    class CsvProgress(KeepsTheStagedFile, CSVLoggerCallback):
        """``progress.csv``, as Tune writes it, without losing rows to a restart."""

    return JsonResults, CsvProgress


def creation_order(trial) -> int:
    """The how-many-th trial Tune created ``trial`` as: its experiment tag starts with that count
    (``3_lr=0.01``, for its random and grid generator and for every searcher alike); 0 for a
    trial whose tag does not (one made by hand)."""
    first = str(getattr(trial, "experiment_tag", "")).split("_", 1)[0]
    return int(first) if first.isdigit() else 0


def bohb_budget(result: dict, budget: int | None) -> None:
    """Mark a result for TuneBOHB, in place: it learns only from results whose ``hyperband_info``
    holds the budget (the rung) they were ranked at, and warns at any result without the key."""
    result["hyperband_info"] = {} if budget is None else {"budget": budget}


def save_stopped_trial(tune_controller, trial) -> None:
    """Have Tune write ``trial`` (being stopped while paused) to the experiment's saved state.
    Tune (2.60) marks a trial for the next save only on its actor's events, and a paused trial
    has none: the state would keep it PAUSED, an unfinished trial in a finished sweep, which a
    resume would train again. The controller a scheduler is handed wraps the real one."""
    controller = getattr(tune_controller, "_tune_controller", tune_controller)
    controller._mark_trial_to_checkpoint(trial)
