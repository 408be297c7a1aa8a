"""A DetectionSet → tf.data: decode, augment (training), resize and pad, pad boxes, batch.

Every reader ends here, so COCO, VOC, TFRecord and synthetic data train identically. As in the
OD API, the augmentations of :mod:`~detsweep.data.augment` work on the decoded picture, before
the resize (``random_scale_crop_and_pad_to_square`` excepted). Boxes end in absolute pixels
(ymin, xmin, ymax, xmax) of the resized image; ``scale`` and ``image_shape`` let
:func:`~detsweep.data.processing.in_original_image` map detections back.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from detsweep.config import AugmentationConfig

from .augment import Augmentations, build_augmentations, random_scale_crop
from .processing import InputSpec, fit_to_input, pad_and_normalise, scaled_boxes
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


def decoded(element: dict, from_files: bool) -> dict:
    """``element`` with its picture decoded: ``image`` float32 ``[h, w, 3]``, pixels 0..255."""
    data = tf.io.read_file(element["image"]) if from_files else element["image"]
    # channels=3 turns grayscale into RGB and drops an alpha channel.
    image = tf.io.decode_image(data, channels=3, expand_animations=False)
    return {**element, "image": tf.cast(image, tf.float32)}


def resized(element: dict, spec: InputSpec) -> dict:
    """``element`` resized by ``spec``, boxes with it. ``image_shape`` is the shape of the image it
    resized (the picture's at evaluation, the augmented image's in training) and ``scale`` maps
    that image's pixels to ``resized_shape``'s."""
    image, scale = fit_to_input(element["image"], spec)
    valid = element["labels"] >= 0
    boxes = tf.where(valid[:, None], scaled_boxes(element["boxes"], scale), -1.0)
    return {**element, "image": image, "boxes": boxes, "scale": scale, "resized_shape": tf.shape(image)[:2],
            "image_shape": tf.shape(element["image"])[:2]}


def decode_and_resize(element: dict, spec: InputSpec, from_files: bool) -> dict:
    return resized(decoded(element, from_files), spec)


def training_example(element: dict, spec: InputSpec, augmentations: Augmentations,
                     from_files: bool) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
    """One ``(image, {"boxes", "labels"})`` of training, as the OD API makes it: the decoded
    picture augmented, resized by ``spec``, scale-jittered on the resized image, padded and
    normalised."""
    element = resized(augmentations.on_decoded_image(decoded(element, from_files)), spec)
    jitter = augmentations.scale_jitter
    if jitter is not None:
        element = random_scale_crop(element, spec, jitter.scale_min, jitter.scale_max)
    element = pad_and_normalise(element, spec)
    return element["image"], {"boxes": element["boxes"], "labels": tf.cast(element["labels"], tf.float32)}


def training_dataset(
    dataset: DetectionSet,
    spec: InputSpec,
    augmentation: AugmentationConfig | Augmentations,
    batch_size: int,
    seed: int,
    shard: tuple[int, int] = (1, 0),
    skip: int = 0,
) -> tf.data.Dataset:
    """Endless, shuffled batches of ``(images, {"boxes", "labels"})`` for one input pipeline.

    ``augmentation``: the config's, or as built already (a training reports what it built).
    ``shard = (num_pipelines, index)``: each worker reads a disjoint part of the data.
    ``skip``: the examples this pipeline's seed already gave (a resumed run's): the batches
    go on exactly where an unbroken run's would be, at the cost of drawing the skipped
    examples' order and seeds, not of decoding them.
    """
    augmentations = augmentation if isinstance(augmentation, Augmentations) else build_augmentations(augmentation)
    from_files = dataset.examples[0].encoded is None
    data = tf.data.Dataset.from_tensor_slices(to_tensors(dataset, spec.max_boxes))
    data = data.shard(*shard).shuffle(len(dataset.examples), seed=seed, reshuffle_each_iteration=True).repeat()
    # Each example its own seed for its augmentations' stateless draws: the same batches for the
    # same seed, whichever threads map them (stateful draws would follow the threads' order).
    seeds = tf.data.Dataset.random(seed=seed).batch(2)
    # One map for the whole example: each map is a stage of its own, with its own buffers
    data = tf.data.Dataset.zip((data, seeds)).skip(skip).map(
        lambda e, s: training_example({**e, "seed": s}, spec, augmentations, from_files),
        num_parallel_calls=tf.data.AUTOTUNE)
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
