"""The Tune function trainable: one trial = one Ray Train run of the trial's config.

Every loop's report reaches the trial's own process in step order (:mod:`.channel`); this
function passes those that carry the sweep's metric (the evaluations, with their
checkpoints) on to Tune. So Tune's schedulers decide on ``eval/…`` at training-step
granularity, and Tune keeps the checkpoints (for PBT and ``num_to_keep``).

Who writes the trial's MLflow run: this process, everything the trial reports (params,
every step's metrics, pictures, checkpoints, replayed steps, worker failures); each node's
first worker, that node's system metrics (``worker.NodeMonitor``); and the sweep's driver at
its end, the run's final status and cost, and Tune's checkpoint of a trial stopped before its
own upload was done (``tracking.sweep_run.close_sweep_run``).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from typing import Any

import ray.tune

from detsweep.checkpoints import checkpoint_uri, read_step
from detsweep.cluster import remove_run_folders
from detsweep.config import TrialConfig, validate
from detsweep.config.loader import get_path, plain, set_path
from detsweep.errors import DetsweepError
from detsweep.evaluation.pictures import without_pictures
from detsweep.startup import StartupClock
from detsweep.tracking.trial_run import RunLink, TrialIdentity, TrialRun

from .channel import RunChannel
from .request import TrainingRequest
from .trainer import ProgressLines, stream_training


def trial_tree(tune_config: dict[str, Any]) -> dict[str, Any]:
    """The trial's config tree: the sampled tree, plus the grid point's dotted overrides, in
    Python's own types (BOHB draws NumPy scalars: ``np.str_('sgd')``, ``np.int64(30)``)."""
    tree = copy.deepcopy(tune_config.get("trial", {}))
    for dotted, value in tune_config.get("point", {}).items():
        set_path(tree, dotted, value)
    return plain(tree)


def trial_config(tune_config: dict[str, Any]) -> TrialConfig:
    """Validated as a config file is: a combination the searcher drew that cannot train is
    the trial's one-line failure (``path: found X, expected Y``)."""
    return validate(TrialConfig, trial_tree(tune_config), "the trial's sampled config")


def swept_values(tune_config: dict[str, Any], paths: list[str]) -> dict[str, Any]:
    """The values a trial's Tune config gives to the swept ``paths`` (grid points included)."""
    tree = trial_tree(tune_config)
    return {dotted: get_path(tree, dotted) for dotted in paths}


def run_trial(tune_config: dict[str, Any]) -> None:
    startup = StartupClock()
    try:
        config = trial_config(tune_config)
    except DetsweepError as error:
        raise TrialFailed(str(error)) from None
    context = ray.tune.get_context()
    restore = ray.tune.get_checkpoint()  # PBT's exploit, or a resumed sweep
    run = open_trial_run(tune_config, config, restore)  # on its writer's thread, while Ray Train starts
    # A new Ray Train run at every start: one with the same name would resume from its own
    # latest checkpoint, not from the one Tune hands over (PBT's exploit must win).
    started = time.strftime("%Y%m%d-%H%M%S")
    runs = f"{context.get_experiment_name()}-train-{context.get_trial_id()}-"
    name = f"{runs}{started}"
    metric = tune_config["search"]["metric"]

    def to_tune(metrics: dict, checkpoint) -> None:
        if metric in metrics:  # the evaluations: what schedulers and searchers decide on
            # Tune's own class, on the same filesystem: a checkpoint in a bucket stays there.
            reported = ray.tune.Checkpoint(checkpoint.path, checkpoint.filesystem) if checkpoint else None
            ray.tune.report(metrics, checkpoint=reported)

    request = TrainingRequest(config, name, tune_config.get("storage"), checkpoint_uri(restore) if restore else None,
                              pictures=True, system_metrics=True, startup=startup)
    try:
        reason = train_and_log(request, run, to_tune)
    except BaseException:  # stopped by the scheduler or the sweep's end: the driver ends the run
        run.close()
        raise
    finally:
        # Tune copied every checkpoint it was handed into the trial's folder, and a trial that
        # starts again (PBT, a resumed sweep) starts a new Ray Train run from one of those: the
        # trial's runs would only pile up in the storage, one a start. A trial stopped by its
        # process's end gets here only on its next start, or at the sweep's end (``finish``).
        remove_run_folders(tune_config.get("storage"), runs)
    run.finish(error=reason)
    if reason:
        raise TrialFailed(reason)


def train_and_log(request: TrainingRequest, run: TrialRun, on_report: Callable[[dict, Any], None],
                  progress: bool = False) -> str | None:
    """Train as ``request`` asks through Ray Train; every report goes to ``run`` (MLflow), to
    this process's console when ``progress``, then, without its pictures, to ``on_report``; a
    step trained again after a restart, and failed workers, are noted on ``run``. The workers
    start while ``run`` opens, and (``request.system_metrics``) log their nodes' system metrics
    to it once it is open. Returns why training failed, or None."""
    channel = RunChannel()
    run.when_open(lambda target: channel.publish("system_metrics", target))
    lines = ProgressLines(request.config.train.num_steps) if progress else None

    def log(metrics: dict, checkpoint) -> None:
        run.log_report(metrics, checkpoint)
        if lines:
            lines(metrics, checkpoint)
        on_report(without_pictures(metrics), checkpoint)

    return stream_training(request, log, notes=run, channel=channel)


def open_trial_run(tune_config: dict[str, Any], config: TrialConfig, restore) -> TrialRun:
    start_step = 0
    if restore is not None:
        with restore.as_directory() as directory:
            start_step = read_step(directory)
    context = ray.tune.get_context()
    search = tune_config["search"]
    trial = TrialIdentity(context.get_trial_id(), context.get_trial_name(), swept_values(tune_config, search["swept"]),
                          search["metric"], search["mode"])
    return TrialRun(RunLink(**tune_config["tracking"]), trial, config, start_step)


class TrialFailed(RuntimeError):
    """The trial's training failed; the message is its reason in one line."""


