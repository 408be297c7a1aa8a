"""The moving average: tf.train.ExponentialMovingAverage's maths, exact swaps, checkpoints."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from detsweep.optim import MovingAverage


def small_model() -> keras.Model:
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2), keras.layers.BatchNormalization()])
    model(np.zeros((1, 3), np.float32))
    return model


def perturb(model: keras.Model, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for weight in model.weights:
        weight.assign(weight.numpy() + rng.normal(size=weight.shape).astype(np.float32))


def test_average_equals_hand_computation_after_n_steps():
    model = small_model()
    ema = MovingAverage.of_model(model, decay=0.9)
    expected = [w.numpy().copy() for w in model.weights]
    for step in range(5):
        perturb(model, seed=step)
        ema.update(step)
        expected = [0.9 * avg + 0.1 * w.numpy() for avg, w in zip(expected, model.weights)]
    for average, want in zip(ema.averages, expected):
        np.testing.assert_allclose(average.numpy(), want, rtol=1e-6, atol=1e-6)


def test_batch_norm_statistics_are_averaged_too():
    """Batch norm's moving mean and variance move in training-mode calls, not by the optimizer;
    their averages follow them as every weight's does, by hand: average <- 0.5 average + 0.5 value."""
    model = small_model()
    norm = model.layers[-1]
    ema = MovingAverage.of_model(model, decay=0.5)

    def statistics() -> dict[str, np.ndarray]:
        return {"mean": norm.moving_mean.numpy(), "variance": norm.moving_variance.numpy()}

    expected = statistics()
    rng = np.random.default_rng(0)
    for step in range(3):
        before = statistics()
        model(rng.normal(3.0 * step, 1.0 + step, (8, 3)).astype(np.float32), training=True)
        ema.update(step)
        moved = statistics()
        assert not any(np.allclose(moved[key], before[key]) for key in moved)  # the batch moved both
        expected = {key: 0.5 * expected[key] + 0.5 * moved[key] for key in expected}
    with ema.averaged_weights():
        np.testing.assert_allclose(norm.moving_mean.numpy(), expected["mean"], rtol=1e-6)
        np.testing.assert_allclose(norm.moving_variance.numpy(), expected["variance"], rtol=1e-6)


def test_dynamic_decay_warms_up_then_caps():
    ema = MovingAverage([tf.Variable(0.0)], decay=0.9999, dynamic=True)
    for step in [0, 1, 10, 100, 10**6]:
        assert float(ema.decay_at(step)) == pytest.approx(min(0.9999, (1 + step) / (10 + step)), rel=1e-6)
    assert float(MovingAverage([tf.Variable(0.0)], decay=0.5).decay_at(0)) == 0.5


def test_dynamic_decay_hand_computation():
    weight = tf.Variable(0.0)
    ema = MovingAverage([weight], decay=0.99, dynamic=True)
    expected = 0.0
    for step, value in enumerate([1.0, 2.0, 3.0]):
        weight.assign(value)
        ema.update(step)
        decay = min(0.99, (1 + step) / (10 + step))
        expected = decay * expected + (1 - decay) * value
    assert float(ema.averages[0]) == pytest.approx(expected, rel=1e-6)


def test_swap_in_and_out_restores_raw_weights_exactly():
    model = small_model()
    ema = MovingAverage.of_model(model, decay=0.7)
    for step in range(3):
        perturb(model, seed=10 + step)
        ema.update(step)
    raw = [w.numpy().copy() for w in model.weights]
    averaged = [a.numpy().copy() for a in ema.averages]
    x = np.ones((2, 3), np.float32)
    with ema.averaged_weights():
        for weight, average in zip(model.weights, averaged):
            np.testing.assert_array_equal(weight.numpy(), average)
        output_averaged = model(x).numpy()
    for weight, before in zip(model.weights, raw):
        np.testing.assert_array_equal(weight.numpy(), before)
    assert not np.allclose(output_averaged, model(x).numpy())


def test_averages_are_saved_in_checkpoints(tmp_path):
    model = small_model()
    ema = MovingAverage.of_model(model, decay=0.5)
    perturb(model, seed=1)
    ema.update(0)
    path = tf.train.Checkpoint(model=model, moving_average=ema).write(str(tmp_path / "ckpt"))

    restored_model = small_model()
    restored = MovingAverage.of_model(restored_model, decay=0.5)
    tf.train.Checkpoint(model=restored_model, moving_average=restored).read(path).assert_consumed()
    for a, b in zip(ema.averages, restored.averages):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


TWO_REPLICAS = r"""
import json
from detsweep.optim import MovingAverage

strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
    # the replicas' updates averaged, as a weight trained under the strategy is kept alike
    weight = tf.Variable([1.0, 2.0], aggregation=tf.VariableAggregation.MEAN)
    ema = MovingAverage([weight], decay=0.5)


@tf.function
def train_step(step):
    replica = lambda: tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group, tf.float32)
    strategy.run(lambda: weight.assign_add([1.0, 1.0] + 2.0 * replica()))  # +1 on one, +3 on the other
    ema.update(step)


copies = lambda variable: [v.numpy().tolist() for v in strategy.experimental_local_results(variable)]
train_step(tf.constant(0))
found = {"averages": copies(ema.averages[0])}
with ema.averaged_weights():
    found["swapped in"] = copies(weight)
found["after"] = copies(weight)
print(json.dumps(found))
"""


def test_update_inside_tf_function_under_a_strategy_two_logical_devices():
    """Two logical CPU devices stand in for two GPUs: the update runs in cross-replica context
    and every replica's copy of the average, and of the weights swapped in, is the same."""
    from .conftest import run_on_two_cpu_devices

    found = run_on_two_cpu_devices(TWO_REPLICAS)
    # the weight moved by the replicas' mean (+2): [3, 4]; the average halfway from [1, 2]
    assert found == {"averages": [[2.0, 3.0]] * 2, "swapped in": [[2.0, 3.0]] * 2, "after": [[3.0, 4.0]] * 2}, found
