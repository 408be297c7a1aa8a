"""RetinaNet from keras-hub: its feature pyramid, anchor generator, box matcher, heads and NMS.

detsweep adds nothing to the architecture. It only chooses sizes (pyramid levels, head
depth) and exposes the two losses separately so that training can report them.
"""

from __future__ import annotations

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
    detector.prediction_decoder = keras_hub.layers.NonMaxSuppression(
        bounding_box_format="yxyx",
        from_logits=True,
        confidence_threshold=config.score_threshold,
        iou_threshold=config.nms_iou_threshold,
        max_detections=config.max_detections,
    )
    return detector


class RetinaNetLosses:
    """keras-hub's RetinaNet loss (focal classification + Huber box, normalised by the positive
    anchors), computed term by term.

    ``RetinaNetObjectDetector.compute_loss`` returns only the sum; a sweep wants both terms.
    The targets come from the detector's own label encoder, the losses are Keras losses with
    ``reduction="sum"``, which under ``tf.distribute`` scale themselves by the number of
    replicas, so summed gradients average over the global batch.
    """

    def __init__(self, detector: keras_hub.models.RetinaNetObjectDetector, config: ModelConfig):
        self.detector = detector
        self.weights = {"box": config.localization_weight, "classification": config.classification_weight}
        self.box_loss = keras.losses.Huber(reduction="sum")
        self.classification_loss = keras.losses.BinaryFocalCrossentropy(from_logits=True, reduction="sum")

    def __call__(self, images: tf.Tensor, targets: dict, predictions: dict) -> dict[str, tf.Tensor]:
        detector = self.detector
        box_targets, class_targets = detector.label_encoder(
            images=images, gt_boxes=targets["boxes"], gt_classes=targets["labels"]
        )
        # As in keras-hub: -1 marks background anchors, -2 ignored ones (IoU between thresholds).
        positives = ops.cast(ops.greater(class_targets, -1.0), "float32")
        normaliser = ops.maximum(ops.sum(positives), 1.0)
        class_weights = ops.cast(ops.not_equal(class_targets, -2.0), "float32") / normaliser
        one_hot = ops.one_hot(ops.cast(class_targets, "int32"), detector.num_classes, dtype="float32")
        box = self.box_loss(box_targets, ops.cast(predictions["bbox_regression"], "float32"),
                            sample_weight=positives / normaliser)
        classification = self.classification_loss(one_hot, ops.cast(predictions["cls_logits"], "float32"),
                                                   sample_weight=class_weights)
        return {"box": self.weights["box"] * box, "classification": self.weights["classification"] * classification}
