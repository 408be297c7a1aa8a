"""COCO instances JSON: ``images``, ``annotations`` and ``categories``.

Category ids may have gaps (COCO's 80 classes use ids 1..90); labels are their
positions in id order, and :meth:`DetectionSet.original_id` maps back. ``iscrowd``
annotations become crowd boxes: regions COCOeval ignores, never training targets.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from numbers import Real
from pathlib import Path
from typing import Any

import numpy as np

from detsweep.config import DatasetConfig
from detsweep.errors import DetsweepError

from .assemble import assemble
from .records import Category, DetectionSet, Example


def read_coco(config: DatasetConfig, verify: bool = True) -> DetectionSet:
    path = Path(config.annotations)
    tree = read_json(path)
    categories = parse_categories(_list(tree, "categories", path), path)
    examples = parse_images(_list(tree, "images", path), path, Path(config.images))
    add_annotations(examples, _list(tree, "annotations", path, required=False), categories, path)
    return assemble(str(path), categories, list(examples.values()), [str(path)] * len(examples), Counter(),
                    verify=verify, skip_empty=config.skip_empty, subset=config.subset)


def read_json(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as stream:
            tree = json.load(stream)
    except FileNotFoundError:
        raise DetsweepError(f"{path}: annotation file not found") from None
    except json.JSONDecodeError as error:
        raise DetsweepError(f"{path}: line {error.lineno}: invalid JSON: {error.msg}") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as error:
        raise DetsweepError(f"{path}: cannot read: {error.__class__.__name__}") from None
    if not isinstance(tree, dict):
        raise DetsweepError(f"{path}: found a JSON {type(tree).__name__}, expected a COCO object with "
                            "images, annotations and categories")
    return tree


def parse_categories(entries: list[Any], path: Path) -> list[Category]:
    categories: dict[int, Category] = {}
    for index, entry in enumerate(entries):
        where = f"{path}: categories[{index}]"
        category_id = _integer(_field(entry, "id", where), f"{where}.id")
        if category_id in categories:
            raise DetsweepError(f"{where}: found id {category_id} twice, expected unique category ids")
        categories[category_id] = Category(category_id, str(_field(entry, "name", where)))
    return sorted(categories.values(), key=lambda category: category.id)


def parse_images(entries: list[Any], path: Path, folder: Path) -> dict[int, Example]:
    examples: dict[int, Example] = {}
    for index, entry in enumerate(entries):
        where = f"{path}: images[{index}]"
        image_id = _integer(_field(entry, "id", where), f"{where}.id")
        if image_id in examples:
            raise DetsweepError(f"{where}: found image id {image_id} twice, expected unique image ids")
        file_name = str(_field(entry, "file_name", where))
        # A missing size is read from the image header later.
        height = _integer(entry.get("height", 0), f"{where}.height")
        width = _integer(entry.get("width", 0), f"{where}.width")
        examples[image_id] = Example(image_id, file_name, height, width, *_no_boxes(), path=str(folder / file_name))
    return examples


def add_annotations(examples: dict[int, Example], entries: list[Any], categories: list[Category], path: Path) -> None:
    label_of = {category.id: label for label, category in enumerate(categories)}
    found: dict[int, list[list[Any]]] = defaultdict(lambda: [[], [], [], []])
    for index, entry in enumerate(entries):
        where = f"{path}: annotations[{index}]"
        image_id = _field(entry, "image_id", where)
        if not _hashable(image_id) or image_id not in examples:
            raise DetsweepError(f"{where}: found image_id {image_id!r}, expected the id of an entry in images")
        category_id = _field(entry, "category_id", where)
        if not _hashable(category_id) or category_id not in label_of:
            raise DetsweepError(f"{where}: found category_id {category_id!r}, expected {_id_choices(label_of)}")
        x, y, w, h = _bbox(_field(entry, "bbox", where), where)
        lists = found[image_id][2:] if entry.get("iscrowd") else found[image_id][:2]
        lists[0].append((y, x, y + h, x + w))
        lists[1].append(label_of[category_id])
    for image_id, (boxes, labels, crowd_boxes, crowd_labels) in found.items():
        example = examples[image_id]
        example.boxes, example.labels = _arrays(boxes, labels)
        example.crowd_boxes, example.crowd_labels = _arrays(crowd_boxes, crowd_labels)


def _list(tree: dict[str, Any], key: str, path: Path, required: bool = True) -> list[Any]:
    value = tree.get(key, None if required else [])
    if not isinstance(value, list):
        found = "no" if value is None else f"a {type(value).__name__} as"
        raise DetsweepError(f"{path}: found {found} {key!r}, expected a list (a COCO instances JSON)")
    return value


def _field(entry: Any, key: str, where: str) -> Any:
    if not isinstance(entry, dict) or key not in entry:
        raise DetsweepError(f"{where}: found no {key!r}, expected an object with {key!r}")
    return entry[key]


def _integer(value: Any, where: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise DetsweepError(f"{where}: found {value!r}, expected an integer")


def _hashable(value: Any) -> bool:
    return not isinstance(value, (list, dict))


def _bbox(value: Any, where: str) -> tuple[float, float, float, float]:
    if not (isinstance(value, list) and len(value) == 4 and all(isinstance(v, Real) and not isinstance(v, bool)
                                                                for v in value)):
        raise DetsweepError(f"{where}: found bbox {value!r}, expected [x, y, width, height]")
    x, y, w, h = (float(v) for v in value)
    return x, y, w, h


def _id_choices(label_of: dict[int, int]) -> str:
    ids = sorted(label_of)
    if len(ids) <= 10:
        return "one of the ids in categories (" + ", ".join(str(i) for i in ids) + ")"
    return f"one of the {len(ids)} ids in categories ({ids[0]}..{ids[-1]})"


def _arrays(boxes: list, labels: list) -> tuple[np.ndarray, np.ndarray]:
    return np.array(boxes, np.float32).reshape(-1, 4), np.array(labels, np.int32)


def _no_boxes() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    return (*_arrays([], []), *_arrays([], []))
