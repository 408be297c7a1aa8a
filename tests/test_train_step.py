"""The train step's contract: one trace for all loops, the strategy that `scaling` asks for."""

import numpy as np
import pytest
import tensorflow as tf

from detsweep.config import ScalingConfig, load_trial_config
from detsweep.data import load_dataset
from detsweep.data.pipeline import evaluation_dataset, training_dataset
from detsweep.data.processing import InputSpec, raw_predictions
from detsweep.models import build_model
from detsweep.optim import MovingAverage, build_optimizer
from detsweep.train import strategy as strategy_module
from detsweep.train.checkpoint import TrainingState
from detsweep.train.evaluate import Evaluator
from detsweep.train.step import make_train_loop

from .conftest import REPO


def test_no_retracing_between_loops_after_evaluation_or_for_a_shorter_last_loop():
    config = load_trial_config(REPO / "configs" / "quickstart.yaml",
                               ["data.train.num_images=16", "data.val.num_images=8"])
    strategy = strategy_module.make_strategy(config.scaling)
    assert strategy is tf.distribute.get_strategy()  # one CPU worker: no all-reduce, no device copies
    train_set = load_dataset(config.data.train, verify=False)
    val_set = load_dataset(config.data.val, verify=False)
    spec = InputSpec(config.model.image_size)
    with strategy.scope():
        model, losses = build_model(config.model, 3)
        optimizer = build_optimizer(config.optimizer)
        optimizer.build(model.trainable_variables)
        average = MovingAverage.of_model(model, 0.99, dynamic=True)
        state = TrainingState(model, optimizer, average)
    batches = iter(strategy.distribute_datasets_from_function(
        lambda context: training_dataset(train_set, spec, config.data.augmentation, batch_size=4, seed=0)))
    loop = make_train_loop(strategy, model, losses, optimizer, average, state.step)
    evaluator = Evaluator(model, val_set, spec, batch_size=8)
    for _ in range(2):
        result = loop(batches, tf.constant(2))
        evaluator.evaluate_with_average(average)
    loop(batches, tf.constant(1))
    assert int(state.step.numpy()) == 5 and int(result["steps_run"]) == 2
    assert loop.experimental_get_tracing_count() == 1
    assert evaluator.detect.experimental_get_tracing_count() == 1


def test_use_tpu_builds_a_tpu_strategy_mocked_tpu_resolver(monkeypatch):
    """No TPU exists here: the resolver, cluster connection and TPUStrategy are mocks."""
    calls = []

    class FakeResolver:
        pass

    monkeypatch.setattr(tf.distribute.cluster_resolver, "TPUClusterResolver", FakeResolver)
    monkeypatch.setattr(tf.config, "experimental_connect_to_cluster", lambda r: calls.append(("connect", r)))
    monkeypatch.setattr(tf.tpu.experimental, "initialize_tpu_system", lambda r: calls.append(("init", r)))
    monkeypatch.setattr(tf.distribute, "TPUStrategy", lambda r: ("TPUStrategy", r))
    kind, resolver = strategy_module.make_strategy(ScalingConfig(use_tpu=True))
    assert kind == "TPUStrategy" and isinstance(resolver, FakeResolver)
    assert [name for name, _ in calls] == ["connect", "init"]


def test_the_val_sets_loss_is_the_training_loss_of_its_images_and_the_filler_copies_weigh_nothing():
    """10 val images in batches of 8: the second batch is 2 images and 6 filler copies. The
    evaluator's loss must be the training loss of the first 8 and of the last 2, each batch
    normalised by its own positives, weighed 8 : 2."""
    config = load_trial_config(REPO / "configs" / "quickstart.yaml", ["data.val.num_images=10"])
    val_set = load_dataset(config.data.val, verify=False)
    spec = InputSpec(config.model.image_size)
    model, losses = build_model(config.model, 3)
    evaluator = Evaluator(model, val_set, spec, batch_size=8, losses=losses)
    _, found = evaluator.detect_all()
    images, meta = next(iter(evaluation_dataset(val_set, spec, batch_size=10)))  # all 10, no filler
    predictions = raw_predictions(model, images)
    expected = {}
    for part, weight in ((slice(0, 8), 0.8), (slice(8, 10), 0.2)):
        terms = losses(images[part], {k: meta[k][part] for k in ("boxes", "labels")},
                       {k: v[part] for k, v in predictions.items()})
        for name, value in (("box_loss", terms["box"]), ("classification_loss", terms["classification"])):
            expected[name] = expected.get(name, 0.0) + weight * float(value)
    assert not model.losses  # no weight decay in the quickstart: the loss is the two terms
    expected["loss"] = expected["box_loss"] + expected["classification_loss"]
    assert found == pytest.approx(expected, rel=1e-4)


REPLICA_SCRIPT = r'''
import json, sys
import numpy as np, tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import keras
from detsweep.config import load_trial_config
from detsweep.data import load_dataset
from detsweep.data.pipeline import evaluation_dataset, training_dataset
from detsweep.data.processing import InputSpec, raw_predictions
from detsweep.train.checkpoint import build_training_state
from detsweep.train.step import make_train_loop

config = load_trial_config(sys.argv[1], sys.argv[2:])
train_set = load_dataset(config.data.train, verify=False)
images, targets = next(iter(training_dataset(train_set, InputSpec(128), config.data.augmentation, 4, seed=0)))
# the same 4 images on each replica: their gradients agree, so N replicas must step as one device
batch = (tf.concat([images, images], 0), {k: tf.concat([v, v], 0) for k, v in targets.items()})
found = {}
for devices in (["/cpu:0"], ["/cpu:0", "/cpu:1"]):
    strategy = tf.distribute.MirroredStrategy(devices)
    keras.utils.set_random_seed(1)
    with strategy.scope():
        state, losses = build_training_state(config, 3)
    before = [w.numpy().copy() for w in state.model.trainable_weights]
    batches = iter(strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensors(batch).repeat()))
    result = make_train_loop(strategy, state.model, losses, state.optimizer, None, state.step)(batches, tf.constant(1))
    update = np.concatenate([(w.numpy() - b).ravel() for w, b in zip(state.model.trainable_weights, before)])
    found[len(devices)] = {"loss": float(result["loss"]), "box_loss": float(result["box_loss"]),
                           "update_norm": float(np.linalg.norm(update)), "update": update[::97].tolist()}
print(json.dumps(found))
'''


def test_two_replicas_step_as_one_device_on_the_same_global_batch_with_and_without_clipping():
    """Two logical CPU devices stand in for two GPUs (or two workers): the same global batch must
    give the same loss and the same update as one device. Keras sums the replicas' gradients and,
    for a "sum" loss, does not divide by the replica count; nor does it clip after the sum."""
    import json
    import sys

    from .conftest import run_bounded

    found = {}
    for clip in (10.0, 0.0):  # the quickstart's clipping bites at the first step (see the norms)
        overrides = ["data.augmentation.random_horizontal_flip=0", "optimizer.use_moving_average=false",
                     "optimizer.learning_rate.warmup_steps=0", f"train.gradient_clipping_by_norm={clip}"]
        result = run_bounded([sys.executable, "-c", REPLICA_SCRIPT, str(REPO / "configs" / "quickstart.yaml"),
                              *overrides], timeout=300, cwd=REPO)
        assert result.returncode == 0, result.stderr[-3000:]
        one, two = json.loads(result.stdout.splitlines()[-1]).values()
        for key in ("loss", "box_loss", "update_norm"):
            assert two[key] == pytest.approx(one[key], rel=1e-3), (clip, key, one[key], two[key])
        apart = np.linalg.norm(np.subtract(two["update"], one["update"])) / np.linalg.norm(one["update"])
        assert apart < 1e-2, (clip, apart)  # the same direction too, up to float sums in another order
        found[clip] = one["update_norm"]
    lr = 0.04  # the quickstart's base rate, no warm-up: the first momentum step is lr × the gradient
    assert found[10.0] == pytest.approx(lr * 10.0, rel=1e-3) and found[10.0] < found[0.0]  # clipped to 10, from more
