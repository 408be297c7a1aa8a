"""The SavedModel export as a float32 TFLite model, for phones and edge devices.

``model.tflite`` has the SavedModel's ``serving_default`` signature, with dynamic input
sizes: give the interpreter's input tensor the image's shape (a signature runner does it
itself). It needs builtin ops only (see :class:`detsweep.models.detector_parts.TensorFlowNonMaxSuppression`),
so the plain interpreter runs it: TF 2.21's Python interpreter has no Flex delegate.

It is converted from the SavedModel's signature as loaded back: in TF 2.21,
``TFLiteConverter.from_saved_model`` kept the weights as resource variables that the
interpreter never initialised (its outputs were NaN); a loaded concrete function has them
frozen into constants.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import tensorflow as tf

from detsweep.checkpoints import CONFIG_FILE

from .paths import INFO_FILE, check_new_folder, staged_folder
from .saved_model import SIGNATURE, export_saved_model

MODEL_FILE = "model.tflite"


def export_tflite(checkpoint_dir: str | Path, out_dir: str | Path, use_average: bool = True) -> Path:
    """Write ``model.tflite``, ``config.yaml`` and ``detsweep.json`` into ``out_dir``, a new or empty folder."""
    out = Path(out_dir)
    check_new_folder(out)
    with tempfile.TemporaryDirectory(prefix="detsweep-export-") as scratch:
        saved = export_saved_model(checkpoint_dir, Path(scratch) / "saved_model", use_average)
        with staged_folder(out) as folder:
            (folder / MODEL_FILE).write_bytes(convert(saved))
            for name in (CONFIG_FILE, INFO_FILE):
                shutil.copyfile(saved / name, folder / name)
    return out


def convert(saved_model_dir: Path) -> bytes:
    loaded = tf.saved_model.load(str(saved_model_dir))
    converter = tf.lite.TFLiteConverter.from_concrete_functions([loaded.signatures[SIGNATURE]], loaded)
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    return converter.convert()
