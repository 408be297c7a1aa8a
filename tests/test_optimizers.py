"""The OD API's optimizer_builder test cases, each written in our YAML and in OD API text format."""

import keras
import numpy as np
import pytest
import yaml

from detsweep.config import load_trial_config
from detsweep.errors import DetsweepError
from detsweep.optim import build_optimizer, unwrap
from detsweep.optim.report import learning_rates

CASES = {
    "adam_constant": (
        "optimizer: {type: adam, learning_rate: {type: constant, learning_rate: 0.002}, use_moving_average: false}",
        "adam_optimizer { learning_rate { constant_learning_rate { learning_rate: 0.002 } } } use_moving_average: false",
    ),
    "momentum_099": (
        "optimizer: {type: momentum, momentum_optimizer_value: 0.99,"
        " learning_rate: {type: constant, learning_rate: 0.001}, use_moving_average: false}",
        "momentum_optimizer { learning_rate { constant_learning_rate { learning_rate: 0.001 } } "
        "momentum_optimizer_value: 0.99 } use_moving_average: false",
    ),
    "adam_ema_02": (
        "optimizer: {type: adam, learning_rate: {type: constant, learning_rate: 0.002},"
        " use_moving_average: true, moving_average_decay: 0.2}",
        "adam_optimizer { learning_rate { constant_learning_rate { learning_rate: 0.002 } } } "
        "use_moving_average: true moving_average_decay: 0.2",
    ),
    "rms_prop_exponential": (
        "optimizer: {type: rms_prop, momentum_optimizer_value: 0.9, decay: 0.9, epsilon: 1.0,"
        " learning_rate: {type: exponential_decay, initial_learning_rate: 0.004, decay_steps: 800720,"
        " decay_factor: 0.95}, use_moving_average: false}",
        "rms_prop_optimizer { learning_rate { exponential_decay_learning_rate { initial_learning_rate: 0.004 "
        "decay_steps: 800720 decay_factor: 0.95 } } momentum_optimizer_value: 0.9 decay: 0.9 epsilon: 1.0 } "
        "use_moving_average: false",
    ),
}


@pytest.fixture(params=["yaml", "odapi"])
def load(request, write):
    def _load(case: str):
        text = CASES[case][0 if request.param == "yaml" else 1]
        return load_trial_config(write("case.yaml" if request.param == "yaml" else "case.config", text))

    return _load


def test_adam_with_constant_rate(load):
    config = load("adam_constant")
    optimizer = build_optimizer(config.optimizer)
    assert isinstance(optimizer, keras.optimizers.Adam)
    assert optimizer.epsilon == pytest.approx(1e-8)  # the OD API's default, not Keras's 1e-7
    assert learning_rates(config.optimizer.learning_rate, [0, 1000]) == pytest.approx([0.002, 0.002])
    assert not config.optimizer.use_moving_average


def test_momentum_099(load):
    optimizer = build_optimizer(load("momentum_099").optimizer)
    assert type(optimizer) is keras.optimizers.SGD
    assert optimizer.momentum == pytest.approx(0.99)


def test_moving_average_with_non_default_decay(load):
    config = load("adam_ema_02").optimizer
    assert config.use_moving_average and config.moving_average_decay == pytest.approx(0.2)


def test_rms_prop_with_exponential_decay(load):
    config = load("rms_prop_exponential").optimizer
    optimizer = build_optimizer(config)
    assert isinstance(optimizer, keras.optimizers.RMSprop)
    assert (optimizer.rho, optimizer.momentum, optimizer.epsilon) == pytest.approx((0.9, 0.9, 1.0))
    rates = learning_rates(config.learning_rate, [0, 800719, 800720, 2 * 800720])
    assert rates == pytest.approx([0.004, 0.004, 0.004 * 0.95, 0.004 * 0.95**2], rel=1e-5)


@pytest.mark.parametrize("text,name", [("", "case.config"), ("optimizer: {}", "case.yaml"),
                                       ("train: {batch_size: 4}", "case.yaml")])
def test_empty_optimizer_is_an_error(write, text, name):
    with pytest.raises(DetsweepError, match=r"optimizer"):
        load_trial_config(write(name, text))


def test_epsilon_default_follows_the_optimizer_type(write):
    base = yaml.safe_load(CASES["adam_constant"][0])
    config = load_trial_config(write("a.yaml", yaml.safe_dump(base)), ["optimizer.type=rms_prop"])
    assert config.optimizer.epsilon == 1.0


def test_adamw_and_sgd(write):
    config = load_trial_config(write("a.yaml", "optimizer: {type: adamw, weight_decay: 0.01}"))
    optimizer = build_optimizer(config.optimizer)
    assert isinstance(optimizer, keras.optimizers.AdamW) and optimizer.weight_decay == pytest.approx(0.01)
    sgd = build_optimizer(load_trial_config(write("b.yaml", "optimizer: {type: sgd}")).optimizer)
    assert type(sgd) is keras.optimizers.SGD and sgd.momentum == 0


def test_clipping_and_loss_scaling_unscale_then_clip_then_step():
    """Under ``mixed_float16`` the optimizer takes gradients of the scaled loss: it divides by
    the scale, then clips the global norm, then steps; an overflow skips the step and halves
    the scale."""
    from detsweep.config import OptimizerConfig

    config = OptimizerConfig(type="sgd", learning_rate={"type": "constant", "learning_rate": 1.0})
    optimizer = build_optimizer(config, clip_norm=1.0, mixed_precision="mixed_float16")
    assert isinstance(optimizer, keras.optimizers.LossScaleOptimizer) and unwrap(optimizer).global_clipnorm == 1.0
    weights = [keras.Variable(np.zeros(2, np.float32)), keras.Variable(np.zeros(1, np.float32))]
    optimizer.build(weights)
    scale = float(optimizer.dynamic_scale.numpy())
    # a gradient of norm 5 (3, 0, 4), scaled: unscaled, clipped to norm 1, applied at rate 1
    optimizer.apply([np.array([3.0, 0.0], np.float32) * scale, np.array([4.0], np.float32) * scale], weights)
    np.testing.assert_allclose(np.concatenate([w.numpy() for w in weights]), [-0.6, 0.0, -0.8], rtol=1e-6)
    optimizer.apply([np.array([np.inf, 0.0], np.float32), np.array([4.0], np.float32)], weights)
    np.testing.assert_allclose(np.concatenate([w.numpy() for w in weights]), [-0.6, 0.0, -0.8], rtol=1e-6)
    assert float(optimizer.dynamic_scale.numpy()) == scale / 2


def test_clipping_bounds_the_global_norm_of_the_update():
    from detsweep.config import OptimizerConfig

    config = OptimizerConfig(type="sgd", learning_rate={"type": "constant", "learning_rate": 1.0})
    optimizer = build_optimizer(config, clip_norm=1.0)
    weights = [keras.Variable(np.zeros(2, np.float32)), keras.Variable(np.zeros(1, np.float32))]
    optimizer.apply([np.array([3.0, 0.0], np.float32), np.array([4.0], np.float32)], weights)
    update = np.concatenate([w.numpy() for w in weights])
    np.testing.assert_allclose(update, [-0.6, 0.0, -0.8], rtol=1e-6)
