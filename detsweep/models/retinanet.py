"""RetinaNet from keras-hub: its feature pyramid, anchor generator, box matcher, heads and NMS.

detsweep adds nothing to the architecture. It chooses sizes (pyramid levels, anchors, head
depth) and the OD API's settings where keras-hub takes them (:mod:`.detector_parts`), and
exposes the two losses separately so that training can report them. A whole-detector preset
is built by :mod:`.detector_presets` instead.
"""

from __future__ import annotations

from collections.abc import Callable

import keras
import keras_hub
import tensorflow as tf
from keras import ops

from detsweep.config import ModelConfig

from .backbones import build_backbone
from .detector_parts import anchor_generator, finish_detector, label_encoder, start_heads
from .detector_presets import build_detector_from_preset, is_detector_preset


def build_retinanet(config: ModelConfig, num_classes: int) -> keras_hub.models.RetinaNetObjectDetector:
    if is_detector_preset(config.weights):
        return build_detector_from_preset(config, num_classes)
    encoder = build_backbone(config.backbone, config.weights)
    backbone = keras_hub.models.RetinaNetBackbone(
        image_encoder=encoder,
        min_level=config.min_level,
        max_level=config.max_level,
        use_p5=False,
        image_shape=(config.image_size, config.image_size, 3),
    )
    anchors = anchor_generator(config)
    detector = keras_hub.models.RetinaNetObjectDetector(
        backbone=backbone,
        num_classes=num_classes,
        bounding_box_format="yxyx",
        anchor_generator=anchors,
        label_encoder=label_encoder(config, anchors),
        pre_logits_num_conv_layers=config.head_conv_layers,
    )
    start_heads(config, detector.classification_head, detector.box_head)
    return finish_detector(detector, config)


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
        # Keras's losses average over their last axis (the box code, the classes); the OD API's
        # sum over it, then may divide the box loss by the code's size: weights undo the mean.
        box_weight = 1.0 if config.normalize_loc_loss_by_codesize else 4.0
        class_weight = detector.num_classes if config.classification_loss_over_classes == "sum" else 1.0
        self.weights = {"box": config.localization_weight * box_weight,
                        "classification": config.classification_weight * class_weight}
        self.box_loss = keras.losses.Huber(delta=config.smooth_l1_delta, reduction="sum")
        self.classification_loss = keras.losses.BinaryFocalCrossentropy(
            apply_class_balancing=config.focal_alpha is not None, alpha=0.25 if config.focal_alpha is None else config.focal_alpha,
            gamma=config.focal_gamma, from_logits=True, reduction="sum")

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
        # keras-hub's matcher, forcing a match for each box, sends an anchor no real box claims to
        # its own sentinel column (out of range) unless some column is padding: one always is.
        boxes = ops.pad(targets["boxes"], [[0, 0], [0, 1], [0, 0]], constant_values=-1.0)
        labels = ops.pad(targets["labels"], [[0, 0], [0, 1]], constant_values=-1)
        box_targets, class_targets = self.detector.label_encoder(images=images, gt_boxes=boxes, gt_classes=labels)
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
