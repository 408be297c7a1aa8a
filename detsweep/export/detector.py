"""A trained model as a detector of whole images: uint8 pictures of any size in, detections
in normalised ``ymin, xmin, ymax, xmax`` with the dataset's own category ids out.
The preprocessing is the pipeline's own (resize the longer side, pad, normalise)."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from detsweep.data.pipeline import InputSpec, pad_and_normalise


class Detector:
    def __init__(self, model, image_size: int, category_ids: list[int]):
        self.model = model
        self.spec = InputSpec(image_size)
        self.category_ids = np.asarray(category_ids, np.int64)

    @classmethod
    def from_checkpoint(cls, directory: str, use_average: bool = True) -> Detector:
        """The checkpoint's model; with ``use_average``, its moving-average weights when it has them."""
        from detsweep.train.restore import load_trained_model

        trained = load_trained_model(directory)
        if use_average and trained.moving_average is not None:
            trained.moving_average.swap()
        return cls(trained.model, trained.config.model.image_size, [c.id for c in trained.categories])

    def detect(self, images: np.ndarray) -> dict[str, np.ndarray]:
        """``images``: uint8 ``[batch, height, width, 3]``."""
        images = np.asarray(images, np.uint8)
        prepared = [self._prepare(image) for image in images]
        batch = tf.stack([image for image, _ in prepared])
        predictions = {k: tf.cast(v, tf.float32) for k, v in self.model(batch, training=False).items()}
        out = {k: v.numpy() for k, v in self.model.decode_predictions(predictions, batch).items()}
        boxes = np.zeros_like(out["boxes"])
        for i, (image, (_, scale)) in enumerate(zip(images, prepared)):
            height, width = image.shape[:2]
            boxes[i] = out["boxes"][i] / scale / np.array([height, width, height, width], np.float32)
        valid = np.arange(out["labels"].shape[1])[None, :] < out["num_detections"][:, None]
        classes = np.where(valid, self.category_ids[np.clip(out["labels"], 0, len(self.category_ids) - 1)], 0)
        return {
            "detection_boxes": np.clip(np.where(valid[..., None], boxes, 0.0), 0.0, 1.0).astype(np.float32),
            "detection_classes": classes.astype(np.int64),
            "detection_scores": np.where(valid, out["confidence"], 0.0).astype(np.float32),
            "num_detections": out["num_detections"].astype(np.int64),
        }

    def _prepare(self, image: np.ndarray) -> tuple[tf.Tensor, float]:
        """As the pipeline does it: the longer side to ``image_size``, padded, normalised."""
        height, width = image.shape[:2]
        scale = self.spec.image_size / max(height, width)
        resized = tf.image.resize(tf.cast(image, tf.float32), (round(height * scale), round(width * scale)))
        return pad_and_normalise({"image": resized}, self.spec)["image"], scale
