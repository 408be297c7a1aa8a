"""``train_loop_per_worker``: what Ray Train runs in each worker process of a trial."""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

import ray.train

from detsweep.config import TrialConfig
from detsweep.startup import StartupClock


def quiet_report_logging() -> None:
    """Ray Train logs every report in full at INFO (a picture's base64 included) under a
    logger named by its file's path; our progress lines already say what matters."""
    from ray.train.v2._internal.execution import context

    logging.getLogger(context.__file__).setLevel(logging.WARNING)


def train_loop_per_worker(loop_config: dict) -> None:
    """Resume from Ray's latest checkpoint when there is one (a restarted worker group),
    else from ``restore_from`` (a Tune checkpoint: PBT, a resumed sweep); train; and report
    every loop to Ray: metrics from every worker (Ray keeps rank 0's), checkpoints from rank 0."""
    latest = ray.train.get_checkpoint()
    # A worker group Ray Train restarted times its own start: the trial's began long before.
    startup = StartupClock.from_dict(loop_config["startup"]) if loop_config.get("startup") and not latest else StartupClock()
    startup.mark("workers")
    from detsweep.train import WorkerContext, run_training  # TensorFlow loads in the worker only

    startup.mark("imports")
    quiet_report_logging()
    config = TrialConfig.model_validate(loop_config["trial"])
    rank = ray.train.get_context().get_world_rank()

    def report(metrics: dict, checkpoint_dir: Path | None) -> None:
        checkpoint = ray.train.Checkpoint.from_directory(str(checkpoint_dir)) if checkpoint_dir and rank == 0 else None
        ray.train.report(metrics, checkpoint=checkpoint)

    if latest is None and loop_config.get("restore_from"):
        latest = ray.train.Checkpoint(loop_config["restore_from"])
    with latest.as_directory() if latest else contextlib.nullcontext() as restore_from:
        context = WorkerContext(rank=rank, restore_from=Path(restore_from) if restore_from else None,
                                pictures=loop_config.get("pictures", False), startup=startup)
        run_training(config, report, context)
