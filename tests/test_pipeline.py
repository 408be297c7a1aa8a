"""The tf.data path: augmentations move boxes with the pixels; bad data stops before Ray starts."""

import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from detsweep.data import generate_synthetic
from detsweep.data.augment import random_horizontal_flip, random_scale_crop
from detsweep.data.pipeline import decode_and_resize, to_tensors
from detsweep.data.processing import InputSpec

from .conftest import run_cli

SPEC = InputSpec(image_size=128)
MAX_BOXES = 8


def first_element():
    dataset = generate_synthetic(1, 128, 3, seed=5)
    tensors = {k: v[:1] for k, v in to_tensors(dataset, MAX_BOXES).items()}
    element = next(iter(tf.data.Dataset.from_tensor_slices(tensors)))
    return decode_and_resize(element, SPEC, from_files=False)


def box_pixels_mean(image, box):
    ymin, xmin, ymax, xmax = (int(round(float(v))) for v in box)
    return float(tf.reduce_mean(image[ymin:ymax, xmin:xmax]))


def test_horizontal_flip_moves_boxes_with_the_pixels():
    element = first_element()
    flipped = random_horizontal_flip(element, probability=1.0)
    valid = element["labels"].numpy() >= 0
    for before, after in zip(element["boxes"].numpy()[valid], flipped["boxes"].numpy()[valid]):
        assert after[1] == pytest.approx(128 - before[3]) and after[3] == pytest.approx(128 - before[1])
        assert box_pixels_mean(flipped["image"], after) == pytest.approx(box_pixels_mean(element["image"], before), abs=1.0)


def test_scale_crop_zoom_keeps_boxes_on_their_objects_inside_the_window():
    element = first_element()
    tf.random.set_seed(3)
    zoomed = random_scale_crop(element, SPEC, scale_min=2.0, scale_max=2.0)
    assert zoomed["image"].shape[:2] == (128, 128)  # cropped back to the square
    boxes, labels = zoomed["boxes"].numpy(), zoomed["labels"].numpy()
    kept = labels >= 0
    assert kept.any()
    assert (boxes[kept] >= 0).all() and (boxes[kept] <= 128).all()
    assert (boxes[~kept] == -1).all()
    # Where the window lies in the image zoomed 2x, found from the pixels alone; each kept box
    # covers there the pixels its object covers in the zoomed image (the shapes' saturated colours).
    upscaled = tf.image.resize(element["image"], (256, 256)).numpy()
    window = zoomed["image"].numpy()
    top, left = min(((y, x) for y in range(129) for x in range(129)),
                    key=lambda at: np.abs(upscaled[at[0]:at[0] + 8, at[1]:at[1] + 8] - window[:8, :8]).sum())
    np.testing.assert_allclose(window, upscaled[top:top + 128, left:left + 128], atol=1e-3)
    original = element["boxes"].numpy()[kept]
    np.testing.assert_allclose(boxes[kept], np.clip(original * 2 - [top, left, top, left], 0, 128), atol=1e-3)
    for box in boxes[kept]:
        inside = box_pixels_mean(window, box)
        assert inside == pytest.approx(box_pixels_mean(upscaled, box + [top, left, top, left]), abs=1.0)
        assert abs(inside - float(window.mean())) > 5  # an object's colour, not the grey background


def test_scale_crop_shrink_pads_later_and_scales_boxes():
    element = first_element()
    shrunk = random_scale_crop(element, SPEC, scale_min=0.5, scale_max=0.5)
    assert tuple(shrunk["resized_shape"].numpy()) == (64, 64)
    valid = element["labels"].numpy() >= 0
    np.testing.assert_allclose(shrunk["boxes"].numpy()[valid], element["boxes"].numpy()[valid] * 0.5, atol=1e-4)


@pytest.mark.parametrize(("images", "replicas", "shares"), [
    (5, 1, [[1, 3, 5, -1], [2, 4, -1, -1]]),  # batches of 2: as many on each pipeline
    (5, 2, [[1, 3, 5, -1], [2, 4, -1, -1]]),  # each step a batch on each of 2 devices
    (6, 2, [[1, 3, 5, -1], [2, 4, 6, -1]]),
    (1, 1, [[1, -1], [-1, -1]]),  # fewer images than pipelines: the second is all filler
])
def test_each_evaluation_pipeline_reads_its_share_once_in_as_many_batches(images, replicas, shares):
    from detsweep.data.pipeline import evaluation_dataset

    dataset = generate_synthetic(images, 32, 3, seed=5)
    read = [[int(i) for _, meta in evaluation_dataset(dataset, InputSpec(image_size=32), 2, (2, index), replicas)
             for i in meta["image_id"]] for index in range(2)]
    assert read == shares


@pytest.mark.parametrize("data, found", [
    ("{train: {format: coco, annotations: gt.json, images: images}}", ("gone.jpg", "not found")),
    ("{train: {format: tfrecord, annotations: 'train.record-?????-of-00010'}}",
     ("train.record-?????-of-00010", "matches no TFRecord files")),
    ("{max_boxes: 0}", ("data.max_boxes: found 0, expected greater than 0",)),
    ("{shuffle_buffer_size: 0}", ("data.shuffle_buffer_size: found 0, expected greater than 0",)),
], ids=["coco image missing", "tfrecord glob matching nothing", "max_boxes 0", "shuffle buffer 0"])
def test_bad_data_fails_before_training_with_one_line(tmp_path, data, found):
    (tmp_path / "images").mkdir()
    (tmp_path / "gt.json").write_text(json.dumps({
        "images": [{"id": 1, "file_name": "gone.jpg", "width": 64, "height": 64}],
        "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [1, 1, 10, 10], "area": 100, "iscrowd": 0}],
        "categories": [{"id": 1, "name": "thing"}]}))
    config = tmp_path / "trial.yaml"
    config.write_text(f"optimizer: {{type: momentum}}\ndata: {data}\n")
    runs = tmp_path / "runs"
    # Ray makes its session folder under RAY_TMPDIR as it starts; a short path, since its
    # sockets live there and a socket's path is limited to 107 characters
    ray_tmp = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
    try:
        result = run_cli("train", str(config), "--storage", str(runs), "--name", "bad", cwd=tmp_path,
                         env={"RAY_TMPDIR": str(ray_tmp)})
        # nothing started: no Ray session, and no run folder (a training's log is the first thing
        # it writes there)
        assert not any(ray_tmp.iterdir()), sorted(path.name for path in ray_tmp.rglob("*"))[:20]
        assert not runs.exists(), sorted(path.name for path in runs.rglob("*"))
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert result.returncode == 2, result.stderr[-3000:]
    [line] = result.stderr.splitlines()
    assert all(words in line for words in found), line


def test_unknown_format_name_is_a_config_error(tmp_path):
    result = run_cli("data", "inspect", "--format", "yolo")
    assert result.returncode == 2 and "format: found 'yolo'" in result.stderr
