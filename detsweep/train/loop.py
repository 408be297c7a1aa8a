"""One training run, top to bottom. Every Ray Train worker runs this; so do benchmarks, without Ray."""

from __future__ import annotations

import enum
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import keras
import tensorflow as tf

from detsweep.config import TrialConfig
from detsweep.config.schema import TrainConfig
from detsweep.data import load_dataset, training_source
from detsweep.data.augment import Augmentations, build_augmentations
from detsweep.data.pipeline import TrainingSource, training_dataset
from detsweep.data.processing import InputSpec
from detsweep.models.detector_presets import preset_trial_config
from detsweep.startup import StartupClock

from .checkpoint import TrainingState, build_training_state, weights_fingerprint
from .evaluate import Evaluator, is_due
from .step import make_train_loop
from .strategy import make_strategy, use_worker_devices, visible_gpus
from .trained_with import TRAINED_WITH_FILE, check_as_sampled, trained_with, trained_with_json
from .warm_start import restore_what_fits


class Milestone(enum.Enum):
    """What a loop ended in. The same on every worker, so workers can meet there (Ray Train's report)."""

    NONE = "none"  # an ordinary loop
    REPORT = "report"  # an inline evaluation, a checkpoint, or both
    EVALUATE = "evaluate"  # a checkpoint whose evaluation is the reporter's to start (train.evaluation: async)


# report(metrics, checkpoint_dir, milestone, pictures), after every loop; ``pictures``: files
# for the run (artifact path → bytes): an evaluation's drawings (PNG), with WorkerContext.pictures,
# and in the first report ``trained_with.json``. The directory exists only during the call: copy
# what you keep.
Reporter = Callable[[dict[str, float], "Path | None", Milestone, dict[str, bytes]], None]


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite: the trial cannot go on."""


@dataclass(frozen=True)
class WorkerContext:
    rank: int = 0
    restore_from: Path | None = None  # a checkpoint directory to resume from
    pictures: bool = False  # for MLflow: a picture of the detections at every evaluation
    startup: StartupClock = field(default_factory=StartupClock)  # its phases are marked here, up to the first loop
    fine_tune_from: Path | None = None  # a local copy of train.fine_tune.checkpoint (default: that folder)
    sampled: dict[str, Any] = field(default_factory=dict)  # what a sweep sampled (dotted path → value): built or refused


def run_training(config: TrialConfig, report: Reporter, context: WorkerContext = WorkerContext()) -> dict[str, float]:
    """Train ``config`` to ``train.num_steps``, reporting every loop; returns the last metrics.
    The first report carries ``trained_with.json`` (what the optimizer, schedule, moving average
    and augmentations were built with, read back from them), a resumed run's ``restore/*`` too;
    the caller adds what else it wants there (:func:`with_first_report_extras`). Raises
    :class:`NotAsSampled` before the first step when they differ from ``context.sampled``."""
    train, startup = config.train, context.startup
    # --- workers, data, model ---------------------------------------------------------
    use_worker_devices(config.scaling)  # first: TensorFlow's runtime must not have started
    strategy = make_strategy(config.scaling, visible_gpus())  # several workers: waits for all of them
    startup.mark("strategy")
    keras.mixed_precision.set_global_policy(train.mixed_precision)
    keras.utils.set_random_seed(train.seed)
    config = preset_trial_config(config)  # a detector preset's architecture wins
    train_source = training_source(config.data)
    # Inline, every worker detects on its share of the val set and rank 0 scores them all.
    # Async, each evaluation is of a checkpoint, elsewhere, and nobody waits.
    inline = train.evaluation == "inline"
    val_set = load_dataset(config.data.val, verify=False) if config.data.val and inline else None
    spec = InputSpec.of(config.model)
    startup.mark("data")
    state, losses, restored = starting_state(strategy, config, context, len(train_source.categories))
    step = int(state.step.numpy())
    startup.mark("model")
    augmentations = build_augmentations(config.data.augmentation)
    built = trained_with(state.optimizer, state.moving_average, augmentations, strategy.num_replicas_in_sync)
    check_as_sampled(context.sampled, built)  # a trial that would train something else ends before its first step
    batches = distributed_batches(strategy, train_source, spec, config, step, augmentations)
    train_loop = make_train_loop(strategy, state.model, losses, state.optimizer, state.moving_average, state.step,
                                 jit_compile=train.jit_compile)
    evaluator = (Evaluator(state.model, val_set, spec, train.eval_batch_size, losses=losses, strategy=strategy,
                           scores=context.rank == 0) if val_set else None)
    if evaluator:
        print(evaluator.sharing_line, flush=True)
    val_set = None  # the evaluator keeps what this worker needs of it
    metrics: dict[str, float] = {}
    first_files = {TRAINED_WITH_FILE: trained_with_json(built)}

    while step < train.num_steps:
        # --- train one loop -----------------------------------------------------------
        started = time.perf_counter()
        result = train_loop(batches, tf.constant(min(train.steps_per_loop, train.num_steps - step)))
        startup.mark_once("first_loop")  # tracing, and the input pipeline's first batches
        if not bool(result["finite"]):
            raise TrainingDiverged(f"loss is NaN/Inf at step {step + int(result['steps_run'])}")
        step = int(state.step.numpy())
        metrics = loop_metrics(result, step, time.perf_counter() - started, state.schedule, train.batch_size)
        metrics, restored = metrics | restored, {}  # only the first report carries restore/*
        # --- evaluate, checkpoint, report ----------------------------------------------
        evaluation_due = config.data.val is not None and is_due(step, train.eval_every, train.num_steps)
        pictures, first_files = first_files, {}  # only the first report carries trained_with.json
        if evaluator and evaluation_due:
            scores = evaluator.evaluate_with_average(state.moving_average, step, picture=context.pictures)
            metrics, pictures = metrics | scores.metrics, pictures | scores.pictures
        milestone, checkpoint_due = milestone_of(step, train, evaluation_due)
        if checkpoint_due:
            with tempfile.TemporaryDirectory(prefix="detsweep-ckpt-") as scratch:
                report(metrics, state.save(Path(scratch), config, train_source.categories), milestone, pictures)
        else:
            report(metrics, None, milestone, pictures)
    return metrics


def starting_state(strategy: tf.distribute.Strategy, config: TrialConfig, context: WorkerContext,
                   num_categories: int) -> tuple[TrainingState, Callable, dict[str, float]]:
    """The state training starts from: its own checkpoint (resumed), another training's weights
    as far as they fit (a fine-tune), or new; the loss terms' callable; and what a resume
    reports once: ``restore/step`` and ``restore/weights_l1``."""
    with strategy.scope():
        state, losses = build_training_state(config, config.model.num_classes or num_categories)
    if context.restore_from:
        step = state.restore(context.restore_from)
        return state, losses, {"restore/step": step, "restore/weights_l1": weights_fingerprint(state.model)}
    if config.train.fine_tune:
        restore_what_fits(state, config, context.fine_tune_from)
    return state, losses, {}


def with_first_report_extras(report: Reporter, extras: Callable[[], tuple[dict, dict[str, bytes]]]) -> Reporter:
    """``report``, with the metrics and pictures ``extras()`` returns added to its first call:
    what a caller wants reported once, made when the first loop is done (the start-up's phases,
    the schedule's picture)."""
    pending = [extras]

    def reporting(metrics: dict[str, float], checkpoint_dir: Path | None, milestone: Milestone,
                  pictures: dict[str, bytes]) -> None:
        if pending:
            more_metrics, more_pictures = pending.pop()()
            metrics, pictures = metrics | more_metrics, pictures | more_pictures
        report(metrics, checkpoint_dir, milestone, pictures)

    return reporting


def distributed_batches(strategy: tf.distribute.Strategy, source: TrainingSource, spec: InputSpec,
                        config: TrialConfig, step: int, augmentations: Augmentations) -> Iterator:
    """Each worker's share of the training batches from ``step`` on: the batches an unbroken
    run would train on there, so that a run paused and resumed (halving, PBT, a lost worker)
    trains as one that never stopped, with ``augmentations`` (built once, from the config's)."""
    train = config.train

    def input_fn(input_context: tf.distribute.InputContext) -> tf.data.Dataset:
        shards, index = input_context.num_input_pipelines, input_context.input_pipeline_id
        # into the run's log: a worker that reads all the data (a strategy that did not see
        # its peers) shows as "1 of 1" on every worker
        print(source.sharing_line(shards), flush=True)
        print(f"input pipeline {index + 1} of {shards}: {source.share(shards, index, train.seed).size} of "
              f"{len(source.box_counts)} training images", flush=True)
        return training_dataset(
            source, spec, augmentations,
            batch_size=input_context.get_per_replica_batch_size(train.batch_size),
            seed=train.seed,
            shard=(shards, index),
            skip=step * (train.batch_size // shards),  # each pipeline gives its share of a step's batch
            shuffle_buffer_size=config.data.shuffle_buffer_size,
        )

    return iter(strategy.distribute_datasets_from_function(input_fn))


def loop_metrics(result: dict, step: int, seconds: float, schedule: Callable, batch_size: int) -> dict[str, float]:
    """What every loop reports; ``train/lr`` is the rate the loop's last step used."""
    return {
        "step": step,
        "train/loss": float(result["loss"]),
        "train/box_loss": float(result["box_loss"]),
        "train/classification_loss": float(result["classification_loss"]),
        "train/lr": float(schedule(step - 1)),
        "train/images_per_sec": batch_size * int(result["steps_run"]) / seconds,
    }


def milestone_of(step: int, train: TrainConfig, evaluation_due: bool) -> tuple[Milestone, bool]:
    """What the loop ending at ``step`` ends in, and whether it saves a checkpoint: an async
    evaluation is of a checkpoint of its step."""
    checkpoint_due = is_due(step, train.checkpoint_every, train.num_steps)
    if evaluation_due and train.evaluation == "async":
        return Milestone.EVALUATE, True
    return (Milestone.REPORT if evaluation_due or checkpoint_due else Milestone.NONE), checkpoint_due
