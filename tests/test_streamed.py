"""TFRecords streamed into training: the record index, each pipeline's share of files or records,
each epoch's order, a resume's cost, what data.max_boxes cuts. On the raccoon TFRecord (40 real
photos), split into shards here."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from detsweep.config import AugmentationConfig, DataConfig, DatasetConfig
from detsweep.data import dataset_categories, load_dataset, training_source
from detsweep.data import streamed as streamed_module
from detsweep.data.pipeline import shuffled_examples, training_dataset
from detsweep.data.processing import InputSpec
from detsweep.data.streamed import StreamedRecords
from detsweep.errors import DetsweepError

from .conftest import RACCOON
from .test_data import png, write_record

RECORD = RACCOON / "data" / "test.record"
LABEL_MAP = RACCOON / "training" / "object-detection.pbtxt"
SPEC = InputSpec(96)


def split_into(folder: Path, shards: int) -> str:
    """The raccoon records into ``shards`` files of the OD API's naming; their glob."""
    raw = [record.numpy() for record in tf.data.TFRecordDataset(str(RECORD))]
    folder.mkdir(exist_ok=True)
    for shard in range(shards):
        with tf.io.TFRecordWriter(str(folder / f"train.record-{shard:05d}-of-{shards:05d}")) as writer:
            for record in raw[shard::shards]:
                writer.write(record)
    return str(folder / f"train.record-?????-of-{shards:05d}")


def records(pattern: str, **fields) -> StreamedRecords:
    config = DatasetConfig(format="tfrecord", annotations=pattern, label_map=str(LABEL_MAP), **fields)
    return StreamedRecords.of(config, None, say=lambda line: None)


def image_digest(element: dict) -> str:
    return hashlib.sha256(element["image"].numpy()).hexdigest()


def one_epoch(share, epoch: int = 0) -> list[str]:
    return [image_digest(element) for element in share.epoch(tf.constant(epoch, tf.int64))]


@pytest.fixture(scope="module")
def every_image() -> set[str]:
    return {hashlib.sha256(example.encoded).hexdigest() for example in load_dataset(
        DatasetConfig(format="tfrecord", annotations=str(RECORD), label_map=str(LABEL_MAP)), verify=False).examples}


@pytest.mark.parametrize("shards", [4, 1], ids=["by file", "by record"])
def test_two_pipelines_read_every_record_once_an_epoch(tmp_path, every_image, shards):
    source = records(split_into(tmp_path / "records", shards))
    assert source.sharing_line(2).startswith("data.train: 4 TFRecord files shared by file" if shards == 4 else
                                             "data.train: 1 TFRecord file for 2 pipelines: each reads every file")
    for epoch in (0, 3):
        read = [one_epoch(source.share(2, index, seed=index), epoch) for index in range(2)]
        assert len(read[0]) == source.share(2, 0, seed=0).size and len(read[1]) == source.share(2, 1, seed=1).size
        assert sorted(read[0] + read[1]) == sorted(every_image)  # none twice, none missed
    # the order of an epoch is drawn from the seed and the epoch: another epoch, another order
    share = source.share(2, 0, seed=0)
    assert one_epoch(share, 0) == one_epoch(source.share(2, 0, seed=0), 0)
    if shards == 4:
        assert one_epoch(share, 0) != one_epoch(share, 1)


def test_streamed_records_are_the_readers_examples_cleaned_alike(tmp_path):
    """Each record's boxes and labels as the in-memory reader (assemble's cleaning) has them."""
    truth = load_dataset(DatasetConfig(format="tfrecord", annotations=str(RECORD), label_map=str(LABEL_MAP)))
    by_digest = {hashlib.sha256(example.encoded).hexdigest(): example for example in truth.examples}
    share = records(str(RECORD)).share(1, 0, seed=0)
    for element in share.epoch(tf.constant(0, tf.int64)):
        example = by_digest[image_digest(element)]
        decoded = share.decoded(element)
        valid = decoded["labels"].numpy() >= 0
        np.testing.assert_allclose(decoded["boxes"].numpy()[valid], example.boxes, atol=1e-3)
        np.testing.assert_array_equal(decoded["labels"].numpy()[valid], example.labels)
    # crowd boxes, a box past the corner and one of no area, ids 3 and 7 as labels 0 and 1
    record = {"image/encoded": [png(40, 80)], "image/object/class/label": [3, 7, 7, 3],
              "image/object/bbox/ymin": [0.0, 0.5, 0.5, 0.2], "image/object/bbox/xmin": [0.0, 0.5, 0.5, 0.2],
              "image/object/bbox/ymax": [0.5, 1.2, 1.0, 0.2], "image/object/bbox/xmax": [0.5, 1.0, 1.0, 0.9],
              "image/object/is_crowd": [0, 0, 1, 0]}
    path = write_record(tmp_path / "odd.record", [record])
    source = StreamedRecords.of(DatasetConfig(format="tfrecord", annotations=str(path)), None, say=lambda line: None)
    assert [category.id for category in source.categories] == [3, 7] and source.max_boxes == 2
    share = source.share(1, 0, seed=0)
    [element] = list(share.epoch(tf.constant(0, tf.int64)))
    decoded = share.decoded(element)
    np.testing.assert_allclose(decoded["boxes"].numpy(), [[0, 0, 20, 40], [20, 40, 40, 80]])
    np.testing.assert_array_equal(decoded["labels"].numpy(), [0, 1])
    assert load_dataset(DatasetConfig(format="tfrecord", annotations=str(path))).num_boxes == 2  # the reader agrees


def count_reads(monkeypatch) -> list[int]:
    """Every record read from a file is counted in the list's one number."""
    read = [0]

    def tick(record):
        read[0] += 1
        return record

    def counted(path):
        return tf.data.TFRecordDataset(path).map(
            lambda record: tf.ensure_shape(tf.py_function(tick, [record], tf.string), []))

    monkeypatch.setattr(streamed_module, "read_records", counted)
    return read


def test_a_resume_gives_the_unbroken_runs_batches_reading_only_the_rest_of_its_epoch(tmp_path, monkeypatch):
    source = records(split_into(tmp_path / "records", 4))
    augmentation = AugmentationConfig(random_horizontal_flip=0.5)
    size = source.share(2, 1, seed=1005).size  # 20 images: 10 batches an epoch
    skip = 2 * size + 6  # past two epochs, 3 batches into the third
    unbroken = [images.numpy() for images, _ in training_dataset(
        source, SPEC, augmentation, batch_size=2, seed=5, shard=(2, 1)).take(skip // 2 + 3)]
    resumed = [images.numpy() for images, _ in training_dataset(
        source, SPEC, augmentation, batch_size=2, seed=5, shard=(2, 1), skip=skip).take(3)]
    for step, images in enumerate(resumed):
        np.testing.assert_array_equal(images, unbroken[skip // 2 + step])
    # Up to the end of its epoch, a resume reads that epoch's share once, not the two before it.
    read = count_reads(monkeypatch)
    share = source.share(2, 1, seed=1005)
    rest = list(shuffled_examples(share, 1005, skip, shuffle_buffer_size=2048).take(size - 6))
    assert len(rest) == size - 6 and read[0] == size
    read[0] = 0
    list(shuffled_examples(share, 1005, 0, shuffle_buffer_size=2048).take(2 * size + size))
    assert read[0] == 3 * size  # an unbroken run read each of the three epochs


def test_int8s_calibration_pictures_are_drawn_from_records_streamed_reading_no_further_than_the_last(
        tmp_path, monkeypatch, every_image):
    """int8's representative set from a TFRecord set: the drawn records, as the reader gives
    them, parsed alone, each file read up to its last drawn record only."""
    from detsweep.data import drawn_examples
    from detsweep.data import tfrecord as tfrecord_module

    config = DatasetConfig(format="tfrecord", annotations=split_into(tmp_path / "records", 4), label_map=str(LABEL_MAP))
    read, parsed = [], []
    reads, parses = tfrecord_module.read_records, tfrecord_module.parse_record

    def counted_reads(path):
        for raw in reads(path):
            read.append(path)
            yield raw

    monkeypatch.setattr(streamed_module, "record_bytes", counted_reads)
    monkeypatch.setattr(streamed_module, "parse_record", lambda *a: parsed.append(a[1]) or parses(*a))
    drawn = drawn_examples(config, 5, seed=3)
    assert len(drawn) == len(parsed) == 5 and len(read) < 40
    last = {path: max(int(origin.rsplit(" ", 1)[1]) for origin in parsed if origin.startswith(path)) for path in set(read)}
    assert {path: read.count(path) for path in set(read)} == {path: number + 1 for path, number in last.items()}
    assert {hashlib.sha256(example.encoded).hexdigest() for example in drawn} <= every_image
    assert [example.encoded for example in drawn_examples(config, 5, seed=3)] == [e.encoded for e in drawn]  # seeded
    assert len(drawn_examples(config, 100, seed=3)) == 40  # all of them when it has fewer


def test_the_shuffle_buffer_is_the_configs(tmp_path):
    """With a buffer of B an image comes out at most B - 1 places ahead of where it was read."""
    source = records(split_into(tmp_path / "records", 4))
    share = source.share(1, 0, seed=0)
    read_order = one_epoch(share, 2)

    def moves(buffer: int) -> list[int]:
        out = [image_digest(element) for element in shuffled_examples(share, 0, 2 * share.size, buffer).take(share.size)]
        assert sorted(out) == sorted(read_order)
        return [read_order.index(digest) - place for place, digest in enumerate(out)]

    assert max(moves(4)) <= 3 and max(moves(1)) == 0 and max(moves(share.size)) > 3
    config = DataConfig.model_validate({"train": {"format": "tfrecord", "annotations": "x"}, "shuffle_buffer_size": 7})
    assert config.shuffle_buffer_size == 7 and DataConfig().shuffle_buffer_size == 2048  # the OD API's default


def test_the_index_is_made_once_per_version_and_gives_the_driver_its_categories(tmp_path, monkeypatch):
    pattern = split_into(tmp_path / "records", 2)
    said = []
    config = DatasetConfig(format="tfrecord", annotations=pattern)  # no label map: the ids are the index's
    monkeypatch.setattr("detsweep.data.load_dataset", lambda *a, **k: pytest.fail("the driver read the whole set"))
    assert [c.name for c in dataset_categories(config)] == ["raccoon"]
    StreamedRecords.of(config, None, say=said.append)
    StreamedRecords.of(config, None, say=said.append)
    assert "from " in said[0] and "from " in said[1]  # the driver's pass above was cached; nothing read again
    # a file rewritten is a new version: indexed again, on this node, and cached
    first = sorted(tmp_path.glob("records/*"))[0]
    first.write_bytes(first.read_bytes())
    StreamedRecords.of(config, None, say=said.append)
    assert " read on " in said[2] and "cached at" in said[2]


def test_max_boxes_cuts_are_counted_and_said(tmp_path, capsys):
    many = {"image/encoded": [png(40, 40)], "image/object/class/label": [1] * 5,
            **{f"image/object/bbox/{side}": [0.1 * i for i in range(5)] for side in ("ymin", "xmin")},
            **{f"image/object/bbox/{side}": [0.1 * i + 0.5 for i in range(5)] for side in ("ymax", "xmax")}}
    few = {**many, "image/object/class/label": [1], **{key: value[:1] for key, value in many.items()
                                                        if key.startswith("image/object/bbox/")}}
    path = write_record(tmp_path / "boxes.record", [many, few, many])
    train = {"format": "tfrecord", "annotations": str(path)}
    said = []
    source = training_source(DataConfig.model_validate({"train": train, "max_boxes": 3}), say=said.append)
    assert said[-1] == "data.max_boxes: 3 cuts 4 boxes of 2 images (the most boxes a training image has is 5)"
    [element] = list(source.share(1, 0, seed=0).epoch(tf.constant(0, tf.int64)).take(1))
    assert element["labels"].shape == (3,)  # the first three kept
    training_source(DataConfig.model_validate({"train": train}), say=said.append)
    assert said[-1] == "data.max_boxes: 5, the most boxes a training image has; none cut"
    # the same count for data held in memory, and from `data inspect`
    training_source(DataConfig.model_validate({"train": {"format": "synthetic", "num_images": 8}, "max_boxes": 1}),
                    say=said.append)
    assert said[-1].startswith("data.max_boxes: 1 cuts ")
    from .conftest import run_here

    result = run_here("data", "inspect", "--format", "tfrecord", "--annotations", str(path), "--max-boxes", "3")
    assert result.returncode == 0, result.stderr
    assert "data.max_boxes: 3 cuts 4 boxes of 2 images (the most boxes a training image has is 5)" in result.stdout


def test_a_bucket_copy_is_keyed_by_content_and_a_relabel_under_the_same_uri_is_a_new_copy(s3, tmp_path, monkeypatch):
    from detsweep.data.remote import content_version, local_copy, pinned, with_local_copies

    for name, value in {**s3.env, "DETSWEEP_DATA_CACHE": str(tmp_path / "cache")}.items():
        monkeypatch.setenv(name, value)
    bucket = s3.new_bucket("relabelled")
    folder = tmp_path / "upload"
    folder.mkdir()
    (folder / "test.record").write_bytes(RECORD.read_bytes())
    (folder / "map.pbtxt").write_text("item { id: 1 name: 'raccoon' }")
    uri = s3.upload(folder, bucket, "raccoon")
    config = DatasetConfig(format="tfrecord", annotations=f"{uri}/test.record", label_map=f"{uri}/map.pbtxt")
    launched = pinned(config)  # the driver, at launch
    assert launched.version and config.version is None
    from detsweep.config import TrialConfig, validate
    from detsweep.preflight import Preflight, preflight

    trial = validate(TrialConfig, {"optimizer": {"type": "momentum"}, "data": {"train": config.model_dump(exclude_none=True)}},
                     source="trial.yaml")
    cleared = preflight(Preflight(trial, "trial.yaml"))  # what launch, train and finetune check, then train on
    assert cleared.config.data.train.version == launched.version
    assert cleared.summaries == [f"{uri}/test.record: sampled 4 records (the first 4 of each of 1 file): 4 boxes, "
                                 "every image decoded, every class in the label map; each node indexes the rest once"]
    first = with_local_copies(launched)  # a node
    assert dataset_categories(launched)[0].name == "raccoon"

    # relabelled under the same URI: a node of the launched sweep refuses, in one line, to train on it
    s3.client().put_object(Bucket=bucket, Key="raccoon/map.pbtxt", Body=b"item { id: 1 name: 'procyon' }")
    with pytest.raises(DetsweepError) as refused:
        with_local_copies(launched)
    assert str(refused.value).startswith("data: found its bucket data at version ") and "\n" not in str(refused.value)
    assert "the version the run was launched with" in str(refused.value)
    # a new launch fixes the new version: a new copy beside the old one, which stays whole
    relaunched = pinned(config)
    assert relaunched.version != launched.version
    second = with_local_copies(relaunched)
    assert second.label_map != first.label_map and second.annotations == first.annotations  # the records did not change
    assert dataset_categories(relaunched)[0].name == "procyon"
    assert Path(first.label_map).read_text() == "item { id: 1 name: 'raccoon' }"
    # a folder: keyed by every object's ETag under it
    version = content_version(uri, "data.images")
    assert [key for key, _ in version.entries] == ["map.pbtxt", "test.record"] and version.folder
    copied = Path(local_copy(uri, version, "data.images"))
    assert sorted(path.name for path in copied.iterdir()) == ["map.pbtxt", "test.record"]
    assert content_version(f"{uri}/map.pbtxt", "x").digest != content_version(f"{uri}/test.record", "x").digest
