"""The distributed train step: ``steps_per_loop`` steps per ``tf.function`` call.

Python runs once per loop. Inside, each step runs the forward and backward pass on every
replica (``strategy.run``); the replicas sum their gradients, and the optimizer clips and
applies the sum as one device would its own; the moving average follows. A non-finite loss
stops the loop at that step, like the OD API's ``check_numerics``.
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
    jit_compile: bool = False,
) -> Callable[[Iterator, tf.Tensor], dict[str, tf.Tensor]]:
    """``loop(batches, num_steps)`` → mean loss terms over the steps run, ``steps_run`` and ``finite``.
    ``losses``: :class:`~detsweep.models.retinanet.RetinaNetLosses` (``encode``, then ``terms``);
    ``jit_compile``: each replica's forward and backward pass compiled by XLA (not with a
    synchronized batch norm, whose all-reduce is inside that pass: the config refuses it)."""
    scales_loss = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
    replicas = strategy.num_replicas_in_sync

    def forward_backward(images, encoded, positives):
        """This replica's part of one device's loss on the global batch (normalised by the global
        batch's ``positives``, so that the replicas' parts add up to it), and its gradients."""
        with tf.GradientTape() as tape:
            predictions = model(images, training=True)
            terms = losses.terms(encoded, predictions, positives)
            loss = terms["box"] + terms["classification"]
            if model.losses:  # weight decay written as layer regularisers: one copy over all replicas
                loss += tf.add_n(model.losses) / replicas
            scaled = optimizer.scale_loss(loss) if scales_loss else loss
        return {"loss": loss, "box_loss": terms["box"], "classification_loss": terms["classification"]}, \
            tape.gradient(scaled, model.trainable_variables)

    # XLA compiles what holds no collective: the targets are encoded and the positives counted
    # across replicas before it, the gradients summed and applied after (Keras's update takes a
    # merge_call on CPU, and its loss scaling under MirroredStrategy fails under jit: #21366).
    compute = tf.function(forward_backward, jit_compile=True) if jit_compile else forward_backward

    def replica_step(images, targets):
        context = tf.distribute.get_replica_context()
        encoded = losses.encode(images, targets)
        positives = context.all_reduce(tf.distribute.ReduceOp.SUM, tf.reduce_sum(encoded["positives"]))
        terms, gradients = compute(images, encoded, positives)
        if replicas > 1:
            # Every replica hands the optimizer the same gradient, the global batch's mean, which
            # Keras sums again: its clipping (by the global norm) and the loss scale's all-finite
            # decision then see what one device would, the same on every replica and worker.
            summed = iter(context.all_reduce(tf.distribute.ReduceOp.SUM, [g for g in gradients if g is not None]))
            gradients = [None if g is None else next(summed) / replicas for g in gradients]
        optimizer.apply(gradients, model.trainable_variables)
        return terms

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
