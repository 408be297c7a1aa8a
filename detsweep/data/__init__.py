"""Detection datasets read into one in-memory form: :class:`DetectionSet`.

Four formats (COCO JSON, Pascal VOC XML, TF OD API TFRecords, synthetic shapes) become
the same examples: absolute ``(ymin, xmin, ymax, xmax)`` boxes clipped to the image,
contiguous labels, crowd boxes kept apart, and counts of everything loading changed.
TensorFlow is imported only to read TFRecords.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from detsweep.config import DataConfig, DatasetConfig

from .records import Category, DetectionSet, Example
from .report import describe, format_description
from .synthetic import generate_synthetic, write_synthetic

if TYPE_CHECKING:
    from .pipeline import TrainingSource


def load_dataset(config: DatasetConfig, verify: bool = True) -> DetectionSet:
    """Read the dataset ``config`` describes.

    With ``verify``, every image header is read once: missing, unreadable or resized
    images are found here rather than inside tf.data. Ray workers pass False after the
    driver has verified. Paths in a bucket are read from this node's copy (:mod:`.remote`).
    """
    from .remote import with_local_copies

    config = with_local_copies(config)
    if config.format == "coco":
        from .coco import read_coco

        return read_coco(config, verify)
    if config.format == "voc":
        from .voc import read_voc

        return read_voc(config, verify)
    if config.format == "tfrecord":
        from .tfrecord import read_tfrecord

        return read_tfrecord(config, verify)
    return generate_synthetic(config.num_images, config.image_size, config.classes, config.seed,
                              verify=verify, skip_empty=config.skip_empty)


def training_source(data: DataConfig, say: Callable[[str], None] = print) -> TrainingSource:
    """What training reads of ``data.train``: TFRecords streamed from this node's files (indexed
    once), other formats held in memory (their pixels read from their files as they are needed).
    Says what ``data.max_boxes`` cuts. The driver verified the files."""
    from .index import cut_line
    from .pipeline import InMemory
    from .remote import with_local_copies

    dataset = with_local_copies(data.train)
    if dataset.format == "tfrecord":
        from .streamed import StreamedRecords

        source = StreamedRecords.of(dataset, data.max_boxes, say)
    else:
        source = InMemory.of(load_dataset(dataset, verify=False), data.max_boxes)
    say(cut_line(source.box_counts, data.max_boxes))
    return source


def dataset_categories(config: DatasetConfig) -> list[Category]:
    """``config``'s categories, reading no more than it must: a TFRecord set's label map, or
    its record index (cached: the labels only, once per version of the files)."""
    if config.format == "tfrecord":
        from .index import record_index
        from .labelmap import read_label_map
        from .remote import with_local_copies
        from .tfrecord import record_files

        if config.label_map:
            return read_label_map(with_local_copies(config).label_map).categories
        local = with_local_copies(config)
        return record_index(record_files(local.annotations), say=lambda line: None).categories(None, None)
    return load_dataset(config, verify=False).categories


def drawn_examples(config: DatasetConfig, count: int, seed: int) -> list[Example]:
    """``count`` of ``config``'s images drawn at random (``seed``), in their order; all of them
    when it has fewer. A TFRecord set is streamed: only the drawn records are parsed and kept."""
    import numpy as np

    from .remote import with_local_copies

    local = with_local_copies(config)
    if local.format == "tfrecord" and not local.subset:
        from .streamed import drawn_records

        return drawn_records(local, count, seed)
    examples = load_dataset(local).examples
    return [examples[i] for i in sorted(np.random.default_rng(seed).permutation(len(examples))[:count])]


__all__ = [
    "Category",
    "DetectionSet",
    "Example",
    "describe",
    "drawn_examples",
    "format_description",
    "dataset_categories",
    "generate_synthetic",
    "load_dataset",
    "training_source",
    "write_synthetic",
]
