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
from detsweep.data.records import plural
from detsweep.evaluation import evaluate_detections, to_coco_detections
from detsweep.evaluation.pictures import detections_file, detections_picture
from detsweep.optim import MovingAverage


@dataclass(frozen=True)
class Scores:
    """An evaluation's metrics, and the pictures it drew (artifact path → PNG bytes)."""

    metrics: dict[str, float]
    pictures: dict[str, bytes] = field(default_factory=dict)


class Evaluator:
    """Scores a model on one val set; the dataset and the traced step are built once.

    Under ``strategy`` the val set is sharded: each input pipeline (a worker) reads every
    n-th image, each device detects on ``batch_size`` images a step, and the detections are
    gathered to every worker; with ``scores`` (rank 0) they become COCO's metrics, elsewhere
    the evaluation ends there. Every worker must evaluate at the same steps (its collectives).

    With ``losses`` (the training's loss terms), the same model call that gives the detections
    also gives the val set's loss: ``eval/loss`` (with the weight decay, as ``train/loss``),
    ``eval/box_loss`` and ``eval/classification_loss``. Each device's batch is normalised by
    its positive anchors, as in training, and batches weigh by their real images (the filler
    copies that complete the last ones weigh nothing).
    """

    def __init__(self, model: keras.Model, val_set: DetectionSet, spec: InputSpec, batch_size: int,
                 losses: Callable | None = None, strategy: tf.distribute.Strategy | None = None,
                 scores: bool = True):
        strategy = strategy or tf.distribute.get_strategy()
        self.scores = scores
        # rank 0 keeps the whole set (the ground truth, the pictures); the others only their share
        self.val_set = val_set if scores else None
        self.ground_truth = val_set.to_coco() if scores else None
        replicas, pipelines = strategy.num_replicas_in_sync, []

        def pipeline(context: tf.distribute.InputContext) -> tf.data.Dataset:
            pipelines.append(context.num_input_pipelines)
            return evaluation_dataset(val_set, spec, batch_size, shard=(pipelines[0], context.input_pipeline_id),
                                      replicas=replicas // pipelines[0])

        self.batches = strategy.distribute_datasets_from_function(pipeline)
        self.sharing_line = (f"{val_set.source}: {plural(len(val_set.examples), 'val image')} evaluated by "
                             f"{plural(pipelines[0], 'pipeline')}, {batch_size} a device a step")
        category_ids = [category.id for category in val_set.categories]
        val_set = None  # the pipeline is built: its function (which TensorFlow keeps) holds no more of it

        def detect(images, meta):
            predictions = raw_predictions(model, images)
            decoded = decoded_detections(model, images, predictions)
            found = in_original_image(decoded, meta["scale"], meta["image_shape"], category_ids)
            found["image_id"] = meta["image_id"]
            if losses is None:
                return found, {}
            real = tf.cast(meta["image_id"] >= 0, tf.float32)
            count = tf.reduce_sum(real)
            terms = losses(images, meta, predictions, image_weights=real)
            loss = terms["box"] + terms["classification"]
            if model.losses:
                loss += tf.add_n(model.losses)
            # summed over the devices below: each batch's terms weighed by its real images
            return found, {"loss": count * loss, "box_loss": count * terms["box"],
                           "classification_loss": count * terms["classification"], "images": count}

        @tf.function(input_signature=[self.batches.element_spec])
        def step(batch):
            found, terms = strategy.run(detect, args=batch)
            return ({key: strategy.gather(value, axis=0) for key, value in found.items()},
                    {key: strategy.reduce("SUM", value, axis=None) for key, value in terms.items()})

        self.step = step

    def detect_all(self) -> tuple[list[dict], dict[str, float]]:
        """COCO result dicts for every val image, and (with losses) the val set's loss terms;
        with ``scores`` off, nothing (the detections were gathered to rank 0)."""
        detections, sums = [], {}
        for batch in self.batches:
            found, terms = self.step(batch)
            if not self.scores:
                continue
            found = {key: value.numpy() for key, value in found.items()}
            detections += to_coco_detections(found.pop("image_id"), found)
            sums = {key: sums.get(key, 0.0) + float(value) for key, value in terms.items()}
        images = sums.pop("images", 0.0)
        return detections, {key: value / images for key, value in sums.items()}

    def evaluate_with_average(self, moving_average: MovingAverage | None, step: int, picture: bool = False) -> Scores:
        """``eval/*``, ``eval_ema/*`` when there is an average, and ``eval/AP_best``; with
        ``picture``, a picture of the better weights' detections, as the evaluation of ``step``'s.
        With ``scores`` off, both passes run (their collectives) and no metrics come back."""
        if not self.scores:
            self.detect_all()
            if moving_average is not None:
                with moving_average.averaged_weights():
                    self.detect_all()
            return Scores({})
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
    evaluator = Evaluator(trained.model, val_set, InputSpec.of(trained.config.model),
                          trained.config.train.eval_batch_size, losses=trained.losses)
    scores = evaluator.evaluate_with_average(trained.moving_average, trained.step, picture=picture)
    return Scores({"step": trained.step, **scores.metrics}, scores.pictures)
