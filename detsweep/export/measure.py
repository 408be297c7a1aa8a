"""An export's models scored and timed side by side: the Keras model it was made from and each
TFLite file, on the checkpoint's val set (:mod:`.scoring`) and in the LiteRT runtime
(:mod:`.serving_cost`). The bootstrap's draws are the same for every model, so each one's
``AP_drop`` below the float32 TFLite file has a paired spread."""

from __future__ import annotations

from importlib.metadata import version
from pathlib import Path

from detsweep.data import load_dataset
from detsweep.data.processing import InputSpec

from .detector import Detector
from .scoring import detections_of, scores
from .serving_cost import measure_latency, size_mb, tflite_runner

REFERENCE = "tflite"  # what the smaller files are compared with


class ExportMeasure:
    def __init__(self, checkpoint_dir: str | Path, use_average: bool, threads: int):
        from detsweep.train.restore import load_trained_model

        trained = load_trained_model(checkpoint_dir)
        if use_average and trained.moving_average is not None:
            trained.moving_average.swap()
        self.val_set = load_dataset(trained.config.data.val)
        self.image_size = trained.config.model.image_size
        self.threads = threads
        detector = Detector(trained.model, InputSpec.of(trained.config.model), [c.id for c in trained.categories])
        self.detections = {"keras": detections_of(detector.detect, self.val_set)}
        self.costs = {"keras": {"params": int(trained.model.count_params())}}

    def add(self, name: str, model: bytes) -> None:
        runner = tflite_runner(model, self.threads)
        self.detections[name] = detections_of(lambda images: runner(images=images), self.val_set)
        latency = measure_latency(model, self.image_size, self.threads)
        self.costs[name] = {"size_mb": size_mb(model), "latency_ms": latency.median_ms, "latency": latency.as_dict()}

    def report(self) -> dict:
        scored = scores(self.val_set, self.detections, reference=REFERENCE if REFERENCE in self.detections else None)
        return {
            "models": {name: {**scored[name], **self.costs[name]} for name in self.detections},
            "val_images": len(self.val_set.examples),
            "runtime": f"LiteRT {version('ai-edge-litert')} on this machine's CPU, XNNPACK, {self.threads} threads,"
                       f" batch 1 at {self.image_size} px",
        }
