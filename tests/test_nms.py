"""detsweep's suppression (:class:`~detsweep.models.detector_parts.TensorFlowNonMaxSuppression`):
the OD API's per-class NMS (``use_class_agnostic_nms: false``) as its ``batch_non_max_suppression``
defines it, keras-hub's class-agnostic one, their settings kept in saved configs, and both
exported to TFLite with builtin ops."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from detsweep.models.detector_parts import TensorFlowNonMaxSuppression

SCORE, IOU = 0.3, 0.5


def suppression(class_agnostic: bool, max_detections: int = 10, per_class: int = 6) -> TensorFlowNonMaxSuppression:
    return TensorFlowNonMaxSuppression(
        bounding_box_format="yxyx", from_logits=False, confidence_threshold=SCORE, iou_threshold=IOU,
        max_detections=max_detections, class_agnostic=class_agnostic, max_detections_per_class=per_class)


def iou(box: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    corners = np.maximum(box[:2], boxes[:, :2]), np.minimum(box[2:], boxes[:, 2:])
    shared = np.prod(np.maximum(corners[1] - corners[0], 0), axis=1)
    area = np.prod(box[2:] - box[:2]) + np.prod(boxes[:, 2:] - boxes[:, :2], axis=1)
    return shared / (area - shared)


def od_api_multiclass_nms(boxes: np.ndarray, scores: np.ndarray, per_class: int, max_detections: int) -> list:
    """One image's ``(score, class, box)`` as the OD API's ``multiclass_non_max_suppression``
    keeps them: per class, greedy from the best score over the boxes scoring above SCORE, a box
    overlapping a kept one by IoU above IOU suppressed, at most ``per_class`` kept; then the best
    ``max_detections`` of all, by score."""
    kept = []
    for label in range(scores.shape[1]):
        left = [i for i in np.argsort(-scores[:, label], kind="stable") if scores[i, label] > SCORE]
        chosen = []
        while left and len(chosen) < per_class:
            best, *left = left
            chosen.append(best)
            left = [i for i in left if iou(boxes[best], boxes[[i]])[0] <= IOU]
        kept += [(scores[i, label], label, boxes[i]) for i in chosen]
    return sorted(kept, key=lambda row: -row[0])[:max_detections]


def clustered(seed: int = 0, images: int = 2, boxes: int = 800, classes: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """Boxes around a few centres (overlaps on both sides of IOU), 800 of them: a class of the
    first image has more than one 512-box tile of the suppression above SCORE. The second image
    scores above SCORE in few places: fewer detections than the total cap."""
    rng = np.random.default_rng(seed)
    centres = rng.uniform(20, 80, (images, 8, 2))[:, rng.integers(0, 8, boxes)]
    centres += rng.normal(0, 3, centres.shape)
    sides = rng.uniform(8, 20, (images, boxes, 2))
    yxyx = np.concatenate([centres - sides / 2, centres + sides / 2], axis=-1).astype(np.float32)
    scores = rng.uniform(0, 1, (images, boxes, classes))
    scores[1] *= np.where(rng.uniform(0, 1, (boxes, classes)) < 0.003, 1.0, SCORE)
    return yxyx, scores.astype(np.float32)


def rows(found: dict, image: int) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:
    count = int(found["num_detections"][image])
    return count, *(np.asarray(found[key][image]) for key in ("confidence", "labels", "boxes"))


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "tf.function"])
def test_per_class_suppression_keeps_what_the_od_apis_multiclass_nms_keeps(traced):
    layer = suppression(class_agnostic=False, max_detections=8, per_class=3)
    boxes, scores = clustered()
    call = tf.function(layer) if traced else layer
    found = call(tf.constant(boxes), tf.constant(scores))
    counts = []
    for image in range(len(boxes)):
        count, confidence, labels, kept_boxes = rows(found, image)
        expected = od_api_multiclass_nms(boxes[image], scores[image], per_class=3, max_detections=8)
        counts.append(count)
        assert count == len(expected)
        np.testing.assert_array_equal(confidence[:count], [score for score, _, _ in expected])
        np.testing.assert_array_equal(labels[:count], [label for _, label, _ in expected])
        np.testing.assert_array_equal(kept_boxes[:count], [box for _, _, box in expected])
        assert (confidence[count:] == -1).all() and (labels[count:] == -1).all() and (kept_boxes[count:] == -1).all()
    # both caps at work: the first image has more than 8 boxes to keep, the second fewer, and
    # uncapped a class would have more than 3 of the first image's best 8
    assert counts[0] == 8 and 0 < counts[1] < 8 and (scores[0] > SCORE).sum(axis=0).max() > 512, counts
    uncapped = od_api_multiclass_nms(boxes[0], scores[0], per_class=800, max_detections=8)
    assert max(np.bincount([label for _, label, _ in uncapped])) > 3


def keras_hub_class_agnostic_nms(boxes: np.ndarray, scores: np.ndarray, max_detections: int) -> list:
    """One image's ``(score, class, box)`` as keras-hub's suppression keeps them: each box with its
    best class and score, greedy over those above SCORE, at most ``max_detections``."""
    confidence, labels = scores.max(axis=1), scores.argmax(axis=1)
    left = [i for i in np.argsort(-confidence, kind="stable") if confidence[i] > SCORE]
    chosen = []
    while left and len(chosen) < max_detections:
        best, *left = left
        chosen.append(best)
        left = [i for i in left if iou(boxes[best], boxes[[i]])[0] <= IOU]
    return [(confidence[i], labels[i], boxes[i]) for i in chosen]


def test_class_agnostic_suppression_keeps_what_keras_hubs_keeps_from_the_boxes_above_the_threshold():
    """Only the boxes above the threshold are suppressed (a box below it can neither be kept nor
    suppress one): the same detections as over every box."""
    layer = suppression(class_agnostic=True, max_detections=40)
    boxes, scores = clustered()
    found = tf.function(layer)(tf.constant(boxes), tf.constant(scores))
    counts = []
    for image in range(len(boxes)):
        count, confidence, labels, kept_boxes = rows(found, image)
        expected = keras_hub_class_agnostic_nms(boxes[image], scores[image], max_detections=40)
        counts.append(count)
        assert count == len(expected)
        np.testing.assert_array_equal(confidence[:count], [score for score, _, _ in expected])
        np.testing.assert_array_equal(labels[:count], [label for _, label, _ in expected])
        np.testing.assert_array_equal(kept_boxes[:count], [box for _, _, box in expected])
    assert counts[0] == 40 and 0 < counts[1] < 40, counts


def test_a_box_above_the_threshold_for_two_classes_is_kept_for_each_per_class_once_class_agnostic():
    boxes = np.array([[[10, 10, 30, 30], [50, 50, 70, 70]]], np.float32)
    scores = np.array([[[0.9, 0.8, 0.1], [0.1, 0.2, 0.7]]], np.float32)
    per_class = suppression(class_agnostic=False)(boxes, scores)
    assert rows(per_class, 0)[0] == 3
    np.testing.assert_array_equal(per_class["labels"][0, :3], [0, 1, 2])
    np.testing.assert_allclose(per_class["confidence"][0, :3], [0.9, 0.8, 0.7])
    np.testing.assert_array_equal(per_class["boxes"][0, :3], boxes[0, [0, 0, 1]])
    agnostic = suppression(class_agnostic=True)(boxes, scores)
    assert rows(agnostic, 0)[0] == 2
    np.testing.assert_array_equal(agnostic["labels"][0, :2], [0, 2])
    np.testing.assert_array_equal(agnostic["boxes"][0, :2], boxes[0])


def test_the_settings_survive_the_layers_config_and_an_older_config_is_class_agnostic():
    import keras

    layer = suppression(class_agnostic=False, max_detections=7, per_class=3)
    for restored in (TensorFlowNonMaxSuppression.from_config(layer.get_config()),
                     keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))):
        assert type(restored) is TensorFlowNonMaxSuppression
        assert (restored.class_agnostic, restored.max_detections_per_class, restored.max_detections,
                restored.confidence_threshold, restored.iou_threshold) == (False, 3, 7, SCORE, IOU)
    older = {key: value for key, value in layer.get_config().items()
             if key not in ("class_agnostic", "max_detections_per_class")}
    assert TensorFlowNonMaxSuppression.from_config(older).class_agnostic is True


@pytest.mark.parametrize("class_agnostic", [False, True], ids=["per class", "class-agnostic"])
def test_a_detector_converts_to_tflite_with_builtin_ops_and_detects_what_keras_detects(class_agnostic, tmp_path):
    """The smallest detector (resnet_tiny, 64 px, levels 3-5: 756 anchors, 3 classes), exported
    and converted as ``detsweep export --format tflite`` does. Its heads start small (logits
    within +-0.5, scores apart by 3e-4 at least, far above the two runtimes' float noise), and
    the boxes at the anchors (box bias 0; keras-hub's -4.6 sends them off the image)."""
    from detsweep.config import ModelConfig
    from detsweep.data.processing import InputSpec, detect_pictures
    from detsweep.export.saved_model import SIGNATURE, DetectionModule
    from detsweep.export.serving_cost import tflite_runner
    from detsweep.export.tflite import convert
    from detsweep.models import build_model

    config = ModelConfig(image_size=64, max_level=5, head_kernel_stddev=0.02, class_prediction_bias_init=0.0,
                         score_threshold=0.5, max_detections=12, use_class_agnostic_nms=class_agnostic,
                         max_detections_per_class=5)
    tf.keras.utils.set_random_seed(1)
    model, _ = build_model(config, num_classes=3)
    module = DetectionModule(model, InputSpec.of(config), [1, 2, 3])
    tf.saved_model.save(module, str(tmp_path), signatures={SIGNATURE: module.serve})
    runner = tflite_runner(convert(tmp_path))
    image = np.random.default_rng(0).integers(0, 256, (1, 48, 64, 3), dtype=np.uint8)
    found, expected = runner(images=image), detect_pictures(model, tf.constant(image), module.spec, [1, 2, 3])
    count = int(expected["num_detections"][0])
    # per class, 5 of each, the best 12 of those 15; class-agnostic, the best 12 of them all
    assert int(found["num_detections"][0]) == count == 12
    assert class_agnostic or set(expected["detection_classes"][0].numpy()) == {1, 2, 3}
    for key, atol in (("detection_classes", 0), ("detection_scores", 1e-5), ("detection_boxes", 1e-5)):
        np.testing.assert_allclose(found[key][0, :count], expected[key][0, :count], atol=atol, err_msg=key)
