"""Fine-tuning's start without Ray: what a new model takes from another training's checkpoint.

The source checkpoint is a quickstart model whose weights, averages, optimizer slots and
step are set to known random values, so every restored number can be traced to it.
"""

from __future__ import annotations

import numpy as np
import pytest

from detsweep.config import load_trial_config
from detsweep.data import Category
from detsweep.errors import DetsweepError
from detsweep.train.checkpoint import build_training_state
from detsweep.train.warm_start import plan_warm_start, restore_what_fits

from .conftest import REPO

QUICKSTART = REPO / "configs" / "quickstart.yaml"
CLASS_HEAD = "classification_head/logits_layer/kernel"


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A saved training at step 40 with 3 classes; returns (directory, weights, averages, slots) by name."""
    config = load_trial_config(QUICKSTART)
    state, _ = build_training_state(config, 3)
    rng = np.random.default_rng(0)
    for variable in [*state.model.weights, *state.moving_average.averages, *state.optimizer.variables]:
        value = variable.numpy()
        if np.issubdtype(value.dtype, np.floating):
            variable.assign(rng.normal(size=value.shape).astype(value.dtype))
    state.step.assign(40)
    state.optimizer.iterations.assign(40)
    directory = state.save(tmp_path_factory.mktemp("source") / "checkpoint", config,
                           [Category(1, "circle"), Category(2, "square"), Category(3, "triangle")])
    averages = dict(zip((w.path for w in state.moving_average._weights), (a.numpy() for a in state.moving_average.averages)))
    return (directory, {w.path: w.numpy() for w in state.model.weights}, averages,
            {v.path.split("/", 1)[1]: v.numpy() for v in state.optimizer.variables})


def fine_tune_config(directory, *overrides: str):
    return load_trial_config(QUICKSTART, [f"train.fine_tune.checkpoint={directory}", *overrides])


def test_a_new_class_count_keeps_everything_but_the_classification_logits(source):
    directory, weights, _, _ = source
    config = fine_tune_config(directory, "model.num_classes=5")
    state, _ = build_training_state(config, 5)
    fresh_head = state.model.get_layer("classification_head").weights[-2].numpy().copy()
    done = restore_what_fits(state, config)

    assert set(done.fresh) == {CLASS_HEAD, "classification_head/logits_layer/bias"}
    assert len(done.restored) == len(state.model.weights) - 2
    for weight in state.model.weights:
        if weight.path in done.restored:
            np.testing.assert_array_equal(weight.numpy(), weights[weight.path])
    head = next(w for w in state.model.weights if w.path == CLASS_HEAD)
    assert head.shape[-1] == 5 * 9 and np.array_equal(head.numpy(), fresh_head)  # 9 anchors × 5 classes, untouched
    # a fresh optimizer at step 0, and averages that start from the restored weights
    assert done.step == 0 and int(state.optimizer.iterations.numpy()) == 0 and done.optimizer_restored == 0
    for weight, average in zip(state.moving_average._weights, state.moving_average.averages):
        np.testing.assert_array_equal(average.numpy(), weight.numpy())


def test_from_moving_average_starts_from_the_averaged_weights(source):
    directory, weights, averages, _ = source
    config = fine_tune_config(directory, "train.fine_tune.from_moving_average=true")
    state, _ = build_training_state(config, 3)
    done = restore_what_fits(state, config)
    assert done.fresh == []
    kernel = next(w for w in state.model.weights if w.path == "conv1_conv/kernel")
    np.testing.assert_array_equal(kernel.numpy(), averages["conv1_conv/kernel"])
    assert not np.array_equal(kernel.numpy(), weights["conv1_conv/kernel"])


def test_keep_optimizer_state_keeps_the_slots_and_the_step(source):
    directory, _, _, slots = source
    config = fine_tune_config(directory, "train.fine_tune.keep_optimizer_state=true")
    state, _ = build_training_state(config, 3)
    done = restore_what_fits(state, config)
    assert done.step == 40 and int(state.step.numpy()) == 40 and int(state.optimizer.iterations.numpy()) == 40
    momentum = [v for v in state.optimizer.variables if v.path.endswith("_momentum")]
    assert done.optimizer_restored >= len(momentum) > 0
    for variable in momentum:
        np.testing.assert_array_equal(variable.numpy(), slots[variable.path.split("/", 1)[1]])


def test_checkpoints_that_do_not_fit_are_refused_with_the_reason(source, tmp_path):
    directory, _, _, _ = source
    other_encoder = fine_tune_config(directory, "model.backbone=resnet18")
    with pytest.raises(DetsweepError, match=r"^train\.fine_tune\.checkpoint: the checkpoint's image encoder "
                                            r"\(resnet_tiny\) does not fit this model's \(resnet18\): \d+ of its \d+ weights"):
        plan_warm_start(other_encoder, 3)

    other_optimizer = fine_tune_config(directory, "optimizer.type=adam", "train.fine_tune.keep_optimizer_state=true")
    with pytest.raises(DetsweepError, match=r"trained with SGD \(optimizer.type momentum\), this config builds Adam"):
        plan_warm_start(other_optimizer, 3)

    with pytest.raises(DetsweepError, match=rf"^train\.fine_tune\.checkpoint: {tmp_path} is not a detsweep checkpoint"):
        plan_warm_start(fine_tune_config(tmp_path), 3)
