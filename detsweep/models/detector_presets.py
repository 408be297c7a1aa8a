"""A whole keras-hub detector as ``model.weights``: the OD API's ``fine_tune_checkpoint_type: detection``.

A RetinaNetObjectDetector preset (keras-hub's ``retinanet_resnet50_fpn_coco``, or a folder its
``save_to_preset`` wrote) starts a trial from the whole detector: its image encoder, feature
pyramid and box head, and its class head when the trial has the preset's number of classes.
For another number the class head starts fresh, as a new detector's does. (A backbone's preset
stays the OD API's ``classification`` checkpoint: the encoder only, :mod:`.backbones`.)

keras-hub's own ``from_preset(..., num_classes=n)`` would start both heads fresh: ``Task.from_preset``
loads no task weights whenever ``num_classes`` is given, only the backbone's. Here the task
weights are loaded after it, the class head left out only when its shape changed.

The preset's architecture wins over the model section (:func:`preset_model_config`, applied to
a whole trial config at each process edge by :func:`preset_trial_config`), and
:func:`preset_overrides` says in one line what it replaced. Everything that only trains (losses,
matcher thresholds, regularisation, NMS, batch norm) stays the config's.
"""

from __future__ import annotations

import os
from typing import Any

import keras
import keras_hub
import numpy as np
from pydantic import ValidationError

from detsweep.adapters import keras_hub as hub
from detsweep.adapters.keras import load_weights_except
from detsweep.config import ModelConfig, TrialConfig
from detsweep.config.loader import describe
from detsweep.errors import DetsweepError

from .detector_parts import anchor_generator, finish_detector, label_encoder, start_heads

Normalisation = tuple[tuple[float, float, float], tuple[float, float, float]]

# The model section's fields a RetinaNet preset fixes: what its weights were trained for.
ARCHITECTURE = ("image_size", "image_resizer", "min_level", "max_level", "anchor_size", "scales_per_octave",
                "aspect_ratios", "head_conv_layers", "box_coder_scales")
# The one box code keras-hub's RetinaNet decodes (``decode_predictions``), whatever its encoder says.
BOX_CODE = "center_xywh"


def is_detector_preset(weights: str) -> bool:
    """``weights`` names a whole keras-hub detector (any ObjectDetector): a name in keras-hub's
    registry of detector presets, or a folder, ``kaggle://`` or ``hf://`` handle whose ``task.json``
    is a detector's. A handle's ``task.json`` is downloaded to know (keras-hub caches it for the
    load that follows); ``none``, a backbone's preset and a path that is no folder are not one."""
    if weights == "none":
        return False
    if weights in keras_hub.models.ObjectDetector.presets:
        return True
    if "://" not in weights and not os.path.isdir(weights):
        return False
    task = saved_task_class(weights)
    return task is not None and issubclass(task, keras_hub.models.ObjectDetector)


def names_a_detector_here(weights: str) -> bool:
    """:func:`is_detector_preset`, as far as this machine can answer it: a registry name, a folder
    here, or a handle whose ``task.json`` can be downloaded here (False when it cannot be read:
    :func:`~.presets.architecture_note` says so)."""
    if weights in keras_hub.models.ObjectDetector.presets:
        return True
    if "://" in weights:
        try:
            return is_detector_preset(weights)
        except Exception:  # no network here: the workers' download will tell
            return False
    return os.path.isdir(weights) and is_detector_preset(weights)


def saved_task_class(weights: str) -> type | None:
    """The class of the task saved with a folder's or handle's preset (its ``task.json``), as
    keras-hub reads it; None when only a backbone was saved."""
    if not hub.preset_has_file(weights, hub.TASK_CONFIG_FILE):
        return None
    return hub.config_class(hub.preset_json(weights, hub.TASK_CONFIG_FILE))


def check_retinanet_preset(weights: str, field: str) -> None:
    """Refuse, in one line, a detector preset of another kind than RetinaNet (keras-hub's D-FINE):
    detsweep's heads, anchors and losses are RetinaNet's."""
    if weights in keras_hub.models.ObjectDetector.presets:
        kinds = [cls for cls in hub.subclasses(keras_hub.models.ObjectDetector) if weights in cls.presets]
    else:
        kinds = [saved_task_class(weights)]
    if not any(issubclass(kind, keras_hub.models.RetinaNetObjectDetector) for kind in kinds):
        raise DetsweepError(f"{field}: found {weights!r}, a preset of {kinds[0].__name__}; expected a "
                            "RetinaNetObjectDetector's (e.g. retinanet_resnet50_fpn_coco) or an image encoder's")


# --- the preset's architecture ------------------------------------------------------------------

def preset_trial_config(config: TrialConfig, field: str = "model.weights") -> TrialConfig:
    """``config`` with :func:`preset_model_config`'s model section, validated whole again: the
    preset's resizer meets the config's augmentations there. ``config`` itself when
    ``model.weights`` is no detector's preset. What does not fit is one line naming ``field``."""
    model = preset_model_config(config.model, field)
    if model is config.model:
        return config
    tree = {**config.model_dump(exclude_unset=True), "model": model.model_dump(exclude_unset=True)}
    try:
        return TrialConfig.model_validate(tree)
    except ValidationError as error:
        where = describe(error, TrialConfig, "", {}).removeprefix(": ")
        raise DetsweepError(f"{field}: found {config.model.weights!r}, a preset whose architecture the rest of "
                            f"the config cannot take ({where})") from None


def preset_model_config(config: ModelConfig, field: str = "model.weights") -> ModelConfig:
    """``config`` with a whole-detector preset's architecture (:data:`ARCHITECTURE`) in place of its
    own; ``config`` itself when ``config.weights`` is no detector's preset. The fields set are the
    user's and the preset's. The preset's image size is rounded to the nearest multiple of
    ``2 ** max_level``, as the anchors need (keras-hub's stride is ``size // ceil(size / 2 ** level)``).
    A preset the model section cannot hold is refused in one line naming ``field``."""
    if not is_detector_preset(config.weights):
        return config
    check_retinanet_preset(config.weights, field)
    check_box_code(config.weights, field)
    fitted = fit_image_size(preset_architecture(config.weights))
    # the preset's normalisation, ImageNet's (None) included: what its weights were trained on
    fitted["image_mean"], fitted["image_std"] = preset_normalisation(config.weights) or (None, None)
    try:
        return ModelConfig.model_validate({**config.model_dump(exclude_unset=True), **fitted})
    except ValidationError as error:
        first = error.errors()[0]
        where = f"model.{'.'.join(map(str, first['loc']))} {first['input']!r}: " if first["loc"] else ""
        raise DetsweepError(f"{field}: found {config.weights!r}, a preset whose architecture detsweep's model "
                            f"section cannot hold ({where}{first['msg']})") from None


def preset_overrides(config: ModelConfig, replaced: ModelConfig | None = None) -> str | None:
    """The one line a trial says when a whole-detector preset replaces model fields the user set
    with other values (each as ``field user's → preset's``), or rounded the preset's image size;
    None otherwise. Give it the user's config, not :func:`preset_model_config`'s, which a caller
    that has it already passes as ``replaced``."""
    if not is_detector_preset(config.weights):
        return None
    found = preset_architecture(config.weights)
    replaced = replaced or preset_model_config(config)
    changes = []
    for name in ARCHITECTURE:
        mine, theirs = getattr(config, name), getattr(replaced, name)
        rounded = name == "image_size" and found.get(name, theirs) != theirs
        if rounded or (name in config.model_fields_set and not _same(mine, theirs)):
            why = f" (the preset's {found[name]}, rounded to a multiple of {2 ** replaced.max_level})" if rounded else ""
            changes.append(f"model.{name} {mine} → {theirs}{why}")
    said = [f"the preset {config.weights}'s architecture replaces " + "; ".join(changes)] if changes else []
    converter = preset_image_converter(config.weights)
    if converter is not None and converter_resizer(converter) is None:
        said.append(f"the preset {config.weights}'s image converter crops the picture to the square, which "
                    f"detsweep never does: model.image_resizer stays {config.image_resizer}")
    return "model.weights: " + "; ".join(said) if said else None


def preset_architecture(weights: str) -> dict[str, Any]:
    """The :data:`ARCHITECTURE` fields as a RetinaNet preset has them: from its ``task.json`` (keras-hub's
    defaults where an older preset left one out) and ``image_size`` from its image converter, else
    its fixed input; no ``image_size`` when it fixes neither."""
    task = hub.preset_json(weights, hub.TASK_CONFIG_FILE)["config"]
    backbone = task["backbone"]["config"]
    anchors = task.get("anchor_generator", {}).get("config", {})
    # keras-hub's variance divides the center_xywh code; detsweep's box coder scales multiply y, x, h, w
    x, y, width, height = task.get("label_encoder", {}).get("config", {}).get("box_variance", [1.0] * 4)
    found = {"min_level": backbone["min_level"], "max_level": backbone["max_level"],
             "anchor_size": float(anchors.get("anchor_size", 4.0)), "scales_per_octave": anchors.get("num_scales", 3),
             # keras-hub's ratio is height / width, the config's width / height
             "aspect_ratios": tuple(1 / ratio for ratio in anchors.get("aspect_ratios", (0.5, 1.0, 2.0))),
             "head_conv_layers": task.get("pre_logits_num_conv_layers", 4),
             "box_coder_scales": (1 / y, 1 / x, 1 / height, 1 / width)}
    converter = preset_image_converter(weights)
    sizes = (converter.image_size if converter is not None else None) or backbone.get("image_shape", [None])[:2]
    if None not in sizes:
        found["image_size"] = max(sizes)  # the longer side: detsweep's input is a square
    resizer = converter_resizer(converter) if converter is not None else None
    if resizer is not None:
        found["image_resizer"] = resizer
    return found


def converter_resizer(converter: keras.layers.Layer) -> str | None:
    """``model.image_resizer`` as a keras-hub image converter resizes: padded to its aspect ratio is
    ``keep_aspect_ratio`` (the OD API's ``pad_to_max_dimension``, the padding centred there, at the
    bottom and right here), neither padded nor cropped is ``fixed_shape``; None for a crop, which
    no OD API resizer does (it would cut boxes off)."""
    if converter.pad_to_aspect_ratio:
        return "keep_aspect_ratio"
    return None if converter.crop_to_aspect_ratio else "fixed_shape"


def check_box_code(weights: str, field: str) -> None:
    """Refuse, in one line, a preset whose label encoder codes boxes otherwise than keras-hub's
    RetinaNet decodes them (:data:`BOX_CODE`): its box head was trained to another code."""
    task = hub.preset_json(weights, hub.TASK_CONFIG_FILE)["config"]
    code = task.get("label_encoder", {}).get("config", {}).get("encoding_format", BOX_CODE)
    if code != BOX_CODE:
        raise DetsweepError(f"{field}: found {weights!r}, a preset whose label encoder codes boxes as {code}; "
                            f"expected {BOX_CODE}, the code keras-hub's RetinaNet decodes")


def fit_image_size(found: dict[str, Any]) -> dict[str, Any]:
    """``found`` with its image size rounded to the nearest multiple of ``2 ** max_level``."""
    if "image_size" not in found:
        return found
    stride = 2 ** found["max_level"]
    return {**found, "image_size": max(1, int(found["image_size"] / stride + 0.5)) * stride}


def preset_num_classes(weights: str) -> int:
    """How many classes the preset's class head predicts."""
    return hub.preset_json(weights, hub.TASK_CONFIG_FILE)["config"]["num_classes"]


def _same(mine: Any, theirs: Any) -> bool:
    # the box coder's scales come back as 1 / (1 / scale): equal within float rounding
    return np.shape(mine) == np.shape(theirs) and bool(np.allclose(mine, theirs, rtol=1e-6, atol=0.0))


# --- the preset's normalisation -----------------------------------------------------------------

def preset_image_converter(weights: str) -> keras.layers.Layer | None:
    """The image converter a task preset was saved with, as keras-hub loads it (its
    ``preprocessor.json``, else ``image_converter.json``); None when it has neither."""
    saved = (hub.PREPROCESSOR_CONFIG_FILE, hub.IMAGE_CONVERTER_CONFIG_FILE)
    if not any(hub.preset_has_file(weights, name) for name in saved):
        return None
    return hub.saved_image_converter(weights, keras_hub.models.RetinaNetObjectDetectorPreprocessor)


def preset_normalisation(weights: str) -> Normalisation | None:
    """``(mean, std)`` in 0..255 pixel units such that ``(pixel - mean) / std`` is the preset's image
    converter's ``pixel * scale + offset``; None when that is ImageNet's (detsweep's default,
    ``detsweep.data.processing.MEAN``/``STD``), or the preset saved no converter."""
    from detsweep.data.processing import MEAN, STD

    converter = preset_image_converter(weights) if is_detector_preset(weights) else None
    if converter is None:
        return None
    scale = np.broadcast_to(np.asarray(1.0 if converter.scale is None else converter.scale, np.float64), 3)
    offset = np.broadcast_to(np.asarray(0.0 if converter.offset is None else converter.offset, np.float64), 3)
    if not np.all(scale):
        raise DetsweepError(f"model.weights: found {weights!r}, a preset whose image converter scales by "
                            f"{converter.scale}; expected a scale that is not zero")
    mean, std = tuple(float(v) + 0.0 for v in -offset / scale), tuple(float(v) for v in 1 / scale)  # + 0.0: no -0.0
    if np.allclose(mean, MEAN, rtol=1e-5) and np.allclose(std, STD, rtol=1e-5):
        return None
    return mean, std


# --- the detector -------------------------------------------------------------------------------

def build_detector_from_preset(config: ModelConfig, num_classes: int) -> keras_hub.models.RetinaNetObjectDetector:
    """The preset's whole detector for ``num_classes``: every weight the preset's, but the class head's
    when ``num_classes`` is not the preset's (a new head then, started as ``build_retinanet`` starts
    one). ``config`` holds the preset's architecture already (:func:`preset_trial_config`, at the
    process's edge); boxes are ``yxyx`` whatever format the preset was saved in, and what only
    trains (matcher, regularisation, batch norm, NMS) is the config's, as ``build_retinanet``
    applies it. The detector is used as ``build_retinanet``'s."""
    anchors = anchor_generator(config)
    # keras-hub loads the backbone's weights (encoder and pyramid) and builds both heads fresh
    detector = keras_hub.models.RetinaNetObjectDetector.from_preset(
        config.weights, num_classes=num_classes, image_shape=(config.image_size, config.image_size, 3),
        bounding_box_format="yxyx", anchor_generator=anchors, label_encoder=label_encoder(config, anchors),
        preprocessor=None,
    )
    new_class_head = num_classes != preset_num_classes(config.weights)
    load_head_weights(detector, config.weights, class_head=not new_class_head)
    if new_class_head:
        start_heads(config, detector.classification_head)
    return finish_detector(detector, config)


def load_head_weights(detector: keras_hub.models.RetinaNetObjectDetector, weights: str, class_head: bool) -> None:
    """The preset's task weights (its heads) into ``detector``, the class head's only when
    ``class_head``: keras-hub's ``Task.load_task_weights``, which leaves out the backbone's
    layers, leaving out the class head's too."""
    kept = [detector.backbone] if class_head else [detector.backbone, detector.classification_head]
    load_weights_except(detector, hub.preset_file(weights, hub.TASK_WEIGHTS_FILE), kept)
