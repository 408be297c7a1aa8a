"""Evaluation during training: detections on the val set → COCOeval, raw and averaged weights."""

from __future__ import annotations

import keras
import tensorflow as tf

from detsweep.data import DetectionSet
from detsweep.data.pipeline import InputSpec, evaluation_dataset
from detsweep.evaluation import evaluate_detections, to_coco_detections
from detsweep.optim import MovingAverage


class Evaluator:
    """Scores a model on one val set; the dataset and the traced detect function are built once."""

    def __init__(self, model: keras.Model, val_set: DetectionSet, spec: InputSpec, batch_size: int):
        self.val_set = val_set
        self.ground_truth = val_set.to_coco()
        self.batches = evaluation_dataset(val_set, spec, batch_size)
        self.original_ids = [category.id for category in val_set.categories]
        image_spec = tf.TensorSpec([batch_size, spec.image_size, spec.image_size, 3], tf.float32)

        @tf.function(input_signature=[image_spec])
        def detect(images):
            # Under mixed precision the heads emit float16; keras-hub's box decoding wants float32.
            predictions = {k: tf.cast(v, tf.float32) for k, v in model(images, training=False).items()}
            return model.decode_predictions(predictions, images)

        self.detect = detect

    def evaluate(self) -> dict[str, float]:
        detections = []
        for images, meta in self.batches:
            out = self.detect(images)
            detections += to_coco_detections(
                meta["image_id"].numpy(), meta["scale"].numpy(), out["boxes"].numpy(),
                out["confidence"].numpy(), out["labels"].numpy(), out["num_detections"].numpy(),
                self.original_ids,
            )
        return evaluate_detections(self.ground_truth, detections)

    def evaluate_with_average(self, moving_average: MovingAverage | None) -> dict[str, float]:
        """``eval/*``, ``eval_ema/*`` when there is an average, and ``eval/AP_best``."""
        metrics = {f"eval/{k}": v for k, v in self.evaluate().items()}
        best = metrics["eval/AP"]
        if moving_average is not None:
            with moving_average.averaged_weights():
                averaged = self.evaluate()
            metrics.update({f"eval_ema/{k}": v for k, v in averaged.items()})
            best = max(best, averaged["AP"])
        metrics["eval/AP_best"] = best
        return metrics


def is_due(step: int, every: int, last_step: int) -> bool:
    return step == last_step or (every > 0 and step % every == 0)




def evaluate_checkpoint(directory: str, overrides: list[str] = ()) -> dict[str, float]:
    """``detsweep eval --checkpoint``: the saved model (and its average) on its config's val set."""
    from detsweep.data import load_dataset
    from detsweep.errors import DetsweepError

    from .restore import load_trained_model

    trained = load_trained_model(directory, overrides)
    if trained.config.data.val is None:
        raise DetsweepError(f"{directory}: the checkpoint's config has no data.val; give one with --set data.val.…")
    val_set = load_dataset(trained.config.data.val, verify=True)
    evaluator = Evaluator(trained.model, val_set, InputSpec(trained.config.model.image_size), batch_size=8)
    return {"step": trained.step, **evaluator.evaluate_with_average(trained.moving_average)}
