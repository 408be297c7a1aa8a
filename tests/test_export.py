"""``detsweep export`` and ``detsweep predict`` on a real checkpoint (the session's trained
sweep's, which the fine-tuning tests start from too): the SavedModel and the TFLite model
detect what the checkpoint detects, and score the AP that training's evaluation scores."""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from detsweep.checkpoints import read_step
from detsweep.config import load_trial_config
from detsweep.data import DetectionSet, Example, load_dataset
from detsweep.data.processing import InputSpec
from detsweep.errors import DetsweepError
from detsweep.evaluation import evaluate_detections
from detsweep.evaluation.pictures import read_image
from detsweep.export.commands import add_export_commands
from detsweep.export.saved_model import SIGNATURE, export_saved_model
from detsweep.export.serving_cost import tflite_runner
from detsweep.train.checkpoint import CONFIG_FILE
from detsweep.train.evaluate import Evaluator
from detsweep.train.restore import load_trained_model

from .conftest import RACCOON, changed_pixels
from .reference_detections import assert_same_detections, detected_by_hand

STEPS = 150  # conftest.trained_sweep's last step: an AP well above zero, so that comparing APs means something


@pytest.fixture(scope="module")
def checkpoint(trained_sweep) -> Path:
    """The checkpoint at the last step of the session's trained sweep, as its trial's folder keeps it."""
    _, report = trained_sweep
    last = max(Path(report["path"], f"trial_{report['best']['trial_id']}").glob("checkpoint_*"), key=read_step)
    assert read_step(last) == STEPS
    return last


@pytest.fixture(scope="module")
def evaluation(checkpoint) -> tuple[DetectionSet, dict[str, list[dict]]]:
    """The val set, and what training's evaluation detects on it: ``eval`` with the trained
    weights, ``eval_ema`` with their moving average (COCO results).

    One image per batch, as the export is served below: on some CPUs the batch's size changes
    how convolutions round, and on a briefly trained model that reorders near-tied scores
    enough to move AP50 by 0.014 (CI; here both give the same AP)."""
    trained = load_trained_model(checkpoint)
    val_set = load_dataset(trained.config.data.val)
    evaluator = Evaluator(trained.model, val_set, InputSpec(trained.config.model.image_size), batch_size=1)
    detections = {"eval": evaluator.detect_all()[0]}
    with trained.moving_average.averaged_weights():
        detections["eval_ema"] = evaluator.detect_all()[0]
    return val_set, detections


@pytest.fixture(scope="module")
def saved_model(checkpoint, tmp_path_factory) -> Path:
    return export_saved_model(checkpoint, tmp_path_factory.mktemp("export") / "saved_model")


@pytest.fixture(scope="module")
def raw_saved_model(checkpoint, tmp_path_factory) -> Path:
    return export_saved_model(checkpoint, tmp_path_factory.mktemp("export") / "raw", use_average=False)


def detsweep(*argv: str) -> int:
    """The export commands as ``detsweep`` parses and runs them."""
    parser = argparse.ArgumentParser(prog="detsweep")
    add_export_commands(parser.add_subparsers(required=True))
    args = parser.parse_args(argv)
    return args.command(args)


def serving(directory: Path):
    """The SavedModel's signature as a function of uint8 images to arrays."""
    loaded = tf.saved_model.load(str(directory))

    def serve(images: np.ndarray) -> dict[str, np.ndarray]:
        outputs = loaded.signatures[SIGNATURE](images=tf.constant(images))
        return {key: value.numpy() for key, value in outputs.items()}

    return serve


def val_images(checkpoint: Path, count: int, size: tuple[int, int]) -> np.ndarray:
    """The first ``count`` val images of the checkpoint's config, resized to ``size`` (height, width)."""
    val_set = load_dataset(load_trial_config(checkpoint / CONFIG_FILE).data.val)
    return np.stack([np.asarray(Image.fromarray(read_image(example)).resize(size[::-1]))
                     for example in val_set.examples[:count]])


def test_the_saved_model_detects_what_the_checkpoint_detects_at_any_image_size(checkpoint, saved_model):
    """Against the checkpoint run by hand (``detected_by_hand``): a resize, pad or mapping back
    that is wrong at a tall or a wide picture shows as other boxes."""
    serve = serving(saved_model)
    for images in (val_images(checkpoint, 2, (90, 70)), val_images(checkpoint, 1, (128, 200))):
        served, expected = serve(images), detected_by_hand(checkpoint, images)
        assert served["detection_boxes"].dtype == np.float32 and served["detection_classes"].dtype == np.int64
        assert served["num_detections"].shape == (len(images),) and served["num_detections"].min() > 0
        assert_same_detections(served, expected, atol=1e-4)


@pytest.mark.parametrize("weights, prefix", [("saved_model", "eval_ema"), ("raw_saved_model", "eval")])
def test_the_saved_model_scores_the_ap_that_trainings_evaluation_scores(request, evaluation, weights, prefix):
    directory = request.getfixturevalue(weights)
    assert json.loads((directory / "detsweep.json").read_text())["moving_average"] == (prefix == "eval_ema")
    val_set, training_detections = evaluation
    serve = serving(directory)
    exported = [d for example in val_set.examples for d in coco_detections(serve(decoded(example)[None]), example)]
    expected = evaluate_detections(val_set.to_coco(), training_detections[prefix])
    # Trained enough for the comparison to mean something: well above the tolerance (the trained
    # sweep's AP, below AP50, was as low as 0.048 here; comparing detections of nothing would be no test).
    assert expected["AP50"] > 4 * AP_TOLERANCE
    scored = evaluate_detections(val_set.to_coco(), exported)
    for metric in ("AP", "AP50"):
        assert scored[metric] == pytest.approx(expected[metric], abs=AP_TOLERANCE), metric


AP_TOLERANCE = 0.005  # float noise moves a few low-scored detections across an IoU threshold


def test_eval_of_a_checkpoint_scores_what_training_scored_and_evaluates_the_config_its_set_overrides_make(
        trained_sweep, checkpoint, capsys):
    """``detsweep eval --checkpoint DIR``: the scores training's own evaluation gave the
    checkpoint (the trial's last report). With ``--set``, the override reaches the model
    evaluated: a score threshold of 1 keeps no detection, so every score of both weights is 0,
    where the checkpoint as saved finds objects."""
    from detsweep.cli import main

    _, report = trained_sweep
    assert main(["eval", "--checkpoint", str(checkpoint), "--json"]) == 0
    scored = json.loads(capsys.readouterr().out)
    for name in ("eval/AP", "eval_ema/AP", "eval_ema/AR100"):
        assert scored[name] == pytest.approx(report["best"]["metrics"][name], abs=1e-6), name
    assert scored["eval_ema/AR100"] > 0
    assert main(["eval", "--checkpoint", str(checkpoint), "--set", "model.score_threshold=1.0", "--json"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["step"] == STEPS
    for prefix in ("eval", "eval_ema"):
        assert {name: metrics[f"{prefix}/{name}"] for name in ("AP", "AP50", "AR100")} == {
            "AP": 0.0, "AP50": 0.0, "AR100": 0.0}, metrics
        assert metrics[f"{prefix}/loss"] > 0  # the val set was scored, before any threshold


def decoded(example: Example) -> np.ndarray:
    """The example's pixels as training's input pipeline decodes them (TensorFlow's JPEG decoder,
    which may differ from Pillow's by a level)."""
    data = example.encoded if example.encoded is not None else Path(example.path).read_bytes()
    return tf.io.decode_image(data, channels=3, expand_animations=False).numpy()


def coco_detections(outputs: dict[str, np.ndarray], example: Example) -> list[dict]:
    """One image's serving outputs as COCO results (pixels, xywh)."""
    count = outputs["num_detections"][0]
    pixels = np.array([example.height, example.width] * 2, np.float32)
    found = zip(outputs["detection_boxes"][0, :count] * pixels, outputs["detection_classes"][0, :count],
                outputs["detection_scores"][0, :count])
    return [{"image_id": example.image_id, "category_id": int(category),
             "bbox": [float(xmin), float(ymin), float(xmax - xmin), float(ymax - ymin)], "score": float(score)}
            for (ymin, xmin, ymax, xmax), category, score in found if xmax > xmin and ymax > ymin]


def test_the_tflite_model_runs_in_the_interpreter_and_detects_what_the_saved_model_detects(
        checkpoint, saved_model, tmp_path, capsys):
    out = tmp_path / "tflite"
    source = f"checkpoint:{checkpoint}"
    assert detsweep("export", "--from", source, "--format", "tflite", "--out", str(out), "--json", "--no-measure") == 0
    report = json.loads(capsys.readouterr().out)
    assert report == {"format": "tflite", "path": str(out), "source": source, "run_id": None, "moving_average": True}
    assert sorted(p.name for p in out.iterdir()) == ["config.yaml", "detsweep.json", "model.tflite"]
    image = val_images(checkpoint, 1, (90, 70))
    runner = tflite_runner((out / "model.tflite").read_bytes())  # LiteRT's
    found = runner(images=image)  # the runner resizes the input tensor to the image
    assert_same_detections(found, serving(saved_model)(image), atol=1e-3)


def test_predict_draws_every_image_and_prints_json(checkpoint, saved_model, tmp_path, capsys):
    grayscale = next(path for path in sorted((RACCOON / "images").glob("*.jpg")) if Image.open(path).mode == "L")
    shapes = tmp_path / "shapes.png"  # what the model learnt to find
    Image.fromarray(val_images(checkpoint, 1, (96, 128))[0]).save(shapes)
    images = [RACCOON / "images" / "raccoon-1.jpg", grayscale, shapes]
    out = tmp_path / "pictures"
    assert detsweep("predict", "--model", str(saved_model), *map(str, images), "--out", str(out), "--json") == 0
    report = json.loads(capsys.readouterr().out)
    assert [image["path"] for image in report["images"]] == [str(p) for p in images]
    assert report["images"][-1]["detections"]
    names = {c["id"]: c["name"] for c in json.loads((saved_model / "detsweep.json").read_text())["categories"]}
    for detection in (d for image in report["images"] for d in image["detections"]):
        assert detection["class_name"] == names[detection["class_id"]]
        assert detection["score"] >= 0.3 and all(0.0 <= v <= 1.0 for v in detection["box"])
    assert sorted(p.name for p in out.iterdir()) == sorted(f"{p.stem}.png" for p in images)
    # each picture is its image with its detections drawn: against the same image drawn without
    # them, it differs where (and only if) something was detected
    from detsweep.export.predict import decode_image_file, picture_of

    for image, found in zip(images, report["images"]):
        drawn = (out / f"{image.stem}.png").read_bytes()
        with Image.open(out / f"{image.stem}.png") as picture:
            assert picture.format == "PNG"
        bare = picture_of(decode_image_file(image), [], f"{image.name}: score >= 0.3")
        differ = changed_pixels(drawn, bare)
        assert (differ.sum() > 100) == bool(found["detections"]), (image, differ.sum(), found["detections"])


def test_predict_from_a_checkpoint_keeps_what_scores_at_least_min_score(checkpoint, saved_model, tmp_path, capsys):
    """``--from checkpoint:<folder>`` detects what the exported model detects (the moving
    average both); ``--min-score`` keeps exactly the detections that score that much."""
    shapes = tmp_path / "shapes.png"
    Image.fromarray(val_images(checkpoint, 1, (96, 128))[0]).save(shapes)

    def predicted(*flags: str) -> list[dict]:
        assert detsweep("predict", *flags, str(shapes), "--json") == 0
        [image] = json.loads(capsys.readouterr().out)["images"]
        return image["detections"]

    everything = predicted("--model", str(saved_model), "--min-score", "0")
    scores = sorted((d["score"] for d in everything), reverse=True)
    assert len(scores) >= 2, scores
    threshold = (scores[0] + scores[1]) / 2  # between the two best: exactly one is kept
    from_checkpoint = predicted("--from", f"checkpoint:{checkpoint}", "--min-score", str(threshold))
    [kept] = [d for d in everything if d["score"] >= threshold]
    assert len(from_checkpoint) == 1 and from_checkpoint[0]["class_id"] == kept["class_id"]
    assert from_checkpoint[0]["score"] == pytest.approx(kept["score"], abs=1e-4)
    np.testing.assert_allclose(from_checkpoint[0]["box"], kept["box"], atol=1e-3)


def test_an_export_from_an_mlflow_run_is_logged_to_that_run(checkpoint, tmp_path, monkeypatch, capsys):
    from mlflow import MlflowClient
    from mlflow.entities import Metric

    from detsweep.tracking.checkpoint_models import log_checkpoint

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    client = MlflowClient(uri)
    experiment = client.create_experiment("export", artifact_location=(tmp_path / "mlartifacts").as_uri())
    run_id = client.create_run(experiment).info.run_id
    scored = Metric("eval/AP_best", 0.5, int(time.time() * 1000), STEPS)
    log_checkpoint(client, experiment, run_id, checkpoint, STEPS, [scored])

    out = tmp_path / "export"
    assert detsweep("export", "--from", f"run:{run_id}", "--no-ema", "--out", str(out), "--json") == 0
    report = json.loads(capsys.readouterr().out)
    assert report["run_id"] == run_id and report["moving_average"] is False
    logged = {Path(a.path).name for a in client.list_artifacts(run_id, "export/saved_model")}
    assert {"saved_model.pb", "variables", "detsweep.json", "config.yaml"} <= logged

    # a TFLite export's scores and costs, measured on the val set and in LiteRT, go to the run too
    assert detsweep("export", "--from", f"run:{run_id}", "--format", "tflite", "--out", str(tmp_path / "tflite"),
                    "--json") == 0
    measured = json.loads(capsys.readouterr().out)["models"]
    assert set(measured) == {"keras", "tflite"} and measured["tflite"]["AP"] == measured["keras"]["AP"] > 0
    metrics = client.get_run(run_id).data.metrics
    for model, name in (("keras", "AP"), ("tflite", "AP"), ("tflite", "AP_spread"), ("tflite", "latency_ms"),
                        ("tflite", "size_mb"), ("keras", "params")):
        assert metrics[f"export/{model}/{name}"] == pytest.approx(measured[model][name]), (model, name)
    assert {Path(a.path).name for a in client.list_artifacts(run_id, "export/tflite")} >= {"model.tflite", "measured.json"}


def test_export_refuses_a_folder_that_is_not_empty(checkpoint, tmp_path):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(DetsweepError) as error:
        detsweep("export", "--from", f"checkpoint:{checkpoint}", "--out", str(out))
    assert str(error.value) == f"{out}: already exists and is not an empty folder; expected a new or empty folder"
    assert [p.name for p in tmp_path.iterdir()] == ["taken"] and [p.name for p in out.iterdir()] == ["notes.txt"]


def test_an_export_that_fails_part_way_leaves_nothing_of_its_own(checkpoint, tmp_path):
    """An export is written into a hidden folder beside ``--out`` and renamed at the end. Here it
    fails at that last step, its model written whole: another process put a file into the empty
    ``--out`` meanwhile (a thread of this test, once the hidden folder appears). What the
    export wrote goes; ``--out`` keeps what the other process put there, and nothing else."""
    out = tmp_path / "export"
    out.mkdir()
    started, done = threading.Event(), threading.Event()

    def write_into_out_once_the_export_writes() -> None:
        while not done.is_set():
            if list(tmp_path.glob(".export.*")):
                (out / "notes.txt").write_text("mine")
                started.set()
                return
            time.sleep(0.005)

    intruder = threading.Thread(target=write_into_out_once_the_export_writes, daemon=True)
    intruder.start()
    try:
        with pytest.raises(OSError):
            detsweep("export", "--from", f"checkpoint:{checkpoint}", "--out", str(out))
    finally:
        done.set()
        intruder.join()
    assert started.is_set()
    assert [p.name for p in tmp_path.iterdir()] == ["export"] and [p.name for p in out.iterdir()] == ["notes.txt"]


def test_export_names_a_checkpoint_that_is_not_there(tmp_path):
    with pytest.raises(DetsweepError) as error:
        detsweep("export", "--from", "checkpoint:/nonexistent", "--out", str(tmp_path / "out"))
    assert "/nonexistent is not a detsweep checkpoint" in str(error.value) and "\n" not in str(error.value)
    assert not (tmp_path / "out").exists()


def test_predict_names_a_missing_image_before_loading_the_model(saved_model, tmp_path):
    missing = tmp_path / "missing.jpg"
    with pytest.raises(DetsweepError) as error:
        detsweep("predict", "--model", str(saved_model), str(RACCOON / "images" / "raccoon-1.jpg"), str(missing),
                 "--out", str(tmp_path / "pictures"))
    assert str(error.value) == f"{missing}: image not found"
    assert not (tmp_path / "pictures").exists()


def test_predict_refuses_a_folder_that_holds_no_exported_model(tmp_path):
    with pytest.raises(DetsweepError) as error:
        detsweep("predict", "--model", str(tmp_path), str(RACCOON / "images" / "raccoon-1.jpg"))
    assert str(error.value).startswith(f"{tmp_path}: not a SavedModel from detsweep export")
