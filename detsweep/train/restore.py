"""Rebuilding a trained model from a checkpoint directory (for eval, export, fine-tuning)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import keras
import tensorflow as tf

from detsweep.config import TrialConfig, validate
from detsweep.config.loader import read_yaml_mapping
from detsweep.data import Category
from detsweep.errors import DetsweepError
from detsweep.models import build_model
from detsweep.optim import MovingAverage

from .checkpoint import CONFIG_FILE, PREFIX, read_meta


@dataclass
class TrainedModel:
    config: TrialConfig
    model: keras.Model
    moving_average: MovingAverage | None
    categories: list[Category]
    step: int


def load_trained_model(directory: str | Path, overrides: list[str] = ()) -> TrainedModel:
    """The model (and its averages) saved in ``directory``, built from the as-run config there."""
    directory = Path(directory)
    if not (directory / CONFIG_FILE).is_file() or not (directory / f"{PREFIX}.index").is_file():
        raise DetsweepError(f"{directory}: not a detsweep checkpoint (expected {CONFIG_FILE} and {PREFIX}.index)")
    config = validate(TrialConfig, read_yaml_mapping(directory / CONFIG_FILE), str(directory / CONFIG_FILE), overrides)
    meta = read_meta(directory)
    categories = [Category(c["id"], c["name"]) for c in meta["categories"]]
    model, _ = build_model(config.model, config.model.num_classes or len(categories))
    average = config.optimizer
    moving_average = (MovingAverage.of_model(model, average.moving_average_decay, average.moving_average_dynamic_decay)
                      if average.use_moving_average else None)
    parts = {"model": model} | ({"moving_average": moving_average} if moving_average else {})
    tf.train.Checkpoint(**parts).read(str(directory / PREFIX)).expect_partial()
    return TrainedModel(config, model, moving_average, categories, meta["step"])
