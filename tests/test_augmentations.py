"""The OD API's augmentations on the decoded image: each follows its rule in
object_detection/core/preprocessor.py, and boxes move with the pixels.

The geometric tests draw on a picture whose pixels hold their own coordinates (red y + 1, green
x + 1), so that where each output pixel came from, and so the window a step chose, is read from
the output alone."""

from typing import get_args

import numpy as np
import pytest
import tensorflow as tf

from detsweep.config import AugmentationConfig, load_trial_config
from detsweep.config.odapi import import_pipeline
from detsweep.config.schema import (
    AbsolutePadConfig,
    BrightnessConfig,
    ContrastConfig,
    DecodedImageStep,
    HueConfig,
    RandomCropImageConfig,
    SaturationConfig,
    SquareCropByScaleConfig,
)
from detsweep.data import generate_synthetic
from detsweep.data.augment import (
    _ON_THE_DECODED_IMAGE,
    augmented,
    random_absolute_pad_image,
    random_adjust_brightness,
    random_adjust_contrast,
    random_adjust_hue,
    random_adjust_saturation,
    random_crop_image,
    random_horizontal_flip,
    random_square_crop_by_scale,
)
from detsweep.data.pipeline import InMemory, training_dataset
from detsweep.data.processing import InputSpec
from detsweep.errors import DetsweepError

from .conftest import REPO

MAX_BOXES = 16
QUICKSTART = REPO / "configs" / "quickstart.yaml"


def coordinate_picture(height: int, width: int) -> np.ndarray:
    ys, xs = np.mgrid[:height, :width]
    return np.stack([ys + 1, xs + 1, np.full_like(ys, 7)], axis=-1).astype(np.float32)


def example(image: np.ndarray, boxes: list[list[float]]) -> dict:
    padded = np.full((MAX_BOXES, 4), -1.0, np.float32)
    padded[:len(boxes)] = np.reshape(boxes, (-1, 4))
    labels = np.where(np.arange(MAX_BOXES) < len(boxes), np.arange(MAX_BOXES), -1).astype(np.int32)
    return {"image": tf.constant(image), "boxes": tf.constant(padded), "labels": tf.constant(labels)}


def origin(output: np.ndarray, background: tuple[float, ...] = (0, 0, 0)) -> tuple[int, int]:
    """Where the output's (0, 0) lies in the coordinate picture, from any pixel taken from it
    (not of the ``background`` colour)."""
    rows, columns = np.nonzero(~np.isclose(output, background, atol=1e-3).all(axis=-1))
    r, c = rows[0], columns[0]
    return int(output[r, c, 0] - 1 - r), int(output[r, c, 1] - 1 - c)


# Boxes over a 160 x 200 picture: inside, straddling every edge by various shares, outside
# most windows, and one without area.
PICTURE = coordinate_picture(160, 200)
BOXES = [[10, 10, 50, 60], [0, 0, 160, 200], [60, 80, 100, 120], [120, 150, 160, 200], [5, 100, 45, 195],
         [70, 0, 150, 40], [30, 30, 130, 170], [100, 60, 110, 70], [140, 0, 160, 20], [0, 180, 20, 200],
         [50, 50, 50, 90]]


def od_api_crop_rule(boxes: np.ndarray, window: list[int], overlap_thresh: float) -> tuple[np.ndarray, np.ndarray]:
    """box_list_ops.prune_completely_outside_window, then prune_non_overlapping_boxes (intersection
    over the box's area >= overlap_thresh): which boxes stay, and each box's share inside."""
    top, left, bottom, right = window
    outside = ((boxes[:, 0] >= bottom) | (boxes[:, 1] >= right) | (boxes[:, 2] <= top) | (boxes[:, 3] <= left))
    height = np.maximum(0, np.minimum(boxes[:, 2], bottom) - np.maximum(boxes[:, 0], top))
    width = np.maximum(0, np.minimum(boxes[:, 3], right) - np.maximum(boxes[:, 1], left))
    with np.errstate(invalid="ignore"):
        share = height * width / ((boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1]))
    return ~outside & (share >= overlap_thresh), share


@pytest.mark.parametrize("overlap_thresh", [0.0, 0.5])
def test_crop_keeps_and_drops_boxes_by_the_od_api_rule_and_moves_them_with_the_pixels(overlap_thresh):
    tf.random.set_seed(1)
    config = RandomCropImageConfig(min_object_covered=0.0, min_area=0.2, max_area=0.6, min_aspect_ratio=0.5,
                                   max_aspect_ratio=2.0, overlap_thresh=overlap_thresh)
    original = np.array(BOXES, np.float32)
    shares = []
    for _ in range(12):
        cropped = random_crop_image(example(PICTURE, BOXES), config)
        image = cropped["image"].numpy()
        top, left = origin(image)
        height, width = image.shape[:2]
        np.testing.assert_array_equal(image, PICTURE[top:top + height, left:left + width])
        kept, share = od_api_crop_rule(original, [top, left, top + height, left + width], overlap_thresh)
        labels = cropped["labels"].numpy()[:len(BOXES)]
        np.testing.assert_array_equal(labels >= 0, kept)
        expected = np.clip(original - [top, left, top, left], 0, [height, width, height, width])
        np.testing.assert_allclose(cropped["boxes"].numpy()[:len(BOXES)][kept], expected[kept])
        assert (cropped["boxes"].numpy()[:len(BOXES)][~kept] == -1).all()
        shares.append(share)
    shares = np.concatenate(shares)
    # the draws met every case of the rule: wholly outside, partly inside below and above the
    # threshold, wholly inside
    assert (shares == 0).any() and ((shares > 0) & (shares < 0.5)).any()
    assert ((shares >= 0.5) & (shares < 1)).any() and (shares == 1).any()


def test_crop_draws_windows_within_the_constraints_it_is_given():
    """sample_distorted_bounding_box's arguments, as the OD API passes them: the window's area
    share and aspect ratio are in their ranges, and it covers min_object_covered of a box."""
    tf.random.set_seed(2)
    config = RandomCropImageConfig(min_object_covered=1.0, min_area=0.3, max_area=0.5, min_aspect_ratio=1.5,
                                   max_aspect_ratio=2.5, overlap_thresh=0.0)
    for _ in range(12):
        image = random_crop_image(example(PICTURE, [[40, 60, 80, 100]]), config)["image"].numpy()
        height, width = image.shape[:2]
        assert 0.3 - 0.02 <= height * width / (160 * 200) <= 0.5 + 0.02
        assert 1.5 - 0.05 <= width / height <= 2.5 + 0.05
        top, left = origin(image)
        assert top <= 40 and left <= 60 and top + height >= 80 and left + width >= 100


def test_crop_without_clip_boxes_keeps_the_boxes_as_moved():
    tf.random.set_seed(3)
    config = RandomCropImageConfig(min_object_covered=0.0, min_area=0.2, max_area=0.4, overlap_thresh=0.0,
                                   clip_boxes=False)
    cropped = random_crop_image(example(PICTURE, [[0, 0, 160, 200]]), config)
    top, left = origin(cropped["image"].numpy())
    np.testing.assert_allclose(cropped["boxes"].numpy()[0], [-top, -left, 160 - top, 200 - left])


def test_crop_random_coef_is_the_probability_of_keeping_the_original():
    tf.random.set_seed(4)
    always = RandomCropImageConfig(max_area=0.8, random_coef=1.0)
    for _ in range(5):
        kept = random_crop_image(example(PICTURE, BOXES), always)
        np.testing.assert_array_equal(kept["image"].numpy(), PICTURE)
        np.testing.assert_array_equal(kept["boxes"].numpy()[:len(BOXES)], BOXES)
        np.testing.assert_array_equal(kept["labels"].numpy()[:len(BOXES)], np.arange(len(BOXES)))
    half = RandomCropImageConfig(max_area=0.8, random_coef=0.5)
    originals = sum(random_crop_image(example(PICTURE, BOXES), half)["image"].shape == PICTURE.shape
                    for _ in range(40))
    assert 8 <= originals <= 32  # binomial(40, 0.5): outside this once in ~10 000 runs


def grey_example(values: list[list[float]]) -> dict:
    """An image of 1 x n pixels of the given RGB values."""
    return example(np.array([values], np.float32), [])


def test_brightness_adds_at_most_max_delta_of_the_pixel_range_and_clips():
    tf.random.set_seed(5)
    pixels = [[100, 120, 140], [250, 250, 250], [3, 3, 3]]
    shifts = []
    for _ in range(20):
        out = random_adjust_brightness(grey_example(pixels), BrightnessConfig(max_delta=0.1))["image"].numpy()[0]
        shift = out[0] - pixels[0]
        assert np.allclose(shift, shift[0], atol=1e-3)  # one delta for the whole image
        assert abs(shift[0]) <= 0.1 * 255 + 1e-3
        np.testing.assert_allclose(out[1:], np.clip(np.array(pixels[1:]) + shift[0], 0, 255), atol=1e-3)
        shifts.append(shift[0])
    # drawn from [-max_delta, max_delta] on pixels / 255: some far past a delta added to 0..255 pixels
    assert min(shifts) < -10 and max(shifts) > 10


def test_contrast_scales_each_channels_spread_by_a_factor_in_its_range():
    tf.random.set_seed(6)
    pixels = [[100, 50, 200], [140, 70, 180]]
    mean = np.mean(pixels, axis=0)
    factors = []
    for _ in range(20):
        out = random_adjust_contrast(grey_example(pixels), ContrastConfig(min_delta=0.5, max_delta=1.5))["image"]
        factor = (out.numpy()[0] - mean) / (np.array(pixels) - mean)
        assert np.allclose(factor, factor[0, 0], atol=1e-3) and 0.5 - 1e-3 <= factor[0, 0] <= 1.5 + 1e-3
        factors.append(factor[0, 0])
    assert min(factors) < 0.8 and max(factors) > 1.2


def hsv(image: tf.Tensor) -> np.ndarray:
    return tf.image.rgb_to_hsv(image / 255.0).numpy()[0]


def test_hue_turns_by_at_most_max_delta_keeping_saturation_and_value():
    tf.random.set_seed(7)
    pixels = [[200, 80, 40], [30, 160, 90]]
    before = hsv(tf.constant([pixels], tf.float32))
    turns = []
    for _ in range(40):  # none of 40 draws below -0.05 (or above 0.05): once in 100 000
        after = hsv(random_adjust_hue(grey_example(pixels), HueConfig(max_delta=0.1))["image"])
        turn = (after[:, 0] - before[:, 0] + 0.5) % 1.0 - 0.5
        assert np.allclose(turn, turn[0], atol=2e-3) and abs(turn[0]) <= 0.1 + 2e-3
        np.testing.assert_allclose(after[:, 1:], before[:, 1:], atol=1e-2)
        turns.append(turn[0])
    assert min(turns) < -0.05 and max(turns) > 0.05


def test_saturation_scales_by_a_factor_in_its_range_keeping_hue():
    tf.random.set_seed(8)
    pixels = [[200, 140, 120], [60, 90, 120]]  # saturation 0.4 and 0.5: no factor here saturates them
    before = hsv(tf.constant([pixels], tf.float32))
    factors = []
    for _ in range(20):
        after = hsv(random_adjust_saturation(grey_example(pixels), SaturationConfig(min_delta=0.6, max_delta=1.8))["image"])
        factor = after[:, 1] / before[:, 1]
        assert np.allclose(factor, factor[0], atol=1e-3) and 0.6 - 1e-3 <= factor[0] <= 1.8 + 1e-3
        np.testing.assert_allclose(after[:, 0], before[:, 0], atol=1e-3)
        factors.append(factor[0])
    assert min(factors) < 0.9 and max(factors) > 1.5


def test_square_crop_by_scale_cuts_a_square_around_a_centre_off_the_border_and_moves_boxes():
    """A 120 x 200 picture with max_border 128: the border is 128 / 4 = 32 rows and 128 / 2 = 64
    columns (halved until under half the side); the side is one of 8 scales from 0.6 to 1.3
    times 200. Zeros pad where the square leaves the picture and, as in the OD API, where the
    picture's last row and column would be, and the square's own last row and column when its
    side is odd."""
    tf.random.set_seed(9)
    picture = coordinate_picture(120, 200)
    boxes = [[10, 10, 50, 60], [0, 0, 120, 200], [60, 150, 110, 195], [90, 0, 119, 30], [20, 170, 40, 200]]
    original = np.array(boxes, np.float32)
    sides = set((tf.linspace(0.6, 1.3, 8) * 200.0).numpy().astype(int))  # float32, as the OD API computes them
    for _ in range(12):
        squared = random_square_crop_by_scale(example(picture, boxes), SquareCropByScaleConfig())
        image = squared["image"].numpy()
        side = image.shape[0]
        assert image.shape == (side, side, 3) and side in sides
        top, left = origin(image)
        centre = np.array([top + side // 2, left + side // 2])
        assert (centre >= [32, 64]).all() and (centre <= [120 - 32, 200 - 64]).all()
        # the crop spans 2 * (side // 2) from its corner, and never the picture's last row and column
        span = 2 * (side // 2)
        inside = picture[:119, :199]
        expected = np.zeros_like(image)
        rows, columns = slice(max(top, 0), min(top + span, 119)), slice(max(left, 0), min(left + span, 199))
        expected[rows.start - top:rows.stop - top, columns.start - left:columns.stop - left] = inside[rows, columns]
        np.testing.assert_array_equal(image, expected)
        moved = original - [top, left, top, left]
        kept = ~((moved[:, 0] >= side) | (moved[:, 1] >= side) | (moved[:, 2] <= 0) | (moved[:, 3] <= 0))
        np.testing.assert_array_equal(squared["labels"].numpy()[:len(boxes)] >= 0, kept)
        np.testing.assert_allclose(squared["boxes"].numpy()[:len(boxes)][kept], np.clip(moved[kept], 0, side))


def test_absolute_pad_places_the_image_on_a_larger_canvas_of_its_mean_colour():
    tf.random.set_seed(10)
    picture = coordinate_picture(60, 80)
    boxes = [[10, 20, 30, 40], [0, 0, 60, 80]]
    sizes = []
    for _ in range(12):
        padded = random_absolute_pad_image(example(picture, boxes),
                                           AbsolutePadConfig(max_height_padding=40, max_width_padding=30))
        image = padded["image"].numpy()
        height, width = image.shape[:2]
        assert 60 <= height < 100 and 80 <= width < 110
        top, left = (-at for at in origin(image, background=picture.mean(axis=(0, 1))))  # the picture's place
        np.testing.assert_array_equal(image[top:top + 60, left:left + 80], picture)
        canvas = np.ones(image.shape[:2], bool)
        canvas[top:top + 60, left:left + 80] = False
        np.testing.assert_allclose(image[canvas], np.broadcast_to(picture.mean(axis=(0, 1)), image[canvas].shape),
                                   atol=1e-3)
        np.testing.assert_allclose(padded["boxes"].numpy()[:2], np.array(boxes) + [top, left, top, left])
        sizes.append((height, width))
    assert len(set(sizes)) > 6 and max(h for h, _ in sizes) > 80 and max(w for _, w in sizes) > 95


def test_absolute_pad_with_a_colour_and_the_builders_no_padding_default():
    tf.random.set_seed(11)
    picture = coordinate_picture(20, 30)
    green = random_absolute_pad_image(example(picture, []), AbsolutePadConfig(max_height_padding=9, max_width_padding=9,
                                                                             pad_color=(0, 255, 0)))["image"].numpy()
    top, left = (-at for at in origin(green, background=(0, 255, 0)))
    canvas = np.ones(green.shape[:2], bool)
    canvas[top:top + 20, left:left + 30] = False
    assert canvas.any() and (green[canvas] == [0, 255, 0]).all()
    unpadded = random_absolute_pad_image(example(picture, []), AbsolutePadConfig())["image"].numpy()
    np.testing.assert_array_equal(unpadded, picture)


def test_a_flip_after_a_crop_mirrors_the_boxes_within_the_cropped_image():
    tf.random.set_seed(12)
    augmentation = AugmentationConfig(random_horizontal_flip=1.0, random_crop_image=RandomCropImageConfig(
        min_object_covered=0.0, min_area=0.3, max_area=0.5, overlap_thresh=0.0))
    box = np.array([40, 50, 120, 150], np.float32)
    for _ in range(4):
        out = augmented(example(PICTURE, [box]), augmentation)
        mirrored = out["image"].numpy()[:, ::-1]
        top, left = origin(mirrored)
        height, width = mirrored.shape[:2]
        np.testing.assert_array_equal(mirrored, PICTURE[top:top + height, left:left + width])
        ymin, xmin, ymax, xmax = np.clip(box - [top, left, top, left], 0, [height, width, height, width])
        np.testing.assert_allclose(out["boxes"].numpy()[0], [ymin, width - xmax, ymax, width - xmin])


def test_a_training_dataset_with_every_augmentation_gives_finite_batches_of_its_shapes():
    augmentation = AugmentationConfig(
        random_horizontal_flip=0.5, random_crop_image={"min_object_covered": 0.0}, random_adjust_brightness={},
        random_adjust_contrast={}, random_adjust_hue={}, random_adjust_saturation={}, random_square_crop_by_scale={},
        random_absolute_pad_image={"max_height_padding": 40, "max_width_padding": 40},
        random_scale_crop_and_pad_to_square={"scale_min": 0.5, "scale_max": 1.5})
    tf.random.set_seed(13)
    spec = InputSpec(96)
    data = training_dataset(InMemory.of(generate_synthetic(6, 80, 3, seed=1), MAX_BOXES), spec, augmentation,
                            batch_size=4, seed=0)
    boxes_seen = 0
    for images, targets in data.take(3):
        assert images.shape == (4, 96, 96, 3) and np.isfinite(images.numpy()).all()
        assert targets["boxes"].shape == (4, MAX_BOXES, 4) and targets["labels"].shape == (4, MAX_BOXES)
        valid = targets["labels"].numpy() >= 0
        boxes = targets["boxes"].numpy()[valid]
        assert ((boxes >= 0) & (boxes <= 96)).all() and (boxes[:, 2:] >= boxes[:, :2]).all()
        boxes_seen += valid.sum()
    assert boxes_seen > 0


def test_a_sweep_sets_one_field_of_a_step_and_ranges_are_checked(write):
    path = write("trial.yaml", "optimizer: {type: momentum}\n")
    config = load_trial_config(path, ["data.augmentation.random_adjust_brightness.max_delta=0.3"])
    assert config.data.augmentation.random_adjust_brightness == BrightnessConfig(max_delta=0.3)
    assert config.data.augmentation.random_crop_image is None  # off unless set
    with pytest.raises(DetsweepError) as error:
        load_trial_config(path, ["data.augmentation.random_crop_image.min_area=0.9",
                                 "data.augmentation.random_crop_image.max_area=0.5"])
    assert "data.augmentation.random_crop_image.min_area: found 0.9, expected <= max_area (0.5)" in str(error.value)


EVERY_STEP = dict(
    random_horizontal_flip=0.5, random_crop_image={"min_object_covered": 0.0}, random_adjust_brightness={},
    random_adjust_contrast={}, random_adjust_hue={}, random_adjust_saturation={}, random_square_crop_by_scale={},
    random_absolute_pad_image={"max_height_padding": 40, "max_width_padding": 40})


def first_batches(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The first three batches with every step on, from a pipeline seeded with ``seed`` under the
    global seed ``seed`` (training sets both: ``keras.utils.set_random_seed(train.seed)``); its
    parallel map may run the examples in any order."""
    tf.random.set_seed(seed)
    data = training_dataset(InMemory.of(generate_synthetic(4, 80, 3, seed=1), MAX_BOXES), InputSpec(96),
                            AugmentationConfig(**EVERY_STEP, random_scale_crop_and_pad_to_square={"scale_min": 0.5}),
                            batch_size=4, seed=seed)
    batches = list(data.take(3))
    return (np.stack([images.numpy() for images, _ in batches]),
            np.stack([targets["boxes"].numpy() for _, targets in batches]))


def test_every_step_is_deterministic_under_a_seed_and_another_seed_draws_otherwise():
    images, boxes = first_batches(21)
    again_images, again_boxes = first_batches(21)
    np.testing.assert_array_equal(images, again_images)
    np.testing.assert_array_equal(boxes, again_boxes)
    other_images, _ = first_batches(22)
    assert not np.allclose(images, other_images)


def test_the_flip_happens_as_often_as_its_probability_says():
    """400 draws at probability 0.3: within four standard deviations of 120 flips."""
    tf.random.set_seed(5)
    picture = coordinate_picture(8, 10)
    flips = 0
    for _ in range(400):
        flipped = augmented(example(picture, [[0, 0, 4, 5]]), AugmentationConfig(random_horizontal_flip=0.3))
        flips += int(flipped["image"].numpy()[0, 0, 1] != picture[0, 0, 1])
    assert abs(flips - 120) <= 4 * (400 * 0.3 * 0.7) ** 0.5, flips


def test_the_scale_jitter_is_refused_on_a_stretched_input(write):
    """It zooms the resized image: stretched by fixed_shape, a distorted square."""
    path = write("trial.yaml", "optimizer: {type: momentum}\nmodel: {image_resizer: fixed_shape}\n")
    with pytest.raises(DetsweepError) as error:
        load_trial_config(path, ["data.augmentation.random_scale_crop_and_pad_to_square.scale_min=0.5"])
    assert str(error.value) == (f"{path}: data.augmentation.random_scale_crop_and_pad_to_square: found {{'scale_min': "
                                "0.5, 'scale_max': 2.0}, expected none with model.image_resizer: fixed_shape (it would "
                                "zoom the stretched square)")


# --- the order of the steps (the OD API applies data_augmentation_options in the file's order) ---

CROP = RandomCropImageConfig(min_object_covered=0.0, min_area=0.3, max_area=0.5, overlap_thresh=0.0)
PAD = AbsolutePadConfig(max_height_padding=80, max_width_padding=80, pad_color=(0, 0, 0))
SETTINGS = {"random_crop_image": CROP, "random_absolute_pad_image": PAD, "random_horizontal_flip": 1.0}
BY_HAND = {"random_crop_image": random_crop_image, "random_absolute_pad_image": random_absolute_pad_image,
           "random_horizontal_flip": random_horizontal_flip}


def seeded_example() -> dict:
    """The coordinate picture with a box, and a seed of its own as the pipeline gives each example:
    each step's draws are the same whatever runs before it."""
    return {**example(PICTURE, [[40, 50, 120, 150]]), "seed": tf.constant([3, 4], tf.int64)}


def by_hand(*names: str) -> dict:
    out = seeded_example()
    for name in names:
        out = BY_HAND[name](out, SETTINGS[name])
    return out


def assert_same(out: dict, expected: dict) -> None:
    np.testing.assert_array_equal(out["image"].numpy(), expected["image"].numpy())
    np.testing.assert_array_equal(out["boxes"].numpy(), expected["boxes"].numpy())
    np.testing.assert_array_equal(out["labels"].numpy(), expected["labels"].numpy())


def differs(one: dict, other: dict) -> bool:
    a, b = one["image"].numpy(), other["image"].numpy()
    return a.shape != b.shape or not np.array_equal(a, b)


@pytest.mark.parametrize("order", [("random_absolute_pad_image", "random_crop_image"),
                                   ("random_horizontal_flip", "random_crop_image")])
def test_the_steps_run_in_the_order_named_where_it_changes_the_result(order):
    """A pad then a crop (the crop may take the padding) and a flip then a crop (the window on the
    mirrored picture) are what the steps give by hand in that order, not in the default order."""
    augmentation = AugmentationConfig(**{name: SETTINGS[name] for name in order}, order=order)
    out = augmented(seeded_example(), augmentation)
    assert_same(out, by_hand(*order))
    assert differs(out, by_hand(*reversed(order)))


def test_steps_set_but_not_named_follow_in_the_default_order_and_a_named_step_not_set_is_skipped():
    """Named: the pad, then hue (not set: skipped); set but not named: the crop and the flip, after
    them in the default order (crop, colour, square crop, pad, flip)."""
    augmentation = AugmentationConfig(**SETTINGS, order=("random_absolute_pad_image", "random_adjust_hue"))
    out = augmented(seeded_example(), augmentation)
    assert_same(out, by_hand("random_absolute_pad_image", "random_crop_image", "random_horizontal_flip"))
    assert differs(out, by_hand("random_crop_image", "random_absolute_pad_image", "random_horizontal_flip"))
    # the default order is the one the config names (the importer reads it from there)
    assert tuple(_ON_THE_DECODED_IMAGE) == get_args(DecodedImageStep)


def test_a_step_named_twice_in_the_order_is_a_one_line_error(write):
    path = write("trial.yaml", "optimizer: {type: momentum}\n"
                               "data: {augmentation: {order: [random_crop_image, random_crop_image]}}\n")
    with pytest.raises(DetsweepError) as error:
        load_trial_config(path)
    assert str(error.value) == (f"{path}: data.augmentation.order: found a list, expected each step at most once "
                                "(random_crop_image is there twice)")


def odapi_file(*steps: str) -> str:
    return ("train_config { optimizer { adam_optimizer { } } "
            + " ".join(f"data_augmentation_options {{ {step} {{ }} }}" for step in steps) + " }")


def test_the_import_keeps_the_files_order_where_it_is_not_the_default(write):
    """flip, pad, crop: the order written, as the loader reads the file; crop, pad, flip (the
    default order): none; the scale jitter before a step: named, as detsweep applies it last."""
    flip_pad_crop = load_trial_config(write("flip_pad_crop.config", odapi_file(
        "random_horizontal_flip", "random_absolute_pad_image", "random_crop_image")))
    assert flip_pad_crop.data.augmentation.order == (
        "random_horizontal_flip", "random_absolute_pad_image", "random_crop_image")
    default = import_pipeline(odapi_file("random_crop_image", "random_absolute_pad_image", "random_horizontal_flip"))
    assert set(default.tree["data"]["augmentation"]) == {
        "random_crop_image", "random_absolute_pad_image", "random_horizontal_flip"}
    jitter_first = import_pipeline(odapi_file("random_scale_crop_and_pad_to_square", "random_crop_image"))
    assert "order" not in jitter_first.tree["data"]["augmentation"]
    assert ("train_config.data_augmentation_options.random_scale_crop_and_pad_to_square: before random_crop_image in "
            "the file; detsweep applies it last, on the resized image") in jitter_first.not_carried


def test_training_batches_apply_the_configs_augmentation():
    """The batches the training loop steps on (``train.loop.distributed_batches``, the same
    seed and order): with ``random_horizontal_flip: 1`` every image and its boxes are those
    without augmentation, mirrored; with no augmentation they are not."""
    from detsweep.data import training_source
    from detsweep.data.augment import build_augmentations
    from detsweep.train.loop import distributed_batches

    def first_batch(*overrides: str) -> tuple[np.ndarray, np.ndarray]:
        config = load_trial_config(QUICKSTART, ["data.train.num_images=8", "data.augmentation={}", *overrides])
        train_set = training_source(config.data)
        images, targets = next(distributed_batches(tf.distribute.get_strategy(), train_set, InputSpec.of(config.model),
                                                   config, 0, build_augmentations(config.data.augmentation)))
        return images.numpy(), targets["boxes"].numpy()

    plain, plain_boxes = first_batch()
    flipped, flipped_boxes = first_batch("data.augmentation.random_horizontal_flip=1.0")
    width = plain.shape[2]
    np.testing.assert_allclose(flipped, plain[:, :, ::-1], atol=1e-5)
    real = plain_boxes.sum(axis=-1) > 0  # the padding rows are zeros in both
    mirrored = np.stack([plain_boxes[..., 0], width - plain_boxes[..., 3], plain_boxes[..., 2],
                         width - plain_boxes[..., 1]], axis=-1)
    np.testing.assert_allclose(flipped_boxes[real], mirrored[real], atol=1e-3)
    assert not np.allclose(flipped, plain, atol=1e-2)  # the flip shows: the shapes are not symmetric
