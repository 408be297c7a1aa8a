"""``model.weights``: an image encoder's preset (the OD API's ``classification`` checkpoint) or a
whole RetinaNet's (its ``detection`` checkpoint). Checked on the driver before Ray or MLflow
start (issue #39): a preset keras-hub cannot load, or one of another kind, is one line and exit
2, never a worker's failure after the cluster started, nor a detector's backbone wrapped as a new
detector's encoder. A whole RetinaNet's preset loads every weight but a class head of other
classes, with its architecture and its normalisation. The presets are written here by
keras-hub's own ``save_to_preset`` (nothing can be downloaded on this machine)."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from .conftest import REPO, run_bounded, run_cli, run_here, side_by_side

QUICKSTART = REPO / "configs" / "quickstart.yaml"
SWEEP = REPO / "sweeps" / "quickstart.yaml"
# A refusal imports keras-hub (and TensorFlow, about 5 s here) and nothing more; Ray's start
# and a trial's first step alone take longer (README, Speed).
SECONDS_TO_REFUSE = 40
EXPECTED = ("expected a keras-hub preset of an image encoder or of a RetinaNet detector: a folder save_to_preset "
            "wrote, kaggle://owner/model/keras/variant[/version], hf://owner/name, or a keras-hub preset name "
            "such as resnet_50_imagenet or retinanet_resnet50_fpn_coco")
KINDS = ("expected one of an image encoder with a feature pyramid (e.g. resnet_50_imagenet) "
         "or of a whole RetinaNet (e.g. retinanet_resnet50_fpn_coco)")
HEADLESS = "a preset of RetinaNetBackbone, a detector's backbone without its heads (no task.json); " + KINDS
# The tiny preset's image converter: a normalisation that is not ImageNet's (per channel).
CONVERTER = {"scale": [1 / 60.0, 1 / 50.0, 1 / 40.0], "offset": [-2.0, -1.5, -1.0]}


@pytest.fixture(scope="module")
def presets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny image encoder's preset, a whole RetinaNet's on it and that RetinaNet's backbone
    alone (no heads), as keras-hub saves them; the RetinaNet's without its heads' weights, and
    with more head layers than the model section holds; a folder that holds no preset."""
    import keras_hub

    from detsweep.models.backbones import build_backbone

    folder = tmp_path_factory.mktemp("presets")
    encoder = build_backbone("resnet_tiny")
    encoder.save_to_preset(str(folder / "backbone"))
    backbone = keras_hub.models.RetinaNetBackbone(image_encoder=encoder, min_level=3, max_level=5, use_p5=False,
                                                  image_shape=(64, 64, 3))
    detector = keras_hub.models.RetinaNetObjectDetector(backbone=backbone, num_classes=2, bounding_box_format="yxyx")
    detector.save_to_preset(str(folder / "detector"))
    backbone.save_to_preset(str(folder / "headless"))
    shutil.copytree(folder / "detector", folder / "no_head_weights")
    (folder / "no_head_weights" / "task.weights.h5").unlink()
    shutil.copytree(folder / "detector", folder / "deep_heads")
    task = json.loads((folder / "deep_heads" / "task.json").read_text())
    task["config"]["pre_logits_num_conv_layers"] = 6
    (folder / "deep_heads" / "task.json").write_text(json.dumps(task))
    (folder / "no_preset").mkdir()
    (folder / "no_preset" / "model.weights.h5").write_bytes(b"")  # weights, but no config.json
    return {name: folder / name for name in ("backbone", "detector", "headless", "no_head_weights", "deep_heads",
                                             "no_preset")}


@pytest.fixture(scope="module")
def detector_preset(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray]]:
    """A tiny whole RetinaNet of COCO's 80 classes, saved as keras-hub saves its COCO presets (with its
    preprocessor and image converter), and its weights by path. Nothing of its architecture is
    detsweep's default, its boxes are ``xyxy``, and each weight is moved off its starting value,
    so that a weight started fresh never passes for a loaded one."""
    import keras_hub
    from keras_hub.src.models.retinanet.retinanet_label_encoder import RetinaNetLabelEncoder

    from detsweep.models.backbones import build_backbone

    backbone = keras_hub.models.RetinaNetBackbone(image_encoder=build_backbone("resnet_tiny"), min_level=3,
                                                  max_level=4, use_p5=False)
    anchors = keras_hub.layers.AnchorGenerator("xyxy", min_level=3, max_level=4, num_scales=2, aspect_ratios=[1.0],
                                               anchor_size=3.0)
    encoder = RetinaNetLabelEncoder(anchors, bounding_box_format="xyxy", encoding_format="center_xywh",
                                    box_variance=[0.1, 0.2, 0.25, 0.5])
    converter = keras_hub.layers.RetinaNetImageConverter(image_size=(96, 96), pad_to_aspect_ratio=True,
                                                         crop_to_aspect_ratio=False, **CONVERTER)
    detector = keras_hub.models.RetinaNetObjectDetector(
        backbone=backbone, num_classes=80, bounding_box_format="xyxy", anchor_generator=anchors, label_encoder=encoder,
        pre_logits_num_conv_layers=1, preprocessor=keras_hub.models.RetinaNetObjectDetectorPreprocessor(converter))
    rng = np.random.default_rng(0)
    for weight in detector.weights:
        weight.assign(weight.numpy() + rng.uniform(0.01, 0.02, weight.shape).astype(weight.dtype))
    folder = tmp_path_factory.mktemp("detector_preset") / "tiny_coco"
    detector.save_to_preset(str(folder))
    return folder, {weight.path: weight.numpy() for weight in detector.weights}


def edited_copy(folder: Path, to: Path, **converter) -> Path:
    """A copy of a detector's preset whose image converter has ``converter``'s settings instead."""
    shutil.copytree(folder, to)
    for name in ("image_converter.json", "preprocessor.json"):
        saved = json.loads((to / name).read_text())
        settings = saved["config"] if name == "image_converter.json" else saved["config"]["image_converter"]["config"]
        settings.update(converter)
        (to / name).write_text(json.dumps(saved))
    return to


def is_class_head(path: str) -> bool:
    return path.startswith("classification_head/")


def forward_layers(layer) -> list:
    """The layers a model's forward pass runs, through its nested models (not the encoder's stages
    past the pyramid's last level, which keras-hub keeps but never calls)."""
    return [layer, *(inner for child in getattr(layer, "layers", []) for inner in forward_layers(child))]


def test_a_preset_saved_by_keras_hub_passes_validate(presets):
    """A backbone's preset and a whole detector's (two ``validate`` calls side by side)."""
    kinds = ("backbone", "detector")
    results = [run_here("validate", str(SWEEP), "--set", f"base.model.weights={presets[kind]}", "--json") for kind in kinds]
    for kind, result in zip(kinds, results):
        assert result.returncode == 0, result.stderr[-3000:]
        report = json.loads(result.stdout)
        assert report["base"]["model"]["weights"] == str(presets[kind])
        # a whole detector's architecture replaces what the quickstart sets, in one note
        replaced = (f"model.weights: the preset {presets[kind]}'s architecture replaces model.image_size 128 → 64; "
                    "model.anchor_size 3.0 → 4.0; model.head_conv_layers 0 → 4")
        assert [note for note in report["notes"] if "model.weights" in note] == ([replaced] if kind == "detector" else [])


REFUSALS = {
    "missing folder": ("{tmp}/gone", "a folder that does not exist; " + EXPECTED),
    "folder without a preset": ("{no_preset}", "a folder without a keras-hub preset (no config.json); " + EXPECTED),
    "detector's backbone without its heads": ("{headless}", HEADLESS),
    "detector without its heads' weights": ("{no_head_weights}", "a detector's preset without its heads' weights "
                                                                 "(no task.weights.h5); " + EXPECTED),
    "detector the model section cannot hold": ("{deep_heads}", "a preset whose architecture detsweep's model section "
                                                               "cannot hold (model.head_conv_layers 6: Input should be "
                                                               "less than or equal to 4)"),
    "short kaggle handle": ("kaggle://keras/resnet/keras",
                            "expected a Kaggle handle kaggle://owner/model/keras/variant[/version]"),
    "kaggle handle of another framework": ("kaggle://keras/resnet/pytorch/resnet_50_imagenet",
                                           "expected a Kaggle handle kaggle://owner/model/keras/variant[/version]"),
    "long hf handle": ("hf://owner/name/extra", "expected a Hugging Face handle hf://owner/name"),
    "unknown preset name": ("resnet_9000_imagenet", "neither a folder nor a keras-hub preset name; " + EXPECTED),
}


@pytest.mark.parametrize("case", REFUSALS)
def test_each_bad_preset_is_named_with_what_was_found_and_what_was_expected(case, presets, tmp_path):
    from detsweep.errors import DetsweepError
    from detsweep.models.presets import check_weights_preset

    weights, reason = (text.format(tmp=tmp_path, **presets) for text in REFUSALS[case])
    with pytest.raises(DetsweepError) as refused:
        check_weights_preset(weights, "model.weights")
    assert str(refused.value) == f"model.weights: found {weights!r}, {reason}"


# Through the command: one case refused by its folder, one by its kind (each a TensorFlow import),
# side by side.
def test_a_bad_preset_given_to_train_is_one_line_before_ray_starts(presets, tmp_path):
    cases = ("missing folder", "detector's backbone without its heads")
    # Ray makes its session folder under RAY_TMPDIR as it starts (a short path: its sockets live there)
    ray_tmp = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))

    def train(case: str) -> tuple[subprocess.CompletedProcess, float]:
        weights = REFUSALS[case][0].format(tmp=tmp_path, **presets)
        started = time.monotonic()
        result = run_cli("train", str(QUICKSTART), "--set", f"model.weights={weights}", "--set", "train.num_steps=2",
                         "--set", "data.val=null", "--storage", str(tmp_path / "ray"), cwd=tmp_path,
                         env={"RAY_TMPDIR": str(ray_tmp)}, timeout=120)
        return result, time.monotonic() - started

    try:
        results = side_by_side([lambda case=case: train(case) for case in cases])
        assert not any(ray_tmp.iterdir()), sorted(path.name for path in ray_tmp.rglob("*"))[:20]
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    for case, (result, took) in zip(cases, results):
        weights, reason = (text.format(tmp=tmp_path, **presets) for text in REFUSALS[case])
        assert (result.returncode, result.stderr) == (
            2, f"detsweep: error: {QUICKSTART}: model.weights: found {weights!r}, {reason}\n")
        assert took < SECONDS_TO_REFUSE, f"{case}: refused after {took:.0f} s"
    assert not (tmp_path / "ray").exists() and not (tmp_path / "mlflow.db").exists()


def test_a_detectors_backbone_without_heads_is_refused_by_validate_and_launch_before_anything_starts(presets,
                                                                                                     tmp_path):
    """A sweep names the field in its base; ``launch`` refuses before its MLflow run and Ray."""
    expected = f"detsweep: error: {SWEEP}: base.model.weights: found '{presets['headless']}', {HEADLESS}\n"
    weights = f"base.model.weights={presets['headless']}"
    ray_tmp = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
    try:
        validated, launched = side_by_side([
            lambda: run_cli("validate", str(SWEEP), "--set", weights, cwd=tmp_path),
            lambda: run_cli("launch", str(SWEEP), "--set", weights, "--set", f"storage={tmp_path / 'ray'}",
                            cwd=tmp_path, env={"RAY_TMPDIR": str(ray_tmp)}, timeout=120)])
        assert not any(ray_tmp.iterdir()), sorted(path.name for path in ray_tmp.rglob("*"))[:20]
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert (validated.returncode, validated.stderr) == (2, expected)
    assert (launched.returncode, launched.stderr) == (2, expected)
    assert not list(tmp_path.iterdir())  # no results folder, no mlflow.db, no log


def test_keras_hubs_own_retinanet_and_encoder_presets_pass_by_name_and_other_kinds_are_refused():
    """Names from keras-hub's registry: D-FINE's detector is not RetinaNet, BERT's is no image
    encoder. Both would otherwise be found only in the workers, after downloading."""
    from detsweep.errors import DetsweepError
    from detsweep.models.presets import check_weights_preset

    refusals = {"dfine_nano_coco": "a preset of DFineObjectDetector; expected a RetinaNetObjectDetector's "
                                   "(e.g. retinanet_resnet50_fpn_coco) or an image encoder's",
                "bert_base_en": f"a keras-hub preset of another kind of backbone; {KINDS}"}
    for name, reason in refusals.items():
        with pytest.raises(DetsweepError) as refused:
            check_weights_preset(name, "base.model.weights")
        assert str(refused.value) == f"base.model.weights: found {name!r}, {reason}"
    for name in ("resnet_50_imagenet", "retinanet_resnet50_fpn_coco", "retinanet_resnet50_fpn_v2_coco"):
        assert check_weights_preset(name, "base.model.weights") == []


def test_a_preset_folder_sized_for_a_cluster_config_is_left_to_its_nodes(tmp_path):
    """Before ``ray up`` the nodes' folders cannot be looked at from here: a note, as for data."""
    result = run_here("validate", str(SWEEP), "--set", f"base.model.weights={tmp_path / 'on_the_nodes'}",
                      "--cluster-config", str(REPO / "ray_cluster.yaml"), "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"left to the nodes, which must have it: base.model.weights: {tmp_path / 'on_the_nodes'}" in json.loads(result.stdout)["notes"]


def test_a_whole_detector_preset_is_told_from_a_backbones(presets):
    """By its task.json for a folder, by keras-hub's registry for a name (D-FINE's too, which
    the build then refuses: its heads are not RetinaNet's)."""
    from detsweep.models.detector_presets import is_detector_preset

    detectors = [str(presets["detector"]), "retinanet_resnet50_fpn_coco", "dfine_nano_coco"]
    others = [str(presets["backbone"]), str(presets["headless"]), str(presets["no_preset"]), "resnet_50_imagenet",
              "none", str(presets["backbone"] / "gone")]
    assert [is_detector_preset(weights) for weights in detectors + others] == [True] * 3 + [False] * 6


def test_an_80_class_detector_preset_in_a_3_class_detector_loads_every_weight_but_a_fresh_class_head(detector_preset):
    from detsweep.config import ModelConfig
    from detsweep.models.detector_parts import TensorFlowNonMaxSuppression
    from detsweep.models.detector_presets import build_detector_from_preset, preset_model_config

    folder, saved = detector_preset
    config = ModelConfig(weights=str(folder), score_threshold=0.2, nms_iou_threshold=0.4, max_detections=7)
    detector = build_detector_from_preset(preset_model_config(config), num_classes=3)
    loaded = {weight.path: weight.numpy() for weight in detector.weights}
    kept = [(path, value) for path, value in saved.items() if not is_class_head(path)]
    for (path, value), (loaded_path, loaded_value) in zip(
            kept, [(path, value) for path, value in loaded.items() if not is_class_head(path)], strict=True):
        assert loaded_path == path
        np.testing.assert_array_equal(loaded_value, value, err_msg=path)
    # the class head: 2 anchors a place (2 scales, 1 ratio) times 3 classes, every weight new, its
    # bias keras-hub's new head's (model.class_prediction_bias_init unset)
    head = detector.classification_head.prediction_layer
    assert (tuple(head.kernel.shape), tuple(head.bias.shape)) == ((3, 3, 256, 6), (6,))
    np.testing.assert_array_equal(head.bias.numpy(), np.zeros(6))
    assert not [path for path, value in loaded.items()
                if is_class_head(path) and value.shape == saved[path].shape and np.allclose(value, saved[path])]
    # used as build_retinanet's: boxes yxyx (the preset's were xyxy), detsweep's NMS with the config's settings
    decoder = detector.prediction_decoder
    assert type(decoder) is TensorFlowNonMaxSuppression
    assert (decoder.confidence_threshold, decoder.iou_threshold, decoder.max_detections) == (0.2, 0.4, 7)
    assert {detector.bounding_box_format, detector.anchor_generator.bounding_box_format,
            detector.label_encoder.bounding_box_format} == {"yxyx"}
    assert detector.label_encoder.box_variance == pytest.approx([0.1, 0.2, 0.25, 0.5])  # the preset's
    outputs = detector(np.zeros((1, 96, 96, 3), np.float32))
    anchors = 2 * (12 * 12 + 6 * 6)  # P3 and P4 of the preset's 96-px input
    assert (outputs["cls_logits"].shape, outputs["bbox_regression"].shape) == ((1, anchors, 3), (1, anchors, 4))


def test_a_detector_preset_of_the_same_classes_loads_every_weight_and_the_configs_training_settings(detector_preset):
    from detsweep.config import ModelConfig
    from detsweep.models.detector_presets import build_detector_from_preset, preset_model_config

    folder, saved = detector_preset
    config = ModelConfig(weights=str(folder), class_prediction_bias_init=-4.6, use_sync_bn=True, l2_regularization=1e-4)
    detector = build_detector_from_preset(preset_model_config(config), num_classes=80)
    for (path, value), weight in zip(saved.items(), detector.weights, strict=True):
        assert weight.path == path
        np.testing.assert_array_equal(weight.numpy(), value, err_msg=path)  # the class bias too: no fresh start
    norms = [layer for layer in forward_layers(detector) if type(layer).__name__ == "BatchNormalization"]
    assert norms and all(layer.synchronized for layer in norms)
    assert len(detector.losses) == len([w for w in detector.trainable_weights if w.name == "kernel" and w.ndim == 4])


def test_a_fresh_class_head_starts_at_the_configs_class_bias(detector_preset):
    from detsweep.config import ModelConfig
    from detsweep.models.detector_presets import build_detector_from_preset, preset_model_config

    folder, saved = detector_preset
    config = preset_model_config(ModelConfig(weights=str(folder), class_prediction_bias_init=-4.6))
    detector = build_detector_from_preset(config, 3)
    np.testing.assert_allclose(detector.classification_head.prediction_layer.bias.numpy(), np.full(6, -4.6))
    # the box head stays the preset's (the OD API's start zeroes a new one's)
    np.testing.assert_array_equal(detector.box_head.prediction_layer.bias.numpy(), saved["box_head/logits_layer/bias"])


def test_the_presets_architecture_replaces_the_configs_and_one_line_says_what_the_user_set(detector_preset, tmp_path):
    from detsweep.config import ModelConfig
    from detsweep.models.detector_presets import preset_model_config, preset_overrides

    folder, _ = detector_preset
    config = ModelConfig(weights=str(folder), image_size=128, max_level=5, head_conv_layers=0, anchor_size=3.0)
    replaced = preset_model_config(config)
    assert (replaced.image_size, replaced.min_level, replaced.max_level, replaced.anchor_size,
            replaced.scales_per_octave, replaced.aspect_ratios, replaced.head_conv_layers) == (96, 3, 4, 3.0, 2, (1.0,), 1)
    assert replaced.box_coder_scales == pytest.approx((5.0, 10.0, 2.0, 4.0))  # y, x, h, w: 1 / keras-hub's variance
    assert preset_overrides(config) == (f"model.weights: the preset {folder}'s architecture replaces "
                                        "model.image_size 128 → 96; model.max_level 5 → 4; model.head_conv_layers 0 → 1")
    assert preset_overrides(ModelConfig(weights=str(folder), anchor_size=3.0)) is None  # nothing set differs
    # an image size the anchors cannot tile: to the nearest multiple of 2 ** max_level, said even unset
    odd = edited_copy(folder, tmp_path / "odd", image_size=[100, 100])
    assert preset_model_config(ModelConfig(weights=str(odd))).image_size == 96
    assert preset_overrides(ModelConfig(weights=str(odd))) == (
        f"model.weights: the preset {odd}'s architecture replaces model.image_size 128 → 96 "
        "(the preset's 100, rounded to a multiple of 16)")


def test_a_backbone_preset_leaves_the_config_as_it_is(presets):
    from detsweep.config import ModelConfig
    from detsweep.models.detector_presets import preset_model_config, preset_normalisation, preset_overrides

    config = ModelConfig(weights=str(presets["backbone"]), image_size=64, max_level=5)
    assert preset_model_config(config) is config
    assert (preset_overrides(config), preset_normalisation(config.weights)) == (None, None)


def test_the_presets_normalisation_is_its_image_converters(detector_preset, presets, tmp_path):
    """``(pixel - mean) / std`` with the returned statistics is keras-hub's own converter; None
    for ImageNet's (detsweep's default) and for a preset saved without a converter."""
    import keras_hub

    from detsweep.data.processing import MEAN, STD
    from detsweep.models.detector_presets import preset_normalisation

    folder, _ = detector_preset
    mean, std = preset_normalisation(str(folder))
    converter = keras_hub.layers.ImageConverter.from_preset(str(folder))
    converter.image_size = None  # the normalisation alone, not its resizing
    pixels = np.random.default_rng(1).integers(0, 256, (2, 8, 8, 3)).astype(np.float32)
    np.testing.assert_allclose((pixels - np.array(mean)) / np.array(std), converter(pixels), rtol=1e-5, atol=1e-5)
    imagenet = edited_copy(folder, tmp_path / "imagenet", scale=[1 / s for s in STD],
                           offset=[-m / s for m, s in zip(MEAN, STD)])
    assert preset_normalisation(str(imagenet)) is None
    # the preset's ImageNet statistics win over the section's own too
    from detsweep.config import ModelConfig
    from detsweep.models.detector_presets import preset_model_config

    own = ModelConfig(weights=str(imagenet), image_mean=(1.0, 2.0, 3.0), image_std=(4.0, 5.0, 6.0))
    assert (preset_model_config(own).image_mean, preset_model_config(own).image_std) == (None, None)
    assert preset_normalisation(str(presets["detector"])) is None  # saved without a preprocessor


def test_a_detector_preset_trains_through_detsweeps_loop_from_the_presets_weights(detector_preset):
    """``build_model`` (``build_retinanet``'s hook) builds it for 3 classes, the preset's 80, and
    two steps of the train loop run on images of the preset's size and normalisation."""
    import tensorflow as tf

    from detsweep.config import load_trial_config
    from detsweep.data import load_dataset
    from detsweep.data.pipeline import training_dataset
    from detsweep.data.processing import InputSpec
    from detsweep.models.detector_presets import preset_normalisation, preset_trial_config
    from detsweep.train.checkpoint import build_training_state
    from detsweep.train.step import make_train_loop

    folder, saved = detector_preset
    config = preset_trial_config(load_trial_config(QUICKSTART, [f"model.weights={folder}", "data.train.num_images=4",
                                                                "data.val=null"]))  # as run_training does
    strategy = tf.distribute.get_strategy()
    with strategy.scope():
        state, losses = build_training_state(config, 3)
    started = {weight.path: weight.numpy() for weight in state.model.weights}
    for path, value in saved.items():
        if not is_class_head(path):
            np.testing.assert_array_equal(started[path], value, err_msg=path)
    spec = InputSpec.of(config.model)
    assert (spec.mean, spec.std) == preset_normalisation(str(folder))
    batches = iter(training_dataset(load_dataset(config.data.train, verify=False), spec, config.data.augmentation,
                                    batch_size=2, seed=0))
    loop = make_train_loop(strategy, state.model, losses, state.optimizer, state.moving_average, state.step)
    result = loop(batches, tf.constant(2))
    assert (int(state.step.numpy()), int(result["steps_run"]), bool(result["finite"])) == (2, 2, True)
    moved = state.model.get_layer("box_head").prediction_layer.kernel.numpy()
    assert not np.array_equal(moved, saved["box_head/logits_layer/kernel"])  # it trained from the preset


def test_a_trial_from_a_detector_preset_trains_and_checkpoints_the_presets_architecture_and_normalisation(
        detector_preset, tmp_path):
    """``run_training``, as every worker runs it: the checkpoint's config is the preset's network
    (image size, levels, heads) with its converter's normalisation, so that evaluation and export
    feed it what it was trained on."""
    from detsweep.checkpoints import read_config
    from detsweep.config import load_trial_config
    from detsweep.models.detector_presets import preset_normalisation
    from detsweep.train import run_training

    folder, _ = detector_preset
    config = load_trial_config(QUICKSTART, [f"model.weights={folder}", "data.train.num_images=4", "data.val=null",
                                            "train.batch_size=2", "train.num_steps=2", "train.steps_per_loop=2",
                                            "train.checkpoint_every=2"])
    kept = []
    run_training(config, lambda metrics, checkpoint, milestone, pictures: kept.append(read_config(checkpoint)) if checkpoint else None)
    [saved] = kept
    assert (saved.model.image_size, saved.model.max_level, saved.model.head_conv_layers) == (96, 4, 1)
    assert (saved.model.image_mean, saved.model.image_std) == preset_normalisation(str(folder))


def test_a_sweep_over_the_network_of_a_whole_detector_preset_is_refused_in_one_line_before_anything_starts(
        presets, write, tmp_path):
    """The preset's architecture wins on every worker: trials that differ only there would train
    one network under many names."""
    sweep = write("sweep.yaml", f"""name: over_the_preset
base: {{from: {QUICKSTART}, model: {{weights: {presets['detector']}}}}}
search:
  metric: train/loss
  mode: min
  num_samples: 2
  space:
    optimizer.learning_rate.learning_rate_base: {{values: [0.01, 0.02]}}
    model.anchor_size: {{values: [3.0, 4.0]}}
""")
    line = (f"detsweep: error: {sweep}: search.space.model.anchor_size: found a field of the network, expected none: "
            f"base.model.weights ({presets['detector']}) is a whole detector's preset, whose architecture wins\n")
    result = run_cli("validate", str(sweep), cwd=tmp_path)
    assert (result.returncode, result.stderr) == (2, line)
    from detsweep.errors import DetsweepError
    from detsweep.sweeps import load_sweep
    from detsweep.sweeps.launch import launch

    with pytest.raises(DetsweepError) as refused:  # launch refuses it before Ray or MLflow start
        launch(load_sweep(sweep), register=False)
    assert f"detsweep: error: {refused.value}\n" == line


# --- a registry name or a handle, read as the workers read it ----------------------------------

COCO = "retinanet_resnet50_fpn_coco"


@pytest.fixture
def kaggle_cache(detector_preset, tmp_path, monkeypatch) -> dict[str, str]:
    """keras-hub's COCO RetinaNet by its registry name, with the tiny preset in its place in
    kagglehub's own cache (``KAGGLEHUB_CACHE``, the folders and completion marks kagglehub writes
    after a download): keras-hub and kagglehub read it as a download they made, and nothing is
    fetched. The environment for a ``detsweep`` process."""
    import keras_hub
    from kagglehub.cache import Cache
    from kagglehub.handle import parse_model_handle

    cache = tmp_path / "kagglehub"
    monkeypatch.setenv("KAGGLEHUB_CACHE", str(cache))
    handle = parse_model_handle(keras_hub.models.RetinaNetObjectDetector.presets[COCO]["kaggle_handle"]
                                .removeprefix("kaggle://"))
    folder, _ = detector_preset
    for file in (path for path in folder.rglob("*") if path.is_file()):
        name = str(file.relative_to(folder))
        Path(Cache().get_path(handle, name)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(file, Cache().get_path(handle, name))
        Cache().mark_as_complete(handle, name)
    return {"KAGGLEHUB_CACHE": str(cache)}


def test_a_registry_name_or_a_handle_is_read_here_as_the_workers_read_it_and_its_architecture_said(
        kaggle_cache, detector_preset):
    """What replaces the user's fields is said before anything starts for a name or a handle
    too, not only for a folder; and the detector loads from the name, every weight the preset's."""
    from detsweep.config import ModelConfig, load_trial_config
    from detsweep.models.detector_presets import build_detector_from_preset, preset_model_config
    from detsweep.models.presets import architecture_note

    said = ("model.weights: the preset {}'s architecture replaces model.image_size 128 → 96; model.max_level 5 → 4; "
            "model.anchor_size 4.0 → 3.0; model.scales_per_octave 3 → 2; model.aspect_ratios (2.0, 1.0, 0.5) → (1.0,); "
            "model.head_conv_layers 0 → 1")
    result = run_here("validate", str(SWEEP), "--set", f"base.model.weights={COCO}", "--set", "base.model.anchor_size=4",
                      "--set", "base.model.scales_per_octave=3", "--set", "base.model.aspect_ratios=[2.0, 1.0, 0.5]",
                      "--json", env=kaggle_cache)
    assert result.returncode == 0, result.stderr[-3000:]
    assert [note for note in json.loads(result.stdout)["notes"] if "model.weights" in note] == [said.format(COCO)]
    handle = f"kaggle://keras/retinanet/keras/{COCO}/4"
    config = load_trial_config(QUICKSTART, [f"model.weights={handle}", "model.anchor_size=4", "model.scales_per_octave=3",
                                            "model.aspect_ratios=[2.0, 1.0, 0.5]"])
    assert architecture_note(config) == said.format(handle)
    _, saved = detector_preset
    detector = build_detector_from_preset(preset_model_config(ModelConfig(weights=COCO)), num_classes=80)
    for (path, value), weight in zip(saved.items(), detector.weights, strict=True):
        assert weight.path == path
        np.testing.assert_array_equal(weight.numpy(), value, err_msg=path)


def test_a_handle_that_cannot_be_read_here_is_said_in_one_line_and_left_to_the_workers(tmp_path, monkeypatch):
    """No network on this machine (nor a cache of it): the check says so, and refuses nothing
    (whether the handle exists is the workers' download to say)."""
    from detsweep.config import load_trial_config
    from detsweep.models.presets import architecture_note

    monkeypatch.setenv("KAGGLEHUB_CACHE", str(tmp_path))
    handle = "kaggle://someone/retinanet/keras/their_coco/2"
    note = architecture_note(load_trial_config(QUICKSTART, [f"model.weights={handle}"]))
    assert note.startswith(f"model.weights: the preset {handle} could not be read here (")
    assert note.endswith("); the workers read it, and a whole detector's architecture wins over model.*")
    assert "\n" not in note


def test_the_presets_converter_gives_the_resizer_and_a_crop_is_said(detector_preset, tmp_path):
    """keras-hub's converter pads (the OD API's keep_aspect_ratio with pad_to_max_dimension),
    stretches (fixed_shape) or crops, which no OD API resizer does: then the config's stays, said."""
    from detsweep.config import ModelConfig
    from detsweep.models.detector_presets import preset_model_config, preset_overrides

    folder, _ = detector_preset
    assert preset_model_config(ModelConfig(weights=str(folder), image_resizer="fixed_shape")).image_resizer == \
        "keep_aspect_ratio"
    stretched = edited_copy(folder, tmp_path / "stretched", pad_to_aspect_ratio=False, crop_to_aspect_ratio=False)
    assert preset_model_config(ModelConfig(weights=str(stretched))).image_resizer == "fixed_shape"
    cropped = edited_copy(folder, tmp_path / "cropped", pad_to_aspect_ratio=False, crop_to_aspect_ratio=True)
    config = ModelConfig(weights=str(cropped), image_size=96, max_level=4, anchor_size=3.0)
    assert preset_model_config(config).image_resizer == "keep_aspect_ratio"
    assert preset_overrides(config) == (
        f"model.weights: the preset {cropped}'s image converter crops the picture to the square, which detsweep "
        "never does: model.image_resizer stays keep_aspect_ratio")


def test_a_preset_whose_architecture_the_rest_of_the_config_cannot_take_is_one_line(detector_preset, tmp_path):
    """A stretching preset under the scale jitter (refused for a stretched square), and a box head
    trained to another box code than keras-hub's RetinaNet decodes."""
    from detsweep.config import ModelConfig, load_trial_config
    from detsweep.errors import DetsweepError
    from detsweep.models.detector_presets import preset_model_config, preset_trial_config

    folder, _ = detector_preset
    stretched = edited_copy(folder, tmp_path / "stretched", pad_to_aspect_ratio=False, crop_to_aspect_ratio=False)
    jitter = load_trial_config(QUICKSTART, [f"model.weights={stretched}",
                                            "data.augmentation.random_scale_crop_and_pad_to_square={}"])
    with pytest.raises(DetsweepError) as refused:
        preset_trial_config(jitter, "base.model.weights")
    assert str(refused.value) == (
        f"base.model.weights: found {str(stretched)!r}, a preset whose architecture the rest of the config cannot "
        "take (data.augmentation.random_scale_crop_and_pad_to_square: found {'scale_min': 0.1, 'scale_max': 2.0}, "
        "expected none with model.image_resizer: fixed_shape (it would zoom the stretched square))")
    assert preset_trial_config(load_trial_config(QUICKSTART, [f"model.weights={folder}"])).model.image_size == 96
    coded = shutil.copytree(folder, tmp_path / "yxhw")
    task = json.loads((coded / "task.json").read_text())
    task["config"]["label_encoder"]["config"]["encoding_format"] = "center_yxhw"
    (coded / "task.json").write_text(json.dumps(task))
    with pytest.raises(DetsweepError) as refused:
        preset_model_config(ModelConfig(weights=str(coded)))
    assert str(refused.value) == (f"model.weights: found {str(coded)!r}, a preset whose label encoder codes boxes as "
                                  "center_yxhw; expected center_xywh, the code keras-hub's RetinaNet decodes")


def test_a_hugging_face_handle_loads_from_the_hubs_cache_as_a_download(detector_preset, tmp_path):
    """``hf://owner/name`` as keras-hub reads it (``huggingface_hub.hf_hub_download``), from the
    Hub's own cache layout (``refs/main`` naming a snapshot) with the Hub offline, in a process of
    its own (the Hub reads its settings at import): the architecture line and every weight."""
    folder, saved = detector_preset
    repo = tmp_path / "hub" / "models--someone--tiny_coco"
    snapshot = "0123456789abcdef0123456789abcdef01234567"
    shutil.copytree(folder, repo / "snapshots" / snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(snapshot)
    np.savez(tmp_path / "saved.npz", **{path.replace("/", "|"): value for path, value in saved.items()})
    check = f"""
import numpy as np
from detsweep.config import ModelConfig, load_trial_config
from detsweep.models.detector_presets import build_detector_from_preset, preset_model_config
from detsweep.models.presets import architecture_note
print(architecture_note(load_trial_config({str(QUICKSTART)!r}, ["model.weights=hf://someone/tiny_coco"])))
saved = np.load({str(tmp_path / "saved.npz")!r})
detector = build_detector_from_preset(preset_model_config(ModelConfig(weights="hf://someone/tiny_coco")), 80)
assert [w.path for w in detector.weights] == [name.replace("|", "/") for name in saved.files]
for weight, name in zip(detector.weights, saved.files):
    np.testing.assert_array_equal(weight.numpy(), saved[name], err_msg=name)
print("every weight", len(saved.files))
"""
    import sys

    from .conftest import cli_environment

    result = run_bounded([sys.executable, "-c", check], cwd=REPO, timeout=120, env=cli_environment(
        {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub")}))
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines() == [
        "model.weights: the preset hf://someone/tiny_coco's architecture replaces model.image_size 128 → 96; "
        "model.max_level 5 → 4; model.head_conv_layers 0 → 1", f"every weight {len(saved)}"]
