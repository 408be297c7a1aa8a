"""What surrounds the network, in one place: pictures → the model's input, and the model's
output → detections in the original picture, with the dataset's own category ids.

The training pipeline, training's evaluation, :class:`~detsweep.export.detector.Detector` and
the SavedModel (so TFLite too) all go through these functions, so an exported model scores
what evaluation scored by construction, not only by test. Boxes are ``ymin, xmin, ymax,
xmax`` throughout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import tensorflow as tf

from detsweep.config import ModelConfig

# ImageNet statistics, as keras-hub's image converters normalise for pretrained encoders.
# (Plain tuples: a tf.constant at import time would start TensorFlow's runtime too early for
# MultiWorkerMirroredStrategy.)
MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)


@dataclass(frozen=True)
class InputSpec:
    """How pictures become the model's input: ``image_resizer`` as the OD API's resizers
    (``keep_aspect_ratio``: the longer side to ``image_size``, padded bottom and right to the
    square; ``fixed_shape``: stretched to the square), then ``(pixel - mean) / std``."""

    image_size: int
    image_resizer: str = "keep_aspect_ratio"
    mean: tuple[float, float, float] = MEAN
    std: tuple[float, float, float] = STD

    @classmethod
    def of(cls, model: ModelConfig) -> InputSpec:
        if model.image_mean is None:
            return cls(model.image_size, image_resizer=model.image_resizer)
        return cls(model.image_size, image_resizer=model.image_resizer, mean=model.image_mean, std=model.image_std)


# --- pictures → the model's input ------------------------------------------------------------

def fit_to_input(images: tf.Tensor, spec: InputSpec) -> tuple[tf.Tensor, tf.Tensor]:
    """An image ``[h, w, 3]`` (or a batch of one size, ``[b, h, w, 3]``) as float32, resized by
    ``spec.image_resizer``; and the scale ``[2]`` (y, x) from original to resized pixels."""
    shape = tf.cast(tf.shape(images)[-3:-1], tf.float32)
    if spec.image_resizer == "fixed_shape":
        scale = spec.image_size / shape
    else:
        scale = tf.fill([2], spec.image_size / tf.reduce_max(shape))
    resized_shape = tf.cast(tf.round(shape * scale), tf.int32)
    return tf.image.resize(tf.cast(images, tf.float32), resized_shape), scale


def scaled_boxes(boxes: tf.Tensor, scale: tf.Tensor) -> tf.Tensor:
    """``ymin, xmin, ymax, xmax`` boxes ``[..., 4]`` times a scale ``[2]`` (y, x)."""
    return boxes * tf.tile(scale, [2])


def pad_and_normalise(element: dict, spec: InputSpec) -> dict:
    """Pad bottom and right to the square, then normalise; one image or a batch."""
    image = tf.image.pad_to_bounding_box(element["image"], 0, 0, spec.image_size, spec.image_size)
    image = (image - spec.mean) / spec.std
    image.set_shape(image.shape[:-3].concatenate([spec.image_size, spec.image_size, 3]))
    return {**element, "image": image}


def letterboxed(image: tf.Tensor, spec: InputSpec) -> tf.Tensor:
    """A uint8 picture ``[h, w, 3]`` as the square uint8 picture the model's input is made of:
    resized and padded as :func:`fit_to_input` and :func:`pad_and_normalise` do, not normalised.
    Served as it is, the resize is the identity and there is nothing to pad."""
    resized, _ = fit_to_input(image, spec)
    square = tf.image.pad_to_bounding_box(resized, 0, 0, spec.image_size, spec.image_size)
    return tf.cast(tf.round(tf.clip_by_value(square, 0.0, 255.0)), tf.uint8)


# --- the model's output → detections in the original picture ------------------------------

# The network's operations are named under this scope in every graph that calls it, so that an
# int8 export can quantize them and keep the pictures' preparation and the decoding in float.
NETWORK_SCOPE = "network"
SCORE_FLOOR = "score_floor"  # the operation that raises class logits to the threshold's (served_predictions)


def raw_predictions(model, images: tf.Tensor) -> dict[str, tf.Tensor]:
    """The heads' outputs on model-ready ``images``, in float32 (under mixed precision they are
    float16; keras-hub's box decoding and the losses want float32)."""
    with tf.name_scope(NETWORK_SCOPE):
        outputs = model(images, training=False)
    return {k: tf.cast(v, tf.float32) for k, v in outputs.items()}


def decoded_detections(model, images: tf.Tensor, predictions: dict[str, tf.Tensor] | None = None) -> dict[str, tf.Tensor]:
    """The model's detections on model-ready ``images``: boxes in their pixels, contiguous labels.
    ``predictions``: the heads' outputs on them, when the caller has them already."""
    predictions = raw_predictions(model, images) if predictions is None else predictions
    # keras-hub's decoding ignores its label encoder's variance, by which the box targets were divided
    variance = tf.constant(model.label_encoder.box_variance, tf.float32)
    return model.decode_predictions({**predictions, "bbox_regression": predictions["bbox_regression"] * variance},
                                    images)


def in_original_image(decoded: dict[str, tf.Tensor], scale: tf.Tensor, image_shape: tf.Tensor,
                      category_ids: list[int]) -> dict[str, tf.Tensor]:
    """Detections back in each original image: ``boxes`` in its pixels, clipped to it;
    ``classes`` as the dataset's category ids; ``scores``; ``num_detections``.

    ``scale`` (``[2]`` or ``[b, 2]``, y and x) maps original to resized pixels; ``image_shape``
    is ``[height, width]`` or ``[b, 2]``. Detections of no category (a model with more classes
    than the data) or with no area left inside the image are dropped; the rest keep their
    order, and rows past ``num_detections`` are zeros.
    """
    boxes, labels = decoded["boxes"], decoded["labels"]
    batch, rows = tf.shape(labels)[0], tf.shape(labels)[1]
    scale = tf.broadcast_to(tf.reshape(tf.cast(scale, tf.float32), [-1, 2]), [batch, 2])
    size = tf.broadcast_to(tf.cast(image_shape, tf.float32), [batch, 2])
    boxes = tf.minimum(tf.maximum(boxes / tf.tile(scale, [1, 2])[:, None, :], 0.0), tf.tile(size, [1, 2])[:, None, :])
    keep = ((tf.range(rows)[None, :] < tf.cast(decoded["num_detections"], tf.int32)[:, None])
            & (labels >= 0) & (labels < len(category_ids))
            & (boxes[..., 2] > boxes[..., 0]) & (boxes[..., 3] > boxes[..., 1]))
    # The kept rows first, in their order: a stable sort on "dropped".
    order = tf.argsort(tf.cast(~keep, tf.int32), axis=1, stable=True)
    keep = tf.gather(keep, order, batch_dims=1)
    classes = tf.gather(tf.constant(category_ids, tf.int64), tf.clip_by_value(labels, 0, len(category_ids) - 1))
    return {
        "boxes": tf.where(keep[..., None], tf.gather(boxes, order, batch_dims=1), 0.0),
        "classes": tf.where(keep, tf.gather(classes, order, batch_dims=1), tf.constant(0, tf.int64)),
        "scores": tf.where(keep, tf.gather(decoded["confidence"], order, batch_dims=1), 0.0),
        "num_detections": tf.reduce_sum(tf.cast(keep, tf.int64), axis=1),
    }


def served_predictions(model, images: tf.Tensor) -> dict[str, tf.Tensor]:
    """The heads' outputs as serving decodes them: a class logit below the score threshold's
    (by one) raised to it. The detections are the same (a score at or below the threshold is
    neither kept nor suppresses another), but an int8 export's class logits get a range their
    far-negative outliers no longer stretch: on the raccoon photos a few anchors' logits near
    -900 made one int8 step 3.6 logits wide, and every score was lost."""
    predictions = raw_predictions(model, images)
    threshold = model.prediction_decoder.confidence_threshold
    if not 0 < threshold < 1:
        return predictions
    with tf.name_scope(NETWORK_SCOPE):  # quantized with the network: the floor bounds its range
        floor = math.log(threshold / (1 - threshold)) - 1.0
        return {**predictions, "cls_logits": tf.maximum(predictions["cls_logits"], floor, name=SCORE_FLOOR)}


def detect_pictures(model, images: tf.Tensor, spec: InputSpec, category_ids: list[int]) -> dict[str, tf.Tensor]:
    """uint8 pictures ``[b, height, width, 3]`` of one size → the OD API's outputs:
    ``detection_boxes`` normalised to the picture, ``detection_classes`` (category ids, int64),
    ``detection_scores``, ``num_detections`` (int64)."""
    resized, scale = fit_to_input(images, spec)
    batch = pad_and_normalise({"image": resized}, spec)["image"]
    image_shape = tf.shape(images)[1:3]
    decoded = decoded_detections(model, batch, served_predictions(model, batch))
    found = in_original_image(decoded, scale, image_shape, category_ids)
    size = tf.cast(tf.tile(image_shape, [2]), tf.float32)
    return {
        "detection_boxes": found["boxes"] / size,
        "detection_classes": found["classes"],
        "detection_scores": found["scores"],
        "num_detections": found["num_detections"],
    }
