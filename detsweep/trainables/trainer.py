"""A trial's Ray Train trainer (``TensorflowTrainer``'s equivalent): resources, fault
tolerance, checkpoints; and one training streamed to the process that asked for it."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import ray.train
from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

from detsweep import console
from detsweep.checkpoints import checkpoint_uri
from detsweep.cluster import connect, run_folder
from detsweep.config import ScalingConfig, TrialConfig
from detsweep.errors import DetsweepError, failure_reason, stderr_held_back
from detsweep.startup import StartupClock

from .channel import NO_NOTES, ForwardReports, RunChannel, RunEnded, RunError, RunNotes, in_step_order
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

    def __call__(self, metrics: dict, checkpoint) -> None:
        if "startup/total_s" in metrics:
            console.say(startup_line(metrics))
        console.say(progress_line(metrics, self.num_steps, saved=checkpoint is not None))


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


def check_data(config: TrialConfig) -> list[str]:
    """Read and verify the datasets once, on the driver, so that workers can trust them;
    returns one summary line per dataset (what was clipped, dropped, converted)."""
    from detsweep.data import load_dataset

    datasets = {"data.train": config.data.train, "data.val": config.data.val}
    summaries = []
    for name, dataset in datasets.items():
        if dataset is not None:
            with console.working(f"reading and checking {name} ({dataset.format})"):
                summaries.append(load_dataset(dataset, verify=True).summary_line())
    return summaries


def check_inputs(config: TrialConfig, where: str, prefix: str = "") -> tuple[list[str], Any]:
    """What the driver checks before Ray starts: the preset ``model.weights`` names (``prefix``:
    where the config sits in its file, e.g. a sweep's ``base.``), the datasets (their summary
    lines, for the caller to print once every check passed, so that a refusal is its one line)
    and, for a fine-tune, that the checkpoint fits (its warm-start plan; else None)."""
    check_weights(config, f"{where}: {prefix}model.weights")
    summaries = check_data(config)
    return summaries, check_fit(config, where) if config.train.fine_tune else None


def check_weights(config: TrialConfig, field: str) -> None:
    """The preset ``model.weights`` names can be the image encoder (:mod:`detsweep.models.presets`)."""
    if config.model.weights == "none":  # keras-hub, and TensorFlow with it, load only for a preset
        return
    from detsweep.models.presets import architecture_note, check_weights_preset

    with console.working(f"checking the preset {config.model.weights}"):
        check_weights_preset(config.model.weights, field)
        note = architecture_note(config, field)
    if note:
        console.say(note)


def check_fit(config: TrialConfig, where: str):
    """Build the model and restore the checkpoint into it here, once, as the workers will
    (the datasets were verified already: see ``check_data``)."""
    from detsweep.data import load_dataset
    from detsweep.train.warm_start import plan_warm_start

    from .worker import fine_tune_source

    categories = load_dataset(config.data.train, verify=False).categories
    # a checkpoint that does not fit: one line, not TensorFlow's start-up
    with console.working("building the model and restoring the fine-tune's checkpoint into it"), \
            stderr_held_back(), fine_tune_source(config) as directory:
        plan = plan_warm_start(config, config.model.num_classes or len(categories), directory)
    if config.train.fine_tune.keep_optimizer_state and plan.step >= config.train.num_steps:
        raise DetsweepError(f"{where}: train.num_steps: found {config.train.num_steps}, expected more than the "
                            f"checkpoint's step {plan.step} (keep_optimizer_state goes on from there)")
    print(f"fine-tune: {len(plan.restored)} weights restored, {len(plan.fresh)} fresh"
          + (f" ({', '.join(plan.fresh)})" if plan.fresh else "") + f"; training starts at step {plan.step}",
          file=console.err(), flush=True)
    return plan


Handler = Callable[[dict, "ray.train.Checkpoint | None"], None]


def stream_training(request: TrainingRequest, on_report: Handler, notes: RunNotes = NO_NOTES,
                    channel: RunChannel | None = None) -> str | None:
    """Train as ``request`` asks through Ray Train, handing ``on_report`` every loop's metrics
    in step order, in this thread, with the checkpoint where a loop saved one; ``notes`` hears
    of failed workers and of steps trained again after a restart; ``channel``: the run's (a new
    one by default), on which, for ``request.system_metrics``, this process publishes the MLflow
    run the workers' nodes log their system metrics to. Returns why training failed, or None.
    The workers never wait for this process (:mod:`.channel`)."""
    channel = channel or RunChannel()
    trainer = make_trainer(request, channel)
    failure: list[BaseException] = []

    def fit() -> None:
        try:
            trainer.fit()
        except BaseException as error:  # reported below, in the caller's thread
            failure.append(error)
        finally:
            channel.put(RunEnded())

    threading.Thread(target=fit, name="detsweep-fit", daemon=True).start()
    try:
        for metrics, checkpoint in in_step_order(channel, lambda step: channel.publish("settled", step), notes):
            on_report(metrics, checkpoint)
    except RunError as error:  # it diverged, or has no score at a step: it cannot go on
        return str(error)
    return failure_reason(failure[0]) if failure else None


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
    lines = ProgressLines(config.train.num_steps)
    last: dict = {"metrics": {}, "checkpoint": None}

    def keep_last(metrics: dict, checkpoint) -> None:
        lines(metrics, checkpoint)
        last["metrics"] = metrics
        last["checkpoint"] = checkpoint_uri(checkpoint) if checkpoint else last["checkpoint"]

    error = stream_training(TrainingRequest(config, name, storage_path, startup=startup), keep_last, ConsoleNotes())
    if error:
        return TrainOutcome(steps=0, metrics={}, checkpoint=None, error=error)
    metrics = last["metrics"]
    return TrainOutcome(steps=int(metrics.get("step", 0)), metrics=metrics, checkpoint=last["checkpoint"])
