"""TF Object Detection API TFRecords: one ``tf.train.Example`` per image.

The features are those of the OD API's dataset tools (create_pascal_tf_record,
create_coco_tf_record): ``image/encoded``, ``image/height``, ``image/width``,
``image/filename``, ``image/source_id``, normalised ``image/object/bbox/{ymin,xmin,
ymax,xmax}``, ``image/object/class/label`` (label map ids), and optionally
``image/object/class/text`` and ``image/object/is_crowd``. The encoded bytes are kept
as they are; the tf.data pipeline decodes them. TensorFlow is imported only here.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from detsweep.config import DatasetConfig
from detsweep.errors import DetsweepError

from .assemble import assemble
from .images import read_header
from .labelmap import LabelMap, read_label_map
from .records import Category, DetectionSet, Example

GLOB_CHARACTERS = re.compile(r"[*?\[]")


@dataclass
class Record:
    origin: str  # "FILE: record N", for messages
    source_id: str
    file_name: str
    height: int
    width: int
    boxes: np.ndarray  # float32 [N, 4] normalised (ymin, xmin, ymax, xmax)
    category_ids: np.ndarray  # int64 [N], the label map's ids
    texts: list[str]
    crowd: np.ndarray  # bool [N]
    encoded: bytes


def read_tfrecord(config: DatasetConfig, verify: bool = True) -> DetectionSet:
    label_map = read_label_map(config.label_map) if config.label_map else None
    records = [parse_record(raw, f"{path}: record {n}", label_map)
               for path in record_files(config.annotations) for n, raw in enumerate(read_records(path))]
    categories = record_categories(records, label_map, config.label_map)
    counts: Counter = Counter()
    examples = to_examples(records, categories, counts, verify)
    return assemble(config.annotations, categories, examples, [record.origin for record in records], counts,
                    verify=verify, skip_empty=config.skip_empty, subset=config.subset)


def sample_tfrecord(config: DatasetConfig, named: str, per_file: int = 4) -> str:
    """The driver's check of a TFRecord set (its local copy), without reading it whole: the files
    exist, the first ``per_file`` records of each parse, their images decode and the label map
    covers their classes. One line, on ``named``, that says it sampled."""
    from itertools import islice

    label_map = read_label_map(config.label_map) if config.label_map else None
    files = record_files(config.annotations)
    records = [parse_record(raw, f"{path}: record {n}", label_map)
               for path in files for n, raw in enumerate(islice(read_records(path), per_file))]
    if not records:
        raise DetsweepError(f"{config.annotations}: found no records, expected at least one")
    counts: Counter = Counter()
    examples = to_examples(records, record_categories(records, label_map, config.label_map), counts, verify=True)
    boxes = sum(len(example.labels) for example in examples)
    return (f"{named}: sampled {len(records)} records (the first {per_file} of each of "
            f"{len(files)} {'file' if len(files) == 1 else 'files'}): {boxes} {'box' if boxes == 1 else 'boxes'}, "
            "every image decoded, every class in the label map; each node indexes the rest once")


def od_api_features() -> dict:
    """What training reads of a record, for ``tf.io.parse_example``."""
    import tensorflow as tf

    boxes = {f"image/object/bbox/{side}": tf.io.VarLenFeature(tf.float32) for side in ("ymin", "xmin", "ymax", "xmax")}
    return {"image/encoded": tf.io.FixedLenFeature([], tf.string), **boxes,
            "image/object/class/label": tf.io.VarLenFeature(tf.int64),
            "image/object/class/text": tf.io.VarLenFeature(tf.string),
            "image/object/is_crowd": tf.io.VarLenFeature(tf.int64)}


def record_files(spec: str) -> list[str]:
    """The files of ``a.record``, ``a.record,b.record`` or a glob like ``train.record-?????-of-00010``."""
    import tensorflow as tf

    files: list[str] = []
    for part in (piece.strip() for piece in spec.split(",")):
        if not part:
            continue
        if GLOB_CHARACTERS.search(part):
            matched = sorted(tf.io.gfile.glob(part))
            if not matched:
                raise DetsweepError(f"{part}: matches no TFRecord files")
            files += matched
        elif not tf.io.gfile.exists(part):
            raise DetsweepError(f"{part}: TFRecord file not found")
        else:
            files.append(part)
    if not files:
        raise DetsweepError(f"{spec!r}: found no TFRecord paths, expected a path, a comma-separated list or a glob")
    return files


def read_records(path: str) -> Iterator[bytes]:
    import tensorflow as tf

    count = 0
    try:
        for record in tf.data.TFRecordDataset(path):
            yield record.numpy()
            count += 1
    except tf.errors.OpError as error:
        raise DetsweepError(f"{path}: corrupt TFRecord file after {count} records: {_op_message(error)}") from None


def parse_record(raw: bytes, origin: str, label_map: LabelMap | None) -> Record:
    import tensorflow as tf
    from google.protobuf.message import DecodeError

    try:
        features = tf.train.Example.FromString(raw).features.feature
    except DecodeError:
        raise DetsweepError(f"{origin}: found bytes that are not a tf.train.Example") from None
    encoded = _bytes(features, "image/encoded")
    if not encoded:
        raise DetsweepError(f"{origin}: found no image/encoded, expected the encoded image of an OD API record")
    source_id = _text(features, "image/source_id")
    file_name = _text(features, "image/filename") or source_id or origin.rsplit(": ", 1)[-1].replace(" ", "-")
    origin = f"{origin} ({file_name})"
    boxes = _boxes(features, origin)
    texts = [value.decode("utf-8", "replace") for value in _values(features, "image/object/class/text")]
    category_ids = np.array(_values(features, "image/object/class/label"), np.int64)
    if not len(category_ids) and texts and label_map is not None:
        category_ids = np.array([_id_of_text(text, label_map, origin) for text in texts], np.int64)
    if len(category_ids) != len(boxes):
        raise DetsweepError(f"{origin}: found {len(category_ids)} image/object/class/label for {len(boxes)} boxes, "
                            "expected one label per box")
    crowd = np.array(_values(features, "image/object/is_crowd") or [0] * len(boxes), bool)
    if len(crowd) != len(boxes):
        raise DetsweepError(f"{origin}: found {len(crowd)} image/object/is_crowd for {len(boxes)} boxes, "
                            "expected one per box")
    return Record(origin, source_id, file_name, _int(features, "image/height"), _int(features, "image/width"),
                  boxes, category_ids, texts, crowd, encoded[0])


def record_categories(records: list[Record], label_map: LabelMap | None, label_map_path: str | None) -> list[Category]:
    """The label map's categories; without one, the ids found, named by class/text when present."""
    if label_map is not None:
        known = {category.id for category in label_map.categories}
        for record in records:
            for category_id in record.category_ids:
                if category_id not in known:
                    raise DetsweepError(f"{record.origin}: found class label {category_id}, expected an id in "
                                        f"{label_map_path} ({', '.join(str(i) for i in sorted(known))})")
        return label_map.categories
    names: dict[int, str] = {}
    for record in records:
        for index, category_id in enumerate(record.category_ids.tolist()):
            if category_id < 1:
                raise DetsweepError(f"{record.origin}: found class label {category_id}, expected ids >= 1 "
                                    "(0 is the OD API's background)")
            if category_id not in names or names[category_id].startswith("class_"):
                text = record.texts[index] if index < len(record.texts) else ""
                names[category_id] = text or names.get(category_id) or f"class_{category_id}"
    return [Category(category_id, names[category_id]) for category_id in sorted(names)]


def to_examples(records: list[Record], categories: list[Category], counts: Counter, verify: bool) -> list[Example]:
    label_of = {category.id: label for label, category in enumerate(categories)}
    image_ids = _image_ids(records)
    examples = []
    for record, image_id in zip(records, image_ids):
        height, width = record.height, record.width
        # Boxes are fractions of the image as decoded, so scale them by its real size.
        if verify or height <= 0 or width <= 0:
            header = read_header(None, record.encoded, record.origin)
            counts["size_mismatch"] += height > 0 and width > 0 and (height, width) != (header.height, header.width)
            height, width = header.height, header.width
        absolute = record.boxes * np.array([height, width, height, width], np.float32)
        labels = np.array([label_of[int(i)] for i in record.category_ids], np.int32)
        examples.append(Example(image_id, record.file_name, height, width, absolute[~record.crowd],
                                labels[~record.crowd], absolute[record.crowd], labels[record.crowd],
                                encoded=record.encoded))
    return examples


def _image_ids(records: list[Record]) -> list[int]:
    # COCO records carry the numeric COCO image id; others a file name: number them then.
    ids = [record.source_id for record in records]
    if all(source_id.isdigit() for source_id in ids) and len(set(ids)) == len(ids):
        return [int(source_id) for source_id in ids]
    return list(range(1, len(records) + 1))


def _boxes(features, origin: str) -> np.ndarray:
    keys = [f"image/object/bbox/{side}" for side in ("ymin", "xmin", "ymax", "xmax")]
    columns = [_values(features, key) for key in keys]
    if len({len(column) for column in columns}) > 1:
        found = ", ".join(f"{len(column)} {key.rsplit('/', 1)[1]}" for key, column in zip(keys, columns))
        raise DetsweepError(f"{origin}: found {found}, expected as many of each bbox coordinate")
    return np.array(columns, np.float32).T.reshape(-1, 4)


def _id_of_text(text: str, label_map: LabelMap, origin: str) -> int:
    if text not in label_map.ids_by_name:
        raise DetsweepError(f"{origin}: found class text {text!r} without a class label, expected a name in the label map")
    return label_map.ids_by_name[text]


def _values(features, key: str) -> list:
    if key not in features:
        return []
    feature = features[key]
    kind = feature.WhichOneof("kind")
    return list(getattr(feature, kind).value) if kind else []


def _bytes(features, key: str) -> list[bytes]:
    return [value for value in _values(features, key) if isinstance(value, bytes)]


def _text(features, key: str) -> str:
    values = _bytes(features, key)
    return values[0].decode("utf-8", "replace") if values else ""


def _int(features, key: str) -> int:
    values = _values(features, key)
    return int(values[0]) if values else 0


def _op_message(error: Exception) -> str:
    """TensorFlow's message without the op plumbing: 'corrupted record at 12'."""
    text = getattr(error, "message", str(error))
    text = re.sub(r"\{\{[^}]*\}\}\s*", "", text)
    text = re.sub(r"\s*\[Op:[^\]]*\].*$", "", text, flags=re.S)
    return text.strip().splitlines()[0] if text.strip() else error.__class__.__name__
