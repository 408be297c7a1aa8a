"""The one in-memory form every dataset reader produces.

Boxes are absolute pixels ``(ymin, xmin, ymax, xmax)``, clipped to the image and of
positive area; labels are contiguous ``0..K-1`` indices into ``categories``, whose
``id`` keeps the dataset's own number (COCO's 1..90, a label map's ids) so that
evaluation and exported models speak the dataset's ids. Crowd boxes are kept apart:
they are never training targets, only regions COCOeval ignores.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Category:
    id: int  # the dataset's original id (COCO's 1..90, label map ids)
    name: str


@dataclass
class Example:
    image_id: int
    file_name: str
    height: int
    width: int
    boxes: np.ndarray  # float32 [N, 4] absolute pixels (ymin, xmin, ymax, xmax)
    labels: np.ndarray  # int32 [N], contiguous 0..K-1
    crowd_boxes: np.ndarray  # float32 [M, 4]; ignore regions for COCOeval, never targets
    crowd_labels: np.ndarray  # int32 [M]
    path: str | None = None  # the image file, or
    encoded: bytes | None = None  # the encoded image (TFRecord, synthetic)


@dataclass
class DetectionSet:
    source: str
    categories: list[Category]
    examples: list[Example]
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def num_boxes(self) -> int:
        return sum(len(example.labels) for example in self.examples)

    @property
    def num_crowd_boxes(self) -> int:
        return sum(len(example.crowd_labels) for example in self.examples)

    def original_id(self, label: int) -> int:
        """Contiguous label → the dataset's category id."""
        if not 0 <= label < len(self.categories):
            raise ValueError(f"label {label} is outside 0..{len(self.categories) - 1}")
        return self.categories[label].id

    def label_of(self, category_id: int) -> int:
        """The dataset's category id → contiguous label."""
        for label, category in enumerate(self.categories):
            if category.id == category_id:
                return label
        raise ValueError(f"category id {category_id} is not one of {[c.id for c in self.categories]}")

    def summary_line(self) -> str:
        """``SOURCE: 200 images, 217 boxes, 1 category; 3 grayscale images converted to RGB``."""
        head = ", ".join([
            plural(len(self.examples), "image"),
            plural(self.num_boxes, "box", "boxes"),
            plural(len(self.categories), "category", "categories"),
        ])
        changes = [describe_count(key, value) for key, value in self.counts.items() if value]
        return "; ".join([f"{self.source}: {head}"] + changes)

    def to_coco(self) -> dict[str, Any]:
        """COCO ground truth for ``pycocotools.coco.COCO``, with the dataset's category ids."""
        images, annotations = [], []
        for example in self.examples:
            images.append({"id": example.image_id, "file_name": example.file_name,
                           "height": example.height, "width": example.width})
            for boxes, labels, crowd in ((example.boxes, example.labels, 0),
                                         (example.crowd_boxes, example.crowd_labels, 1)):
                for box, label in zip(boxes, labels):
                    annotations.append(self._coco_annotation(len(annotations) + 1, example.image_id, box, label, crowd))
        categories = [{"id": category.id, "name": category.name} for category in self.categories]
        return {"images": images, "annotations": annotations, "categories": categories}

    def _coco_annotation(self, number: int, image_id: int, box: np.ndarray, label: int, crowd: int) -> dict[str, Any]:
        ymin, xmin, ymax, xmax = (float(value) for value in box)
        width, height = xmax - xmin, ymax - ymin
        return {"id": number, "image_id": image_id, "category_id": self.original_id(int(label)),
                "bbox": [xmin, ymin, width, height], "area": width * height, "iscrowd": crowd}


# How each count reads in a summary; unknown keys read as their words.
COUNT_PHRASES = {
    "clipped_boxes": "{n} {boxes} clipped to the image",
    "dropped_zero_area_boxes": "{n} zero-area {boxes} dropped",
    "crowd_boxes": "{n} crowd {boxes} kept as ignore regions",
    "difficult_boxes": "{n} difficult {boxes} kept for training",
    "empty_images": "{n} {images} without boxes kept",
    "skipped_empty_images": "{n} {images} without boxes skipped",
    "grayscale_images": "{n} grayscale {images} converted to RGB",
    "rgba_images": "{n} RGBA {images}: alpha dropped",
    "cmyk_images": "{n} CMYK {images} converted to RGB",
    "size_mismatch": "{n} image {sizes} taken from the file, not the annotation",
}


def describe_count(key: str, value: int) -> str:
    words = {"boxes": "box" if value == 1 else "boxes", "images": "image" if value == 1 else "images",
             "sizes": "size" if value == 1 else "sizes"}
    phrase = COUNT_PHRASES.get(key)
    return phrase.format(n=value, **words) if phrase else f"{value} {key.replace('_', ' ')}"


def plural(count: int, one: str, many: str | None = None) -> str:
    return f"{count} {one if count == 1 else many or one + 's'}"


def empty_boxes() -> np.ndarray:
    return np.zeros((0, 4), np.float32)


def empty_labels() -> np.ndarray:
    return np.zeros((0,), np.int32)
