"""TFRecords as training reads them: streamed from the files, parsed in TensorFlow, never held whole.

Pipelines share the files, not the records: pipeline ``i`` of ``n`` reads files ``i, i + n, …``
of the sorted list. With fewer files than pipelines (or a ``subset``), every pipeline reads
every file and keeps records ``i, i + n, …`` of their sorted order. Each epoch a pipeline reads
its files in an order drawn from its seed and the epoch, several at once (interleaved). Either
way a pipeline's share is fixed, and the
:class:`~detsweep.data.index.RecordIndex` says how many training images it holds: an epoch's
length, so :mod:`.pipeline` can start a resumed run at its epoch.

A record is cleaned as :func:`~detsweep.data.assemble.clip_boxes` cleans every format: its
normalised boxes clipped to the image, those of no area and crowd boxes dropped, ids turned
into contiguous labels; the first ``max_boxes`` kept. Boxes become pixels once the image is
decoded, by its real size.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from itertools import islice

import numpy as np
import tensorflow as tf

from detsweep.config import DatasetConfig

from .index import RecordIndex, record_index
from .labelmap import LabelMap, read_label_map
from .records import Category, Example, plural
from .tfrecord import od_api_features, parse_record, record_categories, record_files, to_examples
from .tfrecord import read_records as record_bytes

CYCLE_LENGTH = 8  # files read at once by a worker (the OD API's num_readers is 64, on bigger hosts)


@dataclass(frozen=True)
class StreamedRecords:
    """A TFRecord training set: its index, categories, and how training reads it."""

    index: RecordIndex
    categories: list[Category]
    label_map: LabelMap | None
    skip_empty: bool
    max_boxes: int
    subset: tuple[int, int] | None = None

    @classmethod
    def of(cls, config: DatasetConfig, max_boxes: int | None, say=print) -> StreamedRecords:
        """``config``'s records (local paths: :func:`~detsweep.data.remote.with_local_copies` first),
        indexed once on this node; ``max_boxes`` None keeps every box."""
        index = record_index(record_files(config.annotations), say)
        label_map = read_label_map(config.label_map) if config.label_map else None
        categories = index.categories(label_map, config.label_map)
        return cls(index, categories, label_map, config.skip_empty, max_boxes or max(1, index.most_boxes),
                   config.subset)

    @property
    def box_counts(self) -> list[int]:
        """Every training image's boxes, in the files' order (``subset`` and ``skip_empty`` applied)."""
        counts = [count for file_counts in self.index.boxes for count in file_counts]
        if self.subset:
            counts = counts[slice(*self.subset)]
        return [count for count in counts if count or not self.skip_empty]

    def share(self, count: int, index: int, seed: int) -> RecordShare:
        """Pipeline ``index`` of ``count``'s share, its files' order each epoch drawn from ``seed`` and the epoch."""
        if len(self.index.files) >= count and not self.subset:
            mine = range(index, len(self.index.files), count)
            pieces = tuple(Piece(self.index.files[f], 0, len(self.index.boxes[f]), 0) for f in mine)
            counts = [c for f in mine for c in self.index.boxes[f]]
            return RecordShare(self, pieces, 1, _size(counts, self.skip_empty), seed)
        # By record: record p of the files in their sorted order (of the subset) is pipeline p % count's.
        start, stop = self.subset or (0, self.index.num_records)
        pieces, counts, offset = [], [], 0
        for path, file_counts in zip(self.index.files, self.index.boxes):
            first, last = max(start - offset, 0), min(stop - offset, len(file_counts))
            if first < last:
                keep = (index - (offset + first - start)) % count
                pieces.append(Piece(path, first, last - first, keep))
                counts += file_counts[first:last][keep::count]
            offset += len(file_counts)
        return RecordShare(self, tuple(pieces), count, _size(counts, self.skip_empty), seed)

    def sharing_line(self, count: int) -> str:
        files, pipelines = plural(len(self.index.files), "TFRecord file"), plural(count, "pipeline")
        if self.subset:
            return f"data.train: subset {list(self.subset)} of {files}: {pipelines} read it whole, each keeps 1 record in {count}"
        if len(self.index.files) >= count:
            return f"data.train: {files} shared by file among {pipelines}"
        return (f"data.train: {files} for {pipelines}: each reads every file and keeps 1 record in {count} (shard the "
                f"records into at least {count} files to read each once)")


@dataclass(frozen=True)
class Piece:
    """Records ``[skip, skip + take)`` of ``path``, of which the ``keep``-th of every share's ``every`` count."""

    path: str
    skip: int
    take: int
    keep: int


@dataclass(frozen=True)
class RecordShare:
    """What one pipeline reads: ``pieces`` of files, 1 record in ``every`` of each, ``size`` training images."""

    records: StreamedRecords
    pieces: tuple[Piece, ...]
    every: int
    size: int
    seed: int

    def epoch(self, epoch: tf.Tensor) -> tf.data.Dataset:
        """This share's images of ``epoch``, parsed, not decoded, in the order read: its pieces in an
        order drawn from the seed and the epoch, ``CYCLE_LENGTH`` read at once, a record from each in turn."""
        columns = [tf.constant([getattr(piece, name) for piece in self.pieces]) for name in ("path", "skip", "take", "keep")]
        order = tf.random.experimental.stateless_shuffle(tf.range(len(self.pieces)),
                                                         tf.stack([tf.constant(self.seed, tf.int64), epoch]))

        def piece(i: tf.Tensor) -> tf.data.Dataset:
            path, skip, take, keep = (tf.gather(column, i) for column in columns)
            records = read_records(path).skip(tf.cast(skip, tf.int64)).take(tf.cast(take, tf.int64))
            return records.shard(self.every, tf.cast(keep, tf.int64))

        data = tf.data.Dataset.from_tensor_slices(order).interleave(
            piece, cycle_length=min(len(self.pieces), CYCLE_LENGTH), num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True)
        data = data.map(self.parsed, num_parallel_calls=tf.data.AUTOTUNE)
        return data.filter(lambda element: element["labels"][0] >= 0) if self.records.skip_empty else data

    def parsed(self, serialized: tf.Tensor) -> dict[str, tf.Tensor]:
        """A record as training's element: the encoded image, normalised boxes ``[max_boxes, 4]`` and
        labels ``[max_boxes]``, -1 padding."""
        features = tf.io.parse_single_example(serialized, od_api_features())
        boxes = tf.stack([dense(features[f"image/object/bbox/{side}"]) for side in ("ymin", "xmin", "ymax", "xmax")], 1)
        ids = dense(features["image/object/class/label"])
        if self.records.label_map is not None:  # records with class texts only: the label map's ids
            texts = dense(features["image/object/class/text"])
            ids = tf.cond(tf.size(ids) > 0, lambda: ids, lambda: self._ids_of(texts))
        kept = training_boxes(boxes, dense(features["image/object/is_crowd"]))
        boxes = tf.clip_by_value(tf.boolean_mask(boxes, kept), 0.0, 1.0)[:self.records.max_boxes]
        labels = self._labels_of(tf.boolean_mask(ids, kept))[:self.records.max_boxes]
        missing = self.records.max_boxes - tf.shape(labels)[0]
        return {"image": features["image/encoded"], "boxes": tf.pad(boxes, [[0, missing], [0, 0]], constant_values=-1.0),
                "labels": tf.pad(labels, [[0, missing]], constant_values=-1)}

    def decoded(self, element: dict) -> dict:
        """``element`` with its picture decoded (float32 ``[h, w, 3]``, 0..255) and its boxes in its pixels."""
        image = tf.io.decode_image(element["image"], channels=3, expand_animations=False)
        size = tf.cast(tf.shape(image)[:2], tf.float32)
        boxes = tf.where(element["labels"][:, None] >= 0, element["boxes"] * tf.tile(size, [2]), -1.0)
        return {**element, "image": tf.cast(image, tf.float32), "boxes": boxes}

    def _labels_of(self, ids: tf.Tensor) -> tf.Tensor:
        """Label map ids → contiguous labels (the categories' positions); the index checked every id is one."""
        known = sorted((category.id, label) for label, category in enumerate(self.records.categories))
        sorted_ids = tf.constant([category_id for category_id, _ in known], tf.int64)
        positions = tf.minimum(tf.searchsorted(sorted_ids, ids), len(known) - 1)
        labels = tf.gather(tf.constant([label for _, label in known], tf.int32), positions)
        return tf.where(tf.gather(sorted_ids, positions) == ids, labels, -1)

    def _ids_of(self, texts: tf.Tensor) -> tf.Tensor:
        names = self.records.label_map.ids_by_name
        matches = tf.equal(texts[:, None], tf.constant(list(names), tf.string)[None, :])
        return tf.gather(tf.constant(list(names.values()), tf.int64), tf.argmax(tf.cast(matches, tf.int32), axis=1))


def read_records(path: tf.Tensor) -> tf.data.Dataset:
    return tf.data.TFRecordDataset(path)


def dense(feature: tf.sparse.SparseTensor) -> tf.Tensor:
    return tf.sparse.to_dense(feature)


def training_boxes(boxes: tf.Tensor, crowd: tf.Tensor) -> tf.Tensor:
    """Which normalised boxes ``[n, 4]`` training keeps: of positive area once clipped to the image, not crowd."""
    clipped = tf.clip_by_value(boxes, 0.0, 1.0)
    area = (clipped[:, 2] > clipped[:, 0]) & (clipped[:, 3] > clipped[:, 1])
    not_crowd = tf.cond(tf.size(crowd) > 0, lambda: tf.equal(crowd, 0), lambda: tf.ones_like(area))
    return area & not_crowd


def _size(counts: list[int], skip_empty: bool) -> int:
    return sum(1 for count in counts if count or not skip_empty)


def drawn_records(config: DatasetConfig, count: int, seed: int) -> list[Example]:
    """``count`` of a TFRecord set's records drawn at random (``seed``; all when it has fewer),
    as examples in their order: one pass per file that holds a drawn record, parsing only those
    and stopping after the last (int8's calibration pictures from a set of COCO's size)."""
    files = record_files(config.annotations)
    index = record_index(files, say=lambda line: None)
    drawn = np.random.default_rng(seed).permutation(index.num_records)[:count]
    label_map = read_label_map(config.label_map) if config.label_map else None
    records, start = [], 0
    for path, boxes in zip(index.files, index.boxes):
        wanted = {int(i) - start for i in drawn if start <= i < start + len(boxes)}
        for number, raw in enumerate(islice(record_bytes(path), max(wanted, default=-1) + 1)):
            if number in wanted:
                records.append(parse_record(raw, f"{path}: record {number}", label_map))
        start += len(boxes)
    return to_examples(records, record_categories(records, label_map, config.label_map), Counter(), verify=True)
