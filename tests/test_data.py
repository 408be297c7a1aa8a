"""Dataset readers: real raccoon data (VOC and TFRecord), a COCO JSON made here, synthetic shapes."""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import json
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from detsweep.config import DatasetConfig
from detsweep.data import Category, generate_synthetic, load_dataset, write_synthetic
from detsweep.data.commands import add_data_commands
from detsweep.data.labelmap import read_label_map
from detsweep.errors import DetsweepError

from .conftest import RACCOON, run_cli, run_here

RACCOON_XML = RACCOON / "annotations"
RACCOON_RECORD = RACCOON / "data" / "test.record"
RACCOON_LABEL_MAP = RACCOON / "training" / "object-detection.pbtxt"


def dataset(**fields) -> DatasetConfig:
    return DatasetConfig(**{key: str(value) if isinstance(value, Path) else value for key, value in fields.items()})


def one_line_error(config: DatasetConfig, verify: bool = True) -> str:
    with pytest.raises(DetsweepError) as caught:
        load_dataset(config, verify=verify)
    message = str(caught.value)
    assert "\n" not in message
    return message


# --- Pascal VOC: the raccoon dataset ---------------------------------------------------


def test_raccoon_voc_reads_every_image_and_box_and_counts_grayscale():
    raccoons = load_dataset(dataset(format="voc", annotations=RACCOON_XML))
    assert (len(raccoons.examples), raccoons.num_boxes) == (200, 217)
    assert raccoons.categories == [Category(1, "raccoon")]
    assert raccoons.counts == {"grayscale_images": 3}
    assert raccoons.summary_line() == (f"{RACCOON_XML}: 200 images, 217 boxes, 1 category; "
                                       "3 grayscale images converted to RGB")
    first = raccoons.examples[0]  # natural order: raccoon-1, raccoon-2, …
    assert (first.file_name, first.height, first.width) == ("raccoon-1.jpg", 417, 650)
    assert first.path == str(RACCOON / "images" / "raccoon-1.jpg")  # found via <folder>images</folder>
    np.testing.assert_array_equal(first.boxes, [[88, 81, 408, 522]])
    assert first.boxes.dtype == np.float32 and first.labels.dtype == np.int32


def test_voc_without_verify_reads_no_image_headers(monkeypatch):
    """Every image file the loader opens goes through PIL's ``Image.open`` (``data/images.py``):
    none is opened without ``verify``, each of the 200 with it."""
    from PIL import Image

    opened = []
    real_open = Image.open
    monkeypatch.setattr(Image, "open", lambda source, *args, **kwargs: opened.append(source) or real_open(
        source, *args, **kwargs))
    raccoons = load_dataset(dataset(format="voc", annotations=RACCOON_XML), verify=False)
    assert raccoons.num_boxes == 217 and opened == []
    assert "grayscale_images" not in raccoons.counts  # modes are only known from the headers
    verified = load_dataset(dataset(format="voc", annotations=RACCOON_XML))
    assert len(opened) == len(verified.examples) == 200 and verified.counts["grayscale_images"] == 3


def test_voc_with_a_label_map_and_an_image_folder():
    raccoons = load_dataset(dataset(format="voc", annotations=RACCOON_XML, images=RACCOON / "images",
                                    label_map=RACCOON_LABEL_MAP))
    assert raccoons.categories == [Category(1, "raccoon")] and raccoons.num_boxes == 217


def test_voc_name_missing_from_the_label_map(tmp_path):
    labels = tmp_path / "labels.pbtxt"
    labels.write_text("item { id: 1 name: 'dog' }")
    message = one_line_error(dataset(format="voc", annotations=RACCOON_XML, label_map=labels), verify=False)
    assert "raccoon-1.xml" in message and "'raccoon'" in message and str(labels) in message


def test_voc_devkit_layout_without_sizes_and_difficult_objects(tmp_path):
    root = tmp_path / "VOCdevkit" / "VOC2012"
    (root / "Annotations").mkdir(parents=True)
    (root / "JPEGImages").mkdir()
    (root / "JPEGImages" / "2012_1.jpg").write_bytes(png(30, 40))  # PIL reads it whatever the suffix
    (root / "Annotations" / "2012_1.xml").write_text("""<annotation><folder>VOC2012</folder>
        <filename>2012_1.jpg</filename>
        <object><name>dog</name><difficult>1</difficult>
            <bndbox><xmin>5</xmin><ymin>6</ymin><xmax>50</xmax><ymax>20.5</ymax></bndbox></object>
        <object><name>cat</name><bndbox><xmin>1</xmin><ymin>1</ymin><xmax>3</xmax><ymax>4</ymax></bndbox></object>
        </annotation>""")
    loaded = load_dataset(dataset(format="voc", annotations=root / "Annotations"), verify=False)
    example = loaded.examples[0]
    assert example.path == str(root / "JPEGImages" / "2012_1.jpg")
    assert (example.height, example.width) == (30, 40)  # no <size>: read from the image
    assert [c.name for c in loaded.categories] == ["cat", "dog"]
    np.testing.assert_array_equal(example.boxes, [[6, 5, 20.5, 40], [1, 1, 4, 3]])
    assert example.labels.tolist() == [1, 0]
    assert loaded.counts == {"difficult_boxes": 1, "clipped_boxes": 1}


# --- TFRecord: the raccoon test split ----------------------------------------------------


def test_raccoon_tfrecord_with_its_label_map():
    raccoons = load_dataset(dataset(format="tfrecord", annotations=RACCOON_RECORD, label_map=RACCOON_LABEL_MAP))
    assert len(raccoons.examples) == 40
    assert raccoons.categories == [Category(1, "raccoon")] and raccoons.original_id(0) == 1
    with (RACCOON / "data" / "test_labels.csv").open() as stream:
        rows = list(csv.DictReader(stream))
    assert raccoons.num_boxes == len(rows)
    first = raccoons.examples[0]
    assert first.encoded[:2] == b"\xff\xd8" and first.path is None  # the JPEG bytes, kept as they are
    row = next(row for row in rows if row["filename"] == first.file_name)
    expected = [[float(row[key]) for key in ("ymin", "xmin", "ymax", "xmax")]]
    np.testing.assert_allclose(first.boxes, expected, atol=0.01)
    assert (first.height, first.width) == (int(row["height"]), int(row["width"]))


def test_tfrecord_without_label_map_names_categories_by_class_text():
    raccoons = load_dataset(dataset(format="tfrecord", annotations=f"{RACCOON_RECORD},{RACCOON_RECORD}"), verify=False)
    assert raccoons.categories == [Category(1, "raccoon")] and len(raccoons.examples) == 80


def write_record(path: Path, examples: list[dict]) -> Path:
    import tensorflow as tf

    def feature(values):
        if isinstance(values[0], bytes):
            return tf.train.Feature(bytes_list=tf.train.BytesList(value=values))
        if isinstance(values[0], float):
            return tf.train.Feature(float_list=tf.train.FloatList(value=values))
        return tf.train.Feature(int64_list=tf.train.Int64List(value=values))

    with tf.io.TFRecordWriter(str(path)) as writer:
        for fields in examples:
            features = {key: feature(values) for key, values in fields.items()}
            writer.write(tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString())
    return path


def png(height: int, width: int, mode: str = "RGB") -> bytes:
    buffer = io.BytesIO()
    Image.new(mode, (width, height), 128 if mode == "L" else (200, 100, 50)[: len(mode)]).save(buffer, "PNG")
    return buffer.getvalue()


def test_tfrecord_crowd_boxes_numeric_source_ids_and_unknown_labels(tmp_path):
    record = {
        "image/encoded": [png(40, 80)], "image/height": [40], "image/width": [80], "image/source_id": [b"42"],
        "image/filename": [b"a.png"],
        "image/object/bbox/ymin": [0.0, 0.5], "image/object/bbox/xmin": [0.0, 0.5],
        "image/object/bbox/ymax": [0.5, 1.0], "image/object/bbox/xmax": [0.5, 1.0],
        "image/object/class/label": [3, 7], "image/object/is_crowd": [0, 1],
    }
    path = write_record(tmp_path / "one.record", [record])
    loaded = load_dataset(dataset(format="tfrecord", annotations=tmp_path / "*.record"))
    example = loaded.examples[0]
    assert example.image_id == 42 and [c.id for c in loaded.categories] == [3, 7]
    assert [c.name for c in loaded.categories] == ["class_3", "class_7"]
    np.testing.assert_array_equal(example.boxes, [[0, 0, 20, 40]])
    np.testing.assert_array_equal(example.crowd_boxes, [[20, 40, 40, 80]])
    assert loaded.counts == {"crowd_boxes": 1}
    labels = tmp_path / "labels.pbtxt"
    labels.write_text("item { id: 3 name: 'cat' }")
    message = one_line_error(dataset(format="tfrecord", annotations=path, label_map=labels))
    assert str(path) in message and "label 7" in message


# --- COCO JSON with non-contiguous ids, crowd, empty, out-of-bounds and zero-area boxes ----


def write_coco(folder: Path, tree: dict, images: dict[str, bytes]) -> Path:
    (folder / "images").mkdir(exist_ok=True)
    for name, data in images.items():
        (folder / "images" / name).write_bytes(data)
    path = folder / "instances.json"
    path.write_text(json.dumps(tree, indent=1))
    return path


COCO_TREE = {
    "images": [
        {"id": 10, "file_name": "a.png", "height": 40, "width": 60},
        {"id": 11, "file_name": "empty.png", "height": 40, "width": 60},
        {"id": 12, "file_name": "gray.png", "height": 50, "width": 50},  # the file is 40 x 60
    ],
    "annotations": [
        {"id": 1, "image_id": 10, "category_id": 5, "bbox": [10, 5, 20, 10], "iscrowd": 0},
        {"id": 2, "image_id": 10, "category_id": 90, "bbox": [50, 30, 20, 20], "iscrowd": 0},  # past the corner
        {"id": 3, "image_id": 10, "category_id": 1, "bbox": [0, 0, 60, 40], "iscrowd": 1},
        {"id": 4, "image_id": 12, "category_id": 1, "bbox": [5, 5, 0, 10], "iscrowd": 0},  # zero width
        {"id": 5, "image_id": 12, "category_id": 90, "bbox": [1, 2, 3, 4]},
        {"id": 6, "image_id": 12, "category_id": 5, "bbox": [20, 5, -10, 10]},  # negative width
    ],
    "categories": [{"id": 90, "name": "toothbrush"}, {"id": 1, "name": "person"}, {"id": 5, "name": "car"}],
}


@pytest.fixture
def coco(tmp_path) -> DatasetConfig:
    images = {"a.png": png(40, 60), "empty.png": png(40, 60), "gray.png": png(40, 60, "L")}
    return dataset(format="coco", annotations=write_coco(tmp_path, COCO_TREE, images), images=tmp_path / "images")


def test_coco_labels_are_contiguous_and_map_back_to_the_original_ids(coco):
    loaded = load_dataset(coco)
    assert [(c.id, c.name) for c in loaded.categories] == [(1, "person"), (5, "car"), (90, "toothbrush")]
    assert [loaded.original_id(label) for label in range(3)] == [1, 5, 90]
    assert [loaded.label_of(category_id) for category_id in (1, 5, 90)] == [0, 1, 2]
    a, empty, gray = loaded.examples
    np.testing.assert_array_equal(a.boxes, [[5, 10, 15, 30], [30, 50, 40, 60]])  # yxyx, the second clipped
    assert a.labels.tolist() == [1, 2]
    np.testing.assert_array_equal(a.crowd_boxes, [[0, 0, 40, 60]])
    assert a.crowd_labels.tolist() == [0]
    assert len(empty.labels) == 0
    assert (gray.height, gray.width) == (40, 60)  # the file's size wins
    assert loaded.counts == {"clipped_boxes": 1, "dropped_zero_area_boxes": 2, "crowd_boxes": 1, "empty_images": 1,
                             "grayscale_images": 1, "size_mismatch": 1}
    line = loaded.summary_line()
    assert line.startswith(f"{coco.annotations}: 3 images, 3 boxes, 3 categories; ")
    for phrase in ("1 box clipped to the image", "2 zero-area boxes dropped", "1 image without boxes kept",
                   "1 grayscale image converted to RGB", "1 crowd box kept as ignore regions"):
        assert line.count(phrase) == 1


def test_coco_skip_empty_drops_images_without_boxes(coco):
    loaded = load_dataset(coco.model_copy(update={"skip_empty": True}))
    assert [example.image_id for example in loaded.examples] == [10, 12]
    assert loaded.counts["skipped_empty_images"] == 1 and "empty_images" not in loaded.counts


def test_to_coco_round_trips_through_pycocotools_with_crowd_boxes(coco):
    from pycocotools.coco import COCO

    loaded = load_dataset(coco)
    truth = COCO()
    truth.dataset = loaded.to_coco()
    truth.createIndex()
    assert sorted(truth.getCatIds()) == [1, 5, 90]
    annotations = truth.loadAnns(truth.getAnnIds(imgIds=[10]))
    crowd = [a for a in annotations if a["iscrowd"]]
    assert len(crowd) == 1 and crowd[0]["category_id"] == 1 and crowd[0]["bbox"] == [0, 0, 60, 40]
    clipped = next(a for a in annotations if a["category_id"] == 90)
    assert clipped["bbox"] == [50, 30, 10, 10] and clipped["area"] == 100
    assert truth.imgs[12]["height"] == 40


# --- synthetic shapes ----------------------------------------------------------------------


def test_synthetic_is_deterministic_per_seed():
    first, again, other = (generate_synthetic(16, 64, 6, seed) for seed in (3, 3, 4))
    assert [e.encoded for e in first.examples] == [e.encoded for e in again.examples]
    for a, b in zip(first.examples, again.examples):
        np.testing.assert_array_equal(a.boxes, b.boxes)
        np.testing.assert_array_equal(a.labels, b.labels)
    assert [e.encoded for e in first.examples] != [e.encoded for e in other.examples]
    assert [c.name for c in first.categories] == ["circle", "square", "triangle", "circle_2", "square_2", "triangle_2"]
    assert [c.id for c in first.categories] == [1, 2, 3, 4, 5, 6]


def test_synthetic_objects_per_image_and_sizes():
    shapes = generate_synthetic(64, 100, 3, 0)
    for example in shapes.examples:
        assert 1 <= len(example.labels) <= 4
        sides = example.boxes[:, 2:] - example.boxes[:, :2]
        assert np.all((sides >= 15) & (sides <= 45))
        assert Image.open(io.BytesIO(example.encoded)).size == (100, 100)
    assert set(np.concatenate([e.labels for e in shapes.examples]).tolist()) == {0, 1, 2}


def test_write_synthetic_reads_back_through_the_coco_reader(tmp_path):
    shapes = generate_synthetic(12, 64, 4, 7)
    path = write_synthetic(tmp_path / "shapes", 12, 64, 4, 7)
    assert path == tmp_path / "shapes" / "annotations.json"
    loaded = load_dataset(dataset(format="coco", annotations=path, images=tmp_path / "shapes" / "images"))
    assert loaded.categories == shapes.categories and loaded.counts == {}
    for written, generated in zip(loaded.examples, shapes.examples):
        np.testing.assert_array_equal(written.boxes, generated.boxes)
        np.testing.assert_array_equal(written.labels, generated.labels)
        assert Path(written.path).read_bytes() == generated.encoded
    with pytest.raises(DetsweepError, match="non-empty folder"):
        write_synthetic(tmp_path / "shapes", 2, 64, 1, 0)
    assert [p.name for p in tmp_path.iterdir()] == ["shapes"]  # no staging folder left behind


def test_write_synthetic_leaves_nothing_when_it_fails(tmp_path, monkeypatch):
    import detsweep.data.synthetic as synthetic

    def fail(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(synthetic.json, "dumps", fail)
    (tmp_path / "shapes").mkdir()
    with pytest.raises(DetsweepError, match="shapes: cannot write: No space left on device"):
        write_synthetic(tmp_path / "shapes", 3, 32, 1, 0)
    assert [p.name for p in tmp_path.iterdir()] == ["shapes"] and not any((tmp_path / "shapes").iterdir())


def test_synthetic_config_goes_through_load_dataset():
    loaded = load_dataset(DatasetConfig(format="synthetic", num_images=5, image_size=32, classes=2, seed=1))
    assert len(loaded.examples) == 5 and loaded.source == "synthetic shapes (seed 1)"


# --- bad data: one line naming the file ------------------------------------------------------


def test_missing_image_file(coco):
    Path(coco.images, "a.png").unlink()
    message = one_line_error(coco)
    assert message == f"{Path(coco.images, 'a.png')}: image file not found (referenced by {coco.annotations})"


def test_unreadable_image(tmp_path):
    path = write_coco(tmp_path, {"images": [{"id": 1, "file_name": "bad.jpg", "height": 4, "width": 4}],
                                 "annotations": [], "categories": [{"id": 1, "name": "x"}]},
                      {"bad.jpg": b"this is not a JPEG"})
    message = one_line_error(dataset(format="coco", annotations=path, images=tmp_path / "images"))
    assert message.startswith(f"{tmp_path / 'images' / 'bad.jpg'}: cannot read the image")


def test_unknown_category_id(tmp_path):
    tree = {**COCO_TREE, "annotations": COCO_TREE["annotations"] + [
        {"id": 9, "image_id": 10, "category_id": 7, "bbox": [1, 1, 2, 2]}]}
    path = write_coco(tmp_path, tree, {})
    message = one_line_error(dataset(format="coco", annotations=path, images=tmp_path), verify=False)
    assert message == (f"{path}: annotations[6]: found category_id 7, expected one of the ids in categories "
                       "(1, 5, 90)")


def test_annotation_for_an_unknown_image(tmp_path):
    tree = {**COCO_TREE, "annotations": [{"id": 1, "image_id": 99, "category_id": 1, "bbox": [1, 1, 2, 2]}]}
    path = write_coco(tmp_path, tree, {})
    message = one_line_error(dataset(format="coco", annotations=path, images=tmp_path), verify=False)
    assert str(path) in message and "image_id 99" in message


def test_malformed_json(write, tmp_path):
    path = write("instances.json", '{\n  "images": [\n    {"id": 1,}\n  ]\n}')
    message = one_line_error(dataset(format="coco", annotations=path, images=tmp_path))
    assert message.startswith(f"{path}: line 3: invalid JSON")


def test_malformed_xml(tmp_path):
    (tmp_path / "bad.xml").write_text("<annotation><filename>a.jpg</filename><object></annotation>")
    message = one_line_error(dataset(format="voc", annotations=tmp_path))
    assert message.startswith(f"{tmp_path / 'bad.xml'}: invalid XML: mismatched tag: line 1")


def test_corrupt_tfrecord(tmp_path):
    path = tmp_path / "broken.record"
    data = RACCOON_RECORD.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    message = one_line_error(dataset(format="tfrecord", annotations=path))
    assert message.startswith(f"{path}: corrupt TFRecord file after ") and "truncated record" in message


def test_empty_dataset(tmp_path):
    path = write_coco(tmp_path, {"images": [], "annotations": [], "categories": [{"id": 1, "name": "x"}]}, {})
    assert one_line_error(dataset(format="coco", annotations=path, images=tmp_path)) == (
        f"{path}: found no images, expected at least one")


def test_label_map_items(write):
    labels = read_label_map(write("map.pbtxt", """
        item { id: 0 name: 'background' }
        item { id: 2 name: '/m/01g317' display_name: 'person' frequency: FREQUENT }
        item { name: 'cat' id: 1 keypoints { id: 0 label: 'nose' } }
    """))
    assert labels.categories == [Category(1, "cat"), Category(2, "person")]
    assert labels.ids_by_name == {"person": 2, "/m/01g317": 2, "cat": 1}
    with pytest.raises(DetsweepError, match=r"map2.pbtxt: found id 1 twice"):
        read_label_map(write("map2.pbtxt", "item { id: 1 name: 'a' } item { id: 1 name: 'b' }"))


# --- detsweep data synth / inspect -----------------------------------------------------------


def run_data(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="detsweep")
    add_data_commands(parser.add_subparsers(required=True))
    args = parser.parse_args(["data", *argv])
    return args.command(args)


def test_data_synth_then_inspect_json(tmp_path, capsys):
    out = tmp_path / "shapes"
    assert run_data("synth", "--out", str(out), "--num-images", "6", "--image-size", "48", "--classes", "2",
                    "--seed", "5") == 0
    assert capsys.readouterr().out.strip() == str(out / "annotations.json")
    # the shapes the flags ask for: the generator's pictures for 6 images of 48 px, 2 classes, seed 5
    written = {digest(path.read_bytes()) for path in (out / "images").glob("*.png")}
    assert written == {digest(example.encoded) for example in generate_synthetic(6, 48, 2, 5).examples}
    with pytest.raises(DetsweepError, match=f"^{out}: found a non-empty folder"):
        run_data("synth", "--out", str(out))

    assert run_data("inspect", "--format", "coco", "--annotations", str(out / "annotations.json"),
                    "--images", str(out / "images"), "--json") == 0
    described = json.loads(capsys.readouterr().out)
    assert described["images"] == 6 and facts(described) == coco_facts(out / "annotations.json", out / "images")
    assert described["categories"] == [{"id": 1, "name": "circle"}, {"id": 2, "name": "square"}]
    assert described["skipped"] == {} and described["changes"] == {}
    # the same shapes drawn in memory (`--format synthetic`), by the flags given on the command line
    drawn = run_cli("data", "inspect", "--format", "synthetic", "--num-images", "6", "--image-size", "48",
                    "--classes", "2", "--seed", "5", "--json", timeout=120)
    assert drawn.returncode == 0, drawn.stderr
    assert facts(json.loads(drawn.stdout)) == facts(described)


def test_data_inspect_raccoon_voc(capsys):
    assert run_data("inspect", "--format", "voc", "--annotations", str(RACCOON_XML), "--json") == 0
    described = json.loads(capsys.readouterr().out)
    known = voc_facts(RACCOON_XML, RACCOON / "images")
    assert known["images"] == 200 and facts(described) == known
    assert described["crowd_boxes"] == 0 and described["skipped"] == {}
    grayscale = [path.name for path in (RACCOON / "images").glob("*.jpg") if opened(path).mode == "L"]
    assert len(grayscale) == 3 and described["changes"] == {"grayscale_images": 3}, grayscale
    # the table says the same
    assert run_data("inspect", "--format", "voc", "--annotations", str(RACCOON_XML)) == 0
    table = capsys.readouterr().out.splitlines()
    smallest, largest = known["image_size"]["min"], known["image_size"]["max"]
    assert f"images      200 (height {smallest[0]}–{largest[0]}, width {smallest[1]}–{largest[1]})" in table, table
    assert re.fullmatch(rf" +1 +raccoon +{known['boxes']}", table[table.index("categories  1") + 3]), table
    assert "  3 grayscale images converted to RGB" in table


def test_data_inspect_reads_a_tfrecord_by_its_label_map_through_the_cli(tmp_path):
    """The raccoon test split (40 examples, their boxes listed in test_labels.csv), named by a
    label map of our own: its names, and its category without boxes, are the ones shown."""
    labels = tmp_path / "labels.pbtxt"
    labels.write_text("item { id: 1 name: 'raccoon' display_name: 'Procyon lotor' }\nitem { id: 2 name: 'fox' }\n")
    result = run_here("data", "inspect", "--format", "tfrecord", "--annotations", str(RACCOON_RECORD),
                      "--label-map", str(labels), "--json")
    assert result.returncode == 0, result.stderr
    described = json.loads(result.stdout)
    with (RACCOON / "data" / "test_labels.csv").open() as stream:
        rows = list(csv.DictReader(stream))
    sizes = {row["filename"]: (int(row["height"]), int(row["width"])) for row in rows}
    assert described["images"] == len(sizes) == 40 and described["boxes"] == len(rows)
    assert described["categories"] == [{"id": 1, "name": "Procyon lotor"}, {"id": 2, "name": "fox"}]
    assert described["per_category"] == {"Procyon lotor": len(rows), "fox": 0}
    assert described["image_size"] == size_range(sizes.values())


def test_rgba_images_are_converted_to_rgb_with_their_colours(tmp_path):
    """README: RGBA images are converted. Loading counts them, and the pipeline training and
    evaluation read through gives each pixel's own red, green and blue, its alpha dropped (not
    blended into them)."""
    from detsweep.data.pipeline import evaluation_dataset
    from detsweep.data.processing import MEAN, STD, InputSpec

    pixels = np.random.default_rng(0).integers(0, 256, (16, 16, 4), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels, "RGBA").save(buffer, "PNG")
    tree = {"images": [{"id": 1, "file_name": "rgba.png", "height": 16, "width": 16}],
            "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [2, 2, 8, 8]}],
            "categories": [{"id": 1, "name": "thing"}]}
    path = write_coco(tmp_path, tree, {"rgba.png": buffer.getvalue()})
    loaded = load_dataset(dataset(format="coco", annotations=path, images=tmp_path / "images"))
    assert loaded.counts == {"rgba_images": 1} and "1 RGBA image: alpha dropped" in loaded.summary_line()
    [(images, _)] = evaluation_dataset(loaded, InputSpec(image_size=16), batch_size=1)  # 16 px: no resizing
    assert images.shape == (1, 16, 16, 3)
    np.testing.assert_allclose(images[0].numpy() * STD + MEAN, pixels[..., :3], atol=1e-3)


def digest(data: bytes) -> str:
    """A short name for a file's bytes, readable in a failure's diff."""
    return hashlib.sha256(data).hexdigest()[:12]


def facts(described: dict) -> dict:
    """What a description says about the data itself (not how it was read)."""
    return {key: described[key] for key in ("images", "boxes", "per_category", "image_size")}


def size_range(sizes) -> dict:
    """``describe``'s image_size from (height, width) pairs."""
    heights, widths = zip(*sizes)
    return {"min": [min(heights), min(widths)], "max": [max(heights), max(widths)]}


def opened(path: Path) -> Image.Image:
    """The image at ``path``, its header read (size, mode) and its file closed."""
    with Image.open(path) as image:
        return image


def coco_facts(annotations: Path, images: Path) -> dict:
    """A COCO dataset's facts, read here with json and PIL."""
    tree = json.loads(annotations.read_text())
    names = {category["id"]: category["name"] for category in tree["categories"]}
    boxes = Counter(names[annotation["category_id"]] for annotation in tree["annotations"])
    sizes = [opened(images / image["file_name"]).size[::-1] for image in tree["images"]]
    return {"images": len(tree["images"]), "boxes": len(tree["annotations"]),
            "per_category": {name: boxes[name] for name in names.values()}, "image_size": size_range(sizes)}


def voc_facts(xml_folder: Path, images: Path) -> dict:
    """A one-class VOC dataset's facts, read here with ElementTree and PIL."""
    from xml.etree import ElementTree

    trees = [ElementTree.parse(path) for path in sorted(xml_folder.glob("*.xml"))]
    names = Counter(name.text for tree in trees for name in tree.iterfind("object/name"))
    sizes = [opened(images / tree.findtext("filename")).size[::-1] for tree in trees]
    return {"images": len(trees), "boxes": sum(names.values()), "per_category": dict(names),
            "image_size": size_range(sizes)}


def test_data_inspect_skip_empty_reports_what_was_skipped(coco, capsys):
    run_data("inspect", "--format", "coco", "--annotations", coco.annotations, "--images", coco.images,
             "--skip-empty", "--json")
    described = json.loads(capsys.readouterr().out)
    assert described["skipped"] == {"empty_images": 1, "zero_area_boxes": 2}
    assert described["images"] == 2 and described["crowd_boxes"] == 1


def test_data_flags_are_validated_like_a_config():
    with pytest.raises(DetsweepError) as caught:
        run_data("inspect", "--num-images", "many")
    assert str(caught.value).startswith("detsweep data inspect: num_images: found 'many', expected")
    with pytest.raises(DetsweepError, match="^detsweep data inspect: annotations: found None"):
        run_data("inspect", "--format", "voc")
