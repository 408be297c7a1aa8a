"""The distributed train step: ``steps_per_loop`` steps per ``tf.function`` call.

Python runs once per loop. Inside, each step runs the forward and backward pass on every
replica (``strategy.run``), the optimizer all-reduces, clips and applies the gradients,
and the moving average follows. A non-finite loss stops the loop at that step, like the
OD API's ``check_numerics``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import keras
import tensorflow as tf

from detsweep.optim import MovingAverage

LOSS_TERMS = ("loss", "box_loss", "classification_loss")


def make_train_loop(
    strategy: tf.distribute.Strategy,
    model: keras.Model,
    losses: Callable,
    optimizer: keras.optimizers.Optimizer,
    moving_average: MovingAverage | None,
    step: tf.Variable,
) -> Callable[[Iterator, tf.Tensor], dict[str, tf.Tensor]]:
    """``loop(batches, num_steps)`` → mean loss terms over the steps run, ``steps_run`` and ``finite``."""
    scales_loss = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
    replicas = strategy.num_replicas_in_sync

    def replica_step(images, targets):
        with tf.GradientTape() as tape:
            predictions = model(images, training=True)
            # Each replica's share of the global batch's loss: summed over replicas it is the
            # mean, and the optimizer's summed gradients average over the global batch, as the
            # OD API's (Keras scales only its "mean" reductions by the replica count, not "sum").
            terms = {k: v / replicas for k, v in losses(images, targets, predictions).items()}
            loss = terms["box"] + terms["classification"]
            if model.losses:  # weight decay written as layer regularisers
                loss += tf.add_n(model.losses) / replicas
            scaled = optimizer.scale_loss(loss) if scales_loss else loss
        gradients = tape.gradient(scaled, model.trainable_variables)
        optimizer.apply(gradients, model.trainable_variables)
        return {"loss": loss, "box_loss": terms["box"], "classification_loss": terms["classification"]}

    def reduce(per_replica):
        # Each replica's loss is already divided by the replica count: the sum is the mean.
        return {k: strategy.reduce(tf.distribute.ReduceOp.SUM, v, axis=None) for k, v in per_replica.items()}

    @tf.function
    def loop(batches: Iterator, num_steps: tf.Tensor) -> dict[str, tf.Tensor]:
        totals = {name: tf.constant(0.0) for name in LOSS_TERMS}
        steps_run = tf.constant(0)
        finite = tf.constant(True)
        for _ in tf.range(num_steps):
            images, targets = next(batches)
            terms = reduce(strategy.run(replica_step, args=(images, targets)))
            finite = tf.math.is_finite(terms["loss"])
            if not finite:
                break
            if moving_average is not None:
                moving_average.update(step)
            step.assign_add(1)
            steps_run += 1
            totals = {name: totals[name] + tf.cast(terms[name], tf.float32) for name in LOSS_TERMS}
        count = tf.cast(tf.maximum(steps_run, 1), tf.float32)
        return {**{name: totals[name] / count for name in LOSS_TERMS}, "steps_run": steps_run, "finite": finite}

    return loop
