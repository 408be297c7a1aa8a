"""int8 by post-training quantization: the network in int8, what surrounds it in float.

The network (backbone, pyramid, heads: every operation under
:data:`~detsweep.data.processing.NETWORK_SCOPE`) gets int8 weights and activations, their
ranges measured on a representative set of training pictures. The pictures' preparation and,
after the heads' two outputs (class logits and box codes, separate tensors, so each has a
scale of its own), the box decoding and the suppression stay in float: they have no int8
kernels worth the name, and one scale over boxes and scores would collapse the scores.

Calibration and quantization are two steps here (:mod:`detsweep.adapters.tflite`), the
measured ranges edited in between: the network's kept, every other dropped (an operation with
no range for its input stays float), the class logits' floored. Chosen layers stay float by
name; TensorFlow's quantization debugger measures how far each quantized layer strays from
float (:meth:`Quantizer.layers_losing_most`).
"""

from __future__ import annotations

import csv
import hashlib
import io
import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tensorflow as tf

from detsweep.adapters.tflite import calibrated, quantized
from detsweep.config import DatasetConfig
from detsweep.data import Example, drawn_examples, load_dataset
from detsweep.data.processing import NETWORK_SCOPE, SCORE_FLOOR, InputSpec, letterboxed
from detsweep.errors import DetsweepError

from .saved_model import SIGNATURE

DEFAULT_REPRESENTATIVE = 100  # pictures; TensorFlow's guide asks for about a hundred
NETWORK_PART = re.compile(rf"^{NETWORK_SCOPE}(_\d+)?/")


@dataclass(frozen=True)
class Calibration:
    """The training pictures int8 conversion measures the network's activations on, each
    letterboxed to the model's square (so one input shape serves the calibrator and the
    debugger, and the graph's own resize is the identity on them)."""

    pictures: tuple[np.ndarray, ...]  # uint8 [size, size, 3]
    source: str

    def samples(self) -> Iterator[list[np.ndarray]]:
        for picture in self.pictures:
            yield [picture[None]]


def representative_set(train: DatasetConfig, val: DatasetConfig, count: int, spec: InputSpec,
                       seed: int = 0) -> Calibration:
    """``count`` pictures drawn from ``train`` (all of them when it has fewer). Refused when any
    is also a val picture (same bytes): the val set scores the export, and calibrating on it
    would flatter the int8 model."""
    try:
        chosen = drawn_examples(train, count, seed)  # a TFRecord set streamed, never held
    except DetsweepError as error:
        raise DetsweepError(f"representative set: {error}; int8 calibrates on training pictures "
                            "(give others with --representative-data FILE)") from None
    if not chosen:
        raise DetsweepError(f"representative set: found no training images in {describe(train)}, "
                            "expected some to calibrate int8 on")
    val_digests = {digest(example) for example in load_dataset(val, verify=False).examples}
    shared = [example.file_name for example in chosen if digest(example) in val_digests]
    if shared:
        raise DetsweepError(f"representative set: found {len(shared)} val image(s) among its {len(chosen)} "
                            f"({shared[0]}, …), expected training images only (the val set scores the export)")
    return Calibration(tuple(letterboxed(decoded(example), spec).numpy() for example in chosen), describe(train))


def describe(data: DatasetConfig) -> str:
    where = f"{data.format} {data.annotations or data.images}" if data.format != "synthetic" else f"synthetic, seed {data.seed}"
    return where + (f" {list(data.subset)}" if data.subset else "")


def encoded(example: Example) -> bytes:
    return example.encoded if example.encoded is not None else Path(example.path).read_bytes()


def digest(example: Example) -> str:
    return hashlib.sha256(encoded(example)).hexdigest()


def decoded(example: Example) -> tf.Tensor:
    """The picture as training's pipeline decodes it (TensorFlow's decoder, three channels)."""
    return tf.io.decode_image(encoded(example), channels=3, expand_animations=False)


# --- conversion ------------------------------------------------------------------------------

@dataclass(frozen=True)
class LayerLoss:
    name: str
    rmse_per_scale: float  # the layer's int8 error in units of its quantization step


class Quantizer:
    """A SavedModel's serving signature calibrated once on a representative set, its ranges kept
    for the network alone (:func:`network_ranges_only`); int8 models of it, and the layers that
    lose most."""

    def __init__(self, saved_model_dir: Path, calibration: Calibration):
        loaded = tf.saved_model.load(str(saved_model_dir))
        converter = tf.lite.TFLiteConverter.from_concrete_functions([loaded.signatures[SIGNATURE]], loaded)
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.representative_dataset = lambda: ({"images": picture} for [picture] in calibration.samples())
        self.calibration = calibration
        self.model, self.floored = network_ranges_only(calibrated(converter))

    def int8(self, keep_float: Sequence[str] = ()) -> bytes:
        """The network in int8; ``keep_float``: names of its layers (as :meth:`layers_losing_most`
        gives them, or any part of one) to leave in float too."""
        return quantized(self.model, self.float_nodes(keep_float), FLOAT_OPS)

    def layers_losing_most(self, count: int = 5) -> list[LayerLoss]:
        """The network's quantized layers ranked by how far their int8 outputs stray from float
        on the representative set, worst first: root mean square error over the quantization
        step (TensorFlow's quantization debugger; about 0.29 is rounding alone, 1/sqrt(12)). The
        class logits below the score floor are left out: int8 drops them on purpose."""
        from tensorflow.lite.tools.optimize.debugging.python.debugger import QuantizationDebugger

        debug_model = quantized(self.model, self.float_nodes(()), FLOAT_OPS, numeric_verify=True)
        debugger = QuantizationDebugger(quant_debug_model_content=debug_model, debug_dataset=self.calibration.samples)
        debugger.run()
        dump = io.StringIO()
        debugger.layer_statistics_dump(dump)
        dump.seek(0)
        losses = [LayerLoss(layer_name(row["tensor_name"]),
                            math.sqrt(float(row["mean_squared_error"])) / float(row["scale"]))
                  for row in csv.DictReader(dump) if float(row["scale"]) > 0 and in_network(row["tensor_name"])
                  and layer_name(row["tensor_name"]) not in self.floored]
        return sorted(losses, key=lambda loss: -loss.rmse_per_scale)[:count]

    def float_nodes(self, keep_float: Sequence[str]) -> list[str]:
        """Everything of the main graph outside the network, and the network's tensors whose
        name contains one of ``keep_float``."""
        from ai_edge_litert import schema_py_generated as schema

        names = [tensor.name.decode() for tensor in schema.ModelT.InitFromPackedBuf(self.model, 0).subgraphs[0].tensors]
        kept = [name for name in names if in_network(name) and any(layer in name for layer in keep_float)]
        unknown = [layer for layer in keep_float if not any(layer in name for name in kept)]
        if unknown:
            raise DetsweepError(f"--keep-float {unknown[0]}: found no layer of the network by that name, "
                                "expected a name as an export that misses its target prints")
        return [*(name for name in names if not in_network(name)), *kept]


def layer_name(tensor_name: str) -> str:
    """A quantized tensor's name as people read it: the first operation it was fused from,
    inside the network's scope (``retina_net_object_detector_1/box_head_5/logits_layer_1/BiasAdd``)."""
    return NETWORK_PART.sub("", tensor_name.split(";")[0])


def in_network(tensor_name: str) -> bool:
    """A TFLite tensor of the network: one of the TensorFlow operations it was fused from is
    (under the network's scope, ``network/`` or, opened again in one graph, ``network_1/``)."""
    return any(NETWORK_PART.match(part) for part in tensor_name.split(";"))


def network_ranges_only(calibrated_model: bytes) -> tuple[bytes, set[str]]:
    """The calibrated model with the measured ranges of every tensor outside the network
    removed: an operation with no range for its input stays in float. This is what keeps the
    suppression's loops in float (their subgraphs cannot be denylisted by name: TensorFlow 2.21's
    quantizer then fails to retype the loop's results), and what keeps it from crashing on
    their degenerate ranges (:mod:`detsweep.adapters.tflite`). Also the names of the layers
    whose range :func:`floor_class_logits` cut."""
    import flatbuffers
    from ai_edge_litert import schema_py_generated as schema

    model = schema.ModelT.InitFromPackedBuf(calibrated_model, 0)
    for graph in model.subgraphs:
        for tensor in graph.tensors:
            if tensor.quantization is not None and not in_network(tensor.name.decode()):
                tensor.quantization.min = tensor.quantization.max = None
    floored = floor_class_logits(model)
    builder = flatbuffers.Builder(len(calibrated_model))
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output()), floored


def floor_class_logits(model) -> set[str]:
    """Start the measured range of the class logits, from the heads' last convolutions on, at
    the score floor (:func:`~detsweep.data.processing.served_predictions`): int8 saturation
    then does what the floor does, at the convolution's output already. The floor alone came
    too late: the logits were int8 before it, in steps its few far-negative outliers set.
    Returns the layers whose range it cut (their names as :func:`layer_name` gives them)."""
    from ai_edge_litert import schema_py_generated as schema

    graph = model.subgraphs[0]
    producer = {tensor: op for op in graph.operators for tensor in op.outputs}
    kind = {op_index: code.builtinCode for op_index, code in enumerate(model.operatorCodes)}
    passes_range = {schema.BuiltinOperator.RESHAPE: 1, schema.BuiltinOperator.CONCATENATION: None}
    floored = set()
    for op in graph.operators:
        out = graph.tensors[op.outputs[0]]
        if SCORE_FLOOR not in out.name.decode() or out.quantization is None or out.quantization.min is None:
            continue
        floor = float(out.quantization.min[0])
        upstream = [op.inputs[0]]
        while upstream:
            index = upstream.pop()
            measured = graph.tensors[index].quantization
            if measured is not None and measured.min is not None and measured.min[0] < floor:
                measured.min = [floor]
                floored.add(layer_name(graph.tensors[index].name.decode()))
            source = producer.get(index)
            if source is not None and kind[source.opcodeIndex] in passes_range:
                upstream += list(source.inputs[:passes_range[kind[source.opcodeIndex]]])
    return floored


# Operations of the decoding and suppression that an int8 input would still draw into int8
# (they only move values, so they follow their input's type); the network never uses them.
FLOAT_OPS = ["TOPK_V2"]
