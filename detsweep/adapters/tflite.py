"""TensorFlow Lite's post-training quantization as its two steps (TensorFlow 2.21): measure the
ranges of every tensor on a representative set, then quantize with those ranges. The public
routes (``TFLiteConverter`` with a ``representative_dataset``; ``QuantizationDebugger`` built
from a converter) do both in one go; detsweep edits the ranges in between
(:mod:`detsweep.export.quantize`: the network's alone). Doing both in one go also crashes: on a
trained RetinaNet, the suppression loop's tensors have ranges such as [0, 1.2e-38], and
TensorFlow 2.21's quantizer ends the process with a segmentation fault on them (seen on the
raccoon models trained 400 and 1000 steps; a plain ``converter.convert()`` with a
representative dataset crashes alike). These are the converter's own two steps, called as its
quantization debugger calls them."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["calibrated", "quantized"]


def calibrated(converter) -> bytes:
    """The float model with the ranges the converter measured on its ``representative_dataset``."""
    converter._experimental_calibrate_only = True
    try:
        return converter.convert()
    finally:
        converter._experimental_calibrate_only = False


def quantized(calibrated_model: bytes, float_nodes: Sequence[str] = (), float_ops: Sequence[str] = (),
              numeric_verify: bool = False) -> bytes:
    """The calibrated model in int8 where it has ranges, but the tensors ``float_nodes`` name and
    the operations of ``float_ops``; with ``numeric_verify``, the debug model whose NumericVerify
    operations compare each quantized layer with float (for ``QuantizationDebugger``)."""
    from tensorflow.lite.python import convert

    return convert.mlir_quantize(calibrated_model, enable_numeric_verify=numeric_verify,
                                 denylisted_nodes=list(float_nodes), denylisted_ops=list(float_ops))
