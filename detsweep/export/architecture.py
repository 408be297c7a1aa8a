"""What an architecture costs to serve, known before any trial trains it: the network its
config builds (random weights: the cost does not depend on them), exported as the float32
TFLite file ``detsweep export`` writes and timed by :func:`~.serving_cost.measure_latency`.

The suppression is fed a fixed number of candidates (:data:`CANDIDATES`, every box scoring
above zero), where a trained model feeds it the boxes above its score threshold: an untrained
network scores everything alike, a trained one few boxes, and the cost must be the
architecture's, the same before and after training.
"""

from __future__ import annotations

import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from detsweep.config import ModelConfig
from detsweep.evaluation.metrics import SERVING, SERVING_INT8

from .serving_cost import THREADS, Latency, measure_latency, size_mb

CANDIDATES = 1000


@dataclass(frozen=True)
class ServingCost:
    latency_ms: float
    size_mb: float
    params: int
    latency: Latency
    int8: tuple[float, float] | None = None  # the int8 file's latency (ms) and size (MB), when asked for

    def metrics(self) -> dict[str, float]:
        """As a trial's run logs them."""
        metrics = dict(zip(SERVING, (self.latency_ms, self.size_mb, float(self.params)), strict=True))
        return metrics | (dict(zip(SERVING_INT8, self.int8, strict=True)) if self.int8 else {})

    def as_dict(self) -> dict:
        return asdict(self)


def serving_cost(model: ModelConfig, num_classes: int, threads: int = THREADS, int8: bool = False) -> ServingCost:
    """The architecture's float32 TFLite file's size and latency, and its parameter count; with
    ``int8``, its int8 file's too (calibrated on noise: the kernels cost the same whatever the
    ranges, and the suppression takes its fixed candidates either way)."""
    import tensorflow as tf

    from detsweep.data.processing import InputSpec
    from detsweep.models import build_model

    from .quantize import Quantizer
    from .saved_model import SIGNATURE, DetectionModule
    from .tflite import convert

    network, _ = build_model(model, num_classes)
    as_if_trained(network)
    network.prediction_decoder.confidence_threshold = 0.0  # every box a candidate, ...
    network.prediction_decoder.max_candidates = CANDIDATES  # ... as many as a trained model's would be at most
    module = DetectionModule(network, InputSpec.of(model), list(range(1, num_classes + 1)))
    with tempfile.TemporaryDirectory(prefix="detsweep-cost-") as scratch:
        tf.saved_model.save(module, scratch, signatures={SIGNATURE: module.serve})
        converted = convert(Path(scratch))
        quantized = Quantizer(Path(scratch), noise(model.image_size)).int8() if int8 else None
    latency = measure_latency(converted, model.image_size, threads)
    int8_cost = None
    if quantized is not None:
        int8_cost = (measure_latency(quantized, model.image_size, threads).median_ms, size_mb(quantized))
    return ServingCost(latency.median_ms, size_mb(converted), int(network.count_params()), latency, int8_cost)


def as_if_trained(network) -> None:
    """Every weight nudged by its own noise: freshly initialised layers can hold equal tensors
    (zero biases, a kernel drawn alike for each repeated head layer), which the TFLite file
    stores once, where a trained network's differ. The file then weighs what a trained one
    would; what it computes is unchanged but for the noise."""
    rng = np.random.default_rng(0)
    for weight in network.weights:
        weight.assign(weight + rng.normal(0.0, 1e-4, weight.shape).astype(weight.dtype))


def noise(size: int, count: int = 8):
    """Pictures of uniform noise to calibrate an untrained network on: its cost is asked, not how well it detects."""
    from .quantize import Calibration

    rng = np.random.default_rng(0)
    return Calibration(tuple(rng.integers(0, 256, (size, size, 3), dtype=np.uint8) for _ in range(count)), "noise")
