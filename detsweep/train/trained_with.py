"""What a training was built with, read back from the built objects, against what its sweep sampled.

Ultralytics' Ray Tune integration trained every trial alike for months: the sampled values
never reached the trainer, and nothing looked (ultralytics#23791). Here a training reads back,
from the objects it built (the optimizer and the learning rate it holds, the moving average,
the input pipeline's augmentation steps), the settings they carry, named by the config's
dotted paths (:func:`trained_with`); its first report carries them as ``trained_with.json``, and
a trial fails at its start, in one line, when they differ from its sampled values
(:func:`check_as_sampled`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple, get_args

import keras
from pydantic import BaseModel

from detsweep.config.schema import DEFAULT_EPSILON, OPTIMIZER_ALIASES, SCHEDULE_ALIASES, DecodedImageStep
from detsweep.data.augment import Augmentations
from detsweep.optim import MovingAverage, unwrap
from detsweep.optim.schedules import (
    ConstantLearningRate,
    CosineDecayWithWarmup,
    ExponentialDecayWithBurnin,
    ManualStepping,
)

TRAINED_WITH_FILE = "trained_with.json"  # in the run's first report: what trained_with read back


class Setting(NamedTuple):
    """A config path's value as a built object holds it, and where it was read (``SGD momentum``)."""

    value: Any
    read_from: str


class NotAsSampled(RuntimeError):
    """A training built something other than what its sweep sampled: a sampled value was not
    applied (a bug, not the user's mistake). The message is one line, every difference in it."""


def trained_with(optimizer: keras.optimizers.Optimizer, moving_average: MovingAverage | None,
                 augmentations: Augmentations, replicas: int) -> dict[str, Setting]:
    """The settings of a training's built objects by the config's dotted paths: the optimizer's
    type (by its Keras class) and own hyperparameters, global clipping (times the ``replicas``
    it is shared by); the learning rate the optimizer holds (its schedule's class and
    arguments); the moving average (or none); every augmentation as the pipeline built it."""
    return (optimizer_settings(optimizer, replicas) | learning_rate_settings(optimizer)
            | moving_average_settings(moving_average) | augmentation_settings(augmentations))


# Keras's class → optimizer.type (SGD is two: :func:`optimizer_type`), and each type's own
# hyperparameters, Keras's name → the config's (the fields other types ignore: sweeps/space.py).
OPTIMIZER_TYPES = {keras.optimizers.Adam: "adam", keras.optimizers.AdamW: "adamw", keras.optimizers.RMSprop: "rms_prop"}
HYPERPARAMETERS = {
    "momentum": {"momentum": "momentum_optimizer_value"},
    "adam": {"epsilon": "epsilon"},
    "adamw": {"epsilon": "epsilon", "weight_decay": "weight_decay"},
    "rms_prop": {"rho": "decay", "momentum": "momentum_optimizer_value", "epsilon": "epsilon"},
}


def optimizer_settings(optimizer: keras.optimizers.Optimizer, replicas: int) -> dict[str, Setting]:
    """``optimizer.type`` and the type's own hyperparameters, from the optimizer inside any loss
    scaling; ``train.gradient_clipping_by_norm`` (0: none)."""
    inner = unwrap(optimizer)
    name, held = type(inner).__name__, inner.get_config()
    kind = optimizer_type(inner)
    settings = {"optimizer.type": Setting(kind, name)}
    settings |= {f"optimizer.{field}": Setting(held[key], f"{name} {key}")
                 for key, field in HYPERPARAMETERS.get(kind, {}).items()}
    # build_optimizer gives each replica its share of the clipping norm (optim/optimizers.py)
    settings["train.gradient_clipping_by_norm"] = Setting((held["global_clipnorm"] or 0.0) * replicas,
                                                          f"{name} global_clipnorm x {replicas} replica(s)")
    return settings


def optimizer_type(optimizer: keras.optimizers.Optimizer) -> str:
    """The ``optimizer.type`` a Keras optimizer is: SGD with momentum ``momentum``, without it
    ``sgd``; a class detsweep never builds, its own name."""
    if type(optimizer) is keras.optimizers.SGD:
        return "momentum" if optimizer.momentum > 0 else "sgd"
    return OPTIMIZER_TYPES.get(type(optimizer), type(optimizer).__name__)


SCHEDULE_TYPES = {ConstantLearningRate.__name__: "constant", ExponentialDecayWithBurnin.__name__: "exponential_decay",
                  CosineDecayWithWarmup.__name__: "cosine", ManualStepping.__name__: "manual_step"}


def learning_rate_settings(optimizer: keras.optimizers.Optimizer) -> dict[str, Setting]:
    """``optimizer.learning_rate.*`` of the rate the optimizer holds, as Keras serialises it: a
    schedule's class and arguments (the three OD API schedules' arguments are the config's
    fields), or a number (a constant rate)."""
    rate = unwrap(optimizer).get_config()["learning_rate"]
    if not isinstance(rate, Mapping):
        return _prefixed("optimizer.learning_rate", {"type": Setting("constant", "a fixed learning rate"),
                                                     "learning_rate": Setting(rate, "the optimizer's learning_rate")})
    held, arguments = rate["class_name"], rate["config"]
    kind = SCHEDULE_TYPES.get(held, held)
    settings = {"type": Setting(kind, held)}
    if kind == "manual_step":
        rates = arguments["rates"]
        steps = [{"step": step, "learning_rate": value} for step, value in zip(arguments["boundaries"], rates[1:])]
        settings |= {"initial_learning_rate": Setting(rates[0], f"{held} rates[0]"),
                     "schedule": Setting(steps, f"{held} boundaries and rates"),
                     "warmup": Setting(arguments["warmup"], f"{held} warmup")}
    elif held in SCHEDULE_TYPES:  # another class's arguments need not mean what the config's fields do
        settings |= {key: Setting(value, f"{held} {key}") for key, value in arguments.items()}
    return _prefixed("optimizer.learning_rate", settings)


def moving_average_settings(moving_average: MovingAverage | None) -> dict[str, Setting]:
    if moving_average is None:
        return {"optimizer.use_moving_average": Setting(False, "no MovingAverage")}
    return {"optimizer.use_moving_average": Setting(True, "MovingAverage"),
            "optimizer.moving_average_decay": Setting(moving_average.decay, "MovingAverage decay"),
            "optimizer.moving_average_dynamic_decay": Setting(moving_average.dynamic, "MovingAverage dynamic")}


JITTER = "random_scale_crop_and_pad_to_square"  # the one augmentation on the resized image


def augmentation_settings(augmentations: Augmentations) -> dict[str, Setting]:
    """Every augmentation a config can set, from the steps the pipeline built: a step's section
    as its fields, the flip's probability (0: none), a step not built as None."""
    built = {step.name: step.setting for step in augmentations.decoded} | {JITTER: augmentations.scale_jitter}
    settings: dict[str, Setting] = {}
    for name in (*get_args(DecodedImageStep), JITTER):
        setting = built.get(name)
        held = f"the pipeline's {name} step" if setting is not None else f"no {name} step in the pipeline"
        if isinstance(setting, BaseModel):
            settings |= {f"{name}.{key}": Setting(value, held) for key, value in setting.model_dump().items()}
        else:
            settings[name] = Setting(0.0 if name == "random_horizontal_flip" and setting is None else setting, held)
    return _prefixed("data.augmentation", settings)


def _prefixed(prefix: str, settings: dict[str, Setting]) -> dict[str, Setting]:
    return {f"{prefix}.{path}": setting for path, setting in settings.items()}


def trained_with_json(built: Mapping[str, Setting]) -> bytes:
    """``trained_with.json``: each path's value, sorted by path."""
    return json.dumps({path: built[path].value for path in sorted(built)}, indent=1).encode()


def check_as_sampled(sampled: Mapping[str, Any], built: Mapping[str, Setting]) -> None:
    """Raises :class:`NotAsSampled` when a value the sweep sampled (dotted path → value) is not
    what the training built (:func:`trained_with`), in one line, each difference as
    ``optimizer.momentum_optimizer_value: sampled 0.95, but the trial built 0.9 (SGD momentum)``
    and joined by ``; ``.

    Compared: every sampled path the read-back covers: a path it holds; a field of an
    augmentation step it did not build (which then differs: setting a field sets the step); a
    section sampled whole, field by field (``{}``: the step is on). Numbers agree within a
    relative 1e-6 (a float32 variable reads 0.004 back as 0.004000000189989805); type names by
    the config's aliases; an unset epsilon as the built type's default.

    Not compared: what no built object here holds: ``train.num_steps``, ``model.*`` (the network
    is not read back), ``data.augmentation.order``, and the fields of an optimizer or schedule
    type other than the one built (they do not apply to it). A ``momentum`` optimizer with
    momentum 0 is plain SGD and reads back as ``sgd``: such a trial fails here.
    """
    differences = [line for path, value in sampled.items() for line in _differences(path, value, built)]
    if differences:
        raise NotAsSampled("; ".join(differences))


def _differences(path: str, value: Any, built: Mapping[str, Setting]) -> Iterator[str]:
    if isinstance(value, Mapping) and value:  # a section sampled whole: each field
        for key, item in value.items():
            yield from _differences(f"{path}.{key}", item, built)
        return
    path, value = _in_config_terms(path, value, built)
    held = _built_at(path, built)
    if held is not None and not _agrees(value, held.value):
        yield f"{path}: sampled {_show(value)}, but the trial built {_show(held.value)} ({held.read_from})"


def _in_config_terms(path: str, value: Any, built: Mapping[str, Setting]) -> tuple[str, Any]:
    """A sampled value as validation reads it: a type's alias as its name, ``schedule: cosine`` as
    the schedule's type, an unset epsilon as the built optimizer type's default."""
    if path == "optimizer.learning_rate.schedule" and isinstance(value, str):
        path = "optimizer.learning_rate.type"
    aliases = {"optimizer.type": OPTIMIZER_ALIASES, "optimizer.learning_rate.type": SCHEDULE_ALIASES}.get(path, {})
    if isinstance(value, str):
        value = aliases.get(value, value)
    if path == "optimizer.epsilon" and value is None and "optimizer.type" in built:
        value = DEFAULT_EPSILON.get(built["optimizer.type"].value)
    return path, value


def _built_at(path: str, built: Mapping[str, Setting]) -> Setting | None:
    """What the read-back holds for ``path``: its value; a section's fields as a mapping; the
    None of an augmentation step not built, for any field of it; None where it holds nothing."""
    if path in built:
        return built[path]
    fields = {key[len(path) + 1:]: setting for key, setting in built.items() if key.startswith(path + ".")}
    if fields:
        return Setting({key: setting.value for key, setting in fields.items()}, next(iter(fields.values())).read_from)
    section = path.rpartition(".")[0]
    while section:
        if section in built and built[section].value is None:
            return built[section]
        section = section.rpartition(".")[0]
    return None


def _agrees(sampled: Any, built: Any) -> bool:
    if isinstance(sampled, bool) or isinstance(built, bool):
        return isinstance(sampled, bool) and isinstance(built, bool) and sampled == built
    if isinstance(sampled, (int, float)) and isinstance(built, (int, float)):
        return math.isclose(sampled, built, rel_tol=1e-6)
    if isinstance(sampled, Mapping):  # a section: the fields sampled (the others keep their defaults)
        return isinstance(built, Mapping) and all(key in built and _agrees(item, built[key])
                                                  for key, item in sampled.items())
    if isinstance(sampled, (list, tuple)):
        return (isinstance(built, (list, tuple)) and len(sampled) == len(built)
                and all(_agrees(mine, theirs) for mine, theirs in zip(sampled, built)))
    return sampled == built


def _show(value: Any) -> str:
    """As written in a config, unless too long for the one line."""
    shown = repr(value)
    if isinstance(value, (Mapping, list, tuple)) and len(shown) > 60:
        return "a mapping" if isinstance(value, Mapping) else "a list"
    return shown
