"""The TF Object Detection API's learning-rate schedules as Keras ``LearningRateSchedule``s.

Each one computes, at every step, exactly what ``object_detection/utils/learning_schedules.py``
computes (same formulas, same float32 arithmetic), and is written with elementwise
TensorFlow ops so that it runs inside ``tf.function`` and ``tf.distribute`` and can
also be evaluated on a whole vector of steps at once (for reports and plots).
"""

from __future__ import annotations

import math

import keras
import tensorflow as tf

from detsweep.config import LearningRateConfig


def _steps(step) -> tuple[tf.Tensor, tf.Tensor]:
    """The step as int64 (for exact comparisons) and as float32 (for arithmetic, as the OD API)."""
    as_int = tf.cast(tf.convert_to_tensor(step), tf.int64)
    return as_int, tf.cast(as_int, tf.float32)


class ConstantLearningRate(keras.optimizers.schedules.LearningRateSchedule):
    def __init__(self, learning_rate: float):
        self.learning_rate = learning_rate

    def __call__(self, step):
        step, _ = _steps(step)
        return tf.fill(tf.shape(step), tf.constant(self.learning_rate, tf.float32))

    def get_config(self) -> dict:
        return {"learning_rate": self.learning_rate}


class ExponentialDecayWithBurnin(keras.optimizers.schedules.LearningRateSchedule):
    """``exponential_decay_with_burnin``: a constant burn-in rate, then (staircase) decay, floored."""

    def __init__(
        self,
        initial_learning_rate: float,
        decay_steps: int,
        decay_factor: float,
        staircase: bool = True,
        burnin_learning_rate: float = 0.0,
        burnin_steps: int = 0,
        min_learning_rate: float = 0.0,
    ):
        self.initial_learning_rate = initial_learning_rate
        self.decay_steps = decay_steps
        self.decay_factor = decay_factor
        self.staircase = staircase
        self.burnin_learning_rate = burnin_learning_rate  # as given: what a training reports it was built with
        self.burnin_steps = burnin_steps
        self.min_learning_rate = min_learning_rate

    def __call__(self, step):
        step, _ = _steps(step)
        exponent = tf.cast(step - self.burnin_steps, tf.float32) / self.decay_steps
        if self.staircase:
            exponent = tf.floor(exponent)
        decayed = self.initial_learning_rate * tf.pow(tf.constant(self.decay_factor, tf.float32), exponent)
        # The OD API reads a burn-in rate of 0 as "burn in at the base rate".
        burnin = self.burnin_learning_rate or self.initial_learning_rate
        rate = tf.where(step < self.burnin_steps, tf.constant(burnin, tf.float32), decayed)
        return tf.maximum(rate, self.min_learning_rate)

    def get_config(self) -> dict:
        return {
            "initial_learning_rate": self.initial_learning_rate,
            "decay_steps": self.decay_steps,
            "decay_factor": self.decay_factor,
            "staircase": self.staircase,
            "burnin_learning_rate": self.burnin_learning_rate,
            "burnin_steps": self.burnin_steps,
            "min_learning_rate": self.min_learning_rate,
        }


class CosineDecayWithWarmup(keras.optimizers.schedules.LearningRateSchedule):
    """``cosine_decay_with_warmup``: linear warm-up, a hold at the base rate, cosine to 0 at total_steps."""

    def __init__(
        self,
        learning_rate_base: float,
        total_steps: int,
        warmup_learning_rate: float = 0.0,
        warmup_steps: int = 0,
        hold_base_rate_steps: int = 0,
    ):
        self.learning_rate_base = learning_rate_base
        self.total_steps = total_steps
        self.warmup_learning_rate = warmup_learning_rate
        self.warmup_steps = warmup_steps
        self.hold_base_rate_steps = hold_base_rate_steps

    def __call__(self, step):
        step, step_f = _steps(step)
        decay_start = self.warmup_steps + self.hold_base_rate_steps
        # The OD API's operation order, so that float32 rounding matches too.
        angle = math.pi * (step_f - self.warmup_steps - self.hold_base_rate_steps) / float(self.total_steps - decay_start)
        rate = 0.5 * self.learning_rate_base * (1.0 + tf.cos(angle))
        if self.hold_base_rate_steps > 0:
            rate = tf.where(step > decay_start, rate, self.learning_rate_base)
        if self.warmup_steps > 0:
            slope = (self.learning_rate_base - self.warmup_learning_rate) / self.warmup_steps
            rate = tf.where(step < self.warmup_steps, slope * step_f + self.warmup_learning_rate, rate)
        return tf.where(step > self.total_steps, 0.0, rate)

    def get_config(self) -> dict:
        return {
            "learning_rate_base": self.learning_rate_base,
            "total_steps": self.total_steps,
            "warmup_learning_rate": self.warmup_learning_rate,
            "warmup_steps": self.warmup_steps,
            "hold_base_rate_steps": self.hold_base_rate_steps,
        }


class ManualStepping(keras.optimizers.schedules.LearningRateSchedule):
    """``manual_stepping``: ``rates[i]`` from ``boundaries[i-1]`` on; with warm-up, a linear ramp
    from ``rates[0]`` to ``rates[1]`` over the first boundary's steps."""

    def __init__(self, boundaries: list[int], rates: list[float], warmup: bool = False):
        if len(rates) != len(boundaries) + 1:
            raise ValueError("manual stepping needs exactly one more rate than boundaries")
        self.boundaries = list(boundaries)
        self.rates = list(rates)
        self.warmup = warmup
        if warmup and boundaries:
            slope = (rates[1] - rates[0]) / boundaries[0]
            self._starts = list(range(boundaries[0])) + self.boundaries
            self._values = [rates[0] + slope * s for s in range(boundaries[0])] + self.rates[1:]
        else:
            self._starts = [0] + self.boundaries
            self._values = self.rates

    def __call__(self, step):
        step, _ = _steps(step)
        starts = tf.constant(self._starts, tf.int64)
        # The last start at or before `step` (the first is always 0).
        index = tf.reduce_sum(tf.cast(step[..., None] >= starts, tf.int32), axis=-1) - 1
        return tf.gather(tf.constant(self._values, tf.float32), tf.maximum(index, 0))

    def get_config(self) -> dict:
        return {"boundaries": self.boundaries, "rates": self.rates, "warmup": self.warmup}


def build_schedule(config: LearningRateConfig) -> keras.optimizers.schedules.LearningRateSchedule:
    """The schedule that ``config.type`` names, with the OD API's arguments."""
    if config.type == "constant":
        return ConstantLearningRate(config.learning_rate)
    if config.type == "exponential_decay":
        return ExponentialDecayWithBurnin(
            config.initial_learning_rate,
            config.decay_steps,
            config.decay_factor,
            staircase=config.staircase,
            burnin_learning_rate=config.burnin_learning_rate,
            burnin_steps=config.burnin_steps,
            min_learning_rate=config.min_learning_rate,
        )
    if config.type == "cosine":
        return CosineDecayWithWarmup(
            config.learning_rate_base,
            config.total_steps,
            warmup_learning_rate=config.warmup_learning_rate,
            warmup_steps=config.warmup_steps,
            hold_base_rate_steps=config.hold_base_rate_steps,
        )
    return ManualStepping(
        boundaries=[entry.step for entry in config.schedule],
        rates=[config.initial_learning_rate] + [entry.learning_rate for entry in config.schedule],
        warmup=config.warmup,
    )


def schedule_landmarks(config: LearningRateConfig) -> dict[str, tuple[int, int]]:
    """Named step ranges worth showing on a plot of the schedule (warm-up, hold, burn-in)."""
    if config.type == "cosine":
        hold_end = config.warmup_steps + config.hold_base_rate_steps
        return {"warm-up": (0, config.warmup_steps), "hold": (config.warmup_steps, hold_end)}
    if config.type == "exponential_decay":
        return {"burn-in": (0, config.burnin_steps)}
    if config.type == "manual_step" and config.warmup and config.schedule:
        return {"warm-up": (0, config.schedule[0].step)}
    return {}
