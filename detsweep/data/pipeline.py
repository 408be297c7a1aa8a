"""A DetectionSet → tf.data: decode, resize (aspect kept) and pad, augment, pad boxes, batch.

Every reader ends here, so COCO, VOC, TFRecord and synthetic data train identically.
Boxes stay in absolute pixels (ymin, xmin, ymax, xmax) of the resized image; ``scale``
maps them back to the original image for evaluation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tensorflow as tf

from detsweep.config import AugmentationConfig

from .records import DetectionSet

# ImageNet statistics, as keras-hub's image converters normalise for pretrained encoders.
# (Plain lists: a tf.constant at import time would start TensorFlow's runtime too early for
# MultiWorkerMirroredStrategy.)
MEAN = [0.485 * 255, 0.456 * 255, 0.406 * 255]
STD = [0.229 * 255, 0.224 * 255, 0.225 * 255]


@dataclass(frozen=True)
class InputSpec:
    image_size: int
    max_boxes: int = 100


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
    image, scale = resize_longer_side(tf.io.decode_image(data, channels=3, expand_animations=False), spec.image_size)
    valid = element["labels"] >= 0
    boxes = tf.where(valid[:, None], element["boxes"] * scale, -1.0)
    return {**element, "image": image, "boxes": boxes, "scale": scale, "resized_shape": tf.shape(image)[:2]}


def resize_longer_side(images: tf.Tensor, image_size: int) -> tuple[tf.Tensor, tf.Tensor]:
    """An image ``[h, w, 3]`` (or a batch of one size, ``[b, h, w, 3]``) as float32 with its
    longer side ``image_size``, aspect kept; and the scale from original to resized pixels.
    Exported models do the same in their graphs."""
    shape = tf.cast(tf.shape(images)[-3:-1], tf.float32)
    scale = image_size / tf.reduce_max(shape)
    resized_shape = tf.cast(tf.round(shape * scale), tf.int32)
    return tf.image.resize(tf.cast(images, tf.float32), resized_shape), scale


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


def pad_and_normalise(element: dict, spec: InputSpec) -> dict:
    """Pad bottom and right to the square, then normalise; one image or a batch."""
    image = tf.image.pad_to_bounding_box(element["image"], 0, 0, spec.image_size, spec.image_size)
    image = (image - MEAN) / STD
    image.set_shape(image.shape[:-3].concatenate([spec.image_size, spec.image_size, 3]))
    return {**element, "image": image}


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
    """Every image once, in order: ``(images, {"image_id", "scale"})`` batches of exactly
    ``batch_size`` (the evaluator traces one static batch shape); the last one is filled up with
    copies of the first image whose ``image_id`` is -1."""
    from_files = dataset.examples[0].encoded is None
    tensors = to_tensors(dataset, spec.max_boxes)
    filler = -len(dataset.examples) % batch_size
    tensors = {key: np.concatenate([column, np.repeat(column[:1], filler, axis=0)]) for key, column in tensors.items()}
    tensors["image_id"][len(tensors["image_id"]) - filler:] = -1
    data = tf.data.Dataset.from_tensor_slices(tensors)
    data = data.map(lambda e: pad_and_normalise(decode_and_resize(e, spec, from_files), spec),
                    num_parallel_calls=tf.data.AUTOTUNE)
    data = data.map(lambda e: (e["image"], {"image_id": e["image_id"], "scale": e["scale"]}))
    return data.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)
