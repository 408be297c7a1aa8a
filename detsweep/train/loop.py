"""One training run, top to bottom. Every Ray Train worker runs this; so do benchmarks, without Ray."""

from __future__ import annotations

import base64
import enum
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import keras
import tensorflow as tf

from detsweep.config import TrialConfig
from detsweep.data import load_dataset
from detsweep.data.pipeline import InputSpec, training_dataset
from detsweep.evaluation.pictures import SCHEDULE_PICTURE_KEY
from detsweep.optim import build_schedule
from detsweep.optim.report import schedule_png
from detsweep.startup import StartupClock

from .checkpoint import build_training_state
from .evaluate import Evaluator, is_due
from .step import make_train_loop
from .strategy import make_strategy, use_worker_cpus
from .warm_start import restore_what_fits


class Milestone(enum.Enum):
    """What a loop ended in. The same on every worker, so workers can meet there (Ray Train's report)."""

    NONE = "none"  # an ordinary loop
    REPORT = "report"  # an inline evaluation, a checkpoint, or both
    EVALUATE = "evaluate"  # a checkpoint whose evaluation is the reporter's to start (train.evaluation: async)


# report(metrics, checkpoint_dir, milestone), after every loop. The directory exists only
# during the call: copy what you keep.
Reporter = Callable[[dict[str, float], "Path | None", Milestone], None]


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite: the trial cannot go on."""


@dataclass(frozen=True)
class WorkerContext:
    rank: int = 0
    restore_from: Path | None = None  # a checkpoint directory to resume from
    pictures: bool = False  # for MLflow: the schedule once, the detections at every evaluation
    startup: StartupClock | None = None  # marked here up to the first step, then reported once
    fine_tune_from: Path | None = None  # a local copy of train.fine_tune.checkpoint (default: that folder)


def run_training(config: TrialConfig, report: Reporter, context: WorkerContext = WorkerContext()) -> dict[str, float]:
    """Train ``config`` to ``train.num_steps``, reporting every loop; returns the last metrics."""
    startup: StartupClock | None = context.startup or StartupClock()
    use_worker_cpus(config.scaling.cpus_per_worker)  # first: both need TensorFlow's runtime unstarted
    strategy = make_strategy(config.scaling)  # several workers: waits for all of them
    startup.mark("strategy")
    keras.mixed_precision.set_global_policy(config.train.mixed_precision)
    keras.utils.set_random_seed(config.train.seed)
    train_set = load_dataset(config.data.train, verify=False)  # the driver verified the files
    val_set = load_dataset(config.data.val, verify=False) if config.data.val else None
    spec = InputSpec(config.model.image_size)
    train = config.train
    startup.mark("data")

    with strategy.scope():
        state, losses = build_training_state(config, config.model.num_classes or len(train_set.categories))
    model, optimizer, moving_average = state.model, state.optimizer, state.moving_average
    if context.restore_from:  # the same training, resumed
        state.restore(context.restore_from)
    elif train.fine_tune:  # another training's weights, as far as they fit
        restore_what_fits(state, config, context.fine_tune_from)
    step = int(state.step.numpy())
    startup.mark("model")

    def input_fn(input_context: tf.distribute.InputContext) -> tf.data.Dataset:
        return training_dataset(
            train_set, spec, config.data.augmentation,
            batch_size=input_context.get_per_replica_batch_size(train.batch_size),
            seed=train.seed + 1000 * input_context.input_pipeline_id + step,
            shard=(input_context.num_input_pipelines, input_context.input_pipeline_id),
        )

    batches = iter(strategy.distribute_datasets_from_function(input_fn))
    train_loop = make_train_loop(strategy, model, losses, optimizer, moving_average, state.step)
    # Inline, only rank 0 evaluates; the others wait for it at their next collective (a step, or
    # the report). Async, each evaluation is of a checkpoint, elsewhere, and nobody waits.
    inline = train.evaluation == "inline"
    evaluator = Evaluator(model, val_set, spec, batch_size=8) if val_set and inline and context.rank == 0 else None
    schedule = build_schedule(config.optimizer.learning_rate)
    metrics: dict[str, float] = {}

    while step < train.num_steps:
        started = time.perf_counter()
        result = train_loop(batches, tf.constant(min(train.steps_per_loop, train.num_steps - step)))
        steps_run = int(result["steps_run"])
        if startup:  # the first loop: tracing, and the input pipeline's first batches
            startup.mark("first_loop")
        if not bool(result["finite"]):
            raise TrainingDiverged(f"loss is NaN/Inf at step {step + steps_run}")
        seconds = time.perf_counter() - started
        step = int(state.step.numpy())
        metrics = {
            "step": step,
            "train/loss": float(result["loss"]),
            "train/box_loss": float(result["box_loss"]),
            "train/classification_loss": float(result["classification_loss"]),
            "train/lr": float(schedule(step - 1)),
            "train/images_per_sec": train.batch_size * steps_run / seconds,
        }
        if startup:
            metrics.update(startup.metrics())
            if context.pictures and context.rank == 0:
                metrics[SCHEDULE_PICTURE_KEY] = base64.b64encode(schedule_png(config)).decode("ascii")
            startup = None
        evaluation_due = val_set is not None and is_due(step, train.eval_every, train.num_steps)
        if evaluator and evaluation_due:
            metrics.update(evaluator.evaluate_with_average(moving_average, picture=context.pictures))
        checkpoint_due = is_due(step, train.checkpoint_every, train.num_steps)
        if evaluation_due and not inline:  # evaluated elsewhere, from a checkpoint of this step
            milestone, checkpoint_due = Milestone.EVALUATE, True
        else:
            milestone = Milestone.REPORT if evaluation_due or checkpoint_due else Milestone.NONE
        if checkpoint_due:
            with tempfile.TemporaryDirectory(prefix="detsweep-ckpt-") as scratch:
                report(metrics, state.save(Path(scratch), config, train_set.categories), milestone)
        else:
            report(metrics, None, milestone)
    return metrics
