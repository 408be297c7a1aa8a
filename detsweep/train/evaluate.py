"""Evaluation during training: detections on the val set → COCOeval, raw and averaged weights."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import keras
import tensorflow as tf

from detsweep.data import DetectionSet
from detsweep.data.pipeline import evaluation_dataset
from detsweep.data.processing import InputSpec, decoded_detections, in_original_image, raw_predictions
from detsweep.evaluation import evaluate_detections, to_coco_detections
from detsweep.evaluation.pictures import detections_file, detections_picture
from detsweep.optim import MovingAverage


@dataclass(frozen=True)
class Scores:
    """An evaluation's metrics, and the pictures it drew (artifact path → PNG bytes)."""

    metrics: dict[str, float]
    pictures: dict[str, bytes] = field(default_factory=dict)


class Evaluator:
    """Scores a model on one val set; the dataset and the traced detect function are built once.

    With ``losses`` (the training's loss terms), the same model call that gives the detections
    also gives the val set's loss: ``eval/loss`` (with the weight decay, as ``train/loss``),
    ``eval/box_loss`` and ``eval/classification_loss``. Each batch's is normalised by its
    positive anchors, as in training, and batches weigh by their real images (the filler
    copies that complete the last one weigh nothing).
    """

    def __init__(self, model: keras.Model, val_set: DetectionSet, spec: InputSpec, batch_size: int,
                 losses: Callable | None = None):
        self.val_set = val_set
        self.ground_truth = val_set.to_coco()
        self.batches = evaluation_dataset(val_set, spec, batch_size)
        category_ids = [category.id for category in val_set.categories]
        image_spec, meta_spec = self.batches.element_spec

        @tf.function(input_signature=[image_spec, meta_spec])
        def detect(images, meta):
            predictions = raw_predictions(model, images)
            decoded = decoded_detections(model, images, predictions)
            found = in_original_image(decoded, meta["scale"], meta["image_shape"], category_ids)
            if losses is None:
                return found, {}
            real = tf.cast(meta["image_id"] >= 0, tf.float32)
            terms = losses(images, meta, predictions, image_weights=real)
            loss = terms["box"] + terms["classification"]
            if model.losses:
                loss += tf.add_n(model.losses)
            return found, {"loss": loss, "box_loss": terms["box"], "classification_loss": terms["classification"],
                           "images": tf.reduce_sum(real)}

        self.detect = detect

    def detect_all(self) -> tuple[list[dict], dict[str, float]]:
        """COCO result dicts for every val image, and (with losses) the val set's loss terms."""
        detections, sums, images = [], {}, 0.0
        for batch, meta in self.batches:
            found, terms = self.detect(batch, meta)
            detections += to_coco_detections(meta["image_id"].numpy(), {k: v.numpy() for k, v in found.items()})
            if terms:
                count = float(terms.pop("images"))
                sums = {k: sums.get(k, 0.0) + count * float(v) for k, v in terms.items()}
                images += count
        return detections, {k: v / images for k, v in sums.items()}

    def evaluate_with_average(self, moving_average: MovingAverage | None, step: int, picture: bool = False) -> Scores:
        """``eval/*``, ``eval_ema/*`` when there is an average, and ``eval/AP_best``; with
        ``picture``, a picture of the better weights' detections, as the evaluation of ``step``'s."""
        detections, loss = self.detect_all()
        metrics = {f"eval/{k}": v for k, v in (evaluate_detections(self.ground_truth, detections) | loss).items()}
        best, shown, weights = metrics["eval/AP"], detections, "raw"
        if moving_average is not None:
            with moving_average.averaged_weights():
                averaged_detections, averaged_loss = self.detect_all()
            averaged = evaluate_detections(self.ground_truth, averaged_detections)
            metrics.update({f"eval_ema/{k}": v for k, v in (averaged | averaged_loss).items()})
            if averaged["AP"] > best:
                best, shown, weights = averaged["AP"], averaged_detections, "moving-average"
        metrics["eval/AP_best"] = best
        png = self.picture(shown, title=f"{weights} weights, AP {best:.3f}") if picture else None
        return Scores(metrics, {detections_file(step): png} if png else {})

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
                        picture: bool = False) -> Scores:
    """The saved model (and its average) on its config's val set: ``detsweep eval --checkpoint``,
    and an evaluation off the training path (whose val set the driver verified already)."""
    from detsweep.data import load_dataset
    from detsweep.errors import DetsweepError

    from .restore import load_trained_model

    trained = load_trained_model(directory, overrides)
    if trained.config.data.val is None:
        raise DetsweepError(f"{directory}: the checkpoint's config has no data.val; give one with --set data.val.…")
    val_set = load_dataset(trained.config.data.val, verify=verify)
    evaluator = Evaluator(trained.model, val_set, InputSpec.of(trained.config.model), batch_size=8,
                          losses=trained.losses)
    scores = evaluator.evaluate_with_average(trained.moving_average, trained.step, picture=picture)
    return Scores({"step": trained.step, **scores.metrics}, scores.pictures)
