"""OD API label maps (``.pbtxt``): ``item { id: 1 name: 'raccoon' display_name: 'Raccoon' }``.

Parsed by protobuf's ``text_format`` against the OD API's ``StringIntLabelMap`` fields
we use (string_int_label_map.proto); other fields of an item (keypoints, frequency,
…) are passed over.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from google.protobuf import text_format

from detsweep.errors import DetsweepError
from detsweep.textproto import build_message_classes

from .records import Category

_CLASSES = build_message_classes(
    "detsweep_label_map.proto",
    "detsweep.labelmap",
    {
        "StringIntLabelMapItem": [("name", 1, "string"), ("id", 2, "int32"), ("display_name", 3, "string")],
        "StringIntLabelMap": [("item", 1, "StringIntLabelMapItem", None, "repeated")],
    },
)


@dataclass(frozen=True)
class LabelMap:
    categories: list[Category]  # sorted by id; named by display_name when an item has one
    ids_by_name: dict[str, int]  # name and display_name → id (VOC XML may use either)


def read_label_map(path: str | Path) -> LabelMap:
    """Parse and check a label map: ids >= 1 and unique, every item named."""
    parsed = _CLASSES["StringIntLabelMap"]()
    try:
        text_format.Parse(_read(Path(path)), parsed, allow_unknown_field=True)
    except text_format.ParseError as error:
        raise DetsweepError(f"{path}: not a valid label map: {error}") from None
    categories: dict[int, Category] = {}
    ids_by_name: dict[str, int] = {}
    for item in parsed.item:
        # The OD API reserves id 0 for the background, which is not a class to detect.
        if item.id == 0 and item.name == "background":
            continue
        if item.id < 1:
            raise DetsweepError(f"{path}: item {item.name!r}: found id {item.id}, expected an id >= 1")
        if item.id in categories:
            raise DetsweepError(f"{path}: found id {item.id} twice, expected each id once")
        if not (item.display_name or item.name):
            raise DetsweepError(f"{path}: item with id {item.id}: found no name, expected name or display_name")
        categories[item.id] = Category(item.id, item.display_name or item.name)
        ids_by_name.update({name: item.id for name in (item.display_name, item.name) if name})
    if not categories:
        raise DetsweepError(f"{path}: found no items, expected item {{ id: 1 name: '...' }} entries")
    return LabelMap(sorted(categories.values(), key=lambda category: category.id), ids_by_name)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        raise DetsweepError(f"{path}: label map not found") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as error:
        raise DetsweepError(f"{path}: cannot read the label map: {error.__class__.__name__}") from None
