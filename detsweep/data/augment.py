"""The OD API's data augmentations, on one example of the tf.data pipeline.

An example is a dict: ``image`` float32 ``[h, w, 3]``, pixels 0..255; ``boxes`` ``[max_boxes, 4]``
(ymin, xmin, ymax, xmax) in absolute pixels of that image, rows of -1 for padding; ``labels``
``[max_boxes]``, -1 for padding. Each function returns it with image, boxes and labels changed
together. A box the OD API removes becomes a padding row here: the batch keeps its static
``max_boxes``.

Each function follows the OD API's function of the same name in
``object_detection/core/preprocessor.py``, and like there works on the decoded image, before the
image resizer (except :func:`random_scale_crop`, which works on the resized image). Where the OD
API states a rule on boxes normalised to the image, it is applied to absolute pixels here: the
rules (overlap shares, inside or outside a window) are the same in both. Random draws are
stateless, from the example's ``seed`` (the pipeline's, one per example): a seeded pipeline
draws the same whatever thread maps each example.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import tensorflow as tf

from detsweep.config import AugmentationConfig
from detsweep.config.schema import (
    AbsolutePadConfig,
    BrightnessConfig,
    ContrastConfig,
    HueConfig,
    RandomCropImageConfig,
    SaturationConfig,
    ScaleCropConfig,
    SquareCropByScaleConfig,
)

from .processing import InputSpec


@dataclass(frozen=True)
class AugmentationStep:
    """One augmentation on the decoded image, built: the :class:`~detsweep.config.AugmentationConfig`
    field it stands for and the setting it applies (the field's section, or the flip's probability)."""

    name: str
    setting: Any
    apply: Callable[[dict, Any], dict]

    def __call__(self, example: dict) -> dict:
        return self.apply(example, self.setting)


@dataclass(frozen=True)
class Augmentations:
    """What the training pipeline applies to each example: ``decoded``, the steps on the decoded
    image in the order they run; ``scale_jitter``, ``random_scale_crop_and_pad_to_square`` on the
    resized image (None: off). Built once (:func:`build_augmentations`); what a training reports
    it trained with is read from here."""

    decoded: tuple[AugmentationStep, ...] = ()
    scale_jitter: ScaleCropConfig | None = None

    def on_decoded_image(self, example: dict) -> dict:
        for step in self.decoded:
            example = step(example)
        return example


def build_augmentations(augmentation: AugmentationConfig) -> Augmentations:
    """The steps ``augmentation`` sets, in the order :class:`~detsweep.config.AugmentationConfig`
    states: those ``order`` names in its order, then the others in the default order
    (``random_scale_crop_and_pad_to_square`` apart: it comes after the resize)."""
    steps = [AugmentationStep(name, getattr(augmentation, name), _ON_THE_DECODED_IMAGE[name])
             for name in _in_order(augmentation.order)]
    on = tuple(step for step in steps if step.setting is not None and step.setting != 0)  # a flip of 0 is off
    return Augmentations(on, augmentation.random_scale_crop_and_pad_to_square)


def augmented(example: dict, augmentation: AugmentationConfig) -> dict:
    """``example`` (the decoded image) through the steps ``augmentation`` sets
    (:func:`build_augmentations`). Each draw is named and stateless: the order does not change a
    step's draws."""
    return build_augmentations(augmentation).on_decoded_image(example)


def _in_order(order: tuple[str, ...]) -> list[str]:
    """Every step on the decoded image: those ``order`` names, in its order, then the rest in the
    default order."""
    return [*order, *(name for name in _ON_THE_DECODED_IMAGE if name not in order)]


# --- geometry ------------------------------------------------------------------------------


def random_crop_image(example: dict, config: RandomCropImageConfig) -> dict:
    """As the OD API's ``random_crop_image``: with probability ``random_coef`` the example as it
    is; otherwise the window :func:`tf.image.sample_distorted_bounding_box` draws (its
    constraints from ``config``, 100 attempts, then the whole image) with the boxes that are not
    wholly outside it and have at least ``overlap_thresh`` of their area inside it, moved into
    it and, with ``clip_boxes``, clipped to it."""
    if config.random_coef == 0:  # as the OD API: no draw, no tf.cond
        return _cropped(example, config)
    keep = _uniform(example, "crop or not") <= config.random_coef  # the OD API crops when the draw is > random_coef
    return tf.cond(keep, lambda: example, lambda: _cropped(example, config))


def _cropped(example: dict, config: RandomCropImageConfig) -> dict:
    image, valid = example["image"], example["labels"] >= 0
    shape = tf.shape(image)
    # The OD API's constraint boxes: normalised and clipped to the image; the whole image when
    # there are none.
    covered = tf.clip_by_value(tf.boolean_mask(example["boxes"], valid) / _tiled(shape[:2]), 0.0, 1.0)
    begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
        shape, covered[None], seed=_seed(example, "crop window"), min_object_covered=config.min_object_covered,
        aspect_ratio_range=(config.min_aspect_ratio, config.max_aspect_ratio),
        area_range=(config.min_area, config.max_area), max_attempts=100, use_image_if_no_bounding_boxes=True)
    window = tf.cast(tf.concat([begin[:2], begin[:2] + size[:2]], 0), tf.float32)
    kept = valid & _not_outside(example["boxes"], window) & (_share_inside(example["boxes"], window)
                                                              >= config.overlap_thresh)
    boxes = example["boxes"] - _tiled(begin[:2])
    if config.clip_boxes:
        boxes = _clipped(boxes, size[:2])
    return _with_boxes({**example, "image": tf.slice(image, begin, size)}, boxes, kept)


def random_square_crop_by_scale(example: dict, config: SquareCropByScaleConfig) -> dict:
    """As the OD API's ``random_square_crop_by_scale``: a square of side ``s x`` the longer side
    (``s`` one of ``num_scales`` evenly spaced from ``scale_min`` to ``scale_max``), centred on a
    pixel at least a border from the edges (``max_border`` halved until it is at most half the
    side); zeros where it leaves the image. Boxes wholly outside it are dropped, the rest clipped
    to it. As there, the image's last row and column never enter the crop."""
    image = example["image"]
    height, width = tf.unstack(tf.shape(image)[:2])
    scales = tf.linspace(config.scale_min, config.scale_max, config.num_scales)
    scale = scales[_uniform(example, "square scale", maxval=config.num_scales, dtype=tf.int32)]
    # At least one pixel: the OD API's crop of a tiny scale is empty, and the resize fails on it.
    side = tf.maximum(tf.cast(scale * tf.cast(tf.maximum(height, width), tf.float32), tf.int32), 1)
    centre = tf.stack([_draw_centre(example, "square centre y", height, config.max_border),
                       _draw_centre(example, "square centre x", width, config.max_border)])
    corner = centre - side // 2
    start = tf.maximum(corner, 0)
    stop = tf.minimum(centre + side // 2, tf.stack([height, width]) - 1)  # the OD API's "- 1"
    inside = image[start[0]:stop[0], start[1]:stop[1]]
    squared = tf.image.pad_to_bounding_box(inside, start[0] - corner[0], start[1] - corner[1], side, side)
    boxes = example["boxes"] - _tiled(corner)
    square = tf.cast(tf.stack([0, 0, side, side]), tf.float32)
    kept = (example["labels"] >= 0) & _not_outside(boxes, square)
    return _with_boxes({**example, "image": squared}, _clipped(boxes, tf.stack([side, side])), kept)


def _draw_centre(example: dict, draw: str, size: tf.Tensor, max_border: int) -> tf.Tensor:
    border = _crop_border(max_border, size)
    return _uniform(example, draw, minval=border, maxval=size - border + 1, dtype=tf.int32)


def _crop_border(max_border: int, size: tf.Tensor) -> tf.Tensor:
    """As the OD API's ``_get_crop_border``: ``max_border // 2**k``, the least ``k >= 0`` that
    brings it to at most half of ``size``."""
    halvings = tf.math.ceil(tf.math.log(2.0 * max_border / tf.cast(size, tf.float32)) / tf.math.log(2.0))
    divisor = tf.clip_by_value(tf.pow(2.0, halvings), 1.0, float(max_border))
    return max_border // tf.cast(divisor, tf.int32)


def random_absolute_pad_image(example: dict, config: AbsolutePadConfig) -> dict:
    """As the OD API's ``random_absolute_pad_image``: the image placed at a random offset on a
    canvas larger by ``[0, max_height_padding)`` and ``[0, max_width_padding)`` pixels (each drawn
    uniformly, then the offset uniformly within it), filled with ``pad_color`` or, unset, the
    image's mean colour. Boxes move with the image."""
    image = example["image"]
    shape = tf.shape(image)[:2]
    padding = tf.stack([_uniform(example, "pad height", maxval=config.max_height_padding, dtype=tf.int32),
                        _uniform(example, "pad width", maxval=config.max_width_padding, dtype=tf.int32)])
    # uniform in [0, padding), and 0 where there is none (an integer draw refuses an empty range)
    offset = tf.cast(_uniform(example, "pad offset", [2]) * tf.cast(padding, tf.float32), tf.int32)
    canvas = shape + padding
    colour = tf.reduce_mean(image, axis=[0, 1]) if config.pad_color is None else tf.constant(config.pad_color)
    placed = tf.image.pad_to_bounding_box(image, offset[0], offset[1], canvas[0], canvas[1])
    covered = tf.image.pad_to_bounding_box(tf.ones_like(image[..., :1]), offset[0], offset[1], canvas[0], canvas[1])
    padded = placed + (1.0 - covered) * colour
    return _with_boxes({**example, "image": padded}, example["boxes"] + _tiled(offset), example["labels"] >= 0)


def random_horizontal_flip(example: dict, probability: float) -> dict:
    """As the OD API's ``random_horizontal_flip``: image and boxes mirrored with ``probability``."""
    flip = _uniform(example, "flip") < probability
    width = tf.cast(tf.shape(example["image"])[1], tf.float32)
    ymin, xmin, ymax, xmax = tf.unstack(example["boxes"], axis=-1)
    flipped = tf.stack([ymin, width - xmax, ymax, width - xmin], axis=-1)
    valid = (example["labels"] >= 0)[:, None]
    return {
        **example,
        "image": tf.cond(flip, lambda: tf.image.flip_left_right(example["image"]), lambda: example["image"]),
        "boxes": tf.where(flip & valid, flipped, example["boxes"]),
    }


def random_scale_crop(example: dict, spec: InputSpec, scale_min: float, scale_max: float) -> dict:
    """Zoom the (resized) image by a random factor, then take a random ``image_size`` square
    window of it (padding where the zoomed image is smaller). Boxes follow, clipped to the
    window; boxes left with no area become padding. As the OD API's
    ``random_scale_crop_and_pad_to_square``, on the resized image (``resized_shape``)."""
    size = spec.image_size
    factor = _uniform(example, "zoom", minval=scale_min, maxval=scale_max)
    zoomed_shape = tf.maximum(tf.cast(tf.round(tf.cast(example["resized_shape"], tf.float32) * factor), tf.int32), 1)
    image = tf.image.resize(example["image"], zoomed_shape)
    free = tf.maximum(zoomed_shape - size, 0)
    offset = tf.cast(tf.floor(_uniform(example, "zoom window", [2]) * tf.cast(free + 1, tf.float32)), tf.int32)
    window = tf.minimum(zoomed_shape, size)
    image = tf.slice(image, [offset[0], offset[1], 0], [window[0], window[1], 3])
    shift = tf.cast(tf.concat([offset, offset], 0), tf.float32)
    limit = tf.cast(tf.concat([window, window], 0), tf.float32)
    boxes = tf.clip_by_value(example["boxes"] * factor - shift, 0.0, limit)
    kept = (example["labels"] >= 0) & (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
    return {
        **example,
        "image": image,
        "boxes": tf.where(kept[:, None], boxes, -1.0),
        "labels": tf.where(kept, example["labels"], -1),
        "resized_shape": window,
    }


# --- colour: as the OD API, each on pixels / 255, back to 0..255 and clipped there ------------


def random_adjust_brightness(example: dict, config: BrightnessConfig) -> dict:
    """As the OD API's ``random_adjust_brightness``: ``pixels / 255 + delta``, ``delta`` drawn
    from ``[-max_delta, max_delta]``."""
    delta = _uniform(example, "brightness", minval=-config.max_delta, maxval=config.max_delta)
    return _recoloured(example, lambda image: tf.image.adjust_brightness(image, delta))


def random_adjust_contrast(example: dict, config: ContrastConfig) -> dict:
    """As the OD API's ``random_adjust_contrast``: ``tf.image.adjust_contrast`` (each channel's
    distance from its mean, times a factor) with a factor drawn from ``[min_delta, max_delta]``."""
    factor = _uniform(example, "contrast", minval=config.min_delta, maxval=config.max_delta)
    return _recoloured(example, lambda image: tf.image.adjust_contrast(image, factor))


def random_adjust_hue(example: dict, config: HueConfig) -> dict:
    """As the OD API's ``random_adjust_hue``: ``tf.image.adjust_hue`` by a delta drawn from
    ``[-max_delta, max_delta]``."""
    delta = _uniform(example, "hue", minval=-config.max_delta, maxval=config.max_delta)
    return _recoloured(example, lambda image: tf.image.adjust_hue(image, delta))


def random_adjust_saturation(example: dict, config: SaturationConfig) -> dict:
    """As the OD API's ``random_adjust_saturation``: ``tf.image.adjust_saturation`` with a factor
    drawn from ``[min_delta, max_delta]``."""
    factor = _uniform(example, "saturation", minval=config.min_delta, maxval=config.max_delta)
    return _recoloured(example, lambda image: tf.image.adjust_saturation(image, factor))


def _recoloured(example: dict, adjust: Callable[[tf.Tensor], tf.Tensor]) -> dict:
    return {**example, "image": tf.clip_by_value(adjust(example["image"] / 255.0) * 255.0, 0.0, 255.0)}


# The steps on the decoded image in their default order, by their AugmentationConfig field (as
# its DecodedImageStep), each taking the field's value: a section, or the flip's probability.
_ON_THE_DECODED_IMAGE: dict[str, Callable[[dict, Any], dict]] = {
    "random_crop_image": random_crop_image,
    "random_adjust_brightness": random_adjust_brightness,
    "random_adjust_contrast": random_adjust_contrast,
    "random_adjust_hue": random_adjust_hue,
    "random_adjust_saturation": random_adjust_saturation,
    "random_square_crop_by_scale": random_square_crop_by_scale,
    "random_absolute_pad_image": random_absolute_pad_image,
    "random_horizontal_flip": random_horizontal_flip,
}


# --- boxes ---------------------------------------------------------------------------------


def _not_outside(boxes: tf.Tensor, window: tf.Tensor) -> tf.Tensor:
    """As the OD API's ``prune_completely_outside_window``: a box touching the window only at
    its edge is outside."""
    ymin, xmin, ymax, xmax = tf.unstack(boxes, axis=-1)
    top, left, bottom, right = tf.unstack(window)
    return ~((ymin >= bottom) | (xmin >= right) | (ymax <= top) | (xmax <= left))


def _share_inside(boxes: tf.Tensor, window: tf.Tensor) -> tf.Tensor:
    """As the OD API's ``ioa(window, box)``: the share of each box's area inside the window
    (NaN for a box without area, which no threshold keeps, as there)."""
    ymin, xmin, ymax, xmax = tf.unstack(boxes, axis=-1)
    top, left, bottom, right = tf.unstack(window)
    height = tf.maximum(0.0, tf.minimum(ymax, bottom) - tf.maximum(ymin, top))
    width = tf.maximum(0.0, tf.minimum(xmax, right) - tf.maximum(xmin, left))
    return height * width / ((ymax - ymin) * (xmax - xmin))


def _clipped(boxes: tf.Tensor, shape: tf.Tensor) -> tf.Tensor:
    return tf.clip_by_value(boxes, 0.0, _tiled(shape))


def _with_boxes(example: dict, boxes: tf.Tensor, kept: tf.Tensor) -> dict:
    """``boxes`` in the rows ``kept``, padding rows elsewhere."""
    return {**example, "boxes": tf.where(kept[:, None], boxes, -1.0), "labels": tf.where(kept, example["labels"], -1)}


def _tiled(pair: tf.Tensor) -> tf.Tensor:
    """A ``[y, x]`` pair (a point, a shape) as the float ``[4]`` of ``ymin, xmin, ymax, xmax``."""
    return tf.cast(tf.tile(pair, [2]), tf.float32)


# --- draws ---------------------------------------------------------------------------------


def _seed(example: dict, draw: str) -> tf.Tensor:
    """The stateless seed of one ``draw`` for ``example``: its ``seed`` (the pipeline gives each
    example its own) folded with the draw's name, so that an example's draws are the same
    whichever thread maps it, in whatever order; an example without a seed (a function called
    alone) draws one from TensorFlow's global-seeded stream."""
    if "seed" not in example:
        return tf.random.uniform([2], maxval=tf.int32.max, dtype=tf.int32)
    return tf.random.experimental.stateless_fold_in(example["seed"], zlib.crc32(draw.encode()) & 0x7FFFFFFF)


def _uniform(example: dict, draw: str, shape: tuple | list = (), minval=0, maxval=None, dtype=tf.float32) -> tf.Tensor:
    """``tf.random.uniform`` over ``[minval, maxval)`` (``[0, 1)`` by default) for ``draw`` of
    ``example``, from :func:`_seed`."""
    return tf.random.stateless_uniform(shape, _seed(example, draw), minval, 1 if maxval is None else maxval, dtype=dtype)
