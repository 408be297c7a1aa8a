"""Detections to compare an exported or registered model with: the checkpoint run by hand,
outside the graph they export, and a comparison that allows for float noise at the edge of
the suppression."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tensorflow as tf


def detected_by_hand(checkpoint: Path, images: np.ndarray, use_average: bool = True) -> dict[str, np.ndarray]:
    """What the checkpoint (its averaged weights, with ``use_average``) detects in ``images``
    (uint8, one size), as the exported model's outputs name it, computed outside the
    exported graph: each image stretched by hand so that its longer side is the model's size
    and padded bottom and right to the square, normalised, run through the Keras model, decoded
    by keras-hub's own decoding and suppression, and its boxes mapped back to the picture by
    hand. Only the resizing kernel (``tf.image.resize``, bilinear) is the pipeline's."""
    from detsweep.data.processing import MEAN, STD
    from detsweep.train.restore import load_trained_model

    trained = load_trained_model(checkpoint)
    if use_average and trained.moving_average is not None:
        trained.moving_average.swap()
    model, size = trained.model, trained.config.model.image_size
    assert trained.config.model.image_resizer == "keep_aspect_ratio" and trained.config.model.image_mean is None
    height, width = images.shape[1:3]
    scale = size / max(height, width)
    resized = tf.image.resize(images.astype(np.float32), (round(height * scale), round(width * scale))).numpy()
    canvas = np.zeros((len(images), size, size, 3), np.float32)
    canvas[:, :resized.shape[1], :resized.shape[2]] = resized
    batch = tf.constant((canvas - np.array(MEAN, np.float32)) / np.array(STD, np.float32))
    raw = {name: tf.cast(value, tf.float32) for name, value in model(batch, training=False).items()}
    # keras-hub's decoding leaves out the box variance its label encoder divided the targets by
    variance = tf.constant(model.label_encoder.box_variance, tf.float32)
    decoded = model.decode_predictions({**raw, "bbox_regression": raw["bbox_regression"] * variance}, batch)
    category_ids = np.array([category.id for category in trained.categories])
    found = {"detection_classes": [], "detection_scores": [], "detection_boxes": [], "num_detections": []}
    for index in range(len(images)):
        count = int(decoded["num_detections"][index])
        boxes = np.clip(decoded["boxes"][index, :count].numpy() / scale, 0, [height, width, height, width])
        labels = decoded["labels"][index, :count].numpy()
        keep = (labels >= 0) & (labels < len(category_ids)) & (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
        found["detection_classes"].append(category_ids[labels[keep]])
        found["detection_scores"].append(decoded["confidence"][index, :count].numpy()[keep])
        found["detection_boxes"].append(boxes[keep] / [height, width, height, width])
        found["num_detections"].append(int(keep.sum()))
    rows = max(found["num_detections"])
    return {name: np.array(values) if name == "num_detections" else np.stack(
        [np.pad(value, [(0, rows - len(value))] + [(0, 0)] * (value.ndim - 1)) for value in values])
        for name, values in found.items()}


def assert_same_detections(found: dict, expected: dict, atol: float) -> None:
    """The same detections of each image, within ``atol``, but for float noise at the edge of
    the suppression: a box whose overlap with a better one sits at the IoU threshold (0.5) may
    be kept by one and suppressed by the other, and what it suppresses differs with it. So each
    detection that the other lacks must be one the other's better detections overlap by the
    threshold, give or take 0.01; there are at most 2 such on each side."""
    for i in range(len(found["num_detections"])):
        ours, theirs = (detection_rows(outputs, i, int(outputs["num_detections"][i])) for outputs in (found, expected))
        for rows, other in ((ours, theirs), (theirs, ours)):
            lacking = [row for row in rows if not np.isclose(other, row, atol=atol).all(axis=1).any()]
            assert len(lacking) <= 2 and all(overlapped_by_a_better(row, other, 0.5 - 0.01, atol) for row in lacking), \
                (i, lacking, ours[:, 1], theirs[:, 1])


def overlapped_by_a_better(row: np.ndarray, rows: np.ndarray, iou: float, atol: float) -> bool:
    """Whether one of ``rows`` scoring at least ``row``'s overlaps its box by more than ``iou``."""
    def area(box):
        return np.maximum(box[..., 2] - box[..., 0], 0) * np.maximum(box[..., 3] - box[..., 1], 0)

    better = rows[rows[:, 1] >= row[1] - atol][:, 2:]
    corner = np.maximum(better[:, :2], row[2:4]), np.minimum(better[:, 2:], row[4:6])
    shared = area(np.concatenate(corner, axis=1))
    return bool((shared / (area(better) + area(row[2:]) - shared) > iou).any())


def detection_rows(outputs: dict, index: int, count: int) -> np.ndarray:
    """``[class, score, ymin, xmin, ymax, xmax]`` per detection of one image."""
    return np.column_stack([outputs["detection_classes"][index, :count], outputs["detection_scores"][index, :count],
                            outputs["detection_boxes"][index, :count]])
