"""The Tune function trainable: one trial = one Ray Train run of the trial's config.

Ray Train's controller hands every report to :class:`ForwardReports`, which queues it;
this function, in the trial's own process, passes the evaluations (with their
checkpoints) on to Tune. So Tune's schedulers decide on ``eval/…`` at training-step
granularity, Tune keeps the checkpoints (for PBT and ``num_to_keep``), and everything a
trial reports passes through one place: that is also where its MLflow run is written.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import ray.train
import ray.tune
from ray.util.queue import Queue

from detsweep.config import TrialConfig
from detsweep.config.loader import set_path
from detsweep.evaluation.pictures import without_pictures
from detsweep.startup import StartupClock
from detsweep.tracking.trial_run import RunLink, TrialRun

from .trainer import failure_reason, make_trainer

_DONE = "__done__"


class ForwardReports(ray.train.UserCallback):
    def __init__(self, queue: Queue):
        self.queue = queue

    def after_report(self, run_context, metrics, checkpoint) -> None:
        self.queue.put((metrics[0], checkpoint))


def trial_config(tune_config: dict[str, Any]) -> TrialConfig:
    """The trial's config: the sampled tree, plus the grid point's dotted overrides."""
    tree = tune_config["trial"]
    for dotted, value in tune_config.get("point", {}).items():
        set_path(tree, dotted, value)
    return TrialConfig.model_validate(tree)


def run_trial(tune_config: dict[str, Any]) -> None:
    startup = StartupClock()
    config = trial_config(tune_config)
    context = ray.tune.get_context()
    restore = ray.tune.get_checkpoint()  # PBT's exploit, or a resumed sweep
    run = open_trial_run(tune_config, config, restore)
    startup.mark("mlflow")
    # A new Ray Train run at every start: one with the same name would resume from its own
    # latest checkpoint, not from the one Tune hands over (PBT's exploit must win).
    started = time.strftime("%Y%m%d-%H%M%S")
    name = f"{context.get_experiment_name()}-train-{context.get_trial_id()}-{started}"
    metric = tune_config["search"]["metric"]

    def to_tune(metrics: dict, checkpoint) -> None:
        if metric in metrics:  # the evaluations: what schedulers and searchers decide on
            reported = ray.tune.Checkpoint.from_directory(checkpoint.path) if checkpoint else None
            ray.tune.report(metrics, checkpoint=reported)

    try:
        reason = train_and_log(config, name, tune_config.get("storage"), run, to_tune,
                               restore_from=restore.path if restore else None, startup=startup)
    except BaseException:  # stopped by the scheduler or the sweep's end: the driver ends the run
        run.close()
        raise
    run.finish(error=reason)
    if reason:
        raise TrialFailed(reason)


def train_and_log(config: TrialConfig, name: str, storage_path: str | None, run: TrialRun,
                  on_report: Callable[[dict, Any], None], restore_from: str | None = None,
                  callbacks: Sequence = (), startup: StartupClock | None = None) -> str | None:
    """Train ``config`` through Ray Train; every report goes to ``run`` (MLflow), then, without
    its pictures, to ``on_report``. Returns why training failed, or None."""
    queue: Queue = Queue(actor_options={"num_cpus": 0})
    trainer = make_trainer(config, name=name, storage_path=storage_path, callbacks=[ForwardReports(queue), *callbacks],
                           restore_from=restore_from, pictures=True, startup=startup)
    failure: list[BaseException] = []

    def fit() -> None:
        try:
            trainer.fit()
        except BaseException as error:  # reported below, in the caller's thread
            failure.append(error)
        finally:
            queue.put(_DONE)

    threading.Thread(target=fit, daemon=True).start()
    while (item := queue.get()) != _DONE:
        metrics, checkpoint = item
        run.log_report(metrics, checkpoint)
        on_report(without_pictures(metrics), checkpoint)
    return failure_reason(failure[0]) if failure else None


def open_trial_run(tune_config: dict[str, Any], config: TrialConfig, restore) -> TrialRun:
    from detsweep.sweeps.progress import swept_values

    start_step = 0
    if restore is not None:
        with restore.as_directory() as directory:
            start_step = json.loads((Path(directory) / "meta.json").read_text())["step"]
    context = ray.tune.get_context()
    search = tune_config["search"]
    return TrialRun(RunLink(**tune_config["tracking"]), context.get_trial_id(), context.get_trial_name(), config,
                    swept_values(tune_config, search["swept"]), search["metric"], search["mode"], start_step)


class TrialFailed(RuntimeError):
    """The trial's training failed; the message is its reason in one line."""


