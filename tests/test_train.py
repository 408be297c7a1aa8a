"""Training one trial: the loop in-process (fast), and `detsweep train` through real Ray Train."""

import json
import os
import re
import sys

import numpy as np
import pytest
import tensorflow as tf

from detsweep.config import load_trial_config
from detsweep.data import load_dataset
from detsweep.data.pipeline import decode_and_resize, to_tensors, training_dataset
from detsweep.data.processing import InputSpec, in_original_image
from detsweep.evaluation import evaluate_detections, to_coco_detections
from detsweep.evaluation.metrics import reported_metrics
from detsweep.models import build_model
from detsweep.optim import MovingAverage, build_optimizer
from detsweep.startup import StartupClock
from detsweep.train import TrainingDiverged, WorkerContext, run_training, with_first_report_extras
from detsweep.train.checkpoint import TrainingState, weights_fingerprint
from detsweep.train.restore import load_trained_model

from .conftest import RACCOON, REPO, foreign_lines, run_bounded, run_cli, side_by_side

QUICKSTART = REPO / "configs" / "quickstart.yaml"
# Small and short: 32 training images, 30 steps, eval and checkpoint every 10.
SHORT = [
    "data.train.num_images=32", "data.val.num_images=8", "train.num_steps=30", "train.steps_per_loop=10",
    "train.eval_every=10", "train.checkpoint_every=10", "optimizer.learning_rate.total_steps=30",
    "optimizer.learning_rate.warmup_steps=3", "optimizer.learning_rate.learning_rate_base=0.01",
    "optimizer.learning_rate.warmup_learning_rate=0.001",
]


def short_config(*overrides: str):
    return load_trial_config(QUICKSTART, [*SHORT, *overrides])


class Recorder:
    """A reporter that keeps every report and copies every checkpoint it is shown."""

    def __init__(self, keep_dir=None):
        self.reports, self.checkpoints, self.keep_dir = [], [], keep_dir

    def __call__(self, metrics, checkpoint, milestone, pictures):
        self.reports.append(metrics)
        if checkpoint is not None and self.keep_dir is not None:
            import shutil

            target = self.keep_dir / f"step_{metrics['step']}"
            shutil.copytree(checkpoint, target)
            self.checkpoints.append(target)


def test_loss_goes_down_and_every_loop_is_reported(tmp_path):
    recorder, clock = Recorder(tmp_path), StartupClock()
    run_training(short_config(), with_first_report_extras(recorder, lambda: (clock.metrics(), {})), WorkerContext(startup=clock))
    steps = [report["step"] for report in recorder.reports]
    assert steps == [10, 20, 30]
    assert recorder.reports[-1]["train/loss"] < 0.5 * recorder.reports[0]["train/loss"]
    for key in ("train/box_loss", "train/classification_loss", "train/lr", "train/images_per_sec",
                "eval/AP", "eval/AP50", "eval/AP75", "eval/APs", "eval/APm", "eval/APl", "eval/AR100",
                "eval_ema/AP", "eval_ema/AP50", "eval/AP_best"):
        assert key in recorder.reports[-1], key
    best = recorder.reports[-1]
    assert best["eval/AP_best"] == max(best["eval/AP"], best["eval_ema/AP"])
    # the val set's loss, with the training's loss function: it goes down as the training's does
    first, last = recorder.reports[0], recorder.reports[-1]
    for weights in ("eval", "eval_ema"):
        assert last[f"{weights}/loss"] < 0.75 * first[f"{weights}/loss"], (first[f"{weights}/loss"], last[f"{weights}/loss"])
        assert last[f"{weights}/loss"] == pytest.approx(last[f"{weights}/box_loss"] + last[f"{weights}/classification_loss"])
    assert set(best) - {"step"} == set(reported_metrics(short_config()))  # what a sweep may rank by, exactly
    assert [p.name for p in recorder.checkpoints] == ["step_10", "step_20", "step_30"]
    # The first report says where the start-up time went (the loop marks the phases, the caller
    # adds them); no later one repeats it, and later loops did not move the first loop's mark.
    startup = {key: value for key, value in recorder.reports[0].items() if key.startswith("startup/")}
    assert set(startup) == {f"startup/{phase}_s" for phase in ("strategy", "data", "model", "first_loop", "total")}
    assert min(startup.values()) >= 0 and startup["startup/first_loop_s"] > 0
    assert startup["startup/total_s"] == pytest.approx(sum(startup.values()) - startup["startup/total_s"])
    assert not [key for report in recorder.reports[1:] for key in report if key.startswith("startup/")]
    assert clock.metrics() == startup


def test_restart_from_a_checkpoint_continues_at_its_step_with_its_optimizer_state_on_the_unbroken_runs_batches(tmp_path):
    recorder = Recorder(tmp_path)
    run_training(short_config("train.num_steps=20", "optimizer.learning_rate.total_steps=20"), recorder)
    saved = tmp_path / "step_10"
    resumed = Recorder()
    run_training(short_config("train.num_steps=20", "optimizer.learning_rate.total_steps=20"), resumed,
                 WorkerContext(restore_from=saved))
    assert [r["step"] for r in resumed.reports] == [20]  # one loop: 10 → 20, nothing before
    # it continued from the saved weights (their fingerprint, on its first report), not from new ones
    assert resumed.reports[0]["restore/step"] == 10
    assert resumed.reports[0]["restore/weights_l1"] == pytest.approx(
        weights_fingerprint(load_trained_model(saved).model), rel=1e-12)
    assert not [key for key in recorder.reports[0] if key.startswith("restore/")]  # a fresh start restored nothing
    # and it trained steps 11-20 on the batches the unbroken run trained them on: the same loss
    # (within this process's threads' float noise; the batches of a reseeded pipeline moved it 0.4 %)
    assert resumed.reports[0]["train/loss"] == pytest.approx(recorder.reports[-1]["train/loss"], rel=1e-4)

    # A fresh state restored from the checkpoint holds the saved optimizer slots and step.
    config = short_config()
    model, _ = build_model(config.model, 3)
    optimizer = build_optimizer(config.optimizer)
    optimizer.build(model.trainable_variables)
    state = TrainingState(model, optimizer, MovingAverage.of_model(model, 0.99, True))
    assert state.restore(saved) == 10
    assert int(optimizer.iterations.numpy()) == 10
    reader = tf.train.load_checkpoint(str(saved / "ckpt"))
    slots = [v for v in optimizer.variables if "momentum" in v.path]
    assert len(slots) == len(model.trainable_variables)
    assert any(np.abs(v.numpy()).sum() > 0 for v in slots)
    saved_slots = {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()
                   if name.startswith("optimizer/_variables/")}
    for slot in slots[:5]:
        assert any(value.shape == slot.shape and np.array_equal(value, slot.numpy()) for value in saved_slots.values())


def test_non_finite_loss_stops_the_trial_with_its_step():
    config = short_config("optimizer.learning_rate.learning_rate_base=1e12", "optimizer.learning_rate.warmup_learning_rate=1e12",
                          "train.gradient_clipping_by_norm=0")
    # The first step's loss is the starting weights' (finite); its update at 1e12 makes the next
    # one's infinite: the training stops at step 1, after the one step it trained.
    with pytest.raises(TrainingDiverged, match=r"^loss is NaN/Inf at step 1$"):
        run_training(config, Recorder())


def test_without_moving_average_there_is_no_ema_evaluation():
    recorder = Recorder()
    run_training(short_config("optimizer.use_moving_average=false", "train.num_steps=10",
                              "optimizer.learning_rate.total_steps=10"), recorder)
    final = recorder.reports[-1]
    assert "eval/AP" in final and not any(key.startswith("eval_ema/") for key in final)
    assert final["eval/AP_best"] == final["eval/AP"]


def test_coordinate_round_trip_scores_ap_1(tmp_path):
    """Ground truth through resize (aspect kept) and padding, mapped back by the function exports
    and evaluation share, scores AP = 1; a label of no category and a box outside the image are dropped."""
    from detsweep.config import DatasetConfig

    dataset = load_dataset(DatasetConfig(format="voc", annotations=str(RACCOON / "annotations"),
                                         images=str(RACCOON / "images")), verify=False)
    spec = InputSpec(image_size=160)
    category_ids = [c.id for c in dataset.categories]
    tensors = to_tensors(dataset, 100)
    data = tf.data.Dataset.from_tensor_slices(tensors).map(lambda e: decode_and_resize(e, spec, from_files=True))
    detections = []
    for element in data.map(lambda e: {k: v for k, v in e.items() if k != "image"}).batch(16):
        labels, boxes = element["labels"].numpy(), element["boxes"].numpy()
        counts = (labels >= 0).sum(axis=1)
        # Two more rows on the first image: a label past the categories, and a box left of the image.
        labels[0, counts[0]:counts[0] + 2] = [len(category_ids), 0]
        boxes[0, counts[0]:counts[0] + 2] = [[10, 10, 50, 50], [10, -60, 50, -20]]
        decoded = {"boxes": tf.constant(boxes), "labels": tf.constant(labels), "confidence": tf.ones(labels.shape),
                   "num_detections": tf.constant(counts + np.eye(len(counts), dtype=counts.dtype)[0] * 2)}
        found = in_original_image(decoded, element["scale"], element["image_shape"], category_ids)
        found = {k: v.numpy() for k, v in found.items()}
        np.testing.assert_array_equal(found["num_detections"], counts)
        detections += to_coco_detections(element["image_id"].numpy(), found)
    assert len(detections) == dataset.num_boxes == 217
    metrics = evaluate_detections(dataset.to_coco(), detections)
    assert metrics["AP"] == pytest.approx(1.0) and metrics["AP50"] == pytest.approx(1.0)


def test_workers_read_disjoint_shards():
    dataset = load_dataset(short_config().data.train, verify=False)
    spec = InputSpec(image_size=128)
    config = short_config().data.augmentation
    seen = []
    for index in range(2):
        data = training_dataset(dataset, spec, config, batch_size=4, seed=0, shard=(2, index))
        ids = set()
        for _images, targets in data.take(8):  # 32 images over 4-image batches: each shard repeats after 4
            ids |= {tuple(np.round(b, 3)) for b in targets["boxes"].numpy().reshape(-1, 4) if b[0] >= 0}
        seen.append(ids)
    assert seen[0] and seen[1] and not (seen[0] & seen[1])


def test_the_ap_figures_are_pycocotools_to_1e_6_on_the_same_detections():
    """faster-coco-eval scores the AP figures; pycocotools' COCOeval is the reference, on objects
    of every size, crowd regions, wrong classes, near misses and stray boxes."""
    from detsweep.evaluation.coco import METRIC_NAMES, coco_stats

    rng = np.random.default_rng(7)
    images, annotations, detections = [], [], []
    for image_id in range(1, 121):
        images.append({"id": image_id, "width": 640, "height": 480})
        for _ in range(6):
            x, y, w, h = rng.uniform(0, 500), rng.uniform(0, 380), *rng.uniform(4, 140, 2)
            category = int(rng.integers(1, 6))
            annotations.append({"id": len(annotations) + 1, "image_id": image_id, "category_id": category,
                                "bbox": [x, y, w, h], "area": w * h, "iscrowd": int(rng.random() < 0.05)})
            for _ in range(4):
                guess = category if rng.random() < 0.7 else int(rng.integers(1, 6))
                detections.append({"image_id": image_id, "category_id": guess, "score": float(rng.random()),
                                   "bbox": [x + rng.normal(0, 5), y + rng.normal(0, 5), w * rng.uniform(0.7, 1.3),
                                            h * rng.uniform(0.7, 1.3)]})
        detections += [{"image_id": image_id, "category_id": int(rng.integers(1, 6)), "score": float(rng.random()),
                        "bbox": [*rng.uniform(0, 400, 2), *rng.uniform(2, 200, 2)]} for _ in range(20)]
    truth = {"images": images, "annotations": annotations, "categories": [{"id": c} for c in range(1, 6)]}
    reference = coco_stats(json.loads(json.dumps(truth)), json.loads(json.dumps(detections)), faster=False)
    faster = coco_stats(json.loads(json.dumps(truth)), json.loads(json.dumps(detections)), faster=True)
    assert 0.05 < reference[0] < 0.95 and (reference[3:6] > 0).all()  # something to score, in every size range
    np.testing.assert_allclose(faster, reference, rtol=0, atol=1e-6, err_msg=str(METRIC_NAMES))
    assert evaluate_detections(truth, detections)["AP"] == pytest.approx(reference[0], abs=1e-6)


def test_eval_scores_a_coco_results_file(tmp_path):
    truth = {"images": [{"id": 1, "width": 100, "height": 100}],
             "annotations": [{"id": 1, "image_id": 1, "category_id": 7, "bbox": [10, 10, 30, 30], "area": 900, "iscrowd": 0}],
             "categories": [{"id": 7, "name": "thing"}]}
    (tmp_path / "gt.json").write_text(json.dumps(truth))
    (tmp_path / "dt.json").write_text(json.dumps([{"image_id": 1, "category_id": 7, "bbox": [10, 10, 30, 30], "score": 0.9}]))
    result = run_cli("eval", "--detections", str(tmp_path / "dt.json"), "--annotations", str(tmp_path / "gt.json"), "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["eval/AP"] == pytest.approx(1.0)
    bad = run_cli("eval", "--detections", str(tmp_path / "gt.json"), "--annotations", str(tmp_path / "gt.json"))
    assert bad.returncode == 2 and "expected a COCO results list" in bad.stderr
    # a folder that is no checkpoint: its one line only, found before TensorFlow (and its log lines) load
    nothing = run_cli("eval", "--checkpoint", str(tmp_path))
    assert nothing.returncode == 2 and nothing.stderr.strip().splitlines() == [
        f"detsweep: error: --checkpoint: {tmp_path} is not a detsweep checkpoint (expected config.yaml and ckpt.index in it)"]


LINE = re.compile(r"step (\d+)/(\d+)\s+loss ([\d.]+)")


@pytest.fixture(scope="module")
def ray_train_runs(tmp_path_factory) -> dict:
    """The three trainings below through real Ray Train, two at a time (each is mostly Ray
    Train's start and its waits, and the machine has two cores): ``two_workers`` and
    ``diverges`` (``detsweep train``, each with the folder its storage is under), ``report_flow``."""
    two_workers, diverges = tmp_path_factory.mktemp("two-workers"), tmp_path_factory.mktemp("diverges")
    short = [a for o in SHORT for a in ("--set", o)]
    runs = {
        "two_workers": lambda: run_cli("train", str(QUICKSTART), *short,
                                       "--set", "scaling.num_workers=2", "--storage", str(two_workers / "ray"),
                                       "--name", "w2", "--json"),
        "report_flow": lambda: run_bounded(
            [sys.executable, "-m", "tests.report_flow", *short,
             "--set", "train.steps_per_loop=1", "--set", "train.eval_every=10", "--set", "train.checkpoint_every=0",
             "--set", "train.evaluation=async"],
            cwd=REPO, env={**os.environ, "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "5"}),
        "diverges": lambda: run_cli("train", str(QUICKSTART), *short,
                                    "--set", "train.num_steps=12", "--set", "train.steps_per_loop=1",
                                    "--set", "train.eval_every=12", "--set", "train.checkpoint_every=12",
                                    "--storage", str(diverges / "ray"), "--verbose",
                                    "--set", "optimizer.learning_rate={type: manual_step, initial_learning_rate: 0.01, "
                                                 "schedule: [{step: 4, learning_rate: 1.0e+12}]}"),
    }
    results = dict(zip(runs, side_by_side(list(runs.values()))))
    return {"two_workers": (results["two_workers"], two_workers), "report_flow": results["report_flow"],
            "diverges": (results["diverges"], diverges)}


def test_detsweep_train_on_two_workers_prints_rank_0s_progress_and_its_json_and_its_checkpoint(ray_train_runs):
    """With ``--json`` the object is all of stdout; the progress lines (rank 0's) go to stderr.
    (``detsweep eval`` of a checkpoint scoring what training scored: ``test_export``.)"""
    result, folder = ray_train_runs["two_workers"]
    assert result.returncode == 0, result.stderr[-3000:]
    progress = [(int(m[1]), float(m[3])) for m in LINE.finditer(result.stderr)]
    assert [step for step, _ in progress] == [10, 20, 30]
    assert progress[-1][1] < 0.5 * progress[0][1]
    # where the start-up time went, from the driver's ray.init to the first loop in the workers
    assert re.search(r"first loop after [\d.]+ s: ray [\d.]+, trainer [\d.]+, workers [\d.]+, imports [\d.]+, "
                     r"strategy [\d.]+, data [\d.]+, model [\d.]+, first_loop [\d.]+", result.stderr)
    outcome = json.loads(result.stdout)
    assert outcome["steps"] == 30 and "eval/AP_best" in outcome["metrics"]
    # the console has detsweep's lines only; Ray's, its workers' and TensorFlow's are in the run's log
    assert not foreign_lines(result.stderr), foreign_lines(result.stderr)
    [log] = (folder / "ray" / "w2" / "logs").glob("train.log")
    assert "RayTrainWorker" in log.read_text() and f"logs: {log} " in result.stderr
    # each worker read its own half of the data (disjoint by construction: test_workers_read_disjoint_shards)
    shards = re.findall(r"RayTrainWorker pid=\d+\).* input pipeline (\d) of (\d): (\d+) of (\d+) training images", log.read_text())
    assert sorted(shards) == [("1", "2", "16", "32"), ("2", "2", "16", "32")], shards
    # and the val set's: each worker detects on half, rank 0 scores all (test_train_step.py)
    assert len(re.findall(r"RayTrainWorker pid=\d+\).*: 8 val images evaluated by 2 pipelines, 8 a device a step",
                          log.read_text())) == 2
    # the workers log nothing below a warning: not Ray Train's line per report (a picture's base64 in it)
    assert "Reporting training result" not in log.read_text()
    from detsweep.checkpoints import read_step

    assert read_step(outcome["checkpoint"]) == 30


def test_loops_pass_ray_trains_polls_and_evaluations_beside_training_join_their_checkpoints_steps(ray_train_runs):
    """Ray Train drains one report per poll of its workers; polls are 5 s apart here. Loops of
    one step go to the driver's queue without waiting for a poll: many arrive between two polls.
    Only the milestones pass through Ray Train: with ``train.evaluation: async`` each evaluation
    step saves a checkpoint, which a Ray task of its own evaluates while rank 0 trains on (the
    loops' and the task's clocks on this one machine, not timed), and each evaluation's
    metrics join its checkpoint's step in the merged stream."""
    result = ray_train_runs["report_flow"]
    assert result.returncode == 0, result.stderr[-3000:]
    flow = json.loads(result.stdout.strip().splitlines()[-1])
    loops = [(step, milestone) for kind, step, milestone, *_ in flow["arrived"] if kind == "loop"]
    assert loops == [(step, step % 10 == 0) for step in range(1, 31)]  # each once, in order, from rank 0
    reports = [(step, saved) for kind, step, saved, *_ in flow["arrived"] if kind == "report"]
    assert reports == [(10, True), (20, True), (30, True)]  # every evaluation step checkpointed, though checkpoint_every is 0
    arrived_per_poll = [later - earlier for earlier, later in zip(flow["at_polls"], flow["at_polls"][1:])]
    assert max(arrived_per_poll) >= 6, flow["at_polls"]  # at most 2 (a loop and a report) if it waited

    evaluations = [tuple(item[1:]) for item in flow["arrived"] if item[0] == "evaluation"]
    assert [step for step, *_ in evaluations] == [10, 20, 30]
    # training did not wait for them: the step after each evaluated one was sent before its
    # evaluation ended (often before it started: Ray Train starts it when it takes the report
    # at a poll, while rank 0 trains on)
    at = {item[1]: item[3] for item in flow["arrived"] if item[0] == "loop"}
    assert all(at[step + 1] < ended for step, _, ended in evaluations[:-1]), (at, evaluations)
    assert flow["in_order"] == [[step, step % 10 == 0, step % 10 == 0] for step in range(1, 31)]


def test_detsweep_train_that_diverges_exits_1_with_its_reason_after_every_loop_before_it_and_verbose_shows_ray(
        ray_train_runs):
    """Four good loops of one step, then a learning rate of 1e12: the process says why it
    failed, and each loop before the failure still reached the driver (none is left behind in
    the worker's sender when its training stops). Ray Train did not restart the workers
    (``scaling.max_failures`` is 2): from their checkpoint they would only diverge again.
    ``--verbose``: what Ray and its workers print comes to the console, beside detsweep's
    lines, instead of into a log (the two-worker test above holds the default)."""
    result, folder = ray_train_runs["diverges"]
    assert result.returncode == 1, result.stderr[-3000:]
    # The reason names the global step at which the loss was not finite: steps 1-4 trained at
    # 0.01, step 5 at 1e12 (its loss still the finite one of step 4's weights), and the loss
    # after that update is not finite.
    reason = re.search(r"loss is NaN/Inf at step (\d+)", result.stderr)
    assert reason, result.stderr[-3000:]
    trained = int(reason[1])
    assert trained == 5, result.stderr[-3000:]
    assert "workers failed" not in result.stdout, result.stdout[-3000:]
    assert [int(m[1]) for m in LINE.finditer(result.stdout)] == list(range(1, trained + 1))
    console = result.stdout + result.stderr
    assert "(RayTrainWorker pid=" in console and foreign_lines(result.stdout, result.stderr), console[-3000:]
    assert "logs: " not in console and not list((folder / "ray").glob("*/logs")), console[-3000:]


def test_mixed_float16_trains_with_dynamic_loss_scaling(tmp_path):
    import keras
    import tensorflow as tf

    try:
        recorder = Recorder(tmp_path)
        # float16 on a CPU is emulated: 2 images of 64 px (12 steps: about 40 s here), not the quickstart's 8 of 128 px
        small = ["train.batch_size=2", *(f"{part}.image_size=64" for part in ("model", "data.train", "data.val"))]
        # Keras starts the scale at 2**15, where the first gradients overflow float16: the
        # first steps are skipped, each halving the scale, until one fits and is applied
        run_training(short_config("train.mixed_precision=mixed_float16", "train.num_steps=12", "train.steps_per_loop=12",
                                  "train.checkpoint_every=12", "optimizer.learning_rate.total_steps=12",
                                  "optimizer.learning_rate.warmup_steps=1", "train.eval_every=0", *small), recorder)
        assert keras.mixed_precision.global_policy().name == "mixed_float16"
    finally:
        keras.mixed_precision.set_global_policy("float32")
    final = recorder.reports[-1]
    assert final["step"] == 12 and np.isfinite(final["train/loss"])
    # The optimizer that trained was Keras' LossScaleOptimizer: its dynamic scale is in the checkpoint.
    saved = dict(tf.train.list_variables(str(recorder.checkpoints[-1] / "ckpt")))
    [scale] = [name for name in saved if "dynamic_scale" in name]
    value = tf.train.load_variable(str(recorder.checkpoints[-1] / "ckpt"), scale)
    assert np.isfinite(value) and value >= 1, value
    # Some step was applied (a run whose every step overflowed trains nothing): the inner
    # optimizer counts the updates it made, and the scale halved once for each step skipped.
    ckpt = str(recorder.checkpoints[-1] / "ckpt")
    applied = int(tf.train.load_variable(ckpt, "optimizer/inner_optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE"))
    assert 1 <= applied <= 12 and value == 2.0**15 / 2 ** (12 - applied), (applied, value)


def test_an_async_evaluation_that_fails_ends_the_training_with_its_reason(tmp_path):
    """The evaluation task, in this process: a checkpoint it cannot read is the run's failure,
    with the step and the one-line reason, put on the run's channel (a local queue here) before
    Ray Train hears of the task's error. The merge reading it then ends with the reason, as the RunError that
    ``stream_training`` returns as the training's failure, as it does a diverged training's (the
    diverging tests follow that to a failed trial and to ``detsweep train``'s exit code 1)."""
    import queue

    import ray.train

    from detsweep.config import ScalingConfig
    from detsweep.trainables.channel import Evaluation, RunEnded, RunError, in_step_order
    from detsweep.trainables.evaluator import evaluate_reported

    (tmp_path / "meta.json").write_text(json.dumps({"step": 40, "categories": []}))
    reports = queue.Queue()
    with pytest.raises(Exception, match="not a detsweep checkpoint"):
        evaluate_reported(ray.train.Checkpoint.from_directory(str(tmp_path)), channel=reports, pictures=False,
                          scaling=ScalingConfig())
    reason = f"{tmp_path} is not a detsweep checkpoint (expected config.yaml and ckpt.index in it)"
    [failed] = list(reports.queue)
    assert isinstance(failed, Evaluation) and (failed.step, failed.failure) == (40, reason)
    reports.put(RunEnded())
    with pytest.raises(RunError) as ended:
        list(in_step_order(reports))
    assert str(ended.value) == f"the evaluation of step 40 failed: {reason}"
