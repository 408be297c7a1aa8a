"""Config validation: overrides, unknown keys, the OD API's invalid settings; one-line errors."""

import pytest

from detsweep.config import load_trial_config
from detsweep.errors import DetsweepError

from .conftest import REPO, run_cli

MINIMAL = "optimizer: {type: momentum}\n"


def error_of(write, text: str, *overrides: str) -> str:
    with pytest.raises(DetsweepError) as caught:
        load_trial_config(write("trial.yaml", text), overrides)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_defaults_follow_the_od_api(write):
    config = load_trial_config(write("trial.yaml", MINIMAL))
    assert config.optimizer.use_moving_average is True
    assert config.optimizer.moving_average_decay == 0.9999
    assert config.optimizer.momentum_optimizer_value == 0.9
    assert config.optimizer.learning_rate.type == "constant"
    assert config.optimizer.learning_rate.learning_rate == 0.002


def test_set_overrides_are_parsed_as_yaml_scalars(write):
    config = load_trial_config(
        write("trial.yaml", MINIMAL),
        ["optimizer.type=adam", "optimizer.learning_rate.learning_rate=1e-3", "train.num_steps=40",
         "optimizer.use_moving_average=false", "optimizer.learning_rate.type=cosine",
         "optimizer.learning_rate.warmup_steps=0", "optimizer.learning_rate.total_steps=40"],
    )
    assert config.optimizer.type == "adam"
    assert config.optimizer.learning_rate.learning_rate == 0.001
    assert config.train.num_steps == 40
    assert config.optimizer.use_moving_average is False
    assert config.optimizer.learning_rate.type == "cosine"


def test_schedule_and_optimizer_vary_independently(write):
    text = "optimizer: {type: adam, learning_rate: {schedule: cosine, total_steps: 100, warmup_steps: 5}}"
    config = load_trial_config(write("trial.yaml", text), ["optimizer.type=rms_prop"])
    assert (config.optimizer.type, config.optimizer.learning_rate.type) == ("rms_prop", "cosine")
    assert config.optimizer.epsilon == 1.0


@pytest.mark.parametrize(
    "text, overrides, expected",
    [
        ("optimizer: {type: momentum, lerning_rate: {}}", [], "optimizer.lerning_rate: found an unknown key"),
        (MINIMAL, ["trian.num_steps=4"], "did you mean 'train'?"),
        ("optimizer: {type: adm}", [], "optimizer.type: found 'adm', expected one of sgd, momentum, adam, adamw, "
                                        "rms_prop (did you mean 'adam'?)"),
        (MINIMAL, ["optimizer.learning_rate.learning_rate=-0.1"],
         "--set optimizer.learning_rate.learning_rate=-0.1: optimizer.learning_rate.learning_rate: found -0.1"),
        (MINIMAL, ["optimizer.moving_average_decay=1.0"], "optimizer.moving_average_decay: found 1.0"),
        (MINIMAL, ["optimizer.moving_average_decay=0"], "optimizer.moving_average_decay: found 0"),
        ("optimizer: {type: adam, learning_rate: {type: cosine, total_steps: 100}}", [],
         "optimizer.learning_rate.warmup_steps: found 10000, expected < total_steps (100) (the OD API default), so "
         "that the decay has steps left"),
        ("optimizer: {type: adam, learning_rate: {type: cosine, total_steps: 100, warmup_steps: 200}}", [],
         "optimizer.learning_rate.warmup_steps: found 200, expected < total_steps (100)"),
        # the quickstart's 30 warm-up steps with 30 steps in all: the line names the warm-up, not the hold
        ("optimizer: {type: adam, learning_rate: {type: cosine, total_steps: 30, warmup_steps: 30}}", [],
         "optimizer.learning_rate.warmup_steps: found 30, expected < total_steps (30)"),
        ("optimizer: {type: adam, learning_rate: {type: cosine, total_steps: 100, warmup_steps: 9,"
         " warmup_learning_rate: 0.5, learning_rate_base: 0.1}}", [],
         "optimizer.learning_rate.warmup_learning_rate: found 0.5, expected <= learning_rate_base (0.1)"),
        ("optimizer: {type: adam, learning_rate: {type: manual_step, schedule: [{step: 10}, {step: 10}]}}", [],
         "optimizer.learning_rate.schedule.1.step: found 10, expected > 10"),
        ("optimizer: {type: adam, learning_rate: {type: manual_step, schedule: [{step: 0}]}}", [],
         "optimizer.learning_rate.schedule.0.step: found 0, expected greater than 0"),
        ("optimizer: {type: adam, learning_rate: {type: linear}}", [], "optimizer.learning_rate.type: found 'linear'"),
        (MINIMAL, ["train.eval_every=15"], "train.eval_every: found 15, expected a multiple of train.steps_per_loop"),
        (MINIMAL, ["train.batch_size=3", "scaling.num_workers=2"],
         "train.batch_size: found 3, expected a multiple of scaling.num_workers (2)"),
        # the replicas, not the workers: 2 workers of 2 GPUs each train 4 replicas
        (MINIMAL, ["train.batch_size=6", "scaling.num_workers=2", "scaling.use_gpu=true", "scaling.gpus_per_worker=2"],
         "train.batch_size: found 6, expected a multiple of the replicas, 2 worker(s) x 2 GPUs each"),
        (MINIMAL, ["scaling.use_gpu=true", "scaling.gpus_per_worker=1.5"],
         "scaling.gpus_per_worker: found 1.5, expected a fraction of one GPU, or whole GPUs"),
        (MINIMAL, ["scaling.use_gpu=true", "scaling.use_tpu=true"], "scaling.use_tpu: found True"),
        # XLA compiles the forward pass without the synchronized batch norm (train/step.py)
        (MINIMAL, ["train.jit_compile=true", "model.use_sync_bn=true"],
         "train.jit_compile: found True, expected false with model.use_sync_bn: true"),
        (MINIMAL, ["data.train.format=coco"], "data.train.annotations: found None, expected a path"),
        ("optimizer: [1, 2]", [], "optimizer: found [1, 2], expected a valid dictionary"),
        ("optimizer: [" + ", ".join(["123456789"] * 8) + "]", [], "optimizer: found a list, expected a valid dictionary"),
        ("- just\n- a list\n", [], "found a list at the top level, expected a mapping"),
        ("optimizer: {type: adam\n", [], "trial.yaml: line 2: invalid YAML"),
    ],
)
def test_invalid_settings_are_one_line_errors(write, text, overrides, expected):
    assert expected in error_of(write, text, *overrides)


def test_errors_name_the_file(write):
    assert error_of(write, "optimizer: {type: adm}").startswith(str(write("trial.yaml", "")))


def test_bad_override_syntax(write):
    assert "expected dotted.path=value" in error_of(write, MINIMAL, "optimizer.type")
    assert "not a section" in error_of(write, MINIMAL, "optimizer.type.name=x")


def test_missing_file():
    with pytest.raises(DetsweepError, match="nope.yaml: file not found"):
        load_trial_config("nope.yaml")


@pytest.mark.parametrize(
    "args, expected",
    [
        (["config", "{path}", "--set", "optimizer.typ=adam"], "optimizer.typ: found an unknown key"),
        (["config", "{path}", "--set", "optimizer.learning_rate.learning_rate=-1"], "found -1"),
        (["import-odapi", "missing.config"], "missing.config: file not found"),
        (["optimizer", "{path}", "--steps", "a:b"], "--steps: found 'a:b'"),
    ],
)
def test_cli_errors_exit_2_with_one_line_and_no_traceback(write, args, expected):
    path = write("trial.yaml", MINIMAL)
    result = run_cli(*[arg.format(path=path) for arg in args])
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("detsweep: error:")]
    assert len(errors) == 1 and expected in errors[0], result.stderr
    assert "Traceback" not in result.stderr


def test_cli_config_prints_the_resolved_config():
    result = run_cli("config", str(REPO / "configs" / "quickstart.yaml"), "--set", "train.num_steps=20",
                     "--set", "optimizer.learning_rate.total_steps=20", "--set", "optimizer.learning_rate.warmup_steps=2")
    assert result.returncode == 0, result.stderr
    lines = [line.strip() for line in result.stdout.splitlines()]
    assert "num_steps: 20" in lines and "moving_average_decay: 0.99" in lines  # whole lines: not 0.9999


def test_cli_config_json_prints_the_same_resolved_config_as_one_json_object(capsys):
    """``--json``: the YAML's tree as JSON, ``--set`` applied and every default filled in (run
    in this process: the command imports no TensorFlow, and its output is all we read)."""
    import json

    import yaml

    from detsweep.cli import main

    command = ["config", str(REPO / "configs" / "quickstart.yaml"), "--set", "train.num_steps=20",
               "--set", "optimizer.learning_rate.total_steps=20", "--set", "optimizer.learning_rate.warmup_steps=2"]
    assert main(command) == 0
    as_yaml = yaml.safe_load(capsys.readouterr().out)
    assert main([*command, "--json"]) == 0
    as_json = json.loads(capsys.readouterr().out)  # one object, nothing else on stdout
    assert as_json == as_yaml
    assert as_json["train"]["num_steps"] == 20  # --set
    assert as_json["model"]["score_threshold"] == 0.05 and as_json["train"]["evaluation"] == "inline"  # defaults


# What Tune keeps of a trial that raised (its error.txt): Ray's traceback, the reason last.
TRIAL_TRACEBACK = """Traceback (most recent call last):
  File "/repo/detsweep/trainables/trial.py", line 79, in run_trial
    raise TrialFailed(reason)
detsweep.trainables.trial.TrialFailed: loss is NaN/Inf at step 2"""


@pytest.mark.parametrize("failure, expected", [
    (TRIAL_TRACEBACK, "loss is NaN/Inf at step 2"),  # a trial's error, read back as text
    (RuntimeError("ray.train.WorkerGroupError: detsweep.train.loop.TrainingDiverged: loss is NaN/Inf at step 7"),
     "loss is NaN/Inf at step 7"),  # Ray's wrappers around a worker's error
    ("ray.exceptions.ActorDiedError: The actor died unexpectedly", "ActorDiedError: The actor died unexpectedly"),
    (None, "no reason given"),
])
def test_a_failure_is_told_by_its_innermost_reason_in_one_line(failure, expected):
    from detsweep.errors import failure_reason

    assert failure_reason(failure) == expected
    if isinstance(failure, str):  # the same as the exception Tune hands over, whose text it is
        wrapped = RuntimeError("the trial failed")
        wrapped.__cause__ = Exception(failure)
        assert failure_reason(wrapped) == expected
