"""What every RetinaNet detsweep builds shares, from a config or from a preset: its anchors and
label encoder with the OD API's settings, the heads' starting weights, l2 on the kernels,
synchronized batch norm, and the suppression that TensorFlow's own function does."""

from __future__ import annotations

import keras
import keras_hub
import tensorflow as tf
from keras import ops

from detsweep.adapters.keras_hub import RetinaNetLabelEncoder
from detsweep.config import ModelConfig


def anchor_generator(config: ModelConfig) -> keras_hub.layers.AnchorGenerator:
    """keras-hub's anchors with a configurable size: an object needs an anchor with IoU >= 0.5
    to be learnt at all, so small images with small objects need smaller anchors. keras-hub's
    ratio is height / width (torchvision's), the OD API's and the config's width / height."""
    return keras_hub.layers.AnchorGenerator(
        "yxyx", min_level=config.min_level, max_level=config.max_level, num_scales=config.scales_per_octave,
        aspect_ratios=[1 / ratio for ratio in config.aspect_ratios], anchor_size=config.anchor_size,
    )


def label_encoder(config: ModelConfig, anchors: keras_hub.layers.AnchorGenerator) -> keras.layers.Layer:
    """keras-hub's encoder with the OD API's matcher and box coder settings. keras-hub's
    variance divides the ``center_xywh`` code; the OD API's scales multiply ``y, x, h, w``."""
    y, x, height, width = config.box_coder_scales
    return RetinaNetLabelEncoder(
        anchors, bounding_box_format="yxyx", encoding_format="center_xywh",
        positive_threshold=config.matched_threshold, negative_threshold=config.unmatched_threshold,
        box_variance=[1 / x, 1 / y, 1 / width, 1 / height],
        box_matcher_force_match_for_each_col=config.force_match_for_each_row,
    )


def start_heads(config: ModelConfig, class_head: keras.layers.Layer, box_head: keras.layers.Layer | None = None) -> None:
    """New heads' starting weights where the config sets the OD API's: every kernel drawn from
    a normal of ``head_kernel_stddev`` (keras-hub draws from one of 0.05, which puts the
    logits of a deep encoder in the tens), and the class head's last bias at
    ``class_prediction_bias_init`` with the box head's at zero (keras-hub starts the box head,
    not the class head, at its prior). A head loaded from a preset is not passed."""
    heads = [head for head in (class_head, box_head) if head is not None]
    if config.head_kernel_stddev is not None:
        draw = keras.initializers.RandomNormal(stddev=config.head_kernel_stddev)
        for conv in (conv for head in heads for conv in (*head.conv_layers, head.prediction_layer)):
            conv.kernel.assign(draw(conv.kernel.shape))
    if config.class_prediction_bias_init is not None:
        for head, bias in zip(heads, (config.class_prediction_bias_init, 0.0), strict=False):
            head.prediction_layer.bias.assign(ops.full_like(head.prediction_layer.bias, bias))


def finish_detector(detector: keras_hub.models.RetinaNetObjectDetector,
                    config: ModelConfig) -> keras_hub.models.RetinaNetObjectDetector:
    """What only trains and detects, the config's whatever built the network: l2 on the kernels,
    synchronized batch norm, and the suppression."""
    if config.l2_regularization:
        regularise_kernels(detector, config.l2_regularization)
    if config.use_sync_bn:
        synchronize_batch_norm(detector)
    detector.prediction_decoder = TensorFlowNonMaxSuppression(
        bounding_box_format="yxyx",
        from_logits=True,
        confidence_threshold=config.score_threshold,
        iou_threshold=config.nms_iou_threshold,
        max_detections=config.max_detections,
        class_agnostic=config.use_class_agnostic_nms,
        max_detections_per_class=config.max_detections_per_class,
    )
    return detector


def regularise_kernels(model: keras.Model, weight: float) -> None:
    """Every convolution kernel adds ``weight * 0.5 * sum(kernel ** 2)`` to ``model.losses``:
    the OD API's ``l2_regularizer`` as its Keras models build it (``l2(weight * 0.5)``)."""
    for variable in model.trainable_weights:
        if variable.name in ("kernel", "depthwise_kernel") and len(variable.shape) == 4:  # a convolution's
            variable.regularizer = keras.regularizers.L2(weight * 0.5)


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

    ``class_agnostic`` (keras-hub's, the default): one suppression over each box with its best
    class. Off, the OD API's default (``use_class_agnostic_nms: false``): a suppression per
    class, at most ``max_detections_per_class`` kept in each, then the best ``max_detections``
    of them all by score; a box may be kept under several classes. It stays builtin ops for
    TFLite: ``tf.image.combined_non_max_suppression``, which does the same, is no builtin.

    Boxes stay in the model's format: ``yxyx``, the one the suppression reads. Rows past
    ``num_detections`` are -1, as keras-hub's.
    """

    def __init__(self, *args, class_agnostic: bool = True, max_detections_per_class: int = 100,
                 max_candidates: int | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.class_agnostic = class_agnostic
        self.max_detections_per_class = max_detections_per_class
        self.max_candidates = max_candidates  # at most this many boxes suppressed (per class); None: all above

    def get_config(self):
        return {**super().get_config(), "class_agnostic": self.class_agnostic,
                "max_detections_per_class": self.max_detections_per_class, "max_candidates": self.max_candidates}

    def call(self, box_prediction, class_prediction, images=None):
        # float32 whatever the policy: under mixed_float16 Keras hands a layer float16 inputs
        box_prediction, class_prediction = tf.cast(box_prediction, tf.float32), tf.cast(class_prediction, tf.float32)
        scores = ops.sigmoid(class_prediction) if self.from_logits else class_prediction
        if not self.class_agnostic:
            return self._per_class(box_prediction, scores)
        confidence, order = self._best_above_threshold(ops.max(scores, axis=-1))
        position, count = tf.image.non_max_suppression_padded(
            tf.gather(box_prediction, order, batch_dims=1), confidence, self.max_detections,
            iou_threshold=self.iou_threshold, score_threshold=self.confidence_threshold, pad_to_max_output_size=True,
            sorted_input=True, canonicalized_coordinates=True)
        kept = tf.gather(order, position, batch_dims=1)
        valid = tf.range(self.max_detections)[None, :] < count[:, None]
        return {
            "boxes": tf.where(valid[..., None], tf.gather(box_prediction, kept, batch_dims=1), -1.0),
            "confidence": tf.where(valid, tf.gather(confidence, position, batch_dims=1), -1.0),
            "labels": tf.where(valid, tf.argmax(tf.gather(scores, kept, batch_dims=1), -1, output_type=tf.int32), -1),
            "num_detections": count,
        }

    def _best_above_threshold(self, scores: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """``scores`` ``[..., boxes]`` cut to as many boxes as any row has above the threshold, best
        first, and their indices. A box at or below it is neither kept nor suppresses one, and the
        suppression's time grows with the square of its boxes: seconds an image at 640 px when few
        score above it, minutes per class."""
        above = tf.reduce_max(tf.reduce_sum(tf.cast(scores > self.confidence_threshold, tf.int32), axis=-1))
        if self.max_candidates is not None:
            above = tf.minimum(above, self.max_candidates)
        return tf.math.top_k(scores, tf.maximum(above, 1))

    def _per_class(self, boxes: tf.Tensor, scores: tf.Tensor) -> dict[str, tf.Tensor]:
        """Every (image, class) pair suppressed at once, each over its own boxes by score; then
        the best ``max_detections`` of the ``classes * per_class`` candidates of each image."""
        classes, num_boxes = scores.shape[-1], boxes.shape[1]
        # a class keeps at most all its boxes: fewer candidates to rank (a dynamic count: padding)
        per_class = self.max_detections_per_class if num_boxes is None else min(self.max_detections_per_class, num_boxes)
        class_scores, order = self._best_above_threshold(tf.transpose(scores, [0, 2, 1]))  # [batch, classes, boxes]
        position, count = tf.image.non_max_suppression_padded(
            tf.gather(boxes, order, batch_dims=1), class_scores, per_class, iou_threshold=self.iou_threshold,
            score_threshold=self.confidence_threshold, pad_to_max_output_size=True, sorted_input=True,
            canonicalized_coordinates=True)
        # padding rows rank below every kept one; fewer candidates than max_detections: more padding
        candidates = tf.where(tf.range(per_class) < tf.expand_dims(count, -1),
                              tf.gather(class_scores, position, batch_dims=2), float("-inf"))
        padding = [[0, 0], [0, max(self.max_detections - classes * per_class, 0)]]
        candidates = tf.pad(tf.reshape(candidates, [-1, classes * per_class]), padding, constant_values=float("-inf"))
        confidence, best = tf.math.top_k(candidates, self.max_detections)
        kept = tf.pad(tf.reshape(tf.gather(order, position, batch_dims=2), [-1, classes * per_class]), padding)
        total = tf.minimum(tf.reduce_sum(count, axis=1), self.max_detections)
        valid = tf.range(self.max_detections)[None, :] < total[:, None]
        return {
            "boxes": tf.where(valid[..., None], tf.gather(boxes, tf.gather(kept, best, batch_dims=1), batch_dims=1), -1.0),
            "confidence": tf.where(valid, confidence, -1.0),
            "labels": tf.where(valid, best // per_class, -1),  # candidates are class by class
            "num_detections": total,
        }
