"""What an architecture costs to serve, known before any trial trains it: the network its
config builds (random weights: the cost does not depend on them), exported as the float32
TFLite file ``detsweep export`` writes and timed by :func:`~.serving_cost.measure_latency`.

The suppression is fed a fixed number of candidates (:data:`CANDIDATES`, every box scoring
above zero), where a trained model feeds it the boxes above its score threshold: an untrained
network scores everything alike, a trained one few boxes, and the cost must be the
architecture's, the same before and after training.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from detsweep.config import ModelConfig

from .serving_cost import THREADS, Latency, measure_latency, size_mb

CANDIDATES = 1000


def architecture_key(model: ModelConfig, num_classes: int) -> str:
    """The same for two configs exactly when their networks are alike (``ModelConfig.ARCHITECTURE``)."""
    fields = {name: getattr(model, name) for name in ModelConfig.ARCHITECTURE} | {"num_classes": num_classes}
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=list).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class ServingCost:
    latency_ms: float
    size_mb: float
    params: int
    latency: Latency

    def metrics(self) -> dict[str, float]:
        """As a trial's run logs them."""
        return {"serve/latency_ms": self.latency_ms, "serve/size_mb": self.size_mb, "serve/params": float(self.params)}

    def as_dict(self) -> dict:
        return asdict(self)


def serving_cost(model: ModelConfig, num_classes: int, threads: int = THREADS) -> ServingCost:
    """The architecture's float32 TFLite file's size and latency, and its parameter count."""
    import tensorflow as tf

    from detsweep.data.processing import InputSpec
    from detsweep.models import build_model

    from .saved_model import SIGNATURE, DetectionModule
    from .tflite import convert

    network, _ = build_model(model, num_classes)
    network.prediction_decoder.confidence_threshold = 0.0  # every box a candidate, ...
    network.prediction_decoder.max_candidates = CANDIDATES  # ... as many as a trained model's would be at most
    module = DetectionModule(network, InputSpec.of(model), list(range(1, num_classes + 1)))
    with tempfile.TemporaryDirectory(prefix="detsweep-cost-") as scratch:
        tf.saved_model.save(module, scratch, signatures={SIGNATURE: module.serve})
        converted = convert(Path(scratch))
    latency = measure_latency(converted, model.image_size, threads)
    return ServingCost(latency.median_ms, size_mb(converted), int(network.count_params()), latency)
