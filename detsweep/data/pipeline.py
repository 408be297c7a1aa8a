"""A DetectionSet → tf.data: decode, resize (aspect kept) and pad, augment, pad boxes, batch.

Every reader ends here, so COCO, VOC, TFRecord and synthetic data train identically.
Boxes stay in absolute pixels (ymin, xmin, ymax, xmax) of the resized image; ``scale`` and
``image_shape`` let :func:`~detsweep.data.processing.in_original_image` map detections back.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from detsweep.config import AugmentationConfig

from .processing import InputSpec, pad_and_normalise, resize_longer_side
from .records import DetectionSet


def to_tensors(dataset: DetectionSet, max_boxes: int) -> dict[str, np.ndarray]:
    """Column arrays of a DetectionSet, boxes padded with -1 to ``max_boxes`` per image."""
    count = len(dataset.examples)
    boxes = np.full((count, max_boxes, 4), -1.0, np.float32)
    labels = np.full((count, max_boxes), -1, np.int32)
    for i, example in enumerate(dataset.examples):
        kept = min(len(example.labels), max_boxes)
        boxes[i, :kept] = example.boxes[:kept]
        labels[i, :kept] = example.labels[:kept]
    first = dataset.examples[0]
    sources = [e.encoded if first.encoded is not None else e.path for e in dataset.examples]
    return {
        "image": np.asarray(sources, dtype=object),
        "image_id": np.asarray([e.image_id for e in dataset.examples], np.int64),
        "boxes": boxes,
        "labels": labels,
    }


def decode_and_resize(element: dict, spec: InputSpec, from_files: bool) -> dict:
    data = tf.io.read_file(element["image"]) if from_files else element["image"]
    # channels=3 turns grayscale into RGB and drops an alpha channel.
    decoded = tf.io.decode_image(data, channels=3, expand_animations=False)
    image, scale = resize_longer_side(decoded, spec.image_size)
    valid = element["labels"] >= 0
    boxes = tf.where(valid[:, None], element["boxes"] * scale, -1.0)
    return {**element, "image": image, "boxes": boxes, "scale": scale, "resized_shape": tf.shape(image)[:2],
            "image_shape": tf.shape(decoded)[:2]}


def random_horizontal_flip(element: dict, probability: float) -> dict:
    """Flip image and boxes within the resized image (before padding), as the OD API does."""
    flip = tf.random.uniform([]) < probability
    width = tf.cast(element["resized_shape"][1], tf.float32)
    ymin, xmin, ymax, xmax = tf.unstack(element["boxes"], axis=-1)
    flipped = tf.stack([ymin, width - xmax, ymax, width - xmin], axis=-1)
    valid = (element["labels"] >= 0)[:, None]
    return {
        **element,
        "image": tf.cond(flip, lambda: tf.image.flip_left_right(element["image"]), lambda: element["image"]),
        "boxes": tf.where(flip & valid, flipped, element["boxes"]),
    }


def random_scale_crop(element: dict, spec: InputSpec, scale_min: float, scale_max: float) -> dict:
    """Zoom the (resized) image by a random factor, then take a random ``image_size`` square
    window of it (padding where the zoomed image is smaller). Boxes follow, clipped to the
    window; boxes left with no area become padding. As the OD API's
    ``random_scale_crop_and_pad_to_square``."""
    size = spec.image_size
    factor = tf.random.uniform([], scale_min, scale_max)
    zoomed_shape = tf.maximum(tf.cast(tf.round(tf.cast(element["resized_shape"], tf.float32) * factor), tf.int32), 1)
    image = tf.image.resize(element["image"], zoomed_shape)
    free = tf.maximum(zoomed_shape - size, 0)
    offset = tf.cast(tf.floor(tf.random.uniform([2]) * tf.cast(free + 1, tf.float32)), tf.int32)
    window = tf.minimum(zoomed_shape, size)
    image = tf.slice(image, [offset[0], offset[1], 0], [window[0], window[1], 3])
    shift = tf.cast(tf.concat([offset, offset], 0), tf.float32)
    limit = tf.cast(tf.concat([window, window], 0), tf.float32)
    boxes = tf.clip_by_value(element["boxes"] * factor - shift, 0.0, limit)
    kept = (element["labels"] >= 0) & (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
    return {
        **element,
        "image": image,
        "boxes": tf.where(kept[:, None], boxes, -1.0),
        "labels": tf.where(kept, element["labels"], -1),
        "resized_shape": window,
    }


def training_dataset(
    dataset: DetectionSet,
    spec: InputSpec,
    augmentation: AugmentationConfig,
    batch_size: int,
    seed: int,
    shard: tuple[int, int] = (1, 0),
) -> tf.data.Dataset:
    """Endless, shuffled batches of ``(images, {"boxes", "labels"})`` for one input pipeline.

    ``shard = (num_pipelines, index)``: each worker reads a disjoint part of the data.
    """
    from_files = dataset.examples[0].encoded is None
    data = tf.data.Dataset.from_tensor_slices(to_tensors(dataset, spec.max_boxes))
    data = data.shard(*shard).shuffle(len(dataset.examples), seed=seed, reshuffle_each_iteration=True).repeat()
    data = data.map(lambda e: decode_and_resize(e, spec, from_files), num_parallel_calls=tf.data.AUTOTUNE)
    if augmentation.random_horizontal_flip > 0:
        data = data.map(lambda e: random_horizontal_flip(e, augmentation.random_horizontal_flip),
                        num_parallel_calls=tf.data.AUTOTUNE)
    jitter = augmentation.random_scale_crop_and_pad_to_square
    if jitter is not None:
        data = data.map(lambda e: random_scale_crop(e, spec, jitter.scale_min, jitter.scale_max),
                        num_parallel_calls=tf.data.AUTOTUNE)
    data = data.map(lambda e: pad_and_normalise(e, spec), num_parallel_calls=tf.data.AUTOTUNE)
    data = data.map(lambda e: (e["image"], {"boxes": e["boxes"], "labels": tf.cast(e["labels"], tf.float32)}))
    return data.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def evaluation_dataset(dataset: DetectionSet, spec: InputSpec, batch_size: int) -> tf.data.Dataset:
    """Every image once, in order: ``(images, {"image_id", "scale", "image_shape", "boxes", "labels"})``
    batches of exactly ``batch_size`` (the evaluator traces one static batch shape); the last one is
    filled up with copies of the first image whose ``image_id`` is -1 and which have no boxes.
    Boxes and labels are the training pipeline's targets (resized pixels, float labels, -1 padding)."""
    from_files = dataset.examples[0].encoded is None
    tensors = to_tensors(dataset, spec.max_boxes)
    filler = -len(dataset.examples) % batch_size
    tensors = {key: np.concatenate([column, np.repeat(column[:1], filler, axis=0)]) for key, column in tensors.items()}
    fillers = slice(len(tensors["image_id"]) - filler, None)
    tensors["image_id"][fillers], tensors["labels"][fillers], tensors["boxes"][fillers] = -1, -1, -1.0
    data = tf.data.Dataset.from_tensor_slices(tensors)
    data = data.map(lambda e: pad_and_normalise(decode_and_resize(e, spec, from_files), spec),
                    num_parallel_calls=tf.data.AUTOTUNE)
    data = data.map(lambda e: (e["image"], {**{key: e[key] for key in ("image_id", "scale", "image_shape", "boxes")},
                                            "labels": tf.cast(e["labels"], tf.float32)}))
    return data.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)
