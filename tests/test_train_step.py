"""The train step's contract: one trace for all loops, the strategy that `scaling` asks for."""

import tensorflow as tf

from detsweep.config import ScalingConfig, load_trial_config
from detsweep.data import load_dataset
from detsweep.data.pipeline import training_dataset
from detsweep.data.processing import InputSpec
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
