"""The SavedModel export as a TFLite model, for phones and edge devices: float32 (``tflite``),
float16 weights (``tflite-fp16``) or the network in int8 (``tflite-int8``, :mod:`.quantize`).

``model.tflite`` has the SavedModel's ``serving_default`` signature, with dynamic input
sizes: give the interpreter's input tensor the image's shape (a signature runner does it
itself). It needs builtin ops only (see :class:`detsweep.models.detector_parts.TensorFlowNonMaxSuppression`),
so the plain interpreter runs it: the LiteRT runtime has no Flex delegate.

It is converted from the SavedModel's signature as loaded back: in TF 2.21,
``TFLiteConverter.from_saved_model`` kept the weights as resource variables that the
interpreter never initialised (its outputs were NaN); a loaded concrete function has them
frozen into constants.

With ``measure``, the export is scored and timed beside what it is compared with (the Keras
model; for fp16 and int8 the float32 file too): COCO AP on the val set with its bootstrap
spread (:mod:`.scoring`), file size and latency (:mod:`.serving_cost`). An int8 model more
than :data:`INT8_MAX_DROP` AP below float names the layers that lose most and is offered
beside a variant that keeps them in float, scored the same way.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import tensorflow as tf

from detsweep.checkpoints import CONFIG_FILE

from .paths import INFO_FILE, check_new_folder, staged_folder
from .quantize import Calibration, Quantizer
from .saved_model import SIGNATURE, export_saved_model

MODEL_FILE = "model.tflite"
KEEP_FLOAT_FILE = "model_keep_float.tflite"  # the int8 variant with its worst layers in float
KEEP_FLOAT = "tflite-int8-keep-float"
KINDS = ("tflite", "tflite-fp16", "tflite-int8")
INT8_MAX_DROP = 0.01  # one AP point
NAMED_LAYERS = 5


@dataclass(frozen=True)
class TFLiteRequest:
    kind: str = "tflite"
    calibration: Calibration | None = None  # int8 only
    keep_float: tuple[str, ...] = ()  # int8: the network's layers to leave in float
    measure: bool = False
    threads: int = 2


@dataclass
class TFLiteExport:
    path: Path
    report: dict = field(default_factory=dict)  # with ``measure``: models, their scores and costs


def export_tflite(checkpoint_dir: str | Path, out_dir: str | Path, use_average: bool = True,
                  request: TFLiteRequest = TFLiteRequest()) -> TFLiteExport:
    """Write ``model.tflite``, ``config.yaml`` and ``detsweep.json`` into ``out_dir``, a new or empty folder."""
    out = Path(out_dir)
    check_new_folder(out)
    with tempfile.TemporaryDirectory(prefix="detsweep-export-") as scratch:
        saved = export_saved_model(checkpoint_dir, Path(scratch) / "saved_model", use_average)
        models = {"tflite": convert(saved)}
        quantizer = Quantizer(saved, request.calibration) if request.kind == "tflite-int8" else None
        if request.kind == "tflite-fp16":
            models[request.kind] = convert(saved, float16=True)
        elif quantizer:
            models[request.kind] = quantizer.int8(request.keep_float)
        report = measured(checkpoint_dir, quantizer, models, request, use_average) if request.measure else {}
        with staged_folder(out) as folder:
            (folder / MODEL_FILE).write_bytes(models[request.kind])
            if "keep_float" in report:
                (folder / KEEP_FLOAT_FILE).write_bytes(report.pop("keep_float_model"))
            for name in (CONFIG_FILE, INFO_FILE):
                shutil.copyfile(saved / name, folder / name)
    return TFLiteExport(out, report)


def convert(saved_model_dir: Path, float16: bool = False) -> bytes:
    loaded = tf.saved_model.load(str(saved_model_dir))
    converter = tf.lite.TFLiteConverter.from_concrete_functions([loaded.signatures[SIGNATURE]], loaded)
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    if float16:
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.target_spec.supported_types = [tf.float16]
    return converter.convert()


# --- scored and timed -----------------------------------------------------------------------

def measured(checkpoint_dir: str | Path, quantizer: Quantizer | None, models: dict[str, bytes],
             request: TFLiteRequest, use_average: bool) -> dict:
    """The models scored and timed (:class:`~detsweep.export.measure.ExportMeasure`); for an int8
    model that misses its target, the layers losing most and the variant keeping them in float."""
    from .measure import ExportMeasure

    measure = ExportMeasure(checkpoint_dir, use_average, request.threads)
    for name, model in models.items():
        measure.add(name, model)
    report = measure.report()
    if request.kind != "tflite-int8":
        return report
    int8 = report["models"]["tflite-int8"]
    # a drop beyond twice its paired spread is a loss, not the luck of the val images
    report["int8"] = {"max_drop": INT8_MAX_DROP, "met": int8["AP_drop"] <= INT8_MAX_DROP,
                      "real_loss": int8["AP_drop"] > 2 * int8["AP_drop_spread"],
                      "representative": {"source": request.calibration.source,
                                         "images": len(request.calibration.pictures)}}
    if report["int8"]["met"]:
        return report
    worst = quantizer.layers_losing_most(NAMED_LAYERS)
    names = tuple(loss.name for loss in worst)
    variant = quantizer.int8((*request.keep_float, *names))
    measure.add(KEEP_FLOAT, variant)
    report = {**measure.report(), "int8": report["int8"]}
    report["int8"]["layers_losing_most"] = [{"name": loss.name, "rmse_per_scale": round(loss.rmse_per_scale, 3)}
                                            for loss in worst]
    report["keep_float"] = {"file": KEEP_FLOAT_FILE, "layers": list(names)}
    return {**report, "keep_float_model": variant}
