"""Detection datasets read into one in-memory form: :class:`DetectionSet`.

Four formats (COCO JSON, Pascal VOC XML, TF OD API TFRecords, synthetic shapes) become
the same examples: absolute ``(ymin, xmin, ymax, xmax)`` boxes clipped to the image,
contiguous labels, crowd boxes kept apart, and counts of everything loading changed.
TensorFlow is imported only to read TFRecords.
"""

from __future__ import annotations

from detsweep.config import DatasetConfig

from .records import Category, DetectionSet, Example
from .report import describe, format_description
from .synthetic import generate_synthetic, write_synthetic


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


__all__ = [
    "Category",
    "DetectionSet",
    "Example",
    "describe",
    "format_description",
    "generate_synthetic",
    "load_dataset",
    "write_synthetic",
]
