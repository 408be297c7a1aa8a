"""Evaluation during training: detections on the val set → COCOeval, raw and averaged weights."""

from __future__ import annotations

import base64
import logging
from pathlib import Path

import keras
import tensorflow as tf

from detsweep.data import DetectionSet
from detsweep.data.pipeline import evaluation_dataset
from detsweep.data.processing import InputSpec, decoded_detections, in_original_image
from detsweep.evaluation import evaluate_detections, to_coco_detections
from detsweep.evaluation.pictures import PICTURE_KEY, detections_picture
from detsweep.optim import MovingAverage


class Evaluator:
    """Scores a model on one val set; the dataset and the traced detect function are built once."""

    def __init__(self, model: keras.Model, val_set: DetectionSet, spec: InputSpec, batch_size: int):
        self.val_set = val_set
        self.ground_truth = val_set.to_coco()
        self.batches = evaluation_dataset(val_set, spec, batch_size)
        category_ids = [category.id for category in val_set.categories]
        image_spec = tf.TensorSpec([batch_size, spec.image_size, spec.image_size, 3], tf.float32)
        scale_spec, shape_spec = tf.TensorSpec([batch_size], tf.float32), tf.TensorSpec([batch_size, 2], tf.int32)

        @tf.function(input_signature=[image_spec, scale_spec, shape_spec])
        def detect(images, scale, image_shape):
            return in_original_image(decoded_detections(model, images), scale, image_shape, category_ids)

        self.detect = detect

    def detect_all(self) -> list[dict]:
        """COCO result dicts for every val image."""
        detections = []
        for images, meta in self.batches:
            found = self.detect(images, meta["scale"], meta["image_shape"])
            detections += to_coco_detections(meta["image_id"].numpy(), {k: v.numpy() for k, v in found.items()})
        return detections

    def evaluate_with_average(self, moving_average: MovingAverage | None, picture: bool = False) -> dict:
        """``eval/*``, ``eval_ema/*`` when there is an average, and ``eval/AP_best``; with
        ``picture``, also ``PICTURE_KEY``: a PNG (base64) of the better weights' detections."""
        detections = self.detect_all()
        metrics = {f"eval/{k}": v for k, v in evaluate_detections(self.ground_truth, detections).items()}
        best, shown, weights = metrics["eval/AP"], detections, "raw"
        if moving_average is not None:
            with moving_average.averaged_weights():
                averaged_detections = self.detect_all()
            averaged = evaluate_detections(self.ground_truth, averaged_detections)
            metrics.update({f"eval_ema/{k}": v for k, v in averaged.items()})
            if averaged["AP"] > best:
                best, shown, weights = averaged["AP"], averaged_detections, "moving-average"
        metrics["eval/AP_best"] = best
        if picture:
            png = self.picture(shown, title=f"{weights} weights, AP {best:.3f}")
            if png:
                metrics[PICTURE_KEY] = base64.b64encode(png).decode("ascii")
        return metrics

    def picture(self, detections: list[dict], title: str) -> bytes | None:
        """A picture is a courtesy: if drawing it fails, training goes on without it."""
        try:
            return detections_picture(self.val_set, detections, title=title)
        except Exception as error:
            logging.getLogger(__name__).warning("no picture of the detections: %s", error)
            return None


def is_due(step: int, every: int, last_step: int) -> bool:
    return step == last_step or (every > 0 and step % every == 0)


def evaluate_checkpoint(directory: str | Path, overrides: list[str] = (), verify: bool = True,
                        picture: bool = False) -> dict[str, float]:
    """The saved model (and its average) on its config's val set: ``detsweep eval --checkpoint``,
    and an evaluation off the training path (whose val set the driver verified already)."""
    from detsweep.data import load_dataset
    from detsweep.errors import DetsweepError

    from .restore import load_trained_model

    trained = load_trained_model(directory, overrides)
    if trained.config.data.val is None:
        raise DetsweepError(f"{directory}: the checkpoint's config has no data.val; give one with --set data.val.…")
    val_set = load_dataset(trained.config.data.val, verify=verify)
    evaluator = Evaluator(trained.model, val_set, InputSpec(trained.config.model.image_size), batch_size=8)
    return {"step": trained.step, **evaluator.evaluate_with_average(trained.moving_average, picture=picture)}
