"""Exponential moving averages of model weights, swappable in and out of the model.

The maths is ``tf.train.ExponentialMovingAverage``'s (the OD API's and EfficientDet's):
``average -= (1 - decay) * (average - weight)``, the average starting at the weight's
value. With ``dynamic`` decay (EfficientDet's ``num_updates``), the decay warms up as
``min(decay, (1 + step) / (10 + step))``, so early averages are not dominated by the
random initialisation.

Like EfficientDet, every floating-point weight of the model is averaged, batch-norm
statistics included, so that the averaged model is consistent for evaluation.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import keras
import tensorflow as tf

from detsweep.config import OptimizerConfig


class MovingAverage(tf.Module):
    """Averages of ``variables``; a ``tf.Module`` so ``tf.train.Checkpoint`` saves them.

    Create it under the distribution strategy's scope when there is one; ``update`` and
    ``swap`` run in cross-replica context (outside ``strategy.run``).
    """

    def __init__(self, variables: Sequence, decay: float, dynamic: bool = False, name: str = "moving_average"):
        super().__init__(name=name)
        self.decay = decay
        self.dynamic = dynamic
        self._weights = list(variables)
        self.averages = [
            tf.Variable(tf.convert_to_tensor(weight), trainable=False, name=f"average_{i}")
            for i, weight in enumerate(self._weights)
        ]

    @classmethod
    def of_model(cls, model: keras.Model, decay: float, dynamic: bool = False) -> MovingAverage:
        floating = [w for w in model.weights if keras.backend.is_float_dtype(w.dtype)]
        return cls(floating, decay, dynamic)

    @classmethod
    def from_config(cls, model: keras.Model, optimizer: OptimizerConfig) -> MovingAverage | None:
        """The averages ``optimizer.use_moving_average`` asks for, or None."""
        if not optimizer.use_moving_average:
            return None
        return cls.of_model(model, optimizer.moving_average_decay, optimizer.moving_average_dynamic_decay)

    def decay_at(self, step) -> tf.Tensor:
        """The decay used for the update after ``step`` updates (0 for the first one)."""
        decay = tf.constant(self.decay, tf.float32)
        if not self.dynamic:
            return decay
        step = tf.cast(step, tf.float32)
        return tf.minimum(decay, (1.0 + step) / (10.0 + step))

    def update(self, step) -> None:
        decay = self.decay_at(step)
        for average, weight in zip(self.averages, self._weights):
            rate = tf.cast(1.0 - decay, average.dtype)
            average.assign_sub(rate * (average - tf.cast(tf.convert_to_tensor(weight), average.dtype)))

    def reset(self) -> None:
        """Start averaging afresh from the weights as they are now (after a fine-tune's restore)."""
        for average, weight in zip(self.averages, self._weights):
            average.assign(tf.cast(tf.convert_to_tensor(weight), average.dtype))

    def swap(self) -> None:
        """Exchange the weights and their averages (exact: values are copied, not recomputed)."""
        for average, weight in zip(self.averages, self._weights):
            raw = tf.identity(tf.convert_to_tensor(weight))
            weight.assign(tf.cast(average, weight.dtype))
            average.assign(tf.cast(raw, average.dtype))

    @contextlib.contextmanager
    def averaged_weights(self) -> Iterator[None]:
        """Within the block the model holds the averaged weights; afterwards its own again."""
        self.swap()
        try:
            yield
        finally:
            self.swap()
