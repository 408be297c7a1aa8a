"""Model registry: built-in encoders offline, keras-hub presets through keras-hub's own loader."""

import numpy as np
import pytest

from detsweep.config import ModelConfig
from detsweep.models import build_model
from detsweep.models.backbones import build_backbone


def test_weights_from_a_keras_hub_preset_directory(tmp_path):
    """keras-hub's from_preset, the path used for hub presets, reading a preset saved here
    (no downloads are possible on this machine)."""
    encoder = build_backbone("resnet_tiny")
    encoder.save_to_preset(str(tmp_path / "preset"))
    model, _ = build_model(ModelConfig(weights=str(tmp_path / "preset"), max_level=5), num_classes=2)
    loaded = model.backbone.image_encoder
    assert type(loaded) is type(encoder)
    # every weight, each in its place: the same names in the same order, then the same values
    assert [w.path for w in loaded.weights] == [w.path for w in encoder.weights]
    for saved, restored in zip(encoder.weights, loaded.weights, strict=True):
        np.testing.assert_array_equal(saved.numpy(), restored.numpy())


@pytest.mark.parametrize("name", ["resnet_tiny", "resnet18"])
def test_builtin_backbones_feed_the_feature_pyramid(name):
    model, losses = build_model(ModelConfig(backbone=name, max_level=5, image_size=64), num_classes=4)
    outputs = model(np.zeros((1, 64, 64, 3), np.float32))
    anchors = 9 * (8 * 8 + 4 * 4 + 2 * 2)  # P3..P5 of a 64-px image, 9 anchors each
    assert outputs["cls_logits"].shape == (1, anchors, 4)
    assert outputs["bbox_regression"].shape == (1, anchors, 4)


def test_loss_weights_scale_their_terms():
    import tensorflow as tf

    images = tf.zeros((1, 64, 64, 3))
    targets = {"boxes": tf.constant([[[8.0, 8.0, 40.0, 40.0]]]), "labels": tf.constant([[1.0]])}
    plain_model, plain = build_model(ModelConfig(max_level=5, image_size=64), num_classes=2)
    predictions = plain_model(images)
    weighted = type(plain)(plain_model, ModelConfig(max_level=5, image_size=64, localization_weight=3.0,
                                                    classification_weight=0.5))
    a, b = plain(images, targets, predictions), weighted(images, targets, predictions)
    assert float(b["box"]) == pytest.approx(3.0 * float(a["box"]), rel=1e-5)
    assert float(b["classification"]) == pytest.approx(0.5 * float(a["classification"]), rel=1e-5)
