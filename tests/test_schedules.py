"""Every schedule against the numbers of the OD API's own learning_schedules_test.py."""

import numpy as np
import pytest

from detsweep.config import LearningRateConfig, OptimizerConfig
from detsweep.optim import build_schedule


def rates(config: dict, steps) -> np.ndarray:
    return build_schedule(LearningRateConfig(**config))(np.asarray(steps)).numpy()


def test_constant():
    np.testing.assert_allclose(rates({"type": "constant", "learning_rate": 0.002}, [0, 5, 10**6]), [0.002] * 3)


def test_exponential_decay_with_burnin_and_min_rate():
    config = {
        "type": "exponential_decay", "initial_learning_rate": 1.0, "decay_steps": 3, "decay_factor": 0.1,
        "burnin_learning_rate": 0.5, "burnin_steps": 2, "min_learning_rate": 0.05,
    }
    np.testing.assert_allclose(rates(config, range(9)), [0.5, 0.5, 1, 1, 1, 0.1, 0.1, 0.1, 0.05], rtol=1e-4)


def test_exponential_decay_zero_burnin_rate_means_base_rate_and_smooth_decay():
    config = {"type": "exponential_decay", "initial_learning_rate": 1.0, "decay_steps": 2, "decay_factor": 0.5,
              "burnin_steps": 2, "staircase": False}
    np.testing.assert_allclose(rates(config, [0, 1, 2, 3, 4]), [1.0, 1.0, 1.0, 0.5**0.5, 0.5], rtol=1e-6)


def test_cosine_with_warmup_issue_example():
    config = {"type": "cosine", "learning_rate_base": 1.0, "total_steps": 100,
              "warmup_learning_rate": 0.1, "warmup_steps": 9}
    np.testing.assert_allclose(rates(config, [0, 4, 8, 9, 100]), [0.1, 0.5, 0.9, 1.0, 0.0], rtol=1e-6, atol=1e-7)


def test_cosine_after_total_steps_is_zero():
    config = {"type": "cosine", "learning_rate_base": 1.0, "total_steps": 100,
              "warmup_learning_rate": 0.1, "warmup_steps": 9}
    assert rates(config, [101, 5000]).tolist() == [0.0, 0.0]


def test_cosine_with_hold_base_rate_steps():
    config = {"type": "cosine", "learning_rate_base": 1.0, "total_steps": 120, "warmup_learning_rate": 0.1,
              "warmup_steps": 9, "hold_base_rate_steps": 20}
    steps = [0, 4, 8, 9, 10, 29, 30, 50, 70, 120]
    expected = [0.1, 0.5, 0.9, 1.0, 1.0, 1.0, 0.999702, 0.874255, 0.577365, 0.0]
    np.testing.assert_allclose(rates(config, steps), expected, rtol=1e-5, atol=1e-7)


def test_manual_stepping():
    config = {"type": "manual_step", "initial_learning_rate": 1.0,
              "schedule": [{"step": 2, "learning_rate": 2.0}, {"step": 3, "learning_rate": 3.0},
                           {"step": 7, "learning_rate": 4.0}]}
    np.testing.assert_allclose(rates(config, range(10)), [1, 1, 2, 3, 3, 3, 3, 4, 4, 4])


def test_manual_stepping_with_warmup():
    config = {"type": "manual_step", "initial_learning_rate": 0.02, "warmup": True,
              "schedule": [{"step": 4, "learning_rate": 0.10}, {"step": 6, "learning_rate": 0.01},
                           {"step": 8, "learning_rate": 0.001}]}
    expected = [0.02, 0.04, 0.06, 0.08, 0.10, 0.10, 0.01, 0.01, 0.001]
    np.testing.assert_allclose(rates(config, range(9)), expected, rtol=1e-6)


def test_manual_stepping_without_boundaries_is_constant():
    config = {"type": "manual_step", "initial_learning_rate": 0.01}
    np.testing.assert_allclose(rates(config, range(4)), [0.01] * 4)


def test_od_api_names_are_accepted_for_schedule_type():
    config = LearningRateConfig(type="cosine_decay_learning_rate", total_steps=100, warmup_steps=0)
    assert config.type == "cosine"
    assert LearningRateConfig(schedule="exponential_decay_learning_rate").type == "exponential_decay"


TWO_REPLICAS = r"""
import json, sys
from detsweep.config import OptimizerConfig
from detsweep.optim import build_optimizer

strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
config = OptimizerConfig.model_validate_json(sys.argv[1])
with strategy.scope():
    weight = tf.Variable(0.0)
    optimizer = build_optimizer(config)
    optimizer.build([weight])


@tf.function
def step():
    def replica_step():
        optimizer.apply_gradients([(tf.constant(-1.0), weight)])  # each replica: up by the lr
    strategy.run(replica_step)


seen = []
for _ in range(10):
    before = float(weight.numpy())
    step()
    seen.append(float(weight.numpy()) - before)
print(json.dumps({"seen": seen, "iterations": int(optimizer.iterations.numpy()), "traced": step.experimental_get_tracing_count()}))
"""


def test_schedule_drives_a_keras_optimizer_under_tf_distribute_inside_tf_function_two_logical_devices():
    """Two logical CPU devices stand in for two GPUs: each step the optimizer takes the
    schedule's rate at its own step count, which counts steps, not replicas' updates; Keras
    sums the replicas' gradients (which is why the train step hands it their mean)."""
    from .conftest import run_on_two_cpu_devices

    config = OptimizerConfig(type="sgd", learning_rate={"type": "cosine", "learning_rate_base": 1.0,
                                                        "total_steps": 100, "warmup_learning_rate": 0.1,
                                                        "warmup_steps": 9})
    found = run_on_two_cpu_devices(TWO_REPLICAS, config.model_dump_json())
    np.testing.assert_allclose(found["seen"], 2 * rates(config.learning_rate.model_dump(), range(10)), rtol=1e-5)
    assert (found["iterations"], found["traced"]) == (10, 1), found


@pytest.mark.parametrize("step", [0, 3, 8, 9, 50, 99, 100, 101])
def test_scalar_and_vector_steps_agree(step):
    schedule = build_schedule(LearningRateConfig(type="cosine", total_steps=100, warmup_steps=9,
                                                 learning_rate_base=1.0, warmup_learning_rate=0.1))
    assert float(schedule(step)) == float(schedule(np.arange(102))[step])
