"""Training data → tf.data: decode, augment (training), resize and pad, pad boxes, batch.

Every reader ends here, so COCO, VOC, TFRecord and synthetic data train identically: a
:class:`DetectionSet` held in memory (:class:`InMemory`), or TFRecords streamed from their files
(:class:`~detsweep.data.streamed.StreamedRecords`), each giving a worker its share an epoch at a
time. As in the OD API, the augmentations of :mod:`~detsweep.data.augment` work on the decoded
picture, before the resize (``random_scale_crop_and_pad_to_square`` excepted). Boxes end in
absolute pixels (ymin, xmin, ymax, xmax) of the resized image; ``scale`` and ``image_shape`` let
:func:`~detsweep.data.processing.in_original_image` map detections back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

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
                     decode: Callable[[dict], dict]) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
    """One ``(image, {"boxes", "labels"})`` of training, as the OD API makes it: the picture
    ``decode`` gives augmented, resized by ``spec``, scale-jittered on the resized image, padded
    and normalised."""
    element = resized(augmentations.on_decoded_image(decode(element)), spec)
    jitter = augmentations.scale_jitter
    if jitter is not None:
        element = random_scale_crop(element, spec, jitter.scale_min, jitter.scale_max)
    element = pad_and_normalise(element, spec)
    return element["image"], {"boxes": element["boxes"], "labels": tf.cast(element["labels"], tf.float32)}


class Share(Protocol):
    """What one input pipeline reads, an epoch at a time: ``size`` images, each epoch all of them."""

    size: int

    def epoch(self, epoch: tf.Tensor) -> tf.data.Dataset:
        """The images of ``epoch`` (``image`` not decoded, ``boxes``, ``labels``), before the shuffle."""

    def decoded(self, element: dict) -> dict:
        """``element``'s picture decoded, its boxes in its pixels."""


class TrainingSource(Protocol):
    """Training data: in memory (:class:`InMemory`) or streamed (:class:`~detsweep.data.streamed.StreamedRecords`)."""

    categories: list
    max_boxes: int  # each image's first boxes kept
    box_counts: list[int]  # each training image's boxes

    def share(self, count: int, index: int, seed: int) -> Share: ...

    def sharing_line(self, count: int) -> str:
        """How ``count`` pipelines share the data, in one line."""


@dataclass(frozen=True)
class InMemory:
    """A :class:`DetectionSet` as training data: every pipeline holds it and keeps its share."""

    dataset: DetectionSet
    max_boxes: int

    @classmethod
    def of(cls, dataset: DetectionSet, max_boxes: int | None = None) -> InMemory:
        return cls(dataset, max_boxes or max(1, max((len(e.labels) for e in dataset.examples), default=0)))

    @property
    def categories(self) -> list:
        return self.dataset.categories

    @property
    def box_counts(self) -> list[int]:
        return [len(example.labels) for example in self.dataset.examples]

    def share(self, count: int, index: int, seed: int) -> Share:
        return _InMemoryShare(self, count, index, seed)

    def sharing_line(self, count: int) -> str:
        held = f"{self.dataset.source}: {len(self.dataset.examples)} images in memory"
        return held if count == 1 else f"{held}, each of {count} pipelines keeps 1 in {count}"


class _InMemoryShare:
    """Pipeline ``index`` of ``count``'s images, each epoch in an order drawn from the seed and the epoch."""

    def __init__(self, source: InMemory, count: int, index: int, seed: int):
        self.from_files = source.dataset.examples[0].encoded is None
        self.size = len(range(index, len(source.dataset.examples), count))
        self.seed = seed
        self.columns = {key: tf.constant(column[index::count])
                        for key, column in to_tensors(source.dataset, source.max_boxes).items()}

    def epoch(self, epoch: tf.Tensor) -> tf.data.Dataset:
        order = tf.random.experimental.stateless_shuffle(tf.range(self.size), tf.stack([tf.constant(self.seed, tf.int64), epoch]))
        return tf.data.Dataset.from_tensor_slices(order).map(
            lambda i: {key: column[i] for key, column in self.columns.items()})

    def decoded(self, element: dict) -> dict:
        return decoded(element, self.from_files)


EPOCHS = 2**40  # "endless"


def training_dataset(
    source: TrainingSource | DetectionSet,
    spec: InputSpec,
    augmentation: AugmentationConfig | Augmentations,
    batch_size: int,
    seed: int,
    shard: tuple[int, int] = (1, 0),
    skip: int = 0,
    shuffle_buffer_size: int = 2048,
) -> tf.data.Dataset:
    """Endless, shuffled batches of ``(images, {"boxes", "labels"})`` for one input pipeline.

    ``source``: a DetectionSet is trained on in memory, every box kept. ``augmentation``: the
    config's, or as built already (a training reports what it built). ``shard = (num_pipelines,
    index)``: each pipeline reads a disjoint share. ``seed``: the run's; each pipeline draws from
    its own.

    Each epoch's order is drawn from the seed and the epoch alone: its images shuffled in a
    buffer of ``shuffle_buffer_size``, each given its own seed for its augmentations' stateless
    draws (the same batches whichever threads map them). ``skip``: the images this pipeline
    already gave (a resumed run's). The batches go on exactly where an unbroken run's would be,
    reading only the rest of the epoch it stopped in.
    """
    augmentations = augmentation if isinstance(augmentation, Augmentations) else build_augmentations(augmentation)
    source = InMemory.of(source) if isinstance(source, DetectionSet) else source
    share = source.share(*shard, seed=seed + 1000 * shard[1])  # each pipeline its own draws
    data = shuffled_examples(share, seed + 1000 * shard[1], skip, shuffle_buffer_size)
    # One map for the whole example: each map is a stage of its own, with its own buffers
    data = data.map(lambda element: training_example(element, spec, augmentations, share.decoded),
                    num_parallel_calls=tf.data.AUTOTUNE)
    return data.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def shuffled_examples(share: Share, seed: int, skip: int, shuffle_buffer_size: int) -> tf.data.Dataset:
    """``share``'s examples, endless, from the ``skip``-th: epoch after epoch, each in the share's
    order for it shuffled in a buffer of ``shuffle_buffer_size`` (its seed a number: tf.data's
    shuffle takes no tensor seed under a global seed of 0, so the epochs differ by the share's
    order), each with its augmentations' seed ``[seed, its number]``. Reads only the rest of the
    epoch it starts in."""

    def one_epoch(epoch: tf.Tensor) -> tf.data.Dataset:
        images = share.epoch(epoch).shuffle(shuffle_buffer_size, seed=seed, reshuffle_each_iteration=False)
        return images.enumerate().map(
            lambda i, element: {**element, "seed": tf.stack([tf.constant(seed, tf.int64), epoch * share.size + i])})

    start, within = divmod(skip, share.size)
    return tf.data.Dataset.range(start, EPOCHS).flat_map(one_epoch).skip(within)


def evaluation_dataset(dataset: DetectionSet, spec: InputSpec, batch_size: int,
                       shard: tuple[int, int] = (1, 0), replicas: int = 1) -> tf.data.Dataset:
    """Pipeline ``index`` of ``count``'s images (``shard``; every ``count``-th from ``index``),
    each once, in order, every box kept: ``(images, {"image_id", "scale", "image_shape", "boxes",
    "labels"})`` batches of exactly ``batch_size`` (a traced step takes one static batch shape),
    as many on every pipeline and a multiple of the ``replicas`` it feeds (each collective step
    takes a batch on every replica). The batches are filled up with copies of the share's first
    image whose ``image_id`` is -1 and which have no boxes. Boxes and labels are the training
    pipeline's targets (resized pixels, float labels, -1 padding)."""
    count, index = shard
    from_files = dataset.examples[0].encoded is None
    examples = dataset.examples[index::count]
    per_step = batch_size * replicas
    size = -(-len(dataset.examples) // (count * per_step)) * per_step  # every pipeline's
    # a share may be empty (fewer images than pipelines): it is all filler
    share = replace(dataset, examples=examples or dataset.examples[:1])
    tensors = to_tensors(share, max(1, max(len(example.labels) for example in dataset.examples)))  # every box
    tensors = {key: np.concatenate([column, np.repeat(column[:1], size - len(column), axis=0)])
               for key, column in tensors.items()}
    fillers = slice(len(examples), None)
    tensors["image_id"][fillers], tensors["labels"][fillers], tensors["boxes"][fillers] = -1, -1, -1.0
    data = tf.data.Dataset.from_tensor_slices(tensors)
    data = data.map(lambda e: pad_and_normalise(decode_and_resize(e, spec, from_files), spec),
                    num_parallel_calls=tf.data.AUTOTUNE)
    data = data.map(lambda e: (e["image"], {**{key: e[key] for key in ("image_id", "scale", "image_shape", "boxes")},
                                            "labels": tf.cast(e["labels"], tf.float32)}))
    return data.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)
