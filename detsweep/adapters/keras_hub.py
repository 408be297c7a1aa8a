"""keras-hub's undocumented parts (keras-hub 0.32): how it reads a preset, and RetinaNet's label
encoder, which it does not export.

keras-hub documents ``from_preset`` and ``save_to_preset``, not the files a preset holds nor the
loader that reads them (``keras_hub/src/utils/preset_utils.py``). detsweep reads presets as
keras-hub reads them, on the driver before any compute starts, to refuse one it cannot train
from in one line (``models/presets.py``) and to say what a whole detector's architecture
replaces (``models/detector_presets.py``).
"""

from __future__ import annotations

from typing import Any

import keras
from keras_hub.src.models.retinanet.retinanet_label_encoder import RetinaNetLabelEncoder
from keras_hub.src.utils import preset_utils

__all__ = ["CONFIG_FILE", "IMAGE_CONVERTER_CONFIG_FILE", "MODEL_WEIGHTS_FILE", "PREPROCESSOR_CONFIG_FILE",
           "SHARDED_MODEL_WEIGHTS_CONFIG_FILE", "TASK_CONFIG_FILE", "TASK_WEIGHTS_FILE", "RetinaNetLabelEncoder",
           "backbone_class", "config_class", "preset_file", "preset_has_file", "preset_json", "saved_image_converter",
           "subclasses"]

# The files of a preset folder, by keras-hub's names for them.
CONFIG_FILE = preset_utils.CONFIG_FILE  # the backbone's config
TASK_CONFIG_FILE = preset_utils.TASK_CONFIG_FILE  # the task's (a whole detector's), when one was saved
MODEL_WEIGHTS_FILE = preset_utils.MODEL_WEIGHTS_FILE  # the backbone's weights
SHARDED_MODEL_WEIGHTS_CONFIG_FILE = preset_utils.SHARDED_MODEL_WEIGHTS_CONFIG_FILE  # or their shards' index
TASK_WEIGHTS_FILE = preset_utils.TASK_WEIGHTS_FILE  # the task's own weights (a detector's heads)
PREPROCESSOR_CONFIG_FILE = preset_utils.PREPROCESSOR_CONFIG_FILE
IMAGE_CONVERTER_CONFIG_FILE = preset_utils.IMAGE_CONVERTER_CONFIG_FILE


def preset_file(preset: str, name: str) -> str:
    """A local path to the preset's file ``name``: the folder's own, or a registry name's or
    handle's, downloaded into keras-hub's cache (where the workers on this node find it)."""
    return preset_utils.get_file(preset, name)


def preset_has_file(preset: str, name: str) -> bool:
    return preset_utils.check_file_exists(preset, name)


def preset_json(preset: str, name: str = CONFIG_FILE) -> dict[str, Any]:
    return preset_utils.load_json(preset, name)


def config_class(config: dict[str, Any]) -> type:
    """The class a saved config (``config.json``, ``task.json``) names, as keras-hub resolves it."""
    return preset_utils.check_config_class(config)


def backbone_class(preset: str) -> type:
    """The class of the preset's backbone, by the loader keras-hub picks for it (a converted
    Transformers or timm checkpoint too); ``ValueError`` or ``KeyError`` when it cannot read it."""
    return preset_utils.get_preset_loader(preset).check_backbone_class()


def saved_image_converter(preset: str, preprocessor: type) -> keras.layers.Layer:
    """The image converter saved with a task's preset, loaded as ``preprocessor``'s."""
    return preset_utils.get_preset_loader(preset).load_preprocessor(preprocessor).image_converter


def subclasses(cls: type) -> list[type]:
    """Every subclass of ``cls`` keras-hub defines (each detector's class, say)."""
    return preset_utils.list_subclasses(cls)
