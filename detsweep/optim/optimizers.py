"""OD API optimizer configs → Keras optimizers (the mapping of ``optimizer_builder.py``, TF2 path)."""

from __future__ import annotations

import keras

from detsweep.config import OptimizerConfig

from .schedules import build_schedule


def build_optimizer(
    config: OptimizerConfig, *, clip_norm: float = 0.0, mixed_precision: str = "float32",
    schedule: keras.optimizers.schedules.LearningRateSchedule | None = None, replicas: int = 1,
) -> keras.optimizers.Optimizer:
    """A Keras optimizer with the config's schedule (``schedule``, when the caller keeps it to
    report the rate), clipping and (for float16) dynamic loss scaling.

    Clipping by global norm is done by the optimizer (``global_clipnorm``), which under
    loss scaling happens after the gradients are unscaled, as it must. Under ``tf.distribute``
    Keras clips what each replica hands it before it sums over the ``replicas``; the train
    step hands every replica the same gradient, the global batch's mean (``train.step``), so
    clipping each to ``clip_norm / replicas`` clips their sum by its global norm to
    ``clip_norm``, as one device would.
    """
    common = {"learning_rate": schedule or build_schedule(config.learning_rate)}
    if clip_norm > 0:
        common["global_clipnorm"] = clip_norm / replicas
    optimizer = _make(config, common)
    if mixed_precision == "mixed_float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer


def _make(config: OptimizerConfig, common: dict) -> keras.optimizers.Optimizer:
    if config.type == "sgd":
        return keras.optimizers.SGD(**common)
    if config.type == "momentum":
        return keras.optimizers.SGD(momentum=config.momentum_optimizer_value, **common)
    if config.type == "adam":
        return keras.optimizers.Adam(epsilon=config.epsilon, **common)
    if config.type == "adamw":
        return keras.optimizers.AdamW(weight_decay=config.weight_decay, epsilon=config.epsilon, **common)
    return keras.optimizers.RMSprop(
        rho=config.decay, momentum=config.momentum_optimizer_value, epsilon=config.epsilon, **common
    )


def unwrap(optimizer: keras.optimizers.Optimizer) -> keras.optimizers.Optimizer:
    """The optimizer that holds the hyperparameters (inside a loss-scale wrapper, if any)."""
    return getattr(optimizer, "inner_optimizer", optimizer)
