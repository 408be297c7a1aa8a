"""What detsweep relies on each of a library's undocumented parts to *do*, one test per name in
``detsweep/adapters/``: a release that changes one fails here, saying which, instead of a sweep
going wrong without a word. ``make upgrade-check`` runs this file against the newest releases."""

from __future__ import annotations

import json
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from .conftest import REPO, cli_environment, run_bounded, side_by_side

pytestmark = pytest.mark.upgrade_check


# --- keras-hub ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def saved_presets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny RetinaNet saved by keras-hub's own ``save_to_preset`` (with its image converter), and
    its image encoder's backbone saved alone."""
    import keras_hub

    from detsweep.models.backbones import build_backbone

    encoder = build_backbone("resnet_tiny")
    backbone = keras_hub.models.RetinaNetBackbone(image_encoder=encoder, min_level=3, max_level=4, use_p5=False)
    anchors = keras_hub.layers.AnchorGenerator("yxyx", min_level=3, max_level=4, num_scales=1, aspect_ratios=[1.0],
                                               anchor_size=2.0)
    converter = keras_hub.layers.RetinaNetImageConverter(image_size=(96, 64), pad_to_aspect_ratio=True,
                                                         crop_to_aspect_ratio=False, scale=1 / 255)
    detector = keras_hub.models.RetinaNetObjectDetector(
        backbone=backbone, num_classes=3, bounding_box_format="yxyx", anchor_generator=anchors,
        pre_logits_num_conv_layers=1, preprocessor=keras_hub.models.RetinaNetObjectDetectorPreprocessor(converter))
    folder = tmp_path_factory.mktemp("presets")
    detector.save_to_preset(str(folder / "detector"))
    encoder.save_to_preset(str(folder / "encoder"))
    return {"detector": folder / "detector", "encoder": folder / "encoder"}


def test_a_preset_keras_hub_saved_reads_back_through_the_adapter(saved_presets):
    import keras_hub

    from detsweep.adapters import keras_hub as hub

    detector, encoder = str(saved_presets["detector"]), str(saved_presets["encoder"])
    assert hub.backbone_class(detector) is keras_hub.models.RetinaNetBackbone
    assert hub.backbone_class(encoder) is keras_hub.models.ResNetBackbone
    assert hub.preset_has_file(detector, hub.TASK_CONFIG_FILE) and not hub.preset_has_file(encoder, hub.TASK_CONFIG_FILE)
    task = hub.preset_json(detector, hub.TASK_CONFIG_FILE)
    assert hub.config_class(task) is keras_hub.models.RetinaNetObjectDetector
    assert task["config"]["num_classes"] == 3 and task["config"]["pre_logits_num_conv_layers"] == 1
    assert hub.preset_json(encoder)["config"]["stackwise_num_filters"][0] == 64  # the backbone's own config
    for name in (hub.CONFIG_FILE, hub.MODEL_WEIGHTS_FILE, hub.TASK_WEIGHTS_FILE):
        assert Path(hub.preset_file(detector, name)) == saved_presets["detector"] / name
    assert hub.preset_has_file(detector, hub.PREPROCESSOR_CONFIG_FILE)
    converter = hub.saved_image_converter(detector, keras_hub.models.RetinaNetObjectDetectorPreprocessor)
    assert tuple(converter.image_size) == (96, 64) and converter.pad_to_aspect_ratio and not converter.crop_to_aspect_ratio
    assert converter.scale == pytest.approx(1 / 255)
    assert keras_hub.models.RetinaNetObjectDetector in hub.subclasses(keras_hub.models.ObjectDetector)
    assert keras_hub.models.RetinaNetObjectDetector not in hub.subclasses(keras_hub.models.Backbone)


def test_a_folder_keras_hub_cannot_read_raises_what_the_driver_turns_into_one_line(tmp_path):
    """``models/presets.py`` catches ``ValueError`` and ``KeyError`` as keras-hub's words for a
    config it cannot read."""
    from detsweep.adapters import keras_hub as hub

    (tmp_path / "config.json").write_text(json.dumps({"module": "nowhere", "class_name": "Nothing", "config": {}}))
    with pytest.raises((ValueError, KeyError)):
        hub.backbone_class(str(tmp_path))


def test_retinanets_label_encoder_codes_a_box_as_computed_by_hand():
    """One 8-pixel anchor per point of a 4 × 4 grid (every 8 pixels from 0) on a 32-pixel image,
    and one box of class 2:
    the anchor it overlaps with IoU 0.57 codes it as centre and size offsets divided by the
    variances (x, y, w, h); an anchor it barely touches is background (-1), none ignored."""
    import keras_hub

    from detsweep.adapters.keras_hub import RetinaNetLabelEncoder

    anchors = keras_hub.layers.AnchorGenerator("yxyx", min_level=3, max_level=3, num_scales=1, aspect_ratios=[1.0],
                                               anchor_size=1.0)
    variance = [0.1, 0.2, 0.25, 0.5]
    encoder = RetinaNetLabelEncoder(anchors, bounding_box_format="yxyx", encoding_format="center_xywh",
                                    box_variance=variance)
    box = np.array([5.0, 12.5, 15.0, 20.5])  # y1 x1 y2 x2: centre (10, 16.5), 10 high, 8 wide
    boxes, classes = encoder(np.zeros((1, 32, 32, 3), "float32"), box[None, None].astype("float32"),
                             np.array([[2]], "float32"))
    boxes, classes = np.asarray(boxes)[0], np.asarray(classes).reshape(-1)
    grid = np.asarray(anchors(np.zeros((1, 32, 32, 3), "float32"))["P3"])
    matched = int(np.flatnonzero(np.all(grid == [4, 12, 12, 20], axis=1))[0])  # the anchor centred at (8, 16)
    expected = [(16.5 - 16) / 8 / variance[0], (10 - 8) / 8 / variance[1], math.log(8 / 8) / variance[2],
                math.log(10 / 8) / variance[3]]
    np.testing.assert_allclose(boxes[matched], expected, rtol=1e-5, atol=1e-6)
    assert classes[matched] == 2
    assert set(np.delete(classes, matched)) == {-1.0}


# --- Keras ----------------------------------------------------------------------------------------

def test_loading_weights_except_some_layers_leaves_them_and_everything_inside_them_as_they_were(tmp_path):
    import keras

    class Head(keras.layers.Layer):  # a layer holding layers, as keras-hub's heads do
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.inner = keras.layers.Dense(3, name="inner")

        def call(self, x):
            return self.inner(x)

    from detsweep.adapters.keras import load_weights_except

    inputs = keras.Input((4,))
    trunk = keras.layers.Dense(4, name="trunk")
    head = Head(name="head")
    model = keras.Model(inputs, head(trunk(inputs)))
    saved = [w.numpy().copy() for w in model.weights]
    model.save_weights(tmp_path / "all.weights.h5")
    for weight in model.weights:
        weight.assign(weight.numpy() + 1.0)
    load_weights_except(model, tmp_path / "all.weights.h5", kept=[head])
    np.testing.assert_array_equal(trunk.kernel.numpy(), saved[0])
    np.testing.assert_array_equal(head.inner.kernel.numpy(), saved[2] + 1.0)


# --- MLflow ---------------------------------------------------------------------------------------

def test_mlflow_gc_in_process_deletes_a_deleted_runs_record_and_files_and_keeps_the_rest(tmp_path):
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    from detsweep.adapters.mlflow import collect_garbage

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = client.create_experiment("gc", artifact_location=(tmp_path / "artifacts").as_uri())
    gone, kept = (client.create_run(experiment).info for _ in range(2))
    for run in (gone, kept):
        client.log_text(run.run_id, "weights", "checkpoint/model.txt")
    client.delete_run(gone.run_id)
    collect_garbage(uri, uri)
    with pytest.raises(MlflowException):
        client.get_run(gone.run_id)
    assert not [path for path in (tmp_path / "artifacts" / gone.run_id).rglob("*") if path.is_file()]
    assert (tmp_path / "artifacts" / kept.run_id / "artifacts" / "checkpoint" / "model.txt").read_text() == "weights"


def test_system_metrics_of_a_node_go_to_a_run_another_process_opened_and_leave_it_running(tmp_path, monkeypatch):
    from mlflow import MlflowClient

    from detsweep.adapters.mlflow import start_system_metrics

    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "0.2")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    run = client.create_run(client.create_experiment("metrics")).info
    monitor = start_system_metrics(run.run_id, uri, node_id="node1")
    deadline = time.monotonic() + 30
    while not client.get_run(run.run_id).data.metrics and time.monotonic() < deadline:
        time.sleep(0.2)
    monitor.finish()
    found = client.get_run(run.run_id)
    assert "system/node1/cpu_utilization_percentage" in found.data.metrics, sorted(found.data.metrics)
    assert all(key.startswith("system/node1/") for key in found.data.metrics)
    assert found.info.status == "RUNNING"
    # a sample at once and one at the end: a trial killed (stopped by its scheduler) or ended
    # within the first interval has its node's figures all the same
    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "60")
    short = client.create_run(client.create_experiment("short")).info
    monitor = start_system_metrics(short.run_id, uri)
    assert len(client.get_metric_history(short.run_id, "system/cpu_utilization_percentage")) == 1
    monitor.finish()
    assert len(client.get_metric_history(short.run_id, "system/cpu_utilization_percentage")) == 2


# --- Ray ------------------------------------------------------------------------------------------

def test_ray_trains_settings_are_the_users_where_set_and_the_preemption_watcher_only_off_on_one_machine(monkeypatch):
    from detsweep.adapters.ray import (
        HIDE_GPUS_ON_ZERO,
        POLL_INTERVAL,
        PREEMPTION_WATCHER,
        START_TIMEOUT,
        train_environment,
    )

    monkeypatch.setenv(START_TIMEOUT, "99")
    local, cluster = train_environment(local=True), train_environment(local=False)
    assert local[START_TIMEOUT] == "99" and local[POLL_INTERVAL] == "0.5" and local[PREEMPTION_WATCHER] == "0"
    assert PREEMPTION_WATCHER not in cluster
    assert local[HIDE_GPUS_ON_ZERO] == cluster[HIDE_GPUS_ON_ZERO] == "1"  # what it does: tests/test_gpu_resources.py


RAY_TRAIN_PROBE = """
import builtins, json, os, sys, time

import ray, ray.train
from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer
from ray.util.state import list_actors

from detsweep.adapters.ray import HEAD_NODE_RESOURCE, POLL_INTERVAL, START_TIMEOUT
from detsweep.cluster import connect

def train(config):
    gaps, last = [], time.monotonic()
    for step in range(5):
        ray.train.report({"step": step})  # waits while the last report is not yet polled
        now = time.monotonic()
        gaps.append(now - last)
        last = now
    with open(config["out"], "w") as out:
        json.dump({"gaps": gaps, "print": builtins.print.__module__, "nice": os.nice(0)}, out)

connect()
out = os.path.join(sys.argv[1], "worker.json")
DataParallelTrainer(train, train_loop_config={"out": out}, scaling_config=ray.train.ScalingConfig(num_workers=1),
                    run_config=ray.train.RunConfig(storage_path=sys.argv[1], name="probe")).fit()
found = json.load(open(out))
here = ray.get_runtime_context().gcs_address  # other clusters may run on this machine
found["watchers"] = len(list_actors(here, filters=[("class_name", "=", "PreemptionWatcher")]))
[controller] = list_actors(here, filters=[("class_name", "=", "TrainController")])
environ = dict(line.split("=", 1) for line in open(f"/proc/{controller.pid}/environ").read().split("\\0") if "=" in line)
found["controller_start_timeout"] = environ.get(START_TIMEOUT)
found["controller_poll_interval"] = environ.get(POLL_INTERVAL)
found["head_resource"] = ray.cluster_resources().get(HEAD_NODE_RESOURCE)
print(json.dumps(found))
"""


def test_ray_train_polls_fast_patches_no_print_waits_long_for_workers_and_starts_no_preemption_watcher(tmp_path):
    """One Ray Train run under ``connect``'s settings: the controller (an actor of the job
    ``connect`` starts) reads detsweep's poll interval, and reports are taken every 0.5 s, not
    2 s (a worker's report waits for the last one's poll: README, *Reports: why two
    channels*); a user's own value wins (the test above; ``test_train``'s report-flow test sets
    5 s and counts on it). A worker's ``print`` is Python's; the
    worker runs at nice 0, not Ray's 15; the controller has 1800 s for its workers to start; no
    preemption watcher on one machine; and the head node's own resource is there for the trials'
    processes."""
    from ray._private import ray_constants
    from ray.train.v2._internal import constants

    from detsweep.adapters import ray as adapter

    assert (constants.HEALTH_CHECK_INTERVAL_S_ENV_VAR, constants.WORKER_GROUP_START_TIMEOUT_S_ENV_VAR,
            constants.ENABLE_PRINT_PATCH_ENV_VAR, constants.ENABLE_PREEMPTION_WATCHER_ENV_VAR) == (
        adapter.POLL_INTERVAL, adapter.START_TIMEOUT, adapter.PRINT_PATCH, adapter.PREEMPTION_WATCHER)
    assert ray_constants.RAY_WORKER_NICENESS == adapter.WORKER_NICENESS
    from ray._private import accelerators

    assert accelerators.RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO_ENV_VAR == adapter.HIDE_GPUS_ON_ZERO
    env = {name: value for name, value in cli_environment().items() if not name.startswith("RAY_TRAIN_")}
    result = run_bounded([sys.executable, "-c", RAY_TRAIN_PROBE, str(tmp_path)], cwd=REPO, env=env, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.splitlines()[-1])
    assert found["controller_poll_interval"] == "0.5"
    assert statistics.median(found["gaps"][1:]) < 1.2, found["gaps"]
    assert found["print"] == "builtins"
    assert found["nice"] == 0
    assert found["controller_start_timeout"] == "1800"
    assert found["watchers"] == 0
    assert found["head_resource"] == 1.0
def test_tunes_result_files_keep_the_rows_a_trial_reported_since_the_last_copy_to_storage_when_it_starts_again(ray_driver, tmp_path):
    """Tune's result files (``result.json``, ``progress.csv``) are staged on the driver and
    copied to storage now and then. A trial with a checkpoint that starts again in the same
    driver (after a pause, an exploit) keeps the staged rows, not storage's older copy; in a
    new driver (``resume``) the stored rows are all there are, and they are copied back."""
    import csv
    import shutil

    from ray import tune
    from ray.train._internal.session import _TrainingResult
    from ray.train._internal.storage import StorageContext
    from ray.tune.experiment import Trial

    from detsweep.adapters.ray import result_files

    storage = StorageContext(str(tmp_path / "stored"), "sweep", trial_dir_name="trial_a")
    trial = Trial("__fake", stub=True, storage=storage, trial_id="a", config={})
    trial.relative_logdir = trial.storage.trial_dir_name  # as a sweep's trial_dirname_creator names it

    def start(callbacks: list, trial: Trial) -> list:
        trial.init_local_path()  # as Tune does before it starts a trial
        for callback in callbacks:
            callback.log_trial_start(trial)
        return callbacks

    def report(callbacks: list, trial: Trial, step: int) -> None:
        for callback in callbacks:
            callback.log_trial_result(step // 10, trial, {"step": step, "train/loss": 1 / step})

    def steps_in(folder: Path) -> tuple[list[int], list[int]]:
        with open(folder / "progress.csv") as progress:
            return ([json.loads(line)["step"] for line in (folder / "result.json").read_text().splitlines()],
                    [int(row["step"]) for row in csv.DictReader(progress)])

    driver = start(result_files(), trial)
    staged, stored = Path(trial.local_path), Path(trial.storage.trial_fs_path)
    report(driver, trial, 10)
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    trial.on_checkpoint(_TrainingResult(checkpoint=tune.Checkpoint.from_directory(checkpoint), metrics={"step": 10}))
    shutil.copytree(staged, stored)  # Tune's copy to storage, between two reports
    report(driver, trial, 20)
    start(driver, trial)  # the trial goes on from its checkpoint
    report(driver, trial, 30)
    assert steps_in(staged) == ([10, 20, 30], [10, 20, 30])

    shutil.copytree(staged, stored, dirs_exist_ok=True)
    shutil.rmtree(staged)
    restored = Trial("__fake", stub=True, storage=storage, trial_id="a", config={})  # a new driver's
    restored.relative_logdir = trial.relative_logdir
    restored.on_checkpoint(_TrainingResult(checkpoint=tune.Checkpoint.from_directory(checkpoint), metrics={"step": 30}))
    assert Path(restored.local_path) == staged
    report(start(result_files(), restored), restored, 40)
    assert steps_in(staged) == ([10, 20, 30, 40], [10, 20, 30, 40])


def test_tunes_trials_are_tagged_with_the_count_they_were_created_in_by_either_generator(tmp_path):
    """The schedulers place restored trials in the order Tune created them (its random and grid
    generator counts from 0, a searcher's from 1)."""
    from ray import tune
    from ray.tune.experiment import Experiment
    from ray.tune.search import BasicVariantGenerator
    from ray.tune.search.bohb import TuneBOHB
    from ray.tune.search.search_generator import SearchGenerator

    from detsweep.adapters.ray import creation_order

    def probe(config: dict) -> None:
        """Never run: the trials are only created."""

    space = {"x": tune.uniform(0, 1)}
    bohb = TuneBOHB(metric="m", mode="max", seed=0)
    bohb.set_search_properties("m", "max", space)
    for generator, first in ((BasicVariantGenerator(random_state=0), 0), (SearchGenerator(bohb), 1)):
        generator.add_configurations([Experiment("e", probe, config=space, num_samples=4, storage_path=str(tmp_path))])
        trials = [generator.next_trial() for _ in range(4)]
        assert [creation_order(trial) for trial in trials] == list(range(first, first + 4)), trials


TUNE_PAUSE_THEN_STOP = """
import glob, json, os, sys, time

import ray
from ray import tune
from ray.tune.experiment import Trial
from ray.tune.schedulers import FIFOScheduler

from detsweep.adapters.ray import save_stopped_trial

def train(config):
    for _ in range(4):
        time.sleep(0.5)
        tune.report({"score": 1.0})

class PauseThenStop(FIFOScheduler):
    '''Pauses trial 0 at its second report; stops it, paused, at trial 1's second report.'''

    def __init__(self, saves):
        super().__init__()
        self.saves = saves

    def on_trial_result(self, controller, trial, result):
        if result["training_iteration"] == 2:
            if trial.config["id"] == 0:
                return self.PAUSE
            time.sleep(1.5)  # Tune saves the experiment's state (every second here) with trial 0 PAUSED
            for other in controller.get_trials():
                if other.status == Trial.PAUSED:
                    controller.stop_trial(other)
        return self.CONTINUE

    def on_trial_remove(self, controller, trial):
        if self.saves and trial.status == Trial.PAUSED:
            save_stopped_trial(controller, trial)

    def choose_trial_to_run(self, controller):
        return next((t for t in controller.get_trials() if t.status == Trial.PENDING), None)

ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
saves = sys.argv[2] == "saves"
name = f"saves-{saves}"
tune.Tuner(train, param_space={"id": tune.grid_search([0, 1])},
           tune_config=tune.TuneConfig(scheduler=PauseThenStop(saves)),
           run_config=tune.RunConfig(name=name, storage_path=sys.argv[1], verbose=0)).fit()
[state] = sorted(glob.glob(os.path.join(sys.argv[1], name, "experiment_state-*.json")))[-1:]
trials = [json.loads(trial) for trial, _ in json.load(open(state))["trial_data"]]
print(json.dumps({name: {trial["config"]["id"]: trial["status"] for trial in trials}}))
"""


def test_a_trial_stopped_while_paused_is_saved_terminated_only_through_the_adapter(tmp_path):
    """Tune (2.60) writes a trial stopped while paused to the experiment's saved state only
    when told to: without it the state keeps it PAUSED in a finished sweep (and a resume trains
    it again); this test sees both, so it also says when a release no longer needs the call."""
    env = {**cli_environment(), "TUNE_GLOBAL_CHECKPOINT_S": "1"}
    found = {}
    for result in side_by_side([  # each its own local cluster: Tune waits on its trials' clocks, not the CPU
            lambda saves=saves: run_bounded([sys.executable, "-c", TUNE_PAUSE_THEN_STOP, str(tmp_path), saves],
                                            cwd=REPO, env=env, timeout=240) for saves in ("no-save", "saves")]):
        assert result.returncode == 0, result.stderr[-3000:]
        found.update(json.loads(result.stdout.splitlines()[-1]))
    assert found == {"saves-False": {"0": "PAUSED", "1": "TERMINATED"},
                     "saves-True": {"0": "TERMINATED", "1": "TERMINATED"}}, found


def test_tflite_calibrates_then_quantizes_as_two_steps_with_named_tensors_left_float():
    """``adapters.tflite``: the converter's calibration alone gives a float model with measured
    ranges (the flag restored after); quantizing it makes int8 what has ranges, but the tensors
    named float."""
    import numpy as np
    import tensorflow as tf
    from ai_edge_litert import schema_py_generated as schema

    from detsweep.adapters.tflite import calibrated, quantized

    class Two(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([1, 8], tf.float32)])
        def __call__(self, x):
            first = tf.nn.relu(tf.matmul(x, tf.ones([8, 8]) * 0.1, name="first"))
            return tf.matmul(first, tf.ones([8, 4]) * 0.2, name="second")

    module = Two()
    converter = tf.lite.TFLiteConverter.from_concrete_functions([module.__call__.get_concrete_function()], module)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = lambda: ([np.random.default_rng(i).random((1, 8), np.float32)] for i in range(8))
    measured = calibrated(converter)
    assert converter._experimental_calibrate_only is False
    graph = schema.ModelT.InitFromPackedBuf(measured, 0).subgraphs[0]
    ranged = {t.name.decode() for t in graph.tensors if t.quantization is not None and t.quantization.min is not None}
    assert all(t.type == schema.TensorType.FLOAT32 for t in graph.tensors) and ranged

    def outputs(model: bytes) -> list[tuple[str, int]]:
        """Each fully connected operation's output: its type."""
        parsed = schema.ModelT.InitFromPackedBuf(model, 0)
        graph = parsed.subgraphs[0]
        return [graph.tensors[op.outputs[0]].type for op in graph.operators
                if parsed.operatorCodes[op.opcodeIndex].builtinCode == schema.BuiltinOperator.FULLY_CONNECTED]

    int8, float32 = schema.TensorType.INT8, schema.TensorType.FLOAT32
    assert outputs(quantized(measured)) == [int8, int8]
    last = next(t.name.decode() for t in graph.tensors if t.name.decode().startswith("PartitionedCall"))
    assert outputs(quantized(measured, float_nodes=[last])) == [int8, float32]
    assert outputs(quantized(measured, float_ops=["FULLY_CONNECTED"])) == [float32, float32]
