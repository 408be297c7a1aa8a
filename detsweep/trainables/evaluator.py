"""Evaluation off the training path (``train.evaluation: async``).

Ray Train runs :func:`evaluate_reported` as a Ray task of its own on each checkpoint a worker
reports with ``validation=True`` (``ValidationConfig``, alpha in Ray 2.60; its controller runs
one such task at a time, in report order, and waits for the last before ``fit()`` returns).
Ray Train keeps a task's metrics only in its checkpoint manager, which no callback sees, so
the task puts them on the run's channel itself, where :func:`.channel.in_step_order`
adds them to the checkpoint's step.
"""

from __future__ import annotations

import functools
import time

import ray.train
from ray.train.v2.api.validation_config import ValidationConfig

from detsweep.checkpoints import read_step
from detsweep.config import ScalingConfig
from detsweep.errors import failure_reason

from .channel import Evaluation, RunChannel

# How long a finished evaluation waits for the run's owner to pass its step on (into MLflow,
# and Tune's copy of the checkpoint) before Ray Train may delete the checkpoint.
SETTLE_TIMEOUT_S = 300


def evaluation_task(scaling: ScalingConfig, channel: RunChannel, pictures: bool) -> ValidationConfig:
    """Ray Train's validation config: one worker's resources for each evaluation, whose metrics
    go on ``channel``; each waits there until the run's owner published it passed its step on."""
    # "DEFAULT": under Tune, the controller runs in the trial's placement group (a little
    # memory, no CPU), which would capture the task; it goes to the cluster like a worker.
    resources = {"num_cpus": scaling.cpus_per_worker, "max_retries": 0, "scheduling_strategy": "DEFAULT"}
    if scaling.use_gpu:
        resources["num_gpus"] = scaling.gpus_per_worker
    evaluate = functools.partial(evaluate_reported, channel=channel, pictures=pictures, scaling=scaling)
    return ValidationConfig(evaluate, ray_remote_kwargs=resources)


def evaluate_reported(checkpoint: ray.train.Checkpoint, *, channel: RunChannel, pictures: bool,
                      scaling: ScalingConfig) -> dict:
    """Score ``checkpoint`` (raw and moving-average weights) as rank 0 would have inline, put the
    metrics (with ``pictures``, and the picture of the detections) on the run's channel, and
    return once the run's owner has passed them on (the owner settles evaluated steps in step
    order: it publishes each as ``settled``)."""
    started = time.time()
    from detsweep.train.evaluate import evaluate_checkpoint  # TensorFlow loads in the task only
    from detsweep.train.strategy import use_worker_devices

    with checkpoint.as_directory() as directory:
        step = read_step(directory)
        try:
            use_worker_devices(scaling)  # before TensorFlow's first op; a GPU it cannot see fails the run
            scores = evaluate_checkpoint(directory, verify=False, picture=pictures)
        except Exception as error:
            channel.put(Evaluation(step, {}, failure=failure_reason(error)))
            raise
    metrics = {key: value for key, value in scores.metrics.items() if key != "step"}
    channel.put(Evaluation(step, metrics, started, time.time(), pictures=scores.pictures))
    channel.read("settled", SETTLE_TIMEOUT_S, at_least=step)
    return metrics
