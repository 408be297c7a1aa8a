"""The Tune function trainable: one trial = one Ray Train run of the trial's config.

Ray Train's controller hands every report to :class:`ForwardReports`, which queues it;
this function, in the trial's own process, passes the evaluations (with their
checkpoints) on to Tune. So Tune's schedulers decide on ``eval/…`` at training-step
granularity, Tune keeps the checkpoints (for PBT and ``num_to_keep``), and everything a
trial reports passes through one place.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import ray.train
import ray.tune
from ray.util.queue import Queue

from detsweep.config import TrialConfig
from detsweep.config.loader import set_path

from .trainer import failure_reason, make_trainer

_DONE = "__done__"


class ForwardReports(ray.train.UserCallback):
    def __init__(self, queue: Queue):
        self.queue = queue

    def after_report(self, run_context, metrics, checkpoint) -> None:
        self.queue.put((metrics[0], checkpoint.path if checkpoint else None))


def trial_config(tune_config: dict[str, Any]) -> TrialConfig:
    """The trial's config: the sampled tree, plus the grid point's dotted overrides."""
    tree = tune_config["trial"]
    for dotted, value in tune_config.get("point", {}).items():
        set_path(tree, dotted, value)
    return TrialConfig.model_validate(tree)


def run_trial(tune_config: dict[str, Any]) -> None:
    config = trial_config(tune_config)
    context = ray.tune.get_context()
    restore = ray.tune.get_checkpoint()  # PBT's exploit, or a resumed sweep
    queue: Queue = Queue(actor_options={"num_cpus": 0})
    # A new Ray Train run at every start: one with the same name would resume from its own
    # latest checkpoint, not from the one Tune hands over (PBT's exploit must win).
    started = time.strftime("%Y%m%d-%H%M%S")
    trainer = make_trainer(
        config, name=f"{context.get_experiment_name()}-train-{context.get_trial_id()}-{started}",
        storage_path=tune_config.get("storage"), callbacks=[ForwardReports(queue)],
        restore_from=restore.path if restore else None,
    )
    failure: list[BaseException] = []

    def fit() -> None:
        try:
            trainer.fit()
        except BaseException as error:  # re-raised below, in the trial's thread
            failure.append(error)
        finally:
            queue.put(_DONE)

    threading.Thread(target=fit, daemon=True).start()
    metric = tune_config["metric"]
    while (item := queue.get()) != _DONE:
        metrics, checkpoint_path = item
        if metric in metrics:
            checkpoint = ray.tune.Checkpoint.from_directory(checkpoint_path) if checkpoint_path else None
            ray.tune.report(metrics, checkpoint=checkpoint)
    if failure:
        raise TrialFailed(failure_reason(failure[0]))


class TrialFailed(RuntimeError):
    """The trial's training failed; the message is its reason in one line."""


