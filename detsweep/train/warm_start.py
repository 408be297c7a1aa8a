"""Fine-tuning's first step: restore, from another training's checkpoint, what fits.

The OD API's rule (``fine_tune_checkpoint``): every weight whose name and shape match one in
the checkpoint is restored; the others keep their fresh initialisation (a new classification
head when the class count changed). One rule is stricter here: the image encoder must fit
whole. Encoders of different architectures still share a few names and shapes (batch-norm
statistics of the stem, say); restoring those scraps would be training from scratch in
disguise, so it is an error that names both encoders.

Keras 3 names weights by their layers' paths (``stack0_block0_1_conv/kernel``), and
keras-hub names its layers, so the names are the same in every build of an architecture.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tensorflow as tf

from detsweep.checkpoints import PREFIX, check_checkpoint, read_config, read_meta
from detsweep.config import TrialConfig
from detsweep.errors import DetsweepError
from detsweep.models.detector_presets import preset_trial_config

from .checkpoint import TrainingState, build_training_state


@dataclass(frozen=True)
class WarmStart:
    """What a fine-tune took from its checkpoint, by weight name."""

    restored: list[str]
    fresh: list[str]  # the model's weights that the checkpoint has not (or not in this shape)
    optimizer_restored: int  # optimizer variables restored (keep_optimizer_state), else 0
    step: int  # where training starts

    def to_dict(self) -> dict:
        return {"restored": self.restored, "fresh": self.fresh, "optimizer_restored": self.optimizer_restored,
                "step": self.step}


@dataclass(frozen=True)
class Source:
    """A checkpoint's weights by name, read into memory."""

    config: TrialConfig
    weights: dict[str, np.ndarray]
    optimizer: dict[str, np.ndarray]  # by name without the optimizer's own prefix (``sgd/``)
    optimizer_class: str  # Keras's (``SGD`` for both sgd and momentum)
    step: int


def restore_what_fits(state: TrainingState, config: TrialConfig, directory: Path | None = None) -> WarmStart:
    """Fill ``state`` from the checkpoint in ``directory`` as far as it fits (see the module's
    doc). ``directory``: a local copy of ``train.fine_tune.checkpoint``, which is the default
    when it names a folder (an MLflow source is the caller's to download)."""
    fine_tune = config.train.fine_tune
    source = read_source(directory or Path(fine_tune.checkpoint), fine_tune.from_moving_average)
    model_weights = {weight.path: weight for weight in state.model.weights}
    restored, fresh = match(source.weights, model_weights)
    check_encoder(state, restored, source, config)
    for name in restored:
        model_weights[name].assign(source.weights[name])
    optimizer_restored = 0
    if fine_tune.keep_optimizer_state:
        optimizer_restored = restore_optimizer(state, source, config.optimizer.type)
        state.step.assign(source.step)
    if state.moving_average is not None:
        state.moving_average.reset()  # averaging starts from the restored weights
    return WarmStart(restored, fresh, optimizer_restored, int(state.step.numpy()))


def plan_warm_start(config: TrialConfig, num_classes: int, directory: Path | None = None) -> WarmStart:
    """What :func:`restore_what_fits` will do in the workers, done once here first, so that a
    checkpoint that does not fit fails before anything starts."""
    state, _ = build_training_state(preset_trial_config(config), num_classes)
    return restore_what_fits(state, config, directory)


def match(source: dict[str, np.ndarray], model_weights: dict) -> tuple[list[str], list[str]]:
    restored = [name for name, weight in model_weights.items()
                if name in source and tuple(source[name].shape) == tuple(weight.shape)]
    taken = set(restored)
    return restored, [name for name in model_weights if name not in taken]


def check_encoder(state: TrainingState, restored: list[str], source: Source, config: TrialConfig) -> None:
    encoder = [weight.path for weight in state.model.backbone.image_encoder.weights]
    fitting = len(set(encoder) & set(restored))
    if fitting < len(encoder):
        raise DetsweepError(
            f"train.fine_tune.checkpoint: the checkpoint's image encoder ({_encoder_name(source.config)}) "
            f"does not fit this model's ({_encoder_name(config)}): "
            f"{fitting} of its {len(encoder)} weights match by name and shape; expected the same encoder "
            "(model.backbone / model.weights)")


def _encoder_name(config: TrialConfig) -> str:
    return config.model.weights if config.model.weights != "none" else config.model.backbone


def restore_optimizer(state: TrainingState, source: Source, optimizer_type: str) -> int:
    """The optimizer's slots and iteration count, when the source trained with the same optimizer."""
    ours = state.optimizer.__class__.__name__
    if source.optimizer_class != ours:
        raise DetsweepError(
            f"train.fine_tune.keep_optimizer_state: the checkpoint was trained with {source.optimizer_class} "
            f"(optimizer.type {source.config.optimizer.type}), this config builds {ours} (optimizer.type "
            f"{optimizer_type}); expected the same optimizer, or keep_optimizer_state false")
    count = 0
    for variable in state.optimizer.variables:
        value = source.optimizer.get(_unprefixed(variable.path))
        if value is not None and tuple(value.shape) == tuple(variable.shape):
            variable.assign(value)
            count += 1
    return count


def read_source(directory: Path, from_moving_average: bool) -> Source:
    """The checkpoint's model (averaged, if asked) and optimizer, built on the CPU and read."""
    check_checkpoint(directory, "train.fine_tune.checkpoint")
    config = read_config(directory)
    meta = read_meta(directory)
    with tf.device("CPU:0"):  # a passing copy: keep it off the accelerator the training uses
        state, _ = build_training_state(config, config.model.num_classes or len(meta["categories"]))
        state.checkpoint.read(str(directory / PREFIX)).expect_partial()
        if from_moving_average:
            if state.moving_average is None:
                raise DetsweepError(f"train.fine_tune.from_moving_average: {directory} has no moving averages "
                                    "(its optimizer.use_moving_average was false); expected false here")
            state.moving_average.swap()
        weights = {weight.path: weight.numpy() for weight in state.model.weights}
        optimizer = {_unprefixed(variable.path): variable.numpy() for variable in state.optimizer.variables}
    return Source(config, weights, optimizer, state.optimizer.__class__.__name__, meta["step"])


def _unprefixed(path: str) -> str:
    return path.split("/", 1)[-1]
