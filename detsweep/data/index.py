"""One pass over TFRecord files that knows what training needs without holding the records:
each file's record count, each record's number of training boxes, the class ids found.

Training streams the records (:mod:`.streamed`); this pass is what it knows of them ahead:
how many records each worker's share holds (an epoch's length, so a resume skips only the
rest of its epoch), the categories (the driver and the serving cost need them, not the
pixels), and the most boxes any image has (``data.max_boxes``'s default, and what a set
value cuts). It parses only the labels and box corners, in TensorFlow, and runs on the node
that reads the files, once per version of them: it is cached in the data cache
(``DETSWEEP_DATA_CACHE``), keyed by each file's path, size and modification time, beside a
bucket's copies.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from detsweep.errors import DetsweepError

from .assemble import clip_boxes
from .labelmap import LabelMap
from .records import Category, plural

INDEX_FORMAT = 1  # bumped when what an index holds changes: older ones are not read
BATCH = 256  # records parsed at once


@dataclass(frozen=True)
class RecordIndex:
    """What one pass over TFRecord ``files`` (in their sorted order) found.

    ``boxes[f][r]``: the training boxes of file ``f``'s record ``r``: clipped to the image,
    of positive area, not crowd (what training keeps before ``data.max_boxes``).
    ``ids``: each class id found, with the first record that has it (for messages);
    ``texts``: each class text of a record that has texts but no ids (a label map names them)."""

    files: tuple[str, ...]
    boxes: tuple[tuple[int, ...], ...]
    ids: dict[int, str]
    names: dict[int, str]  # id → the first class/text a record gave it
    texts: dict[str, str]

    @property
    def num_records(self) -> int:
        return sum(len(counts) for counts in self.boxes)

    @property
    def most_boxes(self) -> int:
        return max((max(counts, default=0) for counts in self.boxes), default=0)

    def categories(self, label_map: LabelMap | None, label_map_path: str | None) -> list[Category]:
        """The label map's categories, every id found checked against it; without one, the ids
        found, named by their class text where records give one."""
        if label_map is not None:
            known = {category.id for category in label_map.categories}
            for category_id, origin in self.ids.items():
                if category_id not in known:
                    raise DetsweepError(f"{origin}: found class label {category_id}, expected an id in "
                                        f"{label_map_path} ({', '.join(str(i) for i in sorted(known))})")
            for text, origin in self.texts.items():
                if text not in label_map.ids_by_name:
                    raise DetsweepError(f"{origin}: found class text {text!r} without a class label, expected a "
                                        "name in the label map")
            return label_map.categories
        for text, origin in self.texts.items():
            raise DetsweepError(f"{origin}: found class text {text!r} without a class label, expected "
                                "image/object/class/label, or a label map that names the texts")
        for category_id, origin in self.ids.items():
            if category_id < 1:
                raise DetsweepError(f"{origin}: found class label {category_id}, expected ids >= 1 (0 is the "
                                    "OD API's background)")
        if not self.ids:
            raise DetsweepError(f"{self.files[0]}: found no class labels in {plural(len(self.files), 'file')}, "
                                "expected at least one class to detect")
        return [Category(i, self.names.get(i) or f"class_{i}") for i in sorted(self.ids)]


def cut_by(box_counts: list[int] | tuple[int, ...], max_boxes: int) -> tuple[int, int]:
    """The images that have more than ``max_boxes`` boxes, and the boxes keeping the first ``max_boxes`` cuts."""
    over = [count - max_boxes for count in box_counts if count > max_boxes]
    return len(over), sum(over)


def cut_line(box_counts: list[int] | tuple[int, ...], max_boxes: int | None) -> str:
    """What ``data.max_boxes`` does to the training images, in one line."""
    most = max(box_counts, default=0)
    if max_boxes is None:
        return f"data.max_boxes: {most}, the most boxes a training image has; none cut"
    images, boxes = cut_by(box_counts, max_boxes)
    if not images:
        return f"data.max_boxes: {max_boxes}; none cut (the most boxes a training image has is {most})"
    return (f"data.max_boxes: {max_boxes} cuts {plural(boxes, 'box', 'boxes')} of {plural(images, 'image')} "
            f"(the most boxes a training image has is {most})")


def record_index(files: list[str], say: Callable[[str], None] = print) -> RecordIndex:
    """The index of ``files``: read from the cache, or made by one pass and cached. Says which."""
    from .remote import cache_folder

    cached = cache_folder() / "index" / f"{_version(files)}.json"
    if cached.exists():
        index = _read(cached)
        say(f"record index of {plural(len(files), 'file')}: {index.num_records} records, from {cached}")
        return index
    started = time.perf_counter()
    index = index_records(files)
    _write(cached, index)
    say(f"record index of {plural(len(files), 'file')}: {index.num_records} records, read on {os.uname().nodename} "
        f"in {time.perf_counter() - started:.1f} s, cached at {cached}")
    return index


def index_records(files: list[str]) -> RecordIndex:
    """One pass over ``files``: every record's labels and box corners parsed, nothing else."""
    counts: list[list[int]] = [[] for _ in files]
    ids, names, texts = {}, {}, {}
    for file, batch in _parsed_batches(files):
        for record in batch:
            origin = f"{files[file]}: record {len(counts[file])}"
            _check_lengths(record, origin)
            labels, row_texts = record["label"], record["text"]
            for position, category_id in enumerate(labels):
                if category_id not in ids:
                    ids[category_id] = origin
                if position < len(row_texts) and row_texts[position] and category_id not in names:
                    names[category_id] = row_texts[position].decode("utf-8", "replace")
            if not labels:
                for text in row_texts:
                    texts.setdefault(text.decode("utf-8", "replace"), origin)
            counts[file].append(training_box_count(record))
    return RecordIndex(tuple(files), tuple(tuple(file_counts) for file_counts in counts), ids, names, texts)


def _parsed_batches(files: list[str]):
    """``(file number, records)``, ``BATCH`` records at a time, file after file: per record its box
    corners, labels, texts and crowd flags. One pipeline for every file (a pipeline per file
    would trace its parsing once per file)."""
    import tensorflow as tf

    from .tfrecord import _op_message, od_api_features

    keys = [key for key in od_api_features() if key.startswith("image/object/")]

    def parse(serialized):
        features = tf.io.parse_example(serialized, {key: od_api_features()[key] for key in keys})
        return {key: tf.RaggedTensor.from_sparse(features[key]) for key in keys}

    def batches(number, path):
        return tf.data.TFRecordDataset(path).batch(BATCH).map(parse).map(lambda batch: (number, batch))

    file = 0
    data = tf.data.Dataset.from_tensor_slices((tf.range(len(files)), tf.constant(files))).flat_map(batches)
    try:
        for number, batch in data:
            file = int(number)
            columns = {key.rsplit("/", 1)[-1]: value.to_list() for key, value in batch.items()}
            yield file, [dict(zip(columns, row)) for row in zip(*columns.values())]
    except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as error:
        for path in files[file:]:
            _name_the_bad_record(path)  # raises, naming the file and the record
        raise DetsweepError(f"{files[file]}: found records TensorFlow cannot read ({_op_message(error)}), expected "
                            "tf.train.Example records of the OD API") from None


def training_box_count(record: dict) -> int:
    """The boxes of a parsed record that training keeps: clipped to the image, of positive area, not crowd
    (:func:`~detsweep.data.assemble.clip_boxes` on the unit square, as :mod:`.streamed` does in TensorFlow)."""
    corners = np.array([record[side] for side in ("ymin", "xmin", "ymax", "xmax")], np.float32).T.reshape(-1, 4)
    crowd = np.array(record["is_crowd"] or [0] * len(corners), bool)
    kept, _ = clip_boxes(corners[~crowd], np.zeros(int(np.sum(~crowd)), np.int32), 1, 1, Counter())
    return len(kept)


def _check_lengths(record: dict, origin: str) -> None:
    lengths = [len(record[side]) for side in ("ymin", "xmin", "ymax", "xmax")]
    if len(set(lengths)) > 1:
        found = ", ".join(f"{n} {side}" for n, side in zip(lengths, ("ymin", "xmin", "ymax", "xmax")))
        raise DetsweepError(f"{origin}: found {found}, expected as many of each bbox coordinate")
    labels, texts, crowd = len(record["label"]), len(record["text"]), len(record["is_crowd"])
    if not labels and texts and texts != lengths[0]:
        raise DetsweepError(f"{origin}: found {texts} image/object/class/text for {lengths[0]} boxes, "
                            "expected one class per box")
    if (labels or not texts) and labels != lengths[0]:
        raise DetsweepError(f"{origin}: found {labels} image/object/class/label for {lengths[0]} boxes, "
                            "expected one label per box")
    if crowd and crowd != lengths[0]:
        raise DetsweepError(f"{origin}: found {crowd} image/object/is_crowd for {lengths[0]} boxes, expected one per box")


def _name_the_bad_record(path: str) -> None:
    """Raises naming ``path``'s first record that cannot be read or parsed, if it has one."""
    from .tfrecord import parse_record, read_records

    for number, raw in enumerate(read_records(path)):
        parse_record(raw, f"{path}: record {number}", None)


# --- the cache -------------------------------------------------------------------------------

def _version(files: list[str]) -> str:
    """The files' version: their paths, sizes and modification times (a rewrite changes one)."""
    stats = []
    for path in files:
        stat = os.stat(path)
        stats.append([os.path.abspath(path), stat.st_size, stat.st_mtime_ns])
    return hashlib.sha256(json.dumps([INDEX_FORMAT, stats]).encode()).hexdigest()[:24]


def _write(path: Path, index: RecordIndex) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = path.with_name(f".{path.name}.partial-{os.getpid()}")
    scratch.write_text(json.dumps(asdict(index)))
    os.replace(scratch, path)  # whole or not at all, whoever writes it last


def _read(path: Path) -> RecordIndex:
    tree = json.loads(path.read_text())
    return RecordIndex(files=tuple(tree["files"]), boxes=tuple(tuple(counts) for counts in tree["boxes"]),
                       ids={int(key): value for key, value in tree["ids"].items()},
                       names={int(key): value for key, value in tree["names"].items()}, texts=tree["texts"])
