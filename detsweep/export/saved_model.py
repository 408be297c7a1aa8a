"""A checkpoint as a TensorFlow SavedModel that serves whole pictures, as the OD API's exports do.

The ``serving_default`` signature takes ``images``: uint8 ``[batch, height, width, 3]``, any
size (one per batch). Everything a client would otherwise copy from detsweep is in the graph:
the pipeline's resize, pad and normalise, the model with its box decoding and NMS, and the
way back to normalised ``ymin, xmin, ymax, xmax`` of the original image and the dataset's own
category ids. It returns ``detection_boxes`` float32 ``[batch, N, 4]`` (clipped to [0, 1]),
``detection_classes`` int64 ``[batch, N]`` (the OD API gives float32; an id is an integer),
``detection_scores`` float32 ``[batch, N]`` and ``num_detections`` int64 ``[batch]``; rows past
``num_detections`` are zeros. The outputs equal :class:`~detsweep.export.detector.Detector`'s;
boxes partly outside the image are clipped, as training's evaluation clips them.

Beside the model, ``config.yaml`` (the checkpoint's as-run config) and ``detsweep.json``
(category ids and names, the step, whether the weights are the moving average), so that
``detsweep predict`` can name the classes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import tensorflow as tf

from detsweep.checkpoints import CONFIG_FILE
from detsweep.data.pipeline import InputSpec, pad_and_normalise, resize_longer_side
from detsweep.train.restore import load_trained_model

from .paths import check_new_folder, staged_folder

SIGNATURE = "serving_default"
INFO_FILE = "detsweep.json"


def export_saved_model(checkpoint_dir: str | Path, out_dir: str | Path, use_average: bool = True) -> Path:
    """Write the checkpoint's model (its moving average with ``use_average``, when it has one)
    as a SavedModel into ``out_dir``, a new or empty folder."""
    out = Path(out_dir)
    check_new_folder(out)  # before the slow part
    trained = load_trained_model(checkpoint_dir)
    averaged = use_average and trained.moving_average is not None
    if averaged:
        trained.moving_average.swap()
    module = DetectionModule(trained.model, trained.config.model.image_size, [c.id for c in trained.categories])
    with staged_folder(out) as folder:
        tf.saved_model.save(module, str(folder), signatures={SIGNATURE: module.serve})
        shutil.copyfile(Path(checkpoint_dir) / CONFIG_FILE, folder / CONFIG_FILE)
        info = {"categories": [{"id": c.id, "name": c.name} for c in trained.categories],
                "step": trained.step, "moving_average": averaged}
        (folder / INFO_FILE).write_text(json.dumps(info, indent=1))
    return out


def read_export_info(directory: str | Path) -> dict:
    """``detsweep.json`` of an export: ``categories``, ``step``, ``moving_average``."""
    return json.loads((Path(directory) / INFO_FILE).read_text())


class DetectionModule(tf.Module):
    """The serving graph around a trained detector."""

    def __init__(self, model, image_size: int, category_ids: list[int]):
        super().__init__()
        self.model = model
        self.spec = InputSpec(image_size)
        self.category_ids = category_ids

    @tf.function(input_signature=[tf.TensorSpec([None, None, None, 3], tf.uint8, name="images")])
    def serve(self, images: tf.Tensor) -> dict[str, tf.Tensor]:
        resized, scale = resize_longer_side(images, self.spec.image_size)
        batch = pad_and_normalise({"image": resized}, self.spec)["image"]
        # Under mixed precision the heads emit float16; keras-hub's box decoding wants float32.
        predictions = {k: tf.cast(v, tf.float32) for k, v in self.model(batch, training=False).items()}
        decoded = self.model.decode_predictions(predictions, batch)
        return self.in_original_image(decoded, scale, tf.shape(images)[1:3])

    def in_original_image(self, decoded: dict[str, tf.Tensor], scale: tf.Tensor,
                          image_shape: tf.Tensor) -> dict[str, tf.Tensor]:
        """Boxes normalised to the original image, labels as category ids, padding rows zero."""
        count = tf.cast(decoded["num_detections"], tf.int64)
        valid = tf.range(tf.shape(decoded["labels"], out_type=tf.int64)[1])[None, :] < count[:, None]
        size = tf.cast(tf.tile(image_shape, [2]), tf.float32)
        boxes = tf.clip_by_value(decoded["boxes"] / scale / size, 0.0, 1.0)
        # Padding rows have label -1: any index will do, they are zeroed below.
        classes = tf.gather(tf.constant(self.category_ids, tf.int64), tf.maximum(decoded["labels"], 0))
        return {
            "detection_boxes": tf.where(valid[..., None], boxes, 0.0),
            "detection_classes": tf.where(valid, classes, tf.zeros_like(classes)),
            "detection_scores": tf.where(valid, decoded["confidence"], 0.0),
            "num_detections": count,
        }
