"""A trial's Ray Train trainer (``TensorflowTrainer``'s equivalent): resources, fault
tolerance, checkpoints; and one training streamed to the process that asked for it."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import ray.train
from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

from detsweep import console
from detsweep.checkpoints import checkpoint_uri
from detsweep.cluster import connect, run_folder
from detsweep.config import ScalingConfig, TrialConfig
from detsweep.errors import failure_reason
from detsweep.startup import StartupClock

from .channel import NO_NOTES, ForwardReports, Report, RunChannel, RunEnded, RunError, RunNotes, in_step_order
from .evaluator import evaluation_task
from .request import TrainingRequest
from .tf_config import TensorflowWorkers
from .worker import train_loop_per_worker


def ray_scaling(scaling: ScalingConfig) -> ray.train.ScalingConfig:
    resources = {"CPU": scaling.cpus_per_worker}
    if scaling.use_gpu:
        resources["GPU"] = scaling.gpus_per_worker
    return ray.train.ScalingConfig(
        num_workers=scaling.num_workers,
        use_gpu=scaling.use_gpu,
        resources_per_worker=resources,
        use_tpu=scaling.use_tpu,
        topology=scaling.topology,
        accelerator_type=scaling.accelerator_type,
    )


class ProgressLines:
    """One line per report on this process's console, the first with where start-up time went."""

    def __init__(self, num_steps: int):
        self.num_steps = num_steps

    def __call__(self, report: Report) -> None:
        if "startup/total_s" in report.metrics:
            console.say(startup_line(report.metrics))
        console.say(progress_line(report.metrics, self.num_steps, saved=report.checkpoint is not None))


def startup_line(metrics: dict) -> str:
    """``first loop after 31.2 s: ray 2.1, trainer 8.0, workers 4.4, …``"""
    phases = [(key.removeprefix("startup/").removesuffix("_s"), value) for key, value in metrics.items()
              if key.startswith("startup/") and key != "startup/total_s"]
    return f"first loop after {metrics['startup/total_s']:.1f} s: " + ", ".join(f"{name} {seconds:.1f}" for name, seconds in phases)


def progress_line(metrics: dict, num_steps: int, saved: bool = False) -> str:
    parts = [f"step {metrics.get('step', 0)}/{num_steps}"]
    parts += [f"loss {metrics['train/loss']:.4f}", f"lr {metrics['train/lr']:.3g}",
              f"{metrics['train/images_per_sec']:.1f} img/s"] if "train/loss" in metrics else []
    parts += [f"{key} {metrics[key]:.3f}" for key in ("eval/AP50", "eval_ema/AP50", "eval/AP_best") if key in metrics]
    return "  ".join(parts) + ("  [checkpoint]" if saved else "")


def make_trainer(request: TrainingRequest, channel: RunChannel, callbacks: Sequence = ()) -> DataParallelTrainer:
    """Ray Train's trainer for ``request``; ``channel``: where the run's reports travel to this
    process (:mod:`.channel`); ``callbacks``: more of Ray Train's, in its controller.

    Ray Train's ``TensorflowTrainer`` is this ``DataParallelTrainer`` with Ray's TF_CONFIG
    backend; :class:`TensorflowWorkers` does the same without importing TensorFlow here."""
    config = request.config
    request.startup.mark("trainer")
    return DataParallelTrainer(
        train_loop_per_worker,
        train_loop_config={"request": request, "channel": channel},
        backend_config=TensorflowWorkers(),
        scaling_config=ray_scaling(config.scaling),
        validation_config=(evaluation_task(config.scaling, channel, request.pictures)
                           if config.train.evaluation == "async" else None),
        run_config=ray.train.RunConfig(
            name=request.name,
            storage_path=request.storage,
            failure_config=ray.train.FailureConfig(max_failures=config.scaling.max_failures),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=2),
            callbacks=[ForwardReports(channel), *callbacks],
        ),
    )


@dataclass
class TrainOutcome:
    steps: int
    metrics: dict
    checkpoint: str | None
    error: str | None = None


def stream_training(request: TrainingRequest, on_report: Callable[[Report], None], notes: RunNotes = NO_NOTES,
                    channel: RunChannel | None = None) -> str | None:
    """Train as ``request`` asks through Ray Train, handing ``on_report`` every loop's
    :class:`Report` in step order, in this thread (its metrics, the checkpoint where a loop
    saved one, the pictures where one drew some); ``notes`` hears
    of failed workers and of steps trained again after a restart; ``channel``: the run's (a new
    one by default), on which, for ``request.system_metrics``, this process publishes the MLflow
    run the workers' nodes log their system metrics to. Returns why training failed, or None.
    The workers never wait for this process (:mod:`.channel`)."""
    channel = channel or RunChannel()
    trainer = make_trainer(request, channel)

    def fit() -> None:
        try:
            trainer.fit()
        except BaseException as error:  # the merge raises it, in the caller's thread, after every step
            channel.put(RunEnded(failure_reason(error)))
        else:
            channel.put(RunEnded())

    threading.Thread(target=fit, name="detsweep-fit", daemon=True).start()
    try:
        for report in in_step_order(channel, lambda step: channel.publish("settled", step), notes):
            on_report(report)
    except RunError as error:  # it diverged, has no score at a step, or Ray Train gave up
        return str(error)
    return None


class LastReport:
    """Keeps a training's last metrics and the URI of its last checkpoint, report by report."""

    def __init__(self):
        self.metrics: dict = {}
        self.checkpoint: str | None = None

    def __call__(self, report: Report) -> None:
        self.metrics = report.metrics
        self.checkpoint = checkpoint_uri(report.checkpoint) if report.checkpoint else self.checkpoint


class ConsoleNotes:
    """What ``detsweep train`` says beside its progress lines: that Ray Train found failed workers."""

    def note_replayed(self, step: int) -> None:
        pass  # the progress lines show each step once; the replay is not news to a person watching

    def note_worker_failure(self, reason: str) -> None:
        console.say(f"workers failed: {reason} (Ray Train restarts them from the last checkpoint "
                    "while scaling.max_failures allows)")


def run_train(config: TrialConfig, name: str, address: str | None = None,
              storage_path: str | None = None, check_cluster: Callable[[], None] = lambda: None) -> TrainOutcome:
    """One training through Ray Train, as ``detsweep train`` runs it; ``check_cluster`` raises
    once Ray is connected if the cluster cannot hold its workers (a wait that would never end)."""
    console.keep_log_in(run_folder(storage_path, name), "train.log")
    startup = StartupClock()
    connect(address)
    check_cluster()
    startup.mark("ray")
    lines, last = ProgressLines(config.train.num_steps), LastReport()

    def show_and_keep(report: Report) -> None:
        lines(report)
        last(report)

    error = stream_training(TrainingRequest(config, name, storage_path, startup=startup), show_and_keep, ConsoleNotes())
    if error:
        return TrainOutcome(steps=0, metrics={}, checkpoint=None, error=error)
    return TrainOutcome(steps=int(last.metrics.get("step", 0)), metrics=last.metrics, checkpoint=last.checkpoint)
