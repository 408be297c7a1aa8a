"""RetinaNet from keras-hub: its feature pyramid, anchor generator, box matcher, heads and NMS.

detsweep adds nothing to the architecture. It only chooses sizes (pyramid levels, head
depth), exposes the two losses separately so that training can report them, and has
TensorFlow's own function do keras-hub's NMS (see :class:`TensorFlowNonMaxSuppression`).
"""

from __future__ import annotations

from collections.abc import Callable

import keras
import keras_hub
import tensorflow as tf
from keras import ops

from detsweep.config import ModelConfig

from .backbones import build_backbone


def build_retinanet(config: ModelConfig, num_classes: int) -> keras_hub.models.RetinaNetObjectDetector:
    encoder = build_backbone(config.backbone, config.weights)
    backbone = keras_hub.models.RetinaNetBackbone(
        image_encoder=encoder,
        min_level=config.min_level,
        max_level=config.max_level,
        use_p5=False,
        image_shape=(config.image_size, config.image_size, 3),
    )
    # keras-hub's anchors with a configurable size: an object needs an anchor with IoU >= 0.5
    # to be learnt at all, so small images with small objects need smaller anchors.
    anchors = keras_hub.layers.AnchorGenerator(
        "yxyx", min_level=config.min_level, max_level=config.max_level,
        num_scales=3, aspect_ratios=[0.5, 1.0, 2.0], anchor_size=config.anchor_size,
    )
    detector = keras_hub.models.RetinaNetObjectDetector(
        backbone=backbone,
        num_classes=num_classes,
        bounding_box_format="yxyx",
        anchor_generator=anchors,
        pre_logits_num_conv_layers=config.head_conv_layers,
    )
    if config.use_sync_bn:
        synchronize_batch_norm(detector)
    detector.prediction_decoder = TensorFlowNonMaxSuppression(
        bounding_box_format="yxyx",
        from_logits=True,
        confidence_threshold=config.score_threshold,
        iou_threshold=config.nms_iou_threshold,
        max_detections=config.max_detections,
    )
    return detector


def synchronize_batch_norm(model: keras.Model) -> None:
    """Every batch norm layer of ``model`` takes its batch statistics over all replicas (Keras's
    ``synchronized``, read at each call): with several replicas, one device's statistics on
    the global batch. keras-hub builds its layers without the option."""
    for layer in _all_layers(model):
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.synchronized = True


def _all_layers(layer: keras.layers.Layer) -> list[keras.layers.Layer]:
    nested = getattr(layer, "layers", [])
    return [layer, *(inner for child in nested for inner in _all_layers(child))]


@keras.saving.register_keras_serializable(package="detsweep")
class TensorFlowNonMaxSuppression(keras_hub.layers.NonMaxSuppression):
    """keras-hub's NMS, computed by ``tf.image.non_max_suppression_padded``: the TensorFlow
    function keras-hub's is a port of, with the same settings and the same boxes (boxes of
    exactly equal score may come in another order).

    - keras-hub builds the indices of its tiles of 512 boxes from a float ``linspace``. In a
      ``tf.function`` (evaluation, exported models), TensorFlow's constant folding rewrites
      that arithmetic and 48 indices of the first tile come out one too small: 48 of the 512
      best-scoring boxes are never considered. Eagerly the result is exact greedy NMS, and
      TensorFlow's version, which slices with integers, gives it in both.
    - TensorFlow's version takes a batch of any size; keras-hub's needs a static one.
    - Keras's argmax of floats adds a BitwiseAnd (to put -0.0 below 0.0), for which TFLite has
      no builtin kernel; sigmoid scores are never -0.0, so ``tf.argmax`` gives the same labels.

    Boxes stay in the model's format: ``yxyx``, the one the suppression reads. Rows past
    ``num_detections`` are -1, as keras-hub's.
    """

    def call(self, box_prediction, class_prediction, images=None):
        # float32 whatever the policy: under mixed_float16 Keras hands a layer float16 inputs
        box_prediction, class_prediction = tf.cast(box_prediction, tf.float32), tf.cast(class_prediction, tf.float32)
        scores = ops.sigmoid(class_prediction) if self.from_logits else class_prediction
        confidence = ops.max(scores, axis=-1)
        kept, count = tf.image.non_max_suppression_padded(
            box_prediction, confidence, self.max_detections, iou_threshold=self.iou_threshold,
            score_threshold=self.confidence_threshold, pad_to_max_output_size=True, canonicalized_coordinates=True)
        valid = tf.range(self.max_detections)[None, :] < count[:, None]
        return {
            "boxes": tf.where(valid[..., None], tf.gather(box_prediction, kept, batch_dims=1), -1.0),
            "confidence": tf.where(valid, tf.gather(confidence, kept, batch_dims=1), -1.0),
            "labels": tf.where(valid, tf.argmax(tf.gather(scores, kept, batch_dims=1), -1, output_type=tf.int32), -1),
            "num_detections": count,
        }


class RetinaNetLosses:
    """keras-hub's RetinaNet loss (focal classification + Huber box, normalised by the positive
    anchors), computed term by term.

    ``RetinaNetObjectDetector.compute_loss`` returns only the sum; a sweep wants both terms.
    The targets come from the detector's own label encoder; the losses are Keras losses with
    ``reduction="sum"``, normalised by the batch's positive anchors: a replica's under
    ``tf.distribute``, by the global batch's (``summed``), so that the replicas' terms add up
    to one device's loss on the global batch.
    """

    def __init__(self, detector: keras_hub.models.RetinaNetObjectDetector, config: ModelConfig):
        self.detector = detector
        self.weights = {"box": config.localization_weight, "classification": config.classification_weight}
        self.box_loss = keras.losses.Huber(reduction="sum")
        self.classification_loss = keras.losses.BinaryFocalCrossentropy(from_logits=True, reduction="sum")

    def __call__(self, images: tf.Tensor, targets: dict, predictions: dict,
                 image_weights: tf.Tensor | None = None,
                 summed: Callable[[tf.Tensor], tf.Tensor] | None = None) -> dict[str, tf.Tensor]:
        """``image_weights`` ``[batch]``: 0 leaves an image out (the evaluator's filler copies).
        ``summed``: the batch's positive anchors counted over the global batch (an all-reduce),
        which makes these terms this shard's part of the global batch's loss."""
        encoded = self.encode(images, targets, image_weights)
        count = ops.sum(encoded["positives"])
        return self.terms(encoded, predictions, ops.stop_gradient(summed(count)) if summed else count)

    def encode(self, images: tf.Tensor, targets: dict, image_weights: tf.Tensor | None = None) -> dict[str, tf.Tensor]:
        """The detector's targets for each anchor, and which anchors count: no weights are read,
        so this may run apart from the forward pass (outside XLA, see :mod:`detsweep.train.step`)."""
        box_targets, class_targets = self.detector.label_encoder(
            images=images, gt_boxes=targets["boxes"], gt_classes=targets["labels"]
        )
        # As in keras-hub: -1 marks background anchors, -2 ignored ones (IoU between thresholds).
        counted = 1.0 if image_weights is None else ops.cast(image_weights, "float32")[:, None]
        return {"box_targets": box_targets, "class_targets": class_targets,
                "positives": ops.cast(ops.greater(class_targets, -1.0), "float32") * counted,
                "kept": ops.cast(ops.not_equal(class_targets, -2.0), "float32") * counted}

    def terms(self, encoded: dict[str, tf.Tensor], predictions: dict, positives: tf.Tensor) -> dict[str, tf.Tensor]:
        """The weighted terms for ``encoded`` targets, normalised by ``positives`` anchors (at least 1)."""
        normaliser = ops.maximum(positives, 1.0)
        one_hot = ops.one_hot(ops.cast(encoded["class_targets"], "int32"), self.detector.num_classes, dtype="float32")
        box = self.box_loss(encoded["box_targets"], ops.cast(predictions["bbox_regression"], "float32"),
                            sample_weight=encoded["positives"] / normaliser)
        classification = self.classification_loss(one_hot, ops.cast(predictions["cls_logits"], "float32"),
                                                   sample_weight=encoded["kept"] / normaliser)
        return {"box": self.weights["box"] * box, "classification": self.weights["classification"] * classification}
