"""Pascal VOC: a folder of XML files, one per image.

Without ``images`` in the config, each image is looked for where VOC-style datasets
keep it: the XML's ``<folder>`` or an ``images`` or ``JPEGImages`` folder beside the
annotation folder (the raccoon dataset: ``annotations/`` and ``images/``, with
``<folder>images</folder>``), the annotation folder itself, then the XML's ``<path>``.
Without a label map, categories are the distinct object names, sorted, with ids 1..K.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ElementTree
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from detsweep.config import DatasetConfig
from detsweep.errors import DetsweepError

from .assemble import assemble
from .labelmap import read_label_map
from .records import Category, DetectionSet, Example, empty_boxes, empty_labels


@dataclass
class VocObject:
    name: str
    box: tuple[float, float, float, float]  # ymin, xmin, ymax, xmax
    difficult: bool


@dataclass
class VocImage:
    xml: Path
    file_name: str
    folder: str
    path: str
    height: int  # 0 when the XML has no size: read from the image then
    width: int
    objects: list[VocObject]


def read_voc(config: DatasetConfig, verify: bool = True) -> DetectionSet:
    root = Path(config.annotations)
    parsed = [parse_voc_xml(path) for path in xml_files(root)]
    categories, label_of = voc_categories(parsed, config.label_map)
    folder = root if root.is_dir() else root.parent
    find_image = ImageFinder(folder, Path(config.images) if config.images else None)
    counts: Counter = Counter()
    examples = []
    for image_id, image in enumerate(parsed, start=1):
        # Difficult objects stay training boxes, as in the OD API's create_pascal_tf_record
        # (ignore_difficult_instances defaults to false); COCOeval has no notion of them.
        counts["difficult_boxes"] += sum(obj.difficult for obj in image.objects)
        boxes = np.array([obj.box for obj in image.objects], np.float32).reshape(-1, 4)
        labels = np.array([label_of[obj.name] for obj in image.objects], np.int32)
        examples.append(Example(image_id, image.file_name, image.height, image.width, boxes, labels,
                                empty_boxes(), empty_labels(), path=str(find_image(image))))
    return assemble(str(root), categories, examples, [str(image.xml) for image in parsed], counts,
                    verify=verify, skip_empty=config.skip_empty, subset=config.subset)


def xml_files(root: Path) -> list[Path]:
    """The XML files of a folder in natural order (image 2 before image 10), or one XML file."""
    if root.is_file():
        return [root]
    if not root.is_dir():
        raise DetsweepError(f"{root}: annotation folder not found")
    files = sorted(root.glob("*.xml"), key=lambda path: [int(part) if part.isdigit() else part
                                                          for part in re.split(r"(\d+)", path.name)])
    if not files:
        raise DetsweepError(f"{root}: found no .xml files, expected Pascal VOC annotations")
    return files


def parse_voc_xml(path: Path) -> VocImage:
    try:
        root = ElementTree.parse(path).getroot()
    except ElementTree.ParseError as error:
        raise DetsweepError(f"{path}: invalid XML: {error}") from None
    except OSError as error:
        raise DetsweepError(f"{path}: cannot read: {error.__class__.__name__}") from None
    if root.tag != "annotation":
        raise DetsweepError(f"{path}: found <{root.tag}> at the top, expected a Pascal VOC <annotation>")
    file_name = _text(root, "filename", path)
    return VocImage(
        xml=path,
        file_name=file_name,
        folder=(root.findtext("folder") or "").strip(),
        path=(root.findtext("path") or "").strip(),
        height=int(_number(root, "size/height", path, default=0)),
        width=int(_number(root, "size/width", path, default=0)),
        objects=[_object(element, path) for element in root.findall("object")],
    )


def voc_categories(images: list[VocImage], label_map: str | None) -> tuple[list[Category], dict[str, int]]:
    """Categories and object name → contiguous label."""
    if label_map is None:
        names = sorted({obj.name for image in images for obj in image.objects})
        return [Category(i, name) for i, name in enumerate(names, start=1)], {name: i for i, name in enumerate(names)}
    mapping = read_label_map(label_map)
    label_of_id = {category.id: label for label, category in enumerate(mapping.categories)}
    for image in images:
        for obj in image.objects:
            if obj.name not in mapping.ids_by_name:
                known = ", ".join(sorted(mapping.ids_by_name))
                raise DetsweepError(f"{image.xml}: found object name {obj.name!r}, expected a name in {label_map} "
                                    f"({known})")
    return mapping.categories, {name: label_of_id[i] for name, i in mapping.ids_by_name.items()}


class ImageFinder:
    """Where the image of a VOC XML is: ``images`` if configured, else the first place it exists."""

    def __init__(self, annotation_folder: Path, images: Path | None):
        self.annotation_folder = annotation_folder
        self.images = images

    def __call__(self, image: VocImage) -> Path:
        if self.images is not None:
            return self.images / image.file_name
        candidates = [self.annotation_folder.parent / name for name in (image.folder, "images", "JPEGImages") if name]
        candidates.append(self.annotation_folder)
        for folder in candidates:
            if (folder / image.file_name).is_file():
                return folder / image.file_name
        if image.path and Path(image.path).is_file():
            return Path(image.path)
        # Not found: name the most likely place, so that the check reports it.
        existing = [folder for folder in candidates if folder.is_dir()]
        return (existing[0] if existing else candidates[0]) / image.file_name


def _object(element: ElementTree.Element, path: Path) -> VocObject:
    name = _text(element, "name", path)
    box = {key: _number(element, f"bndbox/{key}", path) for key in ("ymin", "xmin", "ymax", "xmax")}
    difficult = (element.findtext("difficult") or "0").strip() not in ("0", "")
    return VocObject(name, (box["ymin"], box["xmin"], box["ymax"], box["xmax"]), difficult)


def _text(element: ElementTree.Element, tag: str, path: Path) -> str:
    text = (element.findtext(tag) or "").strip()
    if not text:
        raise DetsweepError(f"{path}: found no <{tag}> in <{element.tag}>, expected one")
    return text


def _number(element: ElementTree.Element, tag: str, path: Path, default: float | None = None) -> float:
    text = (element.findtext(tag) or "").strip()
    if not text and default is not None:
        return default
    try:
        return float(text)
    except ValueError:
        found = repr(text) if text else "nothing"
        raise DetsweepError(f"{path}: <{element.tag}>/{tag}: found {found}, expected a number") from None
