"""Rebuilding a trained model from a checkpoint directory (for eval, export, fine-tuning)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import keras
import tensorflow as tf

from detsweep.checkpoints import PREFIX, check_checkpoint, read_config, read_meta
from detsweep.config import TrialConfig
from detsweep.data import Category
from detsweep.models import build_model
from detsweep.optim import MovingAverage


@dataclass
class TrainedModel:
    config: TrialConfig
    model: keras.Model
    moving_average: MovingAverage | None
    categories: list[Category]
    step: int
    losses: Callable  # the model's loss terms (an evaluation reports them)


def load_trained_model(directory: str | Path, overrides: list[str] = ()) -> TrainedModel:
    """The model (and its averages) saved in ``directory``, built from the as-run config there."""
    directory = check_checkpoint(directory)
    config = read_config(directory, overrides)
    meta = read_meta(directory)
    categories = [Category(c["id"], c["name"]) for c in meta["categories"]]
    model, losses = build_model(config.model, config.model.num_classes or len(categories))
    moving_average = MovingAverage.from_config(model, config.optimizer)
    parts = {"model": model} | ({"moving_average": moving_average} if moving_average else {})
    tf.train.Checkpoint(**parts).read(str(directory / PREFIX)).expect_partial()
    return TrainedModel(config, model, moving_average, categories, meta["step"], losses)
