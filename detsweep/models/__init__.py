"""Detection models by name (``model.name``)."""

from __future__ import annotations

import keras

from detsweep.config import ModelConfig

from .retinanet import RetinaNetLosses, build_retinanet

MODELS = {"retinanet": (build_retinanet, RetinaNetLosses)}


def build_model(config: ModelConfig, num_classes: int) -> tuple[keras.Model, RetinaNetLosses]:
    """The detector and the callable that computes its loss terms."""
    build, losses = MODELS[config.name]
    model = build(config, num_classes)
    return model, losses(model, config)


__all__ = ["MODELS", "build_model"]
