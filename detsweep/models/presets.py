"""Is ``model.weights`` a keras-hub preset detsweep can start from: an image encoder's (the OD
API's ``classification`` checkpoint) or a whole RetinaNet's (its ``detection`` checkpoint,
:mod:`.detector_presets`)?

Asked once, on the driver, before Ray or MLflow start: the workers load the preset with
keras-hub's ``from_preset``, and a preset it cannot load, or one of another kind, would
otherwise be found only there, after the cluster started. A preset is read as keras-hub reads
it (its loader, through :mod:`detsweep.adapters.keras_hub`): a folder is one when the loader
recognises its ``config.json``, whose class is the backbone's, and its ``task.json`` names the
task (e.g. a whole detector) saved with it. A handle is checked for its form; whether it exists
is the download's to say. A whole detector's preset named by a registry name or a handle is read
here only to say what its architecture replaces (:func:`architecture_note`): its small json
files, which keras-hub keeps in its cache for the workers on this node.
"""

from __future__ import annotations

import os
import re

from detsweep.adapters import keras_hub as hub
from detsweep.config import ModelConfig, TrialConfig
from detsweep.errors import DetsweepError

from .detector_presets import check_retinanet_preset, preset_model_config, preset_overrides, preset_trial_config

EXPECTED = ("expected a keras-hub preset of an image encoder or of a RetinaNet detector: a folder save_to_preset "
            "wrote, kaggle://owner/model/keras/variant[/version], hf://owner/name, or a keras-hub preset name "
            "such as resnet_50_imagenet or retinanet_resnet50_fpn_coco")
KINDS = ("expected one of an image encoder with a feature pyramid (e.g. resnet_50_imagenet) "
         "or of a whole RetinaNet (e.g. retinanet_resnet50_fpn_coco)")

# keras-hub's own handle forms (get_file): Kaggle's four or five segments with the framework
# "keras" third, and Hugging Face's repository id, owner/name.
KAGGLE_HANDLE = re.compile(r"kaggle://[\w.-]+/[\w.-]+/keras/[\w.-]+(/\d+)?")
HF_HANDLE = re.compile(r"hf://[\w.-]+/[\w.-]+")


def check_weights_preset(weights: str, field: str, local: bool = True) -> list[str]:
    """Refuse, in one line naming ``field``, a ``model.weights`` that is not ``none`` nor a preset
    keras-hub can load of an image encoder or a whole RetinaNet. Not ``local`` (a cluster's nodes,
    not this machine, hold the folders), a folder is left unchecked: returned, for the caller to
    say so."""
    if weights == "none":
        return []
    if "://" in weights:
        check_handle(weights, field)
    elif is_preset_name(weights):
        check_preset_name(weights, field)
    elif not local:
        return [f"{field}: {weights}"]
    else:
        check_preset_folder(weights, field)
    return []


def is_preset_name(weights: str) -> bool:
    """keras-hub looks a name up in its registry before it looks for a folder (``get_file``);
    what is neither, and does not look like a path, was meant as a name."""
    import keras_hub

    looks_like_a_path = os.sep in weights or weights.startswith((".", "~")) or os.path.exists(weights)
    return weights in keras_hub.models.Backbone.presets or not looks_like_a_path


def check_handle(handle: str, field: str) -> None:
    """A Kaggle or Hugging Face handle, well formed (whether it exists is the download's to say)."""
    if handle.startswith("kaggle://") and not KAGGLE_HANDLE.fullmatch(handle):
        raise DetsweepError(f"{field}: found {handle!r}, expected a Kaggle handle "
                            "kaggle://owner/model/keras/variant[/version]")
    if handle.startswith("hf://") and not HF_HANDLE.fullmatch(handle):
        raise DetsweepError(f"{field}: found {handle!r}, expected a Hugging Face handle hf://owner/name")
    if not handle.startswith(("kaggle://", "hf://")):
        raise DetsweepError(f"{field}: found {handle!r}, {EXPECTED}")


def check_preset_name(name: str, field: str) -> None:
    """A name from keras-hub's registry, of a RetinaNet detector or an image encoder."""
    import keras_hub

    if name in keras_hub.models.ObjectDetector.presets:
        check_retinanet_preset(name, field)
        return
    if name in _image_encoder_presets():
        return
    if name in keras_hub.models.Backbone.presets:
        raise DetsweepError(f"{field}: found {name!r}, a keras-hub preset of another kind of backbone; {KINDS}")
    raise DetsweepError(f"{field}: found {name!r}, neither a folder nor a keras-hub preset name; {EXPECTED}")


def check_preset_folder(folder: str, field: str) -> None:
    """keras-hub's loader recognises the folder, and it holds a whole RetinaNet (its task.json), or
    the backbone alone of an image encoder with a feature pyramid (what RetinaNet builds on)."""
    if not os.path.exists(folder):
        raise DetsweepError(f"{field}: found {folder!r}, a folder that does not exist; {EXPECTED}")
    if not os.path.isdir(folder):
        raise DetsweepError(f"{field}: found {folder!r}, a file, not a folder; {EXPECTED}")
    if not os.path.exists(os.path.join(folder, hub.CONFIG_FILE)):
        raise DetsweepError(f"{field}: found {folder!r}, a folder without a keras-hub preset "
                            f"(no {hub.CONFIG_FILE}); {EXPECTED}")
    backbone, task = _preset_classes(folder, field)
    if task is not None and _is_detector(task):
        check_detector_folder(folder, field)
        return
    if _is_detector_backbone(backbone):
        raise DetsweepError(f"{field}: found {folder!r}, a preset of {backbone.__name__}, a detector's backbone "
                            "without its heads (no task.json); " + KINDS)
    if not _is_image_encoder(backbone):
        raise DetsweepError(f"{field}: found {folder!r}, a preset of {backbone.__name__}; expected one of an image "
                            "encoder with a feature pyramid (a keras-hub FeaturePyramidBackbone, e.g. ResNetBackbone) "
                            "or of a whole RetinaNet")
    _check_weights_file(folder, field)


def check_detector_folder(folder: str, field: str) -> None:
    """A whole RetinaNet's preset, with its backbone's and its heads' weights, whose architecture
    the model section can hold (what the workers will replace the config's with)."""
    check_retinanet_preset(folder, field)
    _check_weights_file(folder, field)
    if not os.path.exists(os.path.join(folder, hub.TASK_WEIGHTS_FILE)):
        raise DetsweepError(f"{field}: found {folder!r}, a detector's preset without its heads' weights "
                            f"(no {hub.TASK_WEIGHTS_FILE}); {EXPECTED}")
    preset_model_config(ModelConfig(weights=folder), field)


def _preset_classes(folder: str, field: str) -> tuple[type, type | None]:
    """The classes of the folder's backbone and, when one was saved, of its task, by keras-hub's
    own reading (``get_preset_loader``, ``check_config_class``)."""
    try:
        backbone = hub.backbone_class(folder)
        saved_task = hub.preset_has_file(folder, hub.TASK_CONFIG_FILE)
        task = hub.config_class(hub.preset_json(folder, hub.TASK_CONFIG_FILE)) \
            if saved_task else None
    except (ValueError, KeyError) as error:  # keras-hub's words for a config it cannot read
        reason = str(error).splitlines()[0] if str(error) else f"no {error}"
        raise DetsweepError(f"{field}: found {folder!r}, a folder keras-hub cannot load as a preset ({reason}); "
                            f"{EXPECTED}") from None
    return backbone, task


def _check_weights_file(folder: str, field: str) -> None:
    """keras-hub's format keeps the weights in one file or a shard index (``_load_backbone_weights``);
    Transformers' and timm's formats are keras-hub's converters' to read."""
    if "registered_name" not in hub.preset_json(folder, hub.CONFIG_FILE):
        return
    files = (hub.MODEL_WEIGHTS_FILE, hub.SHARDED_MODEL_WEIGHTS_CONFIG_FILE)
    if not any(os.path.exists(os.path.join(folder, name)) for name in files):
        raise DetsweepError(f"{field}: found {folder!r}, a preset without its weights "
                            f"(no {hub.MODEL_WEIGHTS_FILE}); {EXPECTED}")


def _image_encoder_presets() -> set[str]:
    import keras_hub

    return set(keras_hub.models.FeaturePyramidBackbone.presets) - set(keras_hub.models.ObjectDetector.presets)


def _is_image_encoder(backbone: type) -> bool:
    import keras_hub

    return issubclass(backbone, keras_hub.models.FeaturePyramidBackbone)


def _is_detector(task: type) -> bool:
    import keras_hub

    return issubclass(task, keras_hub.models.ObjectDetector)


def _is_detector_backbone(backbone: type) -> bool:
    """The backbone of one of keras-hub's detectors (RetinaNet's holds its own image encoder
    and feature pyramid): the detector without its heads."""
    import keras_hub

    detectors = hub.subclasses(keras_hub.models.ObjectDetector)
    return any(issubclass(backbone, detector.backbone_cls) for detector in detectors if detector.backbone_cls)


def architecture_note(config: TrialConfig, field: str = "model.weights", local: bool = True) -> str | None:
    """The one line saying which model fields a whole detector's preset replaces
    (:func:`~.detector_presets.preset_overrides`), once the config with them is checked whole
    (:func:`~.detector_presets.preset_trial_config`); None for any other ``model.weights``. A
    folder is read when ``local`` (a cluster config's nodes hold theirs). A registry name or a
    handle is read as the workers will read it, its json files downloaded into keras-hub's cache;
    where that fails (no network here), the line says so, and the workers apply it unseen."""
    weights = config.model.weights
    if weights == "none" or weights in _image_encoder_presets():
        return None
    if "://" not in weights and not is_preset_name(weights):  # a folder
        return _read_note(config, field) if local and os.path.isdir(weights) else None
    try:
        hub.preset_file(weights, hub.CONFIG_FILE)  # every preset has one
    except Exception as error:  # no network, or no such preset: the workers' download will say which
        reason = " ".join(str(error).split())
        return (f"model.weights: the preset {weights} could not be read here ({type(error).__name__}: "
                f"{reason[:100]}{'…' if len(reason) > 100 else ''}); the workers read it, and a whole "
                "detector's architecture wins over model.*")
    return _read_note(config, field)


def _read_note(config: TrialConfig, field: str) -> str | None:
    return preset_overrides(config.model, preset_trial_config(config, field).model)
