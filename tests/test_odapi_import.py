"""Importing OD API pipeline.configs through protobuf's text_format."""

import json

import pytest
import yaml

from detsweep.config import load_trial_config
from detsweep.config.odapi import import_pipeline
from detsweep.errors import DetsweepError
from detsweep.optim import build_optimizer

from .conftest import RACCOON_PIPELINE, run_cli, run_here


def test_raccoon_pipeline_imports_to_rms_prop_with_exponential_decay():
    config = load_trial_config(RACCOON_PIPELINE)
    optimizer = config.optimizer
    assert optimizer.type == "rms_prop"
    assert (optimizer.momentum_optimizer_value, optimizer.decay, optimizer.epsilon) == (0.9, 0.9, 1.0)
    schedule = optimizer.learning_rate
    assert schedule.type == "exponential_decay"
    assert (schedule.initial_learning_rate, schedule.decay_steps, schedule.decay_factor) == (0.004, 800720, 0.95)
    assert schedule.staircase is True  # the proto2 default
    assert (optimizer.use_moving_average, optimizer.moving_average_decay) == (True, 0.9999)  # proto defaults
    assert config.train.batch_size == 24
    assert config.model.num_classes == 1
    assert config.data.augmentation.random_horizontal_flip == 0.5
    assert config.data.val.format == "tfrecord" and config.data.val.annotations.endswith("test.record")
    assert type(build_optimizer(optimizer)).__name__ == "RMSprop"


def test_import_reports_what_it_could_not_carry():
    imported = import_pipeline(RACCOON_PIPELINE.read_text())
    assert any("ssd_random_crop" in line for line in imported.not_carried)
    assert any(line.startswith("model.ssd") for line in imported.not_carried)
    assert any("fine_tune_checkpoint" in line for line in imported.notes)


def test_use_bfloat16_is_for_tpus_only_as_in_the_od_api():
    """model_lib_v2 sets the mixed_bfloat16 policy only when ``--use_tpu`` is given too, and a
    pipeline.config cannot say that: the import keeps float32 and says how to ask for it."""
    imported = import_pipeline(RACCOON_PIPELINE.read_text().replace("train_config: {", "train_config: {\n  use_bfloat16: true"))
    assert "mixed_precision" not in imported.tree.get("train", {})
    [line] = [line for line in imported.not_carried if "use_bfloat16" in line]
    assert "TPUs only" in line and "mixed_bfloat16" in line


def test_import_odapi_command_writes_a_yaml_that_loads_back(tmp_path):
    out = tmp_path / "raccoon.yaml"
    result = run_cli("import-odapi", str(RACCOON_PIPELINE), "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert "not carried over: train_config.data_augmentation_options.ssd_random_crop" in result.stderr
    assert "fine_tune_checkpoint" in out.read_text()  # kept as a comment
    assert load_trial_config(out) == load_trial_config(RACCOON_PIPELINE)


def test_import_odapi_into_a_missing_folder_writes_nothing(tmp_path):
    result = run_cli("import-odapi", str(RACCOON_PIPELINE), "-o", str(tmp_path / "no" / "such.yaml"))
    assert result.returncode == 2 and "does not exist" in result.stderr
    assert not (tmp_path / "no").exists()


def test_bare_optimizer_block_and_unknown_sections_are_read(write):
    text = """
    model { faster_rcnn { num_classes: 7 first_stage_features_stride: 16 } }
    optimizer {
      momentum_optimizer { learning_rate { cosine_decay_learning_rate {
        learning_rate_base: 0.04 total_steps: 25000 warmup_learning_rate: 0.013333 warmup_steps: 2000 } }
        momentum_optimizer_value: 0.9 }
      use_moving_average: false
    }
    """
    config = load_trial_config(write("opt.config", text))
    assert config.optimizer.type == "momentum"
    lr = config.optimizer.learning_rate
    assert (lr.type, lr.learning_rate_base, lr.total_steps, lr.warmup_steps) == ("cosine", 0.04, 25000, 2000)
    assert config.model.num_classes == 7


def test_invalid_text_proto_is_a_one_line_error(write):
    with pytest.raises(DetsweepError, match=r"bad.config: not a valid OD API text proto"):
        load_trial_config(write("bad.config", "train_config { batch_size: }"))


def test_odapi_file_works_with_the_optimizer_command():
    result = run_here("optimizer", str(RACCOON_PIPELINE), "--json", "--steps", "0,800720")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["optimizer"] == "RMSprop"
    assert report["learning_rate"] == pytest.approx([0.004, 0.004 * 0.95], rel=1e-6)


# OD API preprocessing steps detsweep does not have, with their own fields set, and a TrainConfig
# field (max_number_of_boxes) that detsweep's table of OD API fields does not declare at all.
AUGMENTING_PIPELINE = """
model { ssd { num_classes: 2 } }
train_config {
  batch_size: 8
  num_steps: 1000
  max_number_of_boxes: 100
  optimizer { adam_optimizer { learning_rate { constant_learning_rate { learning_rate: 0.001 } } } }
  data_augmentation_options { random_horizontal_flip { } }
  data_augmentation_options { random_jpeg_quality { min_jpeg_quality: 50 max_jpeg_quality: 90 } }
  data_augmentation_options { random_black_patches { max_black_patches: 4 } }
  data_augmentation_options { random_distort_color { color_ordering: 1 } }
}
"""


def test_import_odapi_names_every_augmentation_and_unknown_field_it_leaves_out(write):
    result = run_cli("import-odapi", str(write("augmenting.config", AUGMENTING_PIPELINE)))
    assert result.returncode == 0, result.stderr
    options = "train_config.data_augmentation_options"
    for line in (f"{options}.random_jpeg_quality: not supported by detsweep",
                 f"{options}.random_black_patches: not supported by detsweep",
                 f"{options}.random_distort_color: not supported by detsweep",
                 "train_config.max_number_of_boxes: not a field detsweep knows"):
        assert f"detsweep: not carried over: {line}\n" in result.stderr
    # An option group is named once, not field by field; the flip is carried, so not named.
    assert "min_jpeg_quality" not in result.stderr and "color_ordering" not in result.stderr
    assert "random_horizontal_flip" not in result.stderr
    assert "random_horizontal_flip: 0.5" in result.stdout


def test_fields_detsweep_knows_but_has_no_setting_for_are_named():
    """The raccoon config's from_detection_checkpoint, eval num_examples and num_readers used to
    vanish; its eval `shuffle: false` agrees with detsweep (data.val is read in order): carried."""
    imported = import_pipeline(RACCOON_PIPELINE.read_text())
    assert "train_config.from_detection_checkpoint: goes with fine_tune_checkpoint, whose note names the preset to use" \
        in imported.not_carried
    assert "eval_config.num_examples: detsweep evaluates every image of data.val" in imported.not_carried
    assert "eval_input_reader.num_readers: not a field detsweep knows" in imported.not_carried
    assert not any("shuffle" in line for line in imported.not_carried)
    shuffled = import_pipeline(RACCOON_PIPELINE.read_text().replace("shuffle: false", "shuffle: true"))
    assert "eval_input_reader.shuffle: detsweep reads data.val in order" in shuffled.not_carried


def test_the_readers_box_cap_and_shuffle_buffer_and_the_eval_batch_carry_under_detsweeps_names():
    """The OD API's train_input_reader max_number_of_boxes (boxes kept an image, the first ones)
    and shuffle_buffer_size, and eval_config.batch_size, are data.max_boxes,
    data.shuffle_buffer_size and train.eval_batch_size; the eval reader's own are named (detsweep
    evaluates every box, in order). Unwritten, detsweep's defaults stand."""
    from detsweep.config import TrialConfig, validate

    text = (RACCOON_PIPELINE.read_text()
            .replace("train_input_reader: {", "train_input_reader: {\n  max_number_of_boxes: 50 shuffle_buffer_size: 500")
            .replace("eval_config: {", "eval_config: {\n  batch_size: 4")
            .replace("num_readers: 1", "num_readers: 1 max_number_of_boxes: 200 shuffle_buffer_size: 10"))
    imported = import_pipeline(text)
    assert (imported.tree["data"]["max_boxes"], imported.tree["data"]["shuffle_buffer_size"]) == (50, 500)
    assert imported.tree["train"]["eval_batch_size"] == 4
    assert {line for line in imported.not_carried if "max_number_of_boxes" in line or "shuffle_buffer" in line} == {
        "eval_input_reader.max_number_of_boxes: detsweep's evaluation keeps every box of data.val",
        "eval_input_reader.shuffle_buffer_size: detsweep reads data.val in order"}
    config = validate(TrialConfig, imported.tree, source="pipeline.config")
    assert (config.data.max_boxes, config.data.shuffle_buffer_size, config.train.eval_batch_size) == (50, 500, 4)
    plain = import_pipeline(RACCOON_PIPELINE.read_text())
    assert "max_boxes" not in plain.tree["data"] and "eval_batch_size" not in plain.tree["train"]


def test_an_unknown_field_inside_the_carried_optimizer_is_still_named():
    imported = import_pipeline("""
    optimizer {
      momentum_optimizer { learning_rate { constant_learning_rate { learning_rate: 0.01 } } nesterov: true }
    }""")
    assert imported.tree["optimizer"]["type"] == "momentum"
    assert imported.not_carried == ["optimizer.momentum_optimizer.nesterov: not a field detsweep knows"]


FASTER_RCNN_PIPELINE = """
model {
  faster_rcnn {
    num_classes: 90
    image_resizer { keep_aspect_ratio_resizer { min_dimension: 600 max_dimension: 1024 } }
    feature_extractor { type: 'faster_rcnn_resnet50_keras' batch_norm_trainable: true }
    first_stage_anchor_generator { grid_anchor_generator { scales: [0.25, 0.5, 1.0, 2.0] height_stride: 16 } }
    first_stage_max_proposals: 300
    second_stage_post_processing { score_converter: SOFTMAX }
  }
}
train_config {
  batch_size: 64
  num_steps: 25000
  optimizer {
    momentum_optimizer {
      learning_rate { cosine_decay_learning_rate {
        learning_rate_base: 0.04 total_steps: 25000 warmup_learning_rate: 0.013333 warmup_steps: 2000 } }
      momentum_optimizer_value: 0.9
    }
    use_moving_average: false
  }
}
"""


def test_faster_rcnn_imports_its_optimizer_and_leaves_the_architecture_in_one_line(write):
    result = run_cli("import-odapi", str(write("faster_rcnn.config", FASTER_RCNN_PIPELINE)))
    assert result.returncode == 0, result.stderr
    # One line for the whole architecture, none per field of it; everything else is carried over.
    assert result.stderr.splitlines() == [
        "detsweep: not carried over: model.faster_rcnn: the architecture is not carried over (detsweep trains "
        "model.name, keras-hub RetinaNet); only num_classes is"]
    tree = yaml.safe_load(result.stdout)
    assert tree["optimizer"]["type"] == "momentum" and tree["optimizer"]["use_moving_average"] is False
    assert tree["optimizer"]["learning_rate"] == {"type": "cosine", "learning_rate_base": 0.04, "total_steps": 25000,
                                                  "warmup_learning_rate": 0.013333, "warmup_steps": 2000,
                                                  "hold_base_rate_steps": 0}
    assert tree["model"] == {"num_classes": 90} and tree["train"] == {"batch_size": 64, "num_steps": 25000}


def test_center_net_leaves_the_architecture_in_one_line_too():
    text = FASTER_RCNN_PIPELINE.replace("faster_rcnn {", "center_net {").replace("first_stage_max_proposals", "max_box_predictions")
    imported = import_pipeline(text)
    assert imported.not_carried == [
        "model.center_net: the architecture is not carried over (detsweep trains model.name, keras-hub RetinaNet); "
        "only num_classes is"]
    assert imported.tree["optimizer"]["learning_rate"]["type"] == "cosine"


def test_a_second_eval_reader_is_named_as_a_whole():
    second = 'eval_input_reader: { tf_record_input_reader { input_path: "extra.record" } num_readers: 2 }\n'
    imported = import_pipeline(RACCOON_PIPELINE.read_text() + second)
    assert imported.tree["data"]["val"]["annotations"].endswith("test.record")
    assert ("eval_input_reader[1]: detsweep evaluates on one data.val, the first eval_input_reader"
            in imported.not_carried)
    # The first reader's num_readers is named once; the second reader's is part of the line above.
    assert imported.not_carried.count("eval_input_reader.num_readers: not a field detsweep knows") == 1


# Every augmentation detsweep has, each of its fields set to a value other than its default.
AUGMENTATIONS_PIPELINE = """
train_config {
  batch_size: 8
  num_steps: 100
  optimizer { momentum_optimizer { learning_rate { constant_learning_rate { learning_rate: 0.01 } } } }
  data_augmentation_options { random_horizontal_flip { probability: 0.3 } }
  data_augmentation_options { random_crop_image { min_object_covered: 0.0 min_aspect_ratio: 0.7 max_aspect_ratio: 3.0
                                                  min_area: 0.75 max_area: 0.9 overlap_thresh: 0.0 clip_boxes: false
                                                  random_coef: 0.25 } }
  data_augmentation_options { random_adjust_brightness { max_delta: 0.1 } }
  data_augmentation_options { random_adjust_contrast { min_delta: 0.7 max_delta: 1.1 } }
  data_augmentation_options { random_adjust_hue { max_delta: 0.05 } }
  data_augmentation_options { random_adjust_saturation { min_delta: 0.5 max_delta: 1.5 } }
  data_augmentation_options { random_square_crop_by_scale { max_border: 64 scale_min: 0.5 scale_max: 1.5 num_scales: 4 } }
  data_augmentation_options { random_absolute_pad_image { max_height_padding: 200 max_width_padding: 100
                                                          pad_color: [10, 20, 30] } }
  data_augmentation_options { random_scale_crop_and_pad_to_square { scale_min: 0.3 scale_max: 1.7 } }
}
"""


def test_import_odapi_carries_every_field_of_the_augmentations_detsweep_has(write):
    path = write("augmentations.config", AUGMENTATIONS_PIPELINE)
    result = run_cli("import-odapi", str(path))
    assert result.returncode == 0 and "not carried over" not in result.stderr, result.stderr
    augmentation = load_trial_config(path).data.augmentation
    assert augmentation.random_horizontal_flip == 0.3
    assert augmentation.random_crop_image.model_dump() == {
        "min_object_covered": 0.0, "min_aspect_ratio": 0.7, "max_aspect_ratio": 3.0, "min_area": 0.75, "max_area": 0.9,
        "overlap_thresh": 0.0, "clip_boxes": False, "random_coef": 0.25}
    assert augmentation.random_adjust_brightness.max_delta == 0.1
    assert (augmentation.random_adjust_contrast.min_delta, augmentation.random_adjust_contrast.max_delta) == (0.7, 1.1)
    assert augmentation.random_adjust_hue.max_delta == 0.05
    assert augmentation.random_adjust_saturation.model_dump() == {"min_delta": 0.5, "max_delta": 1.5}
    assert augmentation.random_square_crop_by_scale.model_dump() == {
        "max_border": 64, "scale_min": 0.5, "scale_max": 1.5, "num_scales": 4}
    assert augmentation.random_absolute_pad_image.model_dump() == {
        "max_height_padding": 200, "max_width_padding": 100, "pad_color": (10.0, 20.0, 30.0)}
    assert augmentation.random_scale_crop_and_pad_to_square.model_dump() == {"scale_min": 0.3, "scale_max": 1.7}
    # the file's order, the flip first (detsweep's default puts it last); the scale jitter is last in both
    assert augmentation.order == ("random_horizontal_flip", "random_crop_image", "random_adjust_brightness",
                                  "random_adjust_contrast", "random_adjust_hue", "random_adjust_saturation",
                                  "random_square_crop_by_scale", "random_absolute_pad_image")


def test_unset_augmentation_fields_read_as_the_od_api_builds_them():
    """preprocessor.proto's defaults; the builder's 1 for an unset padding (no padding) and mean
    colour for an unset pad_color, and its 0.5 for a flip probability of 0; a step given twice is
    named, the first one kept."""
    from detsweep.config import TrialConfig
    from detsweep.config.schema import AbsolutePadConfig, RandomCropImageConfig, SquareCropByScaleConfig

    steps = ("random_horizontal_flip { probability: 0 }", "random_crop_image { }", "random_square_crop_by_scale { }",
             "random_absolute_pad_image { }", "random_adjust_hue { }", "random_adjust_hue { max_delta: 0.3 }")
    imported = import_pipeline("train_config { optimizer { adam_optimizer { } } "
                               + " ".join(f"data_augmentation_options {{ {step} }}" for step in steps) + " }")
    augmentation = TrialConfig.model_validate(imported.tree).data.augmentation
    assert augmentation.random_horizontal_flip == 0.5
    assert augmentation.random_crop_image == RandomCropImageConfig(
        min_object_covered=1.0, min_aspect_ratio=0.75, max_aspect_ratio=1.33, min_area=0.1, max_area=1.0,
        overlap_thresh=0.3, clip_boxes=True, random_coef=0.0)
    assert augmentation.random_square_crop_by_scale == SquareCropByScaleConfig(
        max_border=128, scale_min=0.6, scale_max=1.3, num_scales=8)
    assert augmentation.random_absolute_pad_image == AbsolutePadConfig(max_height_padding=1, max_width_padding=1,
                                                                       pad_color=None)
    assert augmentation.random_adjust_hue.max_delta == 0.02
    assert imported.not_carried == [
        "train_config.num_steps is 0 (train forever): detsweep's default num_steps is used",
        "train_config.data_augmentation_options.random_adjust_hue: given again; detsweep applies each step once, "
        "with the first one's settings"]
