"""Importing OD API pipeline.configs through protobuf's text_format."""

import json

import pytest

from detsweep.config import load_trial_config
from detsweep.config.odapi import import_pipeline
from detsweep.errors import DetsweepError
from detsweep.optim import build_optimizer

from .conftest import RACCOON_PIPELINE, run_cli


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
    result = run_cli("optimizer", str(RACCOON_PIPELINE), "--json", "--steps", "0,800720")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["optimizer"] == "RMSprop"
    assert report["learning_rate"] == pytest.approx([0.004, 0.004 * 0.95], rel=1e-6)
