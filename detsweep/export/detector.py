"""A trained model as a detector of whole images: uint8 pictures of any size in, detections
in normalised ``ymin, xmin, ymax, xmax`` with the dataset's own category ids out. It runs
:func:`~detsweep.data.processing.detect_pictures`, the exported SavedModel's own graph."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from detsweep.data.processing import InputSpec, detect_pictures


class Detector:
    def __init__(self, model, spec: InputSpec, category_ids: list[int]):
        pictures = tf.TensorSpec([None, None, None, 3], tf.uint8)
        self._detect = tf.function(lambda images: detect_pictures(model, images, spec, category_ids),
                                   input_signature=[pictures])

    @classmethod
    def from_checkpoint(cls, directory: str, use_average: bool = True) -> Detector:
        """The checkpoint's model; with ``use_average``, its moving-average weights when it has them."""
        from detsweep.train.restore import load_trained_model

        trained = load_trained_model(directory)
        if use_average and trained.moving_average is not None:
            trained.moving_average.swap()
        return cls(trained.model, InputSpec.of(trained.config.model), [c.id for c in trained.categories])

    def detect(self, images: np.ndarray) -> dict[str, np.ndarray]:
        """``images``: uint8 ``[batch, height, width, 3]``."""
        found = self._detect(tf.constant(np.asarray(images, np.uint8)))
        return {key: value.numpy() for key, value in found.items()}
