"""What a checkpoint holds: model, optimizer (slots and iterations), moving averages and step;
beside it the as-run config and the category mapping, so it can be evaluated, resumed
or fine-tuned without anything else."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf
import yaml

from detsweep.checkpoints import CONFIG_FILE, META_FILE, PREFIX
from detsweep.config import TrialConfig
from detsweep.data import Category
from detsweep.models import build_model
from detsweep.optim import MovingAverage, build_optimizer, build_schedule


class TrainingState:
    """The trackable state of one training, created under the strategy's scope."""

    def __init__(self, model: keras.Model, optimizer: keras.optimizers.Optimizer, moving_average: MovingAverage | None,
                 schedule: Callable | None = None):
        self.model, self.optimizer, self.moving_average = model, optimizer, moving_average
        self.schedule = schedule  # the optimizer's learning-rate schedule: step → rate (to report it)
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        parts = {"model": model, "optimizer": optimizer, "step": self.step}
        if moving_average is not None:
            parts["moving_average"] = moving_average
        self.checkpoint = tf.train.Checkpoint(**parts)

    def save(self, directory: Path, config: TrialConfig, categories: list[Category]) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        self.checkpoint.write(str(directory / PREFIX))
        (directory / CONFIG_FILE).write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
        meta = {"step": int(self.step.numpy()), "categories": [{"id": c.id, "name": c.name} for c in categories]}
        (directory / META_FILE).write_text(json.dumps(meta, indent=1))
        return directory

    def restore(self, directory: Path) -> int:
        """Load everything from a checkpoint directory; returns the step it was saved at."""
        self.checkpoint.read(str(Path(directory) / PREFIX)).assert_existing_objects_matched()
        return int(self.step.numpy())


def weights_fingerprint(model: keras.Model) -> float:
    """The sum of |w| over the model's trainable weights, in float64. The same weights give the
    same number: a run that continued from a checkpoint logs it, so anyone can tell which
    checkpoint that was (PBT's donor, say) by computing it on the candidates."""
    return float(sum(np.abs(weight.numpy()).sum(dtype=np.float64) for weight in model.trainable_weights))


def build_training_state(config: TrialConfig, num_classes: int) -> tuple[TrainingState, Callable]:
    """A fresh model, its optimizer (slots built, so a restore can fill them) and moving
    averages; and the callable that computes the model's loss terms."""
    model, losses = build_model(config.model, num_classes)
    train = config.train
    schedule = build_schedule(config.optimizer.learning_rate)
    replicas = tf.distribute.get_strategy().num_replicas_in_sync  # called under the strategy's scope
    optimizer = build_optimizer(config.optimizer, clip_norm=train.gradient_clipping_by_norm, replicas=replicas,
                                mixed_precision=train.mixed_precision, schedule=schedule)
    optimizer.build(model.trainable_variables)
    moving_average = MovingAverage.from_config(model, config.optimizer)
    return TrainingState(model, optimizer, moving_average, schedule), losses


