"""The OD API model zoo's RetinaNet (SSD with a ResNet-50 v1 FPN extractor, a weight-shared box
predictor and focal loss, 640 x 640) imports whole: every field the network's description
sets becomes the model section's, or is named with why, and the network built from it is
keras-hub's RetinaNet with those numbers (issue #39)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from detsweep.config import TrialConfig, validate
from detsweep.config.odapi import import_pipeline

from .conftest import RACCOON, REPO, run_cli

ZOO_CONFIG = REPO / "configs" / "odapi" / "ssd_resnet50_v1_fpn_640x640.config"
ZOO_RETINANET = ZOO_CONFIG.read_text()

# What the network's description becomes: the OD API's numbers under detsweep's names.
ZOO_MODEL = {
    "num_classes": 90, "image_size": 640, "image_resizer": "fixed_shape", "backbone": "resnet50",
    "min_level": 3, "max_level": 7, "anchor_size": 4.0, "scales_per_octave": 2, "aspect_ratios": [1.0, 2.0, 0.5],
    "head_conv_layers": 4, "head_kernel_stddev": 0.01, "class_prediction_bias_init": -4.6, "l2_regularization": 0.0004,
    "box_coder_scales": [10.0, 10.0, 5.0, 5.0], "matched_threshold": 0.5, "unmatched_threshold": 0.5,
    "force_match_for_each_row": True, "focal_alpha": 0.25, "focal_gamma": 2.0, "classification_loss_over_classes": "sum",
    "smooth_l1_delta": 1.0, "normalize_loc_loss_by_codesize": True, "classification_weight": 1.0,
    "localization_weight": 1.0, "score_threshold": 1e-8, "nms_iou_threshold": 0.6, "max_detections": 100,
    "use_class_agnostic_nms": False, "max_detections_per_class": 100,  # unwritten: the OD API's per-class default
}
# What keras-hub's RetinaNet cannot hold, one line each, with why.
PREDICTOR = "model.ssd.box_predictor.weight_shared_convolutional_box_predictor.conv_hyperparams"
EXTRACTOR = "model.ssd.feature_extractor.conv_hyperparams"
ZOO_NOT_CARRIED = {
    f"{PREDICTOR}.activation: RELU_6: keras-hub's ResNet, pyramid and heads use ReLU",
    f"{EXTRACTOR}.activation: RELU_6: keras-hub's ResNet, pyramid and heads use ReLU",
    f"{PREDICTOR}.batch_norm: keras-hub's heads have no batch norm (group norm at most)",
    f"{EXTRACTOR}.batch_norm: keras-hub's ResNet keeps its own batch norm settings",
    f"{EXTRACTOR}.initializer: keras-hub's ResNet and pyramid draw their own starting weights",
}


def test_the_zoo_retinanet_imports_with_the_od_apis_numbers_and_names_what_keras_hub_cannot_hold():
    imported = import_pipeline(ZOO_RETINANET, "retinanet.config")
    assert imported.tree["model"] == ZOO_MODEL
    model_lines = {line for line in imported.not_carried if line.startswith("model.")}
    assert model_lines == ZOO_NOT_CARRIED
    config = validate(TrialConfig, imported.tree, source="retinanet.config")
    assert config.model.aspect_ratios == (1.0, 2.0, 0.5) and config.model.image_resizer == "fixed_shape"
    # the zoo's augmentations, and its ImageNet checkpoint as the keras-hub preset to use
    assert imported.tree["data"]["augmentation"]["random_crop_image"]["min_aspect_ratio"] == 0.75
    assert imported.tree["data"]["augmentation"]["order"] == ["random_horizontal_flip", "random_crop_image"]  # the file's
    assert imported.notes == ["fine_tune_checkpoint: PATH_TO_BE_CONFIGURED/resnet50.ckpt-1 (classification) is an "
                              "OD API checkpoint; detsweep starts from keras-hub presets: set model.weights: "
                              "resnet_50_imagenet (README: From the OD API's model zoo)"]
    detection = import_pipeline(ZOO_RETINANET.replace('"classification"', '"detection"'), "retinanet.config")
    assert "model.weights: retinanet_resnet50_fpn_coco" in detection.notes[0]


def test_a_class_agnostic_suppression_and_its_per_class_cap_are_carried_as_written():
    text = ZOO_RETINANET.replace("max_detections_per_class: 100", "max_detections_per_class: 7 use_class_agnostic_nms: true")
    imported = import_pipeline(text, "retinanet.config")
    assert imported.tree["model"] == {**ZOO_MODEL, "use_class_agnostic_nms": True, "max_detections_per_class": 7}
    assert {line for line in imported.not_carried if line.startswith("model.")} == ZOO_NOT_CARRIED


@pytest.mark.parametrize(("change", "line"), [
    ("fixed_shape_resizer { height: 640 width: 640 }", None),
    ("fixed_shape_resizer { height: 640 width: 512 }",
     "model.ssd.image_resizer.fixed_shape_resizer: 640 x 512; detsweep's input is a square (model.image_size)"),
    ("keep_aspect_ratio_resizer { min_dimension: 640 max_dimension: 640 pad_to_max_dimension: true }", None),
    ("keep_aspect_ratio_resizer { min_dimension: 600 max_dimension: 1024 pad_to_max_dimension: true }",
     "model.ssd.image_resizer.keep_aspect_ratio_resizer.min_dimension: 600: detsweep scales the longer side to "
     "max_dimension, where the OD API first scales the shorter one to min_dimension"),
    ("fixed_shape_resizer { height: 640 width: 640 resize_method: AREA }",
     "model.ssd.image_resizer.fixed_shape_resizer.resize_method: detsweep resizes bilinearly"),
])
def test_each_resizer_maps_to_the_model_input_or_says_what_differs(change, line):
    text = ZOO_RETINANET.replace("fixed_shape_resizer { height: 640 width: 640 }", change)
    imported = import_pipeline(text, "retinanet.config")
    resizer_lines = [entry for entry in imported.not_carried if "image_resizer" in entry]
    assert resizer_lines == ([line] if line else [])
    if line is None:
        keeps = "keep_aspect" in change
        assert imported.tree["model"]["image_resizer"] == ("keep_aspect_ratio" if keeps else "fixed_shape")
        assert imported.tree["model"]["image_size"] == 640


def test_another_feature_extractor_names_the_preset_to_use_and_faster_rcnn_stays_one_line():
    text = ZOO_RETINANET.replace("ssd_resnet50_v1_fpn_keras", "ssd_mobilenet_v2_fpn_keras")
    imported = import_pipeline(text, "mobilenet.config")
    [line] = [entry for entry in imported.not_carried if "feature_extractor.type" in entry]
    assert line.startswith("model.ssd.feature_extractor.type: ssd_mobilenet_v2_fpn_keras; detsweep builds ")
    assert "set model.weights to a keras-hub image-encoder preset" in line
    assert "backbone" not in imported.tree["model"]


def test_import_odapi_writes_the_zoo_retinanet_as_yaml_that_validates(tmp_path):
    source = tmp_path / "retinanet.config"
    source.write_text(ZOO_RETINANET)
    result = run_cli("import-odapi", str(source), "--output", str(tmp_path / "retinanet.yaml"))
    assert result.returncode == 0, result.stderr
    assert "the architecture is not carried over" not in result.stderr
    assert f"detsweep: not carried over: {PREDICTOR}.activation: RELU_6" in result.stderr
    validated = run_cli("config", str(tmp_path / "retinanet.yaml"), "--json")
    assert validated.returncode == 0, validated.stderr
    # what validates is the zoo's model as written, not the defaults a file without it gets
    model = json.loads(validated.stdout)["model"]
    assert {name: model[name] for name in ZOO_MODEL} == ZOO_MODEL, model


def zoo_model(**changes):
    from detsweep.config import ModelConfig

    return ModelConfig(**{**ZOO_MODEL, "image_size": 128, "backbone": "resnet_tiny", **changes})


def test_the_network_built_from_the_zoo_numbers_has_its_anchors_coder_matcher_biases_and_l2():
    import keras

    from detsweep.models import build_retinanet

    detector = build_retinanet(zoo_model(), num_classes=3)
    # anchors: levels 3-7, 2 scales x 3 ratios per place; the OD API's ratio is width / height
    anchors = detector.anchor_generator(np.zeros((1, 128, 128, 3), np.float32))
    assert sum(int(level.shape[0]) for level in anchors.values()) == sum((128 // 2**lv) ** 2 * 6 for lv in range(3, 8))
    ymin, xmin, ymax, xmax = np.asarray(anchors["P3"][:6]).T
    shapes = np.stack([xmax - xmin, ymax - ymin], axis=1)  # width, height; keras-hub rounds to whole pixels
    side = 8 * 4.0  # stride x anchor_scale
    expected = np.array([(side * 2 ** (s / 2) * math.sqrt(r), side * 2 ** (s / 2) / math.sqrt(r))
                         for s in range(2) for r in (1.0, 2.0, 0.5)])
    nearest = np.abs(shapes[:, None, :] - expected[None, :, :]).max(axis=2)
    assert sorted(nearest.argmin(axis=1)) == list(range(6)) and nearest.min(axis=1).max() <= 1.5, (shapes, expected)
    wide = build_retinanet(zoo_model(aspect_ratios=(2.0,), scales_per_octave=1), num_classes=3).anchor_generator(
        np.zeros((1, 128, 128, 3), np.float32))["P3"][0]
    assert float(wide[3] - wide[1]) > 1.9 * float(wide[2] - wide[0])  # ratio 2: twice as wide as high
    encoder = detector.label_encoder
    assert (encoder.positive_threshold, encoder.negative_threshold) == (0.5, 0.5)
    assert encoder.box_matcher.force_match_for_each_col
    assert encoder.box_variance == pytest.approx([0.1, 0.1, 0.2, 0.2])
    # keras-hub's variance divides the center_xywh code; the OD API's scales multiply y, x, h, w
    mixed = build_retinanet(zoo_model(box_coder_scales=(1.0, 2.0, 4.0, 8.0)), num_classes=3).label_encoder
    assert mixed.box_variance == pytest.approx([1 / 2, 1 / 1, 1 / 8, 1 / 4])
    assert np.allclose(detector.classification_head.prediction_layer.bias.numpy(), -4.6)
    assert np.allclose(detector.box_head.prediction_layer.bias.numpy(), 0.0)
    kernels = [w for w in detector.trainable_weights if w.name == "kernel" and len(w.shape) == 4]
    expected_l2 = sum(0.0002 * float(np.sum(np.square(k.numpy()))) for k in kernels)
    assert len(detector.losses) == len(kernels) > 20
    assert float(keras.ops.sum(keras.ops.stack(detector.losses))) == pytest.approx(expected_l2, rel=1e-4)


def test_the_losses_are_the_od_apis_sums_over_classes_and_code_with_alpha_weighting():
    """One anchor, three classes: hand-computed OD API focal (sum over classes, alpha-weighted)
    and smooth L1 (sum over the code, divided by 4 with normalize_loc_loss_by_codesize)."""
    from detsweep.models import RetinaNetLosses, build_retinanet

    for codesize in (True, False):
        config = zoo_model(normalize_loc_loss_by_codesize=codesize)
        losses = RetinaNetLosses(build_retinanet(config, num_classes=3), config)
        logits = np.array([[[2.0, -1.0, 0.5]]], np.float32)
        encoded = {"class_targets": np.array([[1.0]], np.float32), "box_targets": np.array([[[0.5, -2.0, 0.0, 0.2]]], np.float32),
                   "positives": np.ones((1, 1), np.float32), "kept": np.ones((1, 1), np.float32)}
        box = np.array([[[0.0, 0.0, 0.0, 0.0]]], np.float32)
        terms = losses.terms(encoded, {"cls_logits": logits, "bbox_regression": box}, np.float32(1.0))
        p = 1 / (1 + np.exp(-logits[0, 0]))
        y = np.array([0.0, 1.0, 0.0])
        p_t = y * p + (1 - y) * (1 - p)
        focal = np.sum((y * 0.25 + (1 - y) * 0.75) * (1 - p_t) ** 2 * -np.log(p_t))
        diff = np.abs(encoded["box_targets"][0, 0])
        smooth_l1 = np.sum(np.where(diff < 1, 0.5 * diff**2, diff - 0.5)) / (4 if codesize else 1)
        assert float(terms["classification"]) == pytest.approx(focal, rel=1e-4)
        assert float(terms["box"]) == pytest.approx(smooth_l1, rel=1e-4)


def test_the_decoded_boxes_undo_the_box_coders_scales():
    """A box encoded by the label encoder (targets times 10, 10, 5, 5) decodes to itself."""
    import tensorflow as tf

    from detsweep.data.processing import decoded_detections
    from detsweep.models import build_retinanet

    detector = build_retinanet(zoo_model(score_threshold=0.0, unmatched_threshold=0.4), num_classes=1)
    images = tf.zeros((1, 128, 128, 3))
    box = np.array([[[20.0, 30.0, 70.0, 100.0], [-1.0, -1.0, -1.0, -1.0]]], np.float32)  # and a padding row
    targets, classes = detector.label_encoder(images=images, gt_boxes=box, gt_classes=np.array([[0.0, -1.0]], np.float32))
    best = int(tf.argmax(tf.cast(classes[0] == 0.0, tf.float32)))
    logits = np.full((1, targets.shape[1], 1), -20.0, np.float32)
    logits[0, best] = 20.0
    found = decoded_detections(detector, images, {"bbox_regression": targets, "cls_logits": tf.constant(logits)})
    assert int(found["num_detections"][0]) == 1
    assert np.allclose(found["boxes"][0, 0].numpy(), box[0, 0], atol=0.5), found["boxes"][0, 0]


def test_images_whose_every_box_row_is_a_box_encode_under_the_forced_match():
    """A batch padded to its most boxes has images with no padding row: keras-hub's matcher,
    forcing a match for each box, then sends an anchor to a column past the boxes; the losses'
    encoding keeps one padding row, and each box is matched."""
    from detsweep.models import RetinaNetLosses, build_retinanet

    config = zoo_model()
    losses = RetinaNetLosses(build_retinanet(config, num_classes=2), config)
    boxes = np.array([[[10.0, 10.0, 60.0, 60.0]], [[40.0, 50.0, 120.0, 110.0]]], np.float32)
    encoded = losses.encode(np.zeros((2, 128, 128, 3), np.float32), {"boxes": boxes, "labels": np.array([[0.0], [1.0]], np.float32)})
    assert np.isfinite(np.asarray(encoded["box_targets"])).all()
    assert [sorted(set(np.asarray(row).tolist()) - {-1.0, -2.0}) for row in encoded["class_targets"]] == [[0.0], [1.0]]


def test_the_imported_zoo_retinanet_trains_five_steps_at_256_px_on_one_batch_of_real_photos(tmp_path):
    """The zoo's network as imported (ResNet-50, levels 3-7, 640 px stretched) at 256 px: five
    steps on one fixed batch of two raccoon photos (the TFRecord's first two, unaugmented),
    finite losses with the l2 term inside, falling."""
    from detsweep.config.loader import load_trial_config
    from detsweep.train import run_training

    source = tmp_path / "retinanet.config"
    source.write_text(ZOO_RETINANET)
    config = load_trial_config(source, [
        "model.image_size=256", "model.num_classes=1", "train.batch_size=2", "train.num_steps=5", "train.steps_per_loop=1",
        "data.train.subset=[0,2]", "data.augmentation.random_crop_image=null", "data.augmentation.random_horizontal_flip=0",
        "train.mixed_precision=float32", "optimizer.learning_rate.total_steps=5", "optimizer.learning_rate.warmup_steps=1",
        # batch 2 from random weights, not 64 from ImageNet's: a tenth of the zoo's rate
        "optimizer.learning_rate.learning_rate_base=0.004", "optimizer.learning_rate.warmup_learning_rate=0.001",
        "data.train.format=tfrecord", f"data.train.annotations={RACCOON / 'data' / 'test.record'}",
        f"data.train.label_map={RACCOON / 'training' / 'object-detection.pbtxt'}",
    ])
    assert config.model.backbone == "resnet50" and config.model.image_resizer == "fixed_shape"
    reports = []
    run_training(config, lambda metrics, checkpoint, milestone, pictures: reports.append(metrics))
    assert [report["step"] for report in reports] == [1, 2, 3, 4, 5]
    for report in reports:
        assert all(math.isfinite(report[key]) for key in ("train/loss", "train/box_loss", "train/classification_loss"))
        assert report["train/loss"] > report["train/box_loss"] + report["train/classification_loss"]  # the l2 term
    losses = [report["train/loss"] for report in reports]
    assert losses[-1] < losses[0], losses


def test_an_ssd_that_is_not_retinanet_stays_one_line_with_its_num_classes():
    """The raccoon set's SSD MobileNet v1 (no pyramid, a plain convolutional box predictor)."""
    pets = RACCOON / "training" / "ssd_mobilenet_v1_pets.config"
    imported = import_pipeline(pets.read_text(), str(pets))
    assert imported.tree["model"] == {"num_classes": 1}
    assert [line for line in imported.not_carried if line.startswith("model.")] == [
        "model.ssd: an SSD without a feature pyramid (feature_extractor.fpn) and a weight-shared box predictor is "
        "not carried over (detsweep trains keras-hub RetinaNet); only num_classes is"]


@pytest.mark.parametrize(("change", "line"), [
    ("activation: RELU_6,", f"{PREDICTOR}.activation: SWISH: keras-hub's ResNet, pyramid and heads use ReLU"),
    ("override_base_feature_extractor_hyperparams: true", "model.ssd.feature_extractor."
     "override_base_feature_extractor_hyperparams: false: the OD API's ResNet keeps its own l2 (1e-4) and batch "
     "norm; detsweep applies model.l2_regularization to every kernel"),
    ("kernel_size: 3", "model.ssd.box_predictor.weight_shared_convolutional_box_predictor.use_dropout: true: "
                       "keras-hub's heads have no dropout"),
])
def test_what_keras_hubs_retinanet_does_otherwise_is_named_and_efficientdets_swish_parses(change, line):
    replacement = {"activation: RELU_6,": "activation: SWISH,",
                   "override_base_feature_extractor_hyperparams: true": "override_base_feature_extractor_hyperparams: false",
                   "kernel_size: 3": "kernel_size: 3 use_dropout: true"}[change]
    imported = import_pipeline(ZOO_RETINANET.replace(change, replacement, 1), "retinanet.config")
    assert line in imported.not_carried


def test_the_fine_tune_note_names_no_resnet_preset_for_another_encoder():
    """The raccoon set's SSD MobileNet starts from a detection checkpoint (from_detection_checkpoint)."""
    pets = RACCOON / "training" / "ssd_mobilenet_v1_pets.config"
    [note] = import_pipeline(pets.read_text(), str(pets)).notes
    assert note.endswith("(detection) is an OD API checkpoint; detsweep starts from keras-hub presets: set "
                         "model.weights: a keras-hub RetinaNet preset of this network (keras-hub's COCO one is a "
                         "ResNet-50's) (README: From the OD API's model zoo)"), note
    classification = import_pipeline(pets.read_text().replace("from_detection_checkpoint: true", ""), str(pets))
    assert classification.notes[0].endswith("set model.weights: an image encoder's preset (README: From the OD API's "
                                            "model zoo)"), classification.notes
