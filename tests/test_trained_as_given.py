"""Every trial trains what it was given. Ultralytics' Ray Tune integration trained every trial
alike for months because the sampled values never reached the trainer (ultralytics#23791); here
a training reads back, from the objects it built, the optimizer, schedule, moving average and
augmentations it trains with (``train/trained_with.py``), its first report carries them to its
MLflow run as ``trained_with.json``, and a trial whose sampled values they do not hold fails at
its start with one line. All in this process: no Ray cluster, no sweep."""

from __future__ import annotations

import json
import queue
from pathlib import Path

import keras
import pytest
import ray.train

from detsweep.config import LearningRateConfig, OptimizerConfig, TrialConfig, load_trial_config
from detsweep.config.loader import get_path, set_path
from detsweep.data.augment import Augmentations, build_augmentations
from detsweep.errors import failure_reason
from detsweep.optim import build_optimizer, build_schedule
from detsweep.train import NotAsSampled, WorkerContext, run_training
from detsweep.train.checkpoint import build_training_state
from detsweep.train.trained_with import TRAINED_WITH_FILE, check_as_sampled, trained_with
from detsweep.trainables.channel import RayReport, RunEnded, RunError, in_step_order
from detsweep.trainables.request import TrainingRequest

from .conftest import REPO

QUICKSTART = REPO / "configs" / "quickstart.yaml"
# A few steps on a few images, no evaluation: what a test trains when it trains at all.
TINY = ["data.train.num_images=16", "data.val=null", "train.batch_size=4", "train.num_steps=4",
        "train.steps_per_loop=2", "train.eval_every=0", "train.checkpoint_every=0",
        "optimizer.learning_rate.total_steps=4", "optimizer.learning_rate.warmup_steps=1"]

OPTIMIZER_FIELDS = {"optimizer.type", "train.gradient_clipping_by_norm"}
AVERAGE_FIELDS = {"optimizer.use_moving_average", "optimizer.moving_average_decay",
                  "optimizer.moving_average_dynamic_decay"}
# Each config: its overrides on the quickstart, and the optimizer's and schedule's paths read back.
CONFIGS = {
    "momentum, cosine, dynamic average, flip and crop": (
        ["optimizer.momentum_optimizer_value=0.95", "optimizer.moving_average_decay=0.995",
         "data.augmentation.random_crop_image={min_area: 0.3, random_coef: 0.25}"],
        OPTIMIZER_FIELDS | {"optimizer.momentum_optimizer_value"} | AVERAGE_FIELDS,
        {"type", "learning_rate_base", "total_steps", "warmup_learning_rate", "warmup_steps", "hold_base_rate_steps"}),
    "sgd, constant, no average, no augmentation": (
        ["optimizer.type=sgd", "optimizer.learning_rate.type=constant", "optimizer.learning_rate.learning_rate=0.01",
         "optimizer.use_moving_average=false", "data.augmentation={}", "train.gradient_clipping_by_norm=0"],
        OPTIMIZER_FIELDS | {"optimizer.use_moving_average"},
        {"type", "learning_rate"}),
    "adam, exponential decay burning in at the base rate, colour steps": (
        ["optimizer.type=adam", "optimizer.epsilon=1e-6", "optimizer.learning_rate.type=exponential_decay",
         "optimizer.learning_rate.initial_learning_rate=0.03", "optimizer.learning_rate.burnin_steps=5",
         "optimizer.learning_rate.decay_factor=0.5", "optimizer.moving_average_dynamic_decay=false",
         "data.augmentation.random_adjust_brightness={max_delta: 0.1}", "data.augmentation.random_adjust_contrast={}",
         "data.augmentation.random_adjust_hue={max_delta: 0.05}", "data.augmentation.random_adjust_saturation={}"],
        OPTIMIZER_FIELDS | {"optimizer.epsilon"} | AVERAGE_FIELDS,
        {"type", "initial_learning_rate", "decay_steps", "decay_factor", "staircase", "burnin_learning_rate",
         "burnin_steps", "min_learning_rate"}),
    "adamw, manual steps with warm-up, square crop, pad and jitter in an order": (
        ["optimizer.type=adamw", "optimizer.weight_decay=0.01", "optimizer.learning_rate.type=manual_step",
         "optimizer.learning_rate.initial_learning_rate=0.02", "optimizer.learning_rate.warmup=true",
         "optimizer.learning_rate.schedule=[{step: 10, learning_rate: 0.04}, {step: 50, learning_rate: 0.004}]",
         "data.augmentation.random_square_crop_by_scale={scale_min: 0.8}",
         "data.augmentation.random_absolute_pad_image={max_height_padding: 20, pad_color: [0, 10, 200]}",
         "data.augmentation.random_scale_crop_and_pad_to_square={scale_min: 0.5, scale_max: 1.5}",
         "data.augmentation.order=[random_horizontal_flip, random_absolute_pad_image]"],
        OPTIMIZER_FIELDS | {"optimizer.epsilon", "optimizer.weight_decay"} | AVERAGE_FIELDS,
        {"type", "initial_learning_rate", "schedule", "warmup"}),
    "rms_prop inside float16 loss scaling": (
        ["optimizer.type=rms_prop", "optimizer.decay=0.8", "optimizer.momentum_optimizer_value=0.5",
         "train.mixed_precision=mixed_float16"],
        OPTIMIZER_FIELDS | {"optimizer.decay", "optimizer.momentum_optimizer_value", "optimizer.epsilon"} | AVERAGE_FIELDS,
        {"type", "learning_rate_base", "total_steps", "warmup_learning_rate", "warmup_steps", "hold_base_rate_steps"}),
}


def built_as_training_builds(config: TrialConfig, monkeypatch) -> dict:
    """What ``build_training_state`` and the pipeline build for ``config``, read back; a one-layer
    model stands in for the detector (the moving average needs weights, not a RetinaNet)."""
    def stand_in(model, num_classes):
        return keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)]), None

    monkeypatch.setattr("detsweep.train.checkpoint.build_model", stand_in)
    state, _ = build_training_state(config, 3)
    return trained_with(state.optimizer, state.moving_average, build_augmentations(config.data.augmentation), 1)


@pytest.mark.parametrize("name", CONFIGS)
def test_what_is_read_back_from_the_built_objects_is_the_config(name, monkeypatch):
    """Each optimizer type, schedule type, average on and off, and every augmentation: the
    read-back holds the config's value at each of its paths, and exactly the paths the built
    types use (another type's fields do not apply to them)."""
    overrides, optimizer_paths, schedule_fields = CONFIGS[name]
    config = load_trial_config(QUICKSTART, overrides)
    built = built_as_training_builds(config, monkeypatch)
    tree = config.model_dump()
    check_as_sampled({path: get_path(tree, path) for path in built}, built)  # raises on any difference
    assert {path for path in built if path.startswith(("optimizer.", "train.")) and ".learning_rate." not in path} \
        == optimizer_paths
    assert {path.removeprefix("optimizer.learning_rate.") for path in built if ".learning_rate." in path} \
        == schedule_fields
    steps = {path.split(".")[2] for path in built if path.startswith("data.augmentation.")}
    assert steps == set(tree["data"]["augmentation"]) - {"order"}  # every augmentation, on or off


def test_the_read_back_names_what_differs_in_one_line_and_leaves_the_unused_alone(monkeypatch):
    config = load_trial_config(QUICKSTART, ["data.augmentation.random_crop_image={}"])
    built = built_as_training_builds(config, monkeypatch)
    # What the config's names allow: aliases, a whole section, a step on with its defaults; a
    # sampled field no built object holds (the network, the other schedules') is not compared.
    check_as_sampled({"optimizer.type": "momentum_optimizer", "optimizer.learning_rate.schedule": "cosine_decay",
                      "optimizer.learning_rate": {"learning_rate_base": 0.04, "warmup_learning_rate": 0.004},
                      "data.augmentation.random_crop_image": {}, "optimizer.epsilon": 0.5, "model.anchor_size": 9,
                      "optimizer.learning_rate.initial_learning_rate": 0.5, "train.num_steps": 7}, built)
    with pytest.raises(NotAsSampled) as raised:
        check_as_sampled({"optimizer.moving_average_decay": 0.9, "data.augmentation.random_adjust_hue.max_delta": 0.1,
                          "data.augmentation.random_crop_image": None, "optimizer.learning_rate.warmup_steps": 30,
                          "optimizer.type": "adam"}, built)
    assert str(raised.value) == (
        "optimizer.moving_average_decay: sampled 0.9, but the trial built 0.99 (MovingAverage decay); "
        "data.augmentation.random_adjust_hue.max_delta: sampled 0.1, but the trial built None "
        "(no random_adjust_hue step in the pipeline); "
        "data.augmentation.random_crop_image: sampled None, but the trial built a mapping "
        "(the pipeline's random_crop_image step); "
        "optimizer.type: sampled 'adam', but the trial built 'momentum' (SGD)")
    # An epsilon left unset is the OD API's default of the type (Adam: 1e-8, not Keras's 1e-7).
    adam = trained_with(build_optimizer(OptimizerConfig(type="adam")), None, Augmentations(), 1)
    check_as_sampled({"optimizer.type": "adam_optimizer", "optimizer.epsilon": None}, adam)


def test_a_float32_rate_and_a_clipping_norm_shared_by_replicas_read_back_as_configured():
    """A rate held in a float32 variable reads 0.004 back as 0.004000000189989805: within the
    tolerance. Each of 4 replicas clips at a quarter of the norm: together, at the norm."""
    config = load_trial_config(QUICKSTART, ["optimizer.learning_rate.type=constant",
                                            "optimizer.learning_rate.learning_rate=0.004"])
    fixed = build_optimizer(config.optimizer, clip_norm=10.0, replicas=4,
                            schedule=config.optimizer.learning_rate.learning_rate)
    built = trained_with(fixed, None, build_augmentations(config.data.augmentation), replicas=4)
    assert built["optimizer.learning_rate.learning_rate"].value != 0.004
    check_as_sampled({"optimizer.learning_rate.type": "constant", "optimizer.learning_rate.learning_rate": 0.004,
                      "train.gradient_clipping_by_norm": 10.0, "optimizer.use_moving_average": False}, built)


def test_a_sweeps_trial_asks_its_workers_for_what_tune_sampled(monkeypatch):
    """The trial's request carries the values Tune drew for it, which its workers hold what they
    build to; what a training builds from the trial's config holds them."""
    from detsweep.startup import StartupClock
    from detsweep.sweeps.spec import load_sweep
    from detsweep.sweeps.tuner import param_space
    from detsweep.tracking import RunLink
    from detsweep.trainables.trial import training_request, trial_config

    tune_config = param_space(load_sweep(REPO / "sweeps" / "quickstart.yaml"), RunLink("sqlite:///unused.db", "0", None))
    drawn = {"optimizer.learning_rate.learning_rate_base": 0.045, "optimizer.moving_average_decay": 0.995}
    assert tune_config["search"]["swept"] == list(drawn)
    for path, value in drawn.items():  # in place of the Tune domains there, as Tune hands them to the trial
        set_path(tune_config["trial"], path, value)
    config = trial_config(tune_config)
    request = training_request(tune_config, config, "run", None, StartupClock())
    assert request.sampled == drawn
    check_as_sampled(request.sampled, built_as_training_builds(request.config, monkeypatch))


def drop_momentum(monkeypatch) -> None:
    """Breaks the application of momentum: the optimizer gets the default's."""
    monkeypatch.setattr("detsweep.train.checkpoint.build_optimizer", lambda config, **given: build_optimizer(
        config.model_copy(update={"momentum_optimizer_value": 0.9}), **given))


def drop_base_rate(monkeypatch) -> None:
    """Breaks the application of the cosine schedule's base rate: the schedule gets the default's."""
    monkeypatch.setattr("detsweep.train.checkpoint.build_schedule", lambda config: build_schedule(
        config.model_copy(update={"learning_rate_base": LearningRateConfig().learning_rate_base})))


def drop_flip(monkeypatch) -> None:
    """Breaks the application of the flip: the pipeline builds none."""
    monkeypatch.setattr("detsweep.train.loop.build_augmentations", lambda augmentation: build_augmentations(
        augmentation.model_copy(update={"random_horizontal_flip": 0.0})))


BREAKS = {
    "momentum": (drop_momentum, ["optimizer.momentum_optimizer_value=0.95"],
                 {"optimizer.type": "momentum", "optimizer.momentum_optimizer_value": 0.95},
                 "optimizer.momentum_optimizer_value: sampled 0.95, but the trial built 0.9 (SGD momentum)"),
    "base rate": (drop_base_rate, ["optimizer.learning_rate.learning_rate_base=0.03"],
                  {"optimizer.learning_rate.learning_rate_base": 0.03},
                  "optimizer.learning_rate.learning_rate_base: sampled 0.03, but the trial built 0.002 "
                  "(CosineDecayWithWarmup learning_rate_base)"),
    "flip": (drop_flip, ["data.augmentation.random_horizontal_flip=0.5"],
             {"data.augmentation.random_horizontal_flip": 0.5},
             "data.augmentation.random_horizontal_flip: sampled 0.5, but the trial built 0.0 "
             "(no random_horizontal_flip step in the pipeline)"),
}


@pytest.mark.parametrize("swept", BREAKS)
def test_a_training_whose_sampled_value_was_not_applied_fails_before_its_first_step(swept, monkeypatch):
    breaks, overrides, sampled, line = BREAKS[swept]
    breaks(monkeypatch)
    reports = []
    with pytest.raises(NotAsSampled) as raised:
        run_training(load_trial_config(QUICKSTART, [*TINY, *overrides]), lambda *report: reports.append(report),
                     WorkerContext(sampled=sampled))
    assert str(raised.value) == line
    assert reports == []  # not one step trained


class OneWorker:
    """Ray Train's context of a trial's only worker, for the worker's function called in this process."""

    def get_world_rank(self) -> int:
        return 0

    def get_local_rank(self) -> int:
        return 0


def run_worker(config: TrialConfig, sampled: dict, monkeypatch) -> queue.Queue:
    """``train_loop_per_worker`` as Ray Train runs it, here: its channel a local queue, and Ray
    Train's reports put there as ``ForwardReports`` puts them (without their checkpoints)."""
    from detsweep.trainables import worker

    channel: queue.Queue = queue.Queue()
    monkeypatch.setattr(ray.train, "get_context", OneWorker)
    monkeypatch.setattr(ray.train, "get_checkpoint", lambda: None)
    monkeypatch.setattr(ray.train, "report", lambda metrics, checkpoint=None, validation=False: channel.put(
        RayReport(int(metrics["step"]), metrics, None)))
    monkeypatch.setattr(worker, "quiet_info_logging", lambda: None)  # this process's loggers stay as they are
    worker.train_loop_per_worker({"request": TrainingRequest(config, "run", sampled=sampled), "channel": channel})
    channel.put(RunEnded())  # the worker returned: Ray Train ends the run
    return channel


def test_the_worker_ends_its_run_at_the_start_with_the_one_line_and_ray_train_sees_no_failure(monkeypatch):
    """As a worker whose devices are not as sized: the reason goes down the channel marked
    ``at_start``, the worker returns (Ray Train has nothing to restart), and the run's owner
    raises it at once: the trial's error is that line."""
    from detsweep.trainables.trial import TrialFailed

    breaks, overrides, sampled, line = BREAKS["momentum"]
    breaks(monkeypatch)
    channel = run_worker(load_trial_config(QUICKSTART, [*TINY, *overrides]), sampled, monkeypatch)
    with pytest.raises(RunError) as raised:
        list(in_step_order(channel))
    assert str(raised.value) == line
    assert failure_reason(TrialFailed(str(raised.value))) == line  # as progress lines and `status` show it


def test_what_a_training_built_reaches_its_mlflow_run_once(tmp_path, monkeypatch):
    """A training as given trains, and its first report, through the worker and the channel's
    merge, puts ``trained_with.json`` on the trial's run: the config's values, read back."""
    from mlflow import MlflowClient

    from detsweep.tracking import RunLink, TrialIdentity, TrialRun

    config = load_trial_config(QUICKSTART, [*TINY, "optimizer.momentum_optimizer_value=0.95"])
    sampled = {"optimizer.momentum_optimizer_value": 0.95, "optimizer.learning_rate.learning_rate_base": 0.04}
    channel = run_worker(config, sampled, monkeypatch)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    run = TrialRun(RunLink(uri, client.create_experiment("trained-as-given"), None),
                   TrialIdentity("t_00000", "trial_t_00000", sampled), config)
    files = []
    for report in in_step_order(channel):
        files.append(sorted(report.pictures))
        run.log_report(report.metrics, report.checkpoint, report.pictures)
    run.finish()
    assert files == [[TRAINED_WITH_FILE], []]  # two loops; the first carries it
    logged = json.loads(Path(client.download_artifacts(run.run_id, TRAINED_WITH_FILE, str(tmp_path))).read_text())
    assert logged["optimizer.momentum_optimizer_value"] == 0.95
    assert logged["optimizer.learning_rate.type"] == "cosine" and logged["optimizer.moving_average_decay"] == 0.99
    assert logged["data.augmentation.random_horizontal_flip"] == 0.5 and logged["train.gradient_clipping_by_norm"] == 10
    tree = config.model_dump(mode="json")
    assert logged == {path: get_path(tree, path) for path in logged}
