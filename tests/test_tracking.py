"""MLflow tracking without Ray: where runs go, what a trial's run holds when it is reopened,
the retrying writer, and the errors users get before anything trains."""

from __future__ import annotations

import json
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from detsweep.config import TrackingConfig
from detsweep.errors import DetsweepError
from detsweep.tracking import RunLink, TrialIdentity, TrialRun, open_sweep_run, resolve_backend
from detsweep.tracking.checkpoint_models import best_checkpoint, best_of, checkpoints, model_uri, score, step_of
from detsweep.tracking.source import local_copy
from detsweep.tracking.writer import RetryingWriter

from .conftest import RACCOON, REPO, run_bounded, run_cli, run_here
from .mlflow_checks import free_port

QUICKSTART_SWEEP = REPO / "sweeps" / "quickstart.yaml"


def test_the_tracking_uri_comes_from_the_config_then_the_environment_then_the_embedded_default(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    embedded = resolve_backend(TrackingConfig(), cwd=tmp_path)
    assert embedded.uri == f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert embedded.artifact_root == (tmp_path / "mlartifacts").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://tracking:5000")
    assert resolve_backend(TrackingConfig(), cwd=tmp_path).uri == "http://tracking:5000"
    relative = resolve_backend(TrackingConfig(uri="sqlite:///runs/m.db"), cwd=tmp_path)
    assert relative.uri == f"sqlite:///{tmp_path / 'runs' / 'm.db'}"  # absolute: trials run elsewhere
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "ftp://x")
    with pytest.raises(DetsweepError, match=r"MLFLOW_TRACKING_URI: found 'ftp://x', expected an http\(s\)://"):
        resolve_backend(TrackingConfig(), cwd=tmp_path)


def test_launch_refuses_an_unreachable_tracking_server_before_anything_starts(tmp_path):
    uri = f"http://127.0.0.1:{free_port()}"
    result = run_cli("launch", str(QUICKSTART_SWEEP), "--set", f"storage={tmp_path / 'ray'}", cwd=tmp_path,
                     env={"MLFLOW_TRACKING_URI": uri})
    assert result.returncode == 2
    assert result.stderr.strip() == f"detsweep: error: MLFLOW_TRACKING_URI: no MLflow server answers at {uri} (ConnectionError)"
    assert not (tmp_path / "ray").exists() and not (tmp_path / "mlflow.db").exists()


def test_launch_refuses_a_tracking_uri_it_cannot_use(tmp_path):
    result = run_cli("launch", str(QUICKSTART_SWEEP), "--set", "base.tracking.uri=ftp://x", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        f"detsweep: error: {QUICKSTART_SWEEP}: base: tracking.uri: found 'ftp://x', "
        "expected an http(s):// MLflow server or a sqlite:/// file"]


def test_ports_for_test_servers_are_free_distinct_and_outside_the_kernels_ephemeral_range():
    """So no outgoing connection takes one between the check and the server's bind, and two
    asked for before either is bound (a cluster's dashboard and its agents) differ."""
    import socket

    low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    ports = [free_port() for _ in range(30)]
    assert len(set(ports)) == 30 and not any(low <= port <= high for port in ports), (ports, low, high)
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", ports[-1]))  # free indeed
        listening.listen()


def test_the_writer_retries_until_the_call_succeeds_and_keeps_the_order():
    done, failures = [], iter([ConnectionError("down"), ConnectionError("down")])

    def flaky():
        error = next(failures, None)
        if error:
            raise error
        done.append("first")

    writer = RetryingWriter(max_backoff_s=0.1)
    writer.submit("first", flaky)
    writer.submit("second", lambda: done.append("second"))
    assert writer.close(timeout_s=30) == [] and done == ["first", "second"]


def test_the_writer_gives_up_on_a_refusal_at_once_and_on_an_outage_at_its_deadline():
    class Refused(Exception):
        error_code = "INVALID_PARAMETER_VALUE"

    calls = []

    def refused():
        calls.append(1)
        raise Refused("bad value")

    def down():
        raise ConnectionError("down")

    writer = RetryingWriter(max_backoff_s=0.2)
    writer.submit("refused", refused)
    writer.submit("down", down)
    started = time.monotonic()
    assert writer.close(timeout_s=2) == ["refused", "down"]
    assert calls == [1] and time.monotonic() - started < 10


def test_draining_the_writer_waits_for_what_was_submitted_and_leaves_it_open():
    """What a stopped trial's process waits for before Tune ends it (``trainables.trial.ending_on_stop``)."""
    slow, done = threading.Event(), []
    writer = RetryingWriter(max_backoff_s=0.1)
    writer.submit("slow", slow.wait)
    writer.submit("after", lambda: done.append("after"))
    assert not writer.drain(timeout_s=0.3) and done == []  # still writing: it says so at its bound
    slow.set()
    assert writer.drain(timeout_s=5) and done == ["after"]
    writer.submit("later", lambda: done.append("later"))
    assert writer.close(timeout_s=5) == [] and done == ["after", "later"]


def test_the_writer_counts_a_write_still_in_flight_at_its_deadline_as_lost():
    """A call the server never answers (a hung request) is given up at close: lost, as is
    everything queued behind it."""
    hung = threading.Event()
    writer = RetryingWriter()
    writer.submit("hung", hung.wait)
    writer.submit("queued", lambda: None)
    try:
        assert writer.close(timeout_s=0.5) == ["hung", "queued"]
    finally:
        hung.set()


def checkpoint_dir(tmp_path: Path, step: int) -> Path:
    directory = tmp_path / f"checkpoint_{step}"
    directory.mkdir()
    (directory / "meta.json").write_text(json.dumps({"step": step}))
    return directory


def test_a_checkpoint_write_retried_after_a_failure_part_way_finishes_the_same_model(tmp_path):
    """The writer retries ``log_checkpoint`` whole when a call in it fails (a server restart);
    the retry finishes the model the first attempt made: one model a step, READY, listed once
    among the run's outputs, whether the upload was cut or only an answer was lost."""
    from mlflow import MlflowClient

    from detsweep.tracking.checkpoint_models import checkpoints, is_ready, log_checkpoint, step_of

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.create_experiment("retried", artifact_location=(tmp_path / "artifacts").as_uri())
    run_id = client.create_run(experiment).info.run_id

    class Cut:
        """The client, whose ``method`` fails once: before doing its work, or after (the answer lost)."""

        def __init__(self, method: str, after: bool):
            self.method, self.after, self.failed = method, after, False

        def __getattr__(self, name):
            call = getattr(client, name)
            if name != self.method or self.failed:
                return call

            def failing(*args, **kwargs):
                self.failed = True
                if self.after:
                    call(*args, **kwargs)
                raise ConnectionError(f"{name}: the server went away")
            return failing

    for step, (method, after) in enumerate([("log_model_artifacts", False), ("finalize_logged_model", True),
                                            ("log_outputs", True)], start=1):
        cut = Cut(method, after)
        with pytest.raises(ConnectionError):
            log_checkpoint(cut, experiment, run_id, checkpoint_dir(tmp_path, step), step)
        model = log_checkpoint(cut, experiment, run_id, tmp_path / f"checkpoint_{step}", step)  # the writer's retry
        assert cut.failed and is_ready(model) and step_of(model) == step
    models = checkpoints(client, [experiment], run_id, ready=False)
    assert sorted(step_of(m) for m in models) == [1, 2, 3] and all(is_ready(m) for m in models)
    outputs = [output.model_id for output in client.get_run(run_id).outputs.model_outputs]
    assert sorted(outputs) == sorted(m.model_id for m in models)
    for model in models:
        assert client.list_logged_model_artifacts(model.model_id)[0].path == "meta.json"


def test_a_trial_run_its_first_start_left_without_config_gets_it_at_its_reopening(tmp_path):
    """A driver killed as its trials opened their runs: a run made, then nothing (no params,
    no config, no datasets). The resumed trial finds it and writes what is missing."""
    from mlflow import MlflowClient

    from detsweep.sweeps.experiment import as_run
    from detsweep.sweeps.spec import load_sweep

    sweep = load_sweep(QUICKSTART_SWEEP)
    backend = resolve_backend(TrackingConfig(), cwd=tmp_path)
    link = open_sweep_run(sweep, str(tmp_path / "ray" / "quickstart"), backend, as_run(sweep))
    trial = TrialIdentity("t_00000", "trial_t_00000", {}, "eval/AP_best", "max")
    client = MlflowClient(backend.uri)
    killed = TrialRun(link, trial, sweep.base)
    killed.writer.close(30)
    client.delete_run(killed.run_id)  # (only to get the tags a trial's run is made with)
    bare = client.create_run(link.experiment_id, run_name=trial.name, tags=killed.tags).info.run_id

    resumed = TrialRun(link, trial, sweep.base, start_step=10)
    resumed.finish()
    assert resumed.run_id == bare
    run = client.get_run(bare)
    assert run.data.params["train.num_steps"] == str(sweep.base.train.num_steps)
    assert {i.tags[0].value for i in run.inputs.dataset_inputs} == {"training", "validation"}
    assert "config.yaml" in {a.path for a in client.list_artifacts(bare)}


def test_a_reopened_trial_run_continues_without_duplicate_params_or_steps(tmp_path):
    import ray.train
    from mlflow import MlflowClient

    from detsweep.evaluation.pictures import SCHEDULE_FILE, detections_file
    from detsweep.optim.report import schedule_png
    from detsweep.sweeps.experiment import as_run
    from detsweep.sweeps.spec import load_sweep

    sweep = load_sweep(QUICKSTART_SWEEP)
    backend = resolve_backend(TrackingConfig(), cwd=tmp_path)
    link = open_sweep_run(sweep, str(tmp_path / "ray" / "quickstart"), backend, as_run(sweep))
    swept = {"optimizer.learning_rate.learning_rate_base": 0.04}

    def trial(start_step: int = 0) -> TrialRun:
        return TrialRun(link, TrialIdentity("t_00000", "trial_t_00000", swept, "eval/AP_best", "max"), sweep.base, start_step)

    first = trial()
    server_busy = threading.Event()
    first.writer.submit("a slow server", server_busy.wait)
    schedule = schedule_png(sweep.base)  # a first report's, drawn by the worker
    first.log_report({"step": 10, "train/loss": 1.0, "eval/AP_best": 0.2},
                     ray.train.Checkpoint.from_directory(str(checkpoint_dir(tmp_path, 10))),
                     {SCHEDULE_FILE: schedule, detections_file(10): b"first"})
    shutil.rmtree(tmp_path / "checkpoint_10")  # Ray Train drops it (num_to_keep) before the writer gets there
    server_busy.set()
    first.log_report({"step": 20, "train/loss": 0.5})
    first.close()  # the process dies here (a worker failure, a killed driver)

    again = trial(start_step=10)  # restarted from the step-10 checkpoint: 20 is trained twice
    again.log_report({"step": 20, "train/loss": 0.7, "restore/step": 10, "startup/total_s": 9.0})
    again.log_report({"step": 30, "train/loss": 0.3, "eval/AP_best": 0.1},
                     ray.train.Checkpoint.from_directory(str(checkpoint_dir(tmp_path, 30))), {detections_file(30): b"30"})
    again.log_report({"step": 40, "train/loss": 0.2})
    again.note_worker_failure("the worker died")  # Ray Train restarts the group from step 30's checkpoint
    again.note_replayed(40)  # the channel's word: the restarted group trained 40 again
    again.log_report({"step": 50, "train/loss": 0.1, "eval/AP_best": 0.15},
                     ray.train.Checkpoint.from_directory(str(checkpoint_dir(tmp_path, 50))))
    again.finish(error="loss is NaN/Inf at step 51")

    client = MlflowClient(backend.uri)
    runs = client.search_runs([link.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{link.parent_run_id}'")
    assert [run.info.run_id for run in runs] == [first.run_id] == [again.run_id]
    run = runs[0]
    assert run.info.status == "FAILED" and run.data.tags["detsweep.error"] == "loss is NaN/Inf at step 51"
    assert run.data.params["optimizer.learning_rate.learning_rate_base"] == "0.04"
    assert run.data.params["train.num_steps"] == str(sweep.base.train.num_steps)
    losses = [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "train/loss")]
    assert sorted(losses) == [(10, 1.0), (20, 0.5), (30, 0.3), (40, 0.2), (50, 0.1)]  # the first value of 20 stays
    assert len(client.get_metric_history(run.info.run_id, "eval/AP_best")) == 3  # linked to checkpoints, kept once
    # what the restart said once, on the step it trained again, is logged with the next step
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "restore/step")] == [(30, 10)]
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "startup/total_s")] == [(30, 9.0)]
    assert run.data.tags["detsweep.replayed_steps"] == "20-20, 40-40"  # kept from MLflow, never silent
    assert run.data.tags["detsweep.worker_failures"] == "1: the worker died"
    # each checkpoint a READY model of the run, scored by what the run logged at its step; the
    # run keeps its best, still step 10's (0.2 > 0.15 > 0.1), and its latest, step 50's
    models = checkpoints(client, [link.experiment_id], run.info.run_id)
    assert sorted((step_of(m), score(m, "eval/AP_best")) for m in models) == [(10, 0.2), (50, 0.15)]
    assert [step_of(m) for m in checkpoints(client, [link.experiment_id], run.info.run_id, ready=False)
            if m.model_id not in {kept.model_id for kept in models}] == []  # step 30's deleted
    assert step_of(best_checkpoint(client, link.experiment_id, run.info.run_id, "eval/AP_best", "max")) == 10
    with local_copy(model_uri(best_of(models, "eval/AP_best", "max")), backend.uri) as best:
        assert json.loads((best / "meta.json").read_text())["step"] == 10
    names = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.yaml", "learning_rate.png", "error.txt", "detections"} <= names and "checkpoints" not in names
    # pictures are files of the run, each as it was drawn, never metrics
    assert client.download_artifacts(run.info.run_id, "learning_rate.png", str(tmp_path)) and \
        (tmp_path / "learning_rate.png").read_bytes() == schedule
    assert {a.path for a in client.list_artifacts(run.info.run_id, "detections")} == {
        "detections/step_000010.png", "detections/step_000030.png"}
    assert set(run.data.metrics) == {"train/loss", "eval/AP_best", "restore/step", "startup/total_s",
                                     "hparams/optimizer.learning_rate.learning_rate_base"}
    assert (tmp_path / "mlartifacts" / "quickstart").is_dir()


def test_detsweep_ui_names_a_tracking_server():
    """On the embedded backend it runs ``mlflow ui`` (the ASHA sweep test opens that in a browser)."""
    shown = run_cli("ui", env={"MLFLOW_TRACKING_URI": "http://tracking.internal:5000"})
    assert shown.returncode == 0 and shown.stdout.strip() == "MLflow: http://tracking.internal:5000"
    secure = run_cli("ui", env={"MLFLOW_TRACKING_URI": "https://tracking.internal:5000",
                                "MLFLOW_TRACKING_SERVER_CERT_PATH": "/certs/ca.crt"})
    assert secure.stdout.strip() == "MLflow: https://tracking.internal:5000 (a browser trusts it once it trusts /certs/ca.crt)"


def test_detsweep_ui_with_a_config_runs_mlflow_ui_on_the_configs_tracking_uri(tmp_path, write):
    """``ui --config FILE``: the process becomes ``mlflow ui`` on the config's sqlite file and its
    artifact folder, at ``--port``. What it runs is read from the process itself once it has
    exec'd; it is then stopped, before it serves (the ASHA sweep test opens a served one)."""
    import psutil

    from .conftest import cli_environment, kill_session, time_left

    database = tmp_path / "runs" / "ui.db"
    config = write("trial.yaml", f"optimizer: {{type: momentum}}\ntracking: {{uri: 'sqlite:///{database}'}}\n")
    port = str(free_port())
    ui = subprocess.Popen([sys.executable, "-m", "detsweep.cli", "ui", "--config", str(config), "--port", port],
                          cwd=tmp_path, env=cli_environment(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                          text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + time_left(60)
        while "mlflow" not in (running := psutil.Process(ui.pid).cmdline()) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        kill_session(ui)
        said = ui.communicate()[0].splitlines()[:1]  # its line, printed just before the exec
    expected = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", f"sqlite:///{database}", "--port", port,
                "--artifacts-destination", (database.parent / "mlartifacts").as_uri()]
    assert running == expected
    assert said == [f"MLflow: http://127.0.0.1:{port} ({' '.join(expected)})"]


def test_the_detections_picture_shows_each_image_beside_its_ground_truth():
    """A row per image: its ground truth boxes on the left, the detections that score at least
    0.3 on the right; a lower score draws nothing. (Seen against the same picture drawn
    without boxes, or without the detection.)"""
    import dataclasses
    import io

    from PIL import Image

    from detsweep.config.schema import DatasetConfig
    from detsweep.data import load_dataset
    from detsweep.evaluation.pictures import detections_picture

    from .conftest import changed_pixels

    val_set = load_dataset(DatasetConfig(format="synthetic", num_images=3, image_size=96, classes=2, seed=5))
    first = val_set.examples[0]
    ymin, xmin, ymax, xmax = (float(v) for v in first.boxes[0])
    found = {"image_id": first.image_id, "category_id": val_set.categories[0].id,
             "bbox": [xmin, ymin, xmax - xmin, ymax - ymin], "score": 0.9}
    drawn = detections_picture(val_set, [found], count=2)
    picture = Image.open(io.BytesIO(drawn))
    one_row = Image.open(io.BytesIO(detections_picture(val_set, [found], count=1)))
    assert picture.format == "PNG" and picture.width == one_row.width
    assert picture.height == pytest.approx(2 * one_row.height, rel=0.05)  # a row per image: truth | detections
    assert len(set(np.asarray(picture.convert("L")).ravel().tolist())) > 20  # images drawn, not blank
    middle, row = picture.width // 2, picture.height // 2

    unsure = detections_picture(val_set, [{**found, "score": 0.29}], count=2)
    detection = changed_pixels(drawn, unsure)  # the detection's box and label, on the right of its image's row
    assert detection[:row, middle:].sum() > 200 and not detection[row:].any() and not detection[:, :middle].any()
    no_truth = dataclasses.replace(val_set, examples=[
        dataclasses.replace(example, boxes=example.boxes[:0], labels=example.labels[:0]) for example in val_set.examples])
    truth = changed_pixels(unsure, detections_picture(no_truth, [], count=2))  # each image's boxes, on the left
    for rows in (slice(0, row), slice(row, None)):
        assert truth[rows, :middle].sum() > 200 and not truth[rows, middle:].any(), truth[rows].sum()


def test_the_picture_survives_boxes_far_outside_the_image():
    from detsweep.config.schema import DatasetConfig
    from detsweep.data import load_dataset
    from detsweep.evaluation.pictures import detections_picture

    val_set = load_dataset(DatasetConfig(format="synthetic", num_images=1, image_size=64, classes=1, seed=1))
    wild = [{"image_id": val_set.examples[0].image_id, "category_id": val_set.categories[0].id,
             "bbox": bbox, "score": 0.9} for bbox in ([-1e9, 5e8, 3e9, 1e9], [10, 10, float("nan"), 5])]
    assert detections_picture(val_set, wild, count=1).startswith(b"\x89PNG")


def test_the_sweep_run_goes_to_the_named_experiment_tagged_with_its_version_and_commit_and_is_never_reopened(tmp_path):
    """A launch whose results folder was deleted (its sweep.yaml gone, so not refused) gets a
    new parent run: the earlier sweep's trials.csv, pictures and best stay as they were."""
    from mlflow import MlflowClient

    import detsweep
    from detsweep.sweeps.experiment import as_run
    from detsweep.sweeps.spec import load_sweep

    sweep = load_sweep(QUICKSTART_SWEEP, ["base.tracking.experiment=detectors"])
    backend = resolve_backend(sweep.base.tracking, cwd=tmp_path)
    results = str(tmp_path / "ray" / "quickstart")
    first = open_sweep_run(sweep, results, backend, as_run(sweep))
    again = open_sweep_run(sweep, results, backend, as_run(sweep))
    assert again.parent_run_id != first.parent_run_id and again.experiment_id == first.experiment_id
    client = MlflowClient(backend.uri)
    experiment = client.get_experiment(first.experiment_id)
    assert experiment.name == "detectors"
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"  # the UI opens on training runs
    run = client.get_run(first.parent_run_id)
    assert run.info.run_name == "quickstart" and run.data.tags["detsweep.results_path"] == results
    # what ran, for whoever reads the run later: the search, detsweep's version, the checkout's commit
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True)
    assert {key: run.data.tags.get(key) for key in ("detsweep.sweep", "detsweep.algorithm", "detsweep.scheduler",
                                                    "detsweep.version", "mlflow.source.git.commit")} == {
        "detsweep.sweep": "quickstart", "detsweep.algorithm": "random", "detsweep.scheduler": "halving",
        "detsweep.version": detsweep.__version__, "mlflow.source.git.commit": commit.stdout.strip()}
    assert run.data.params["space.optimizer.moving_average_decay"] == "{values: [0.99, 0.995]}"
    assert {a.path for a in client.list_artifacts(first.parent_run_id)} == {"sweep.yaml", "base_config.yaml"}


def test_a_runs_environment_tags_are_the_installed_versions_pythons_and_the_lock_files_hash(tmp_path, monkeypatch):
    """What a run ran on, read from the packages' metadata and the checkout's ``uv.lock``; a
    checkout copied without its lock file says ``none``, a library not installed has no tag."""
    import hashlib
    import platform
    from importlib.metadata import version

    from detsweep.tracking import provenance

    libraries = ("ray", "tensorflow", "keras", "keras-hub", "mlflow", "optuna")
    lock = hashlib.sha256((REPO / "uv.lock").read_bytes()).hexdigest()[:16]
    provenance.run_environment_tags.cache_clear()
    try:
        assert provenance.run_environment_tags() == {f"detsweep.version.{name}": version(name) for name in libraries} | {
            "detsweep.python": platform.python_version(), "detsweep.lock": lock}
        with monkeypatch.context() as patched:
            patched.setattr(provenance, "lock_file", lambda: tmp_path / "uv.lock")  # a copy without it
            patched.setattr(provenance, "LIBRARIES", (*libraries, "detsweep-no-such-library"))
            provenance.run_environment_tags.cache_clear()
            tags = provenance.run_environment_tags()
            assert tags["detsweep.lock"] == "none" and "detsweep.version.detsweep-no-such-library" not in tags
            assert tags["detsweep.version.ray"] == version("ray")
    finally:
        provenance.run_environment_tags.cache_clear()  # the next caller reads the real lock file again


def test_best_shows_what_the_best_trial_ran_on_under_it_and_nothing_for_a_run_older_than_the_tags():
    from detsweep.cli import format_ranking
    from detsweep.tracking.provenance import environment_of

    tags = {"detsweep.version.ray": "2.60.0", "detsweep.lock": "1a2b", "detsweep.python": "3.11.7",
            "detsweep.version.tensorflow": "2.21.0", "detsweep.role": "trial"}
    ran_on = environment_of(tags)
    assert ran_on == {"python": "3.11.7", "ray": "2.60.0", "tensorflow": "2.21.0", "lock": "1a2b"}
    assert list(ran_on) == ["python", "ray", "tensorflow", "lock"] and environment_of({"detsweep.role": "trial"}) == {}

    def trial(run_id: str, environment: dict[str, str]) -> dict:
        return {"run_id": run_id, "trial_id": run_id, "status": "FINISHED", "value": 0.5, "swept": {},
                "checkpoint": None, "environment": environment}

    def shown(*trials: dict) -> list[str]:
        report = {"experiment": "e", "tracking_uri": "u", "metric": "eval/AP_best", "mode": "max", "trials": list(trials),
                  "ranked": len(trials)}
        return format_ranking(report).splitlines()

    lines = shown(trial("best", ran_on), trial("next", ran_on))
    assert [line.strip() for line in lines if "ran on:" in line] == [
        "ran on: python 3.11.7, ray 2.60.0, tensorflow 2.21.0, lock 1a2b"]
    assert "ran on:" in lines[4] and lines[2].startswith("best")  # under the best trial, after its checkpoint
    assert not [line for line in shown(trial("older", {}), trial("next", ran_on)) if "ran on:" in line]


def test_the_driver_ends_a_stopped_trials_run_with_what_it_cost_and_uploads_nothing(tmp_path):
    """A trial the scheduler stopped left its run RUNNING (its own process wrote what it reported,
    checkpoints included: ``trainables.trial.ending_on_stop``); the driver marks it KILLED and early
    stopped, and writes what it cost on it and on the sweep's run. It uploads no checkpoint,
    though Tune holds one for the trial."""
    from mlflow import MlflowClient

    from detsweep.sweeps.experiment import as_run
    from detsweep.sweeps.spec import load_sweep
    from detsweep.tracking import close_sweep_run

    sweep = load_sweep(QUICKSTART_SWEEP)
    backend = resolve_backend(TrackingConfig(), cwd=tmp_path)
    link = open_sweep_run(sweep, str(tmp_path / "ray" / "quickstart"), backend, as_run(sweep))
    stopped = TrialRun(link, TrialIdentity("t_00001", "trial_t_00001"), sweep.base)
    stopped.log_report({"step": 5, "train/loss": 2.0})
    stopped.close()
    cost = {"cost/cpu_hours": 0.25, "cost/gpu_hours": 0.0}
    trial = {"trial_id": "t_00001", "status": "STOPPED", "metrics": {"step": 5, "eval/AP_best": 0.1}, "config": {},
             "checkpoint": str(checkpoint_dir(tmp_path, 5)), "error": None, "cost": cost}
    close_sweep_run(link, {"metric": "eval/AP_best", "trials": [trial], "best": trial, "cost": cost}, [], {})

    client = MlflowClient(backend.uri)
    run = client.get_run(stopped.run_id)
    assert run.info.status == "KILLED" and run.data.tags["early_stopped"] == "true"
    assert checkpoints(client, [link.experiment_id], stopped.run_id, ready=False) == []
    assert {k: run.data.metrics[k] for k in cost} == cost  # the driver writes what the trial cost
    assert {k: client.get_run(link.parent_run_id).data.metrics[k] for k in cost} == cost


class CountingClient:
    """MLflow's client, counting the calls made on it (each one request or more to a server)."""

    calls: list[str] = []

    def __init__(self, uri: str):
        from mlflow.tracking.client import MlflowClient  # where it lives: the test replaces mlflow.MlflowClient

        self._client = MlflowClient(uri)

    def __getattr__(self, name: str):
        CountingClient.calls.append(name)
        return getattr(self._client, name)

    def counted(self) -> int:
        count = len(CountingClient.calls)
        CountingClient.calls.clear()
        return count


def a_sweep_of_stand_in_trials(folder: Path, count: int):
    """A quickstart sweep's parent run and ``count`` trial runs as the trials' own processes
    open them, all but the last two completed in Tune (and closed by the driver's run closer as
    they were): every third stopped early at step 5, the others finished. Its link, Tune's
    stand-in trials and ``launch``'s report of them."""
    from mlflow import MlflowClient
    from ray.tune.experiment import Trial

    from detsweep.sweeps.closing import RunCloser
    from detsweep.sweeps.experiment import as_run
    from detsweep.sweeps.spec import load_sweep
    from detsweep.tracking.trial_run import PARENT_TAG, ROLE_TAG, TRIAL_TAG

    sweep = load_sweep(QUICKSTART_SWEEP)
    end = sweep.base.train.num_steps
    link = open_sweep_run(sweep, str(folder / "ray" / "quickstart"), resolve_backend(TrackingConfig(), cwd=folder),
                          as_run(sweep))
    client, closer, trials, report = MlflowClient(link.uri), RunCloser(link, end, sweep.base.scaling), [], []
    for number in range(count):
        trial_id, step = f"t_{number:05d}", 5 if number % 3 == 0 else end
        client.create_run(link.experiment_id, tags={TRIAL_TAG: trial_id, PARENT_TAG: link.parent_run_id,
                                                    ROLE_TAG: "trial"})
        trial = Trial("run_trial", config={}, trial_id=trial_id, stub=True)
        trial.set_status(Trial.RUNNING)
        trial.run_metadata.last_result = {"step": step, "eval/AP_best": number / count, "time_total_s": 36.0}
        trials.append(trial)
        status = "TERMINATED" if step == end else "STOPPED"
        report.append({"trial_id": trial_id, "status": status, "metrics": {"step": step, "eval/AP_best": number / count},
                       "config": {}, "checkpoint": None, "error": None, "cost": closer.ended(trial, None)["cost"]})
    for trial in trials[:-2]:
        closer.on_trial_complete(0, trials, trial)
    closer.on_experiment_end(trials)
    cost = {"cost/cpu_hours": 1.0, "cost/gpu_hours": 0.0}
    return link, trials, {"metric": "eval/AP_best", "trials": report, "best": report[-1], "cost": cost}


def test_the_driver_closes_each_run_as_tune_completes_its_trial_and_the_end_and_best_cost_no_request_per_trial(
        tmp_path, monkeypatch):
    """Completed in Tune, a stopped trial's run is KILLED and early stopped, a finished one's
    FINISHED, each with its cost; the sweep's end then closes only the two left, and makes as
    many requests for 30 trials as for 12; ``best`` too, looking up the checkpoints of the
    trials it shows only."""
    from mlflow import MlflowClient

    from detsweep.tracking import close_sweep_run
    from detsweep.tracking.best import rank_trials
    from detsweep.tracking.sweep_run import sweep_figure, trial_runs

    monkeypatch.setattr("mlflow.MlflowClient", CountingClient)
    requests = {}
    for count in (12, 30):  # the two left open finished in both
        folder = tmp_path / str(count)
        link, trials, report = a_sweep_of_stand_in_trials(folder, count)
        runs = trial_runs(MlflowClient(link.uri), link)
        closed = {runs[t["trial_id"]].info.status for t in report["trials"][:-2] if t["status"] == "STOPPED"}
        assert closed == {"KILLED"} and runs["t_00003"].data.tags["early_stopped"] == "true"
        assert runs["t_00001"].info.status == "FINISHED" and "early_stopped" not in runs["t_00001"].data.tags
        assert runs["t_00001"].data.metrics["cost/cpu_hours"] == report["trials"][1]["cost"]["cost/cpu_hours"] > 0
        assert {runs[t.trial_id].info.status for t in trials[-2:]} == {"RUNNING"}  # not completed yet
        CountingClient(link.uri).counted()
        curves = {t["trial_id"]: {10: 0.1, 20: t["metrics"]["eval/AP_best"]} for t in report["trials"]}
        close_sweep_run(link, report, [], curves)
        requests[count] = [CountingClient(link.uri).counted()]
        drawn = sweep_figure(report, [], curves).axes[-1]  # its curves: the best 8 as lines, the others a band
        assert (len(drawn.lines), len(drawn.collections), len(drawn.get_legend().texts)) == (8, 1, 9)
        assert {run.info.status for run in trial_runs(MlflowClient(link.uri), link).values()} == {"FINISHED", "KILLED"}
        backend = resolve_backend(TrackingConfig(), cwd=folder)
        ranking = rank_trials(CountingClient(link.uri), "quickstart", backend, top=10)
        assert CountingClient.calls.count("search_logged_models") == 10  # the trials shown, each looked up
        requests[count].append(CountingClient(link.uri).counted())
        assert len(ranking.to_dict()["trials"]) == 10 and ranking.to_dict()["ranked"] == count
    assert requests[12] == requests[30], requests


def test_best_ranks_several_sweeps_of_one_experiment_by_any_metric_and_mode(tmp_path):
    """``detsweep best`` on runs written by the trials' own code (no training needed to rank):
    two sweeps launched under one name are ranked as one, by the sweep's metric and mode, or
    by ``--metric``/``--mode``, cut to ``--top``."""
    from detsweep.sweeps.experiment import as_run
    from detsweep.sweeps.spec import load_sweep

    sweep = load_sweep(QUICKSTART_SWEEP)
    backend = resolve_backend(TrackingConfig(), cwd=tmp_path)
    lr = "optimizer.learning_rate.learning_rate_base"
    scores = {"first": {"t_1": (0.3, 0.5, 0.04), "t_2": (0.1, 0.2, 0.01)}, "second": {"t_3": (0.2, 0.9, 0.02)}}
    parents = []
    for results, trials in scores.items():  # the same sweep launched twice: two parent runs, one experiment
        link = open_sweep_run(sweep, str(tmp_path / "ray" / results), backend, as_run(sweep))
        parents.append(link.parent_run_id)
        for trial_id, (ap, loss, rate) in trials.items():
            run = TrialRun(link, TrialIdentity(trial_id, f"trial_{trial_id}", {lr: rate}, sweep.search.metric, "max"), sweep.base)
            run.log_report({"step": 10, "eval/AP_best": ap, "train/loss": loss})
            run.finish()

    shown = [run_here("best", "quickstart", "--json", cwd=tmp_path),
             run_here("best", "quickstart", "--json", "--metric", "train/loss", "--mode", "min", "--top", "2", cwd=tmp_path),
             run_here("best", "quickstart", "--top", "1", cwd=tmp_path)]
    assert all(result.returncode == 0 for result in shown), [result.stderr for result in shown]
    ranking, by_loss = (json.loads(result.stdout) for result in shown[:2])
    assert (ranking["metric"], ranking["mode"]) == ("eval/AP_best", "max") == (sweep.search.metric, sweep.search.mode)
    assert sorted(ranking["parent_run_ids"]) == sorted(parents)
    assert [(t["trial_id"], t["value"]) for t in ranking["trials"]] == [("t_1", 0.3), ("t_3", 0.2), ("t_2", 0.1)]
    assert [t["swept"][lr] for t in ranking["trials"]] == [0.04, 0.02, 0.01]  # what each trial swept
    assert (by_loss["metric"], by_loss["mode"]) == ("train/loss", "min")
    assert [(t["trial_id"], t["value"]) for t in by_loss["trials"]] == [("t_2", 0.2), ("t_1", 0.5)]
    table = shown[2]
    assert "t_1" in table.stdout and "t_3" not in table.stdout, table.stdout


def test_the_champion_alias_moves_only_to_a_version_that_scored_better(tmp_path):
    """Sweeps registered under one name: the alias ``champion`` goes to a new version only when
    it beats the champion on the same metric (in the sweep's mode); a tie keeps the champion."""
    from mlflow import MlflowClient

    from detsweep.export.registry import CHAMPION, crown_if_better

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    client.create_registered_model("sweep")

    def register(score: float, metric: str = "eval/AP_best", mode: str = "max") -> str:
        version = client.create_model_version("sweep", source=str(tmp_path),
                                              tags={"metric": metric, "mode": mode, "score": repr(score)})
        return crown_if_better(client, "sweep", version.version, metric, mode, score)

    assert register(0.30) == "1"
    assert register(0.20) == "1" and register(0.30) == "1"  # worse, then a tie: the champion stays
    assert register(0.40) == "4" and str(client.get_model_version_by_alias("sweep", CHAMPION).version) == "4"
    assert register(0.9, "train/loss", "min") == "5"  # scored on another metric: no comparison, the newer wins
    assert register(1.2, "train/loss", "min") == "5" and register(0.5, "train/loss", "min") == "7"
    assert str(client.get_model_version_by_alias("sweep", CHAMPION).version) == "7"


def test_trials_get_the_telemetry_choice_and_the_writers_settings_through_the_job_and_no_credential(monkeypatch):
    """A job's environment is shown by Ray's State API: the credentials stay out of it (each
    node's raylet holds them, as the next test's runner gives them). The writer's settings are
    in it, so that no trial process adds a variable once Ray's threads run; a user's own wins."""
    from detsweep.tracking.backend import trial_environment

    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", raising=False)
    for name, value in {"MLFLOW_TRACKING_USERNAME": "ann", "MLFLOW_TRACKING_PASSWORD": "s3cret", "DO_NOT_TRACK": "true",
                        "MLFLOW_DISABLE_TELEMETRY": "true", "AWS_SECRET_ACCESS_KEY": "not for trials"}.items():
        monkeypatch.setenv(name, value)
    assert trial_environment() == {"DO_NOT_TRACK": "true", "MLFLOW_DISABLE_TELEMETRY": "true",
                                   "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"}
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "3")
    assert trial_environment()["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "3"


def test_a_raylet_started_through_the_credentials_runner_holds_detsweeps_user_in_its_environment(tmp_path):
    """``python -m detsweep.tracking.credentials FILE -- COMMAND``, as ``ray_cluster.yaml``
    starts each raylet: COMMAND runs with the file's two values in its environment, read as
    data (quotes dropped, nothing run); a file holding a head-only secret runs nothing."""
    credentials = tmp_path / "mlflow.env"
    credentials.write_text("# detsweep's user\nMLFLOW_TRACKING_USERNAME=detsweep\nMLFLOW_TRACKING_PASSWORD='pa$(id)ss'\n")
    show = [sys.executable, "-c", "import os; print(os.environ['MLFLOW_TRACKING_USERNAME'], os.environ['MLFLOW_TRACKING_PASSWORD'])"]
    shown = run_bounded([sys.executable, "-m", "detsweep.tracking.credentials", str(credentials), "--", *show],
                        timeout=60, cwd=REPO)
    assert shown.returncode == 0 and shown.stdout.split() == ["detsweep", "pa$(id)ss"], shown.stderr
    credentials.write_text(credentials.read_text() + "MLFLOW_FLASK_SERVER_SECRET_KEY=k\n")
    refused = run_bounded([sys.executable, "-m", "detsweep.tracking.credentials", str(credentials), "--", *show],
                          timeout=60, cwd=REPO)
    assert refused.returncode == 1 and refused.stdout == "" and refused.stderr.startswith(
        f"{credentials}: found MLFLOW_FLASK_SERVER_SECRET_KEY; expected only MLFLOW_TRACKING_USERNAME and ")


def test_the_heads_secret_is_read_as_key_value_lines_or_json_and_a_refusal_is_one_line(tmp_path, monkeypatch):
    """What Secrets Manager's console makes (JSON) and what ``--secret-string file://`` makes
    (lines) read alike; a secret the head may not read, or a binary one, stops the start in one
    line naming what to change; a missing one is the try-it-out server (None)."""
    import boto3
    from botocore.stub import Stubber

    from detsweep.tracking.credentials import head_secret

    lines = tmp_path / "head.env"
    lines.write_text("MLFLOW_AUTH_ADMIN_PASSWORD=a\nMLFLOW_FLASK_SERVER_SECRET_KEY='k'\n")
    as_json = tmp_path / "head.json"
    as_json.write_text('{"MLFLOW_AUTH_ADMIN_PASSWORD": "a", "MLFLOW_FLASK_SERVER_SECRET_KEY": "k"}')
    assert head_secret(str(lines)) == head_secret(str(as_json)) == {
        "MLFLOW_AUTH_ADMIN_PASSWORD": "a", "MLFLOW_FLASK_SERVER_SECRET_KEY": "k"}

    client = boto3.client("secretsmanager", region_name="us-west-2", aws_access_key_id="x", aws_secret_access_key="x")
    monkeypatch.setattr(boto3, "client", lambda *args, **kwargs: client)
    with Stubber(client) as stub:
        stub.add_client_error("get_secret_value", "AccessDeniedException")
        stub.add_client_error("get_secret_value", "ResourceNotFoundException")
        stub.add_response("get_secret_value", {"SecretBinary": b"x", "Name": "detsweep/mlflow-head"})
        with pytest.raises(SystemExit) as denied:
            head_secret("secretsmanager:detsweep/mlflow-head")
        assert str(denied.value) == ("secretsmanager:detsweep/mlflow-head: Secrets Manager refused to give it "
                                     "(AccessDeniedException); expected the head's instance profile to allow "
                                     "secretsmanager:GetSecretValue on it")
        assert head_secret("secretsmanager:detsweep/mlflow-head") is None
        with pytest.raises(SystemExit, match=r"^secretsmanager:detsweep/mlflow-head: found a binary secret; expected text"):
            head_secret("secretsmanager:detsweep/mlflow-head")


def test_the_heads_certificate_is_kept_while_it_fits_and_made_again_when_it_does_not(tmp_path):
    """Made at every ``ray up``: kept while the authority's certificate signed it and it names
    the head's addresses; made again for a new address, or when the authority beside it is
    not the one that signed it (a set-up cut part-way, a copy over the head's)."""
    from cryptography import x509

    from detsweep.tracking.tls import SERVER_CERT, SERVER_KEY, ensure_certificate

    folder, authority = tmp_path / "tls", tmp_path / "ca.crt"
    assert ensure_certificate(folder, authority, ["10.0.0.5", "127.0.0.1", "localhost"])
    assert (folder / SERVER_KEY).stat().st_mode & 0o777 == 0o600
    signed = x509.load_pem_x509_certificate((folder / SERVER_CERT).read_bytes())
    signed.verify_directly_issued_by(x509.load_pem_x509_certificate(authority.read_bytes()))
    assert not ensure_certificate(folder, authority, ["10.0.0.5", "localhost"])  # kept
    assert ensure_certificate(folder, authority, ["10.0.0.6", "localhost"])  # a new address
    other = tmp_path / "other"
    ensure_certificate(other, tmp_path / "other-ca.crt", ["10.0.0.6", "localhost"])
    shutil.copy(tmp_path / "other-ca.crt", authority)  # an authority that did not sign it
    assert ensure_certificate(folder, authority, ["10.0.0.6", "localhost"])
    assert not ensure_certificate(folder, authority, ["10.0.0.6", "localhost"])


def test_a_trials_cost_is_what_its_workers_held_for_as_long_as_it_ran():
    from detsweep.config import ScalingConfig
    from detsweep.sweeps.experiment import trial_cost

    assert trial_cost(1800, ScalingConfig(num_workers=2, cpus_per_worker=4)) == {"cost/cpu_hours": 4.0, "cost/gpu_hours": 0.0}
    gpus = ScalingConfig(num_workers=4, cpus_per_worker=8, use_gpu=True, gpus_per_worker=1)
    assert trial_cost(900, gpus) == {"cost/cpu_hours": 8.0, "cost/gpu_hours": 1.0}


def test_a_trials_datasets_are_its_runs_inputs_with_a_digest_that_follows_the_data(tmp_path):
    from mlflow import MlflowClient

    from detsweep.config import DatasetConfig
    from detsweep.sweeps.experiment import as_run
    from detsweep.sweeps.spec import load_sweep
    from detsweep.tracking.datasets import describe

    voc = DatasetConfig(format="voc", annotations=str(RACCOON / "annotations"), images=str(RACCOON / "images"))
    raccoon = describe(voc)
    assert raccoon.name == "annotations" and json.loads(raccoon.source) == {"uri": str(RACCOON / "annotations")}
    assert describe(voc).digest == raccoon.digest != describe(voc.model_copy(update={"subset": (0, 40)})).digest
    copy = tmp_path / "annotations"
    shutil.copytree(RACCOON / "annotations", copy)
    moved = voc.model_copy(update={"annotations": str(copy)})
    before = describe(moved).digest
    (copy / "raccoon-2.xml").write_text((copy / "raccoon-2.xml").read_text() + "\n")  # one file a byte longer
    assert describe(moved).digest != before

    sweep = load_sweep(QUICKSTART_SWEEP)
    backend = resolve_backend(TrackingConfig(), cwd=tmp_path)
    link = open_sweep_run(sweep, str(tmp_path / "ray" / "quickstart"), backend, as_run(sweep))
    run = TrialRun(link, TrialIdentity("t_00001", "trial_t_00001"), sweep.base)
    run.close()
    inputs = MlflowClient(backend.uri).get_run(run.run_id).inputs.dataset_inputs
    assert {(i.dataset.name, i.tags[0].key, i.tags[0].value) for i in inputs} == {
        ("synthetic-3c-128px-seed1", "mlflow.data.context", "training"),
        ("synthetic-3c-128px-seed2", "mlflow.data.context", "validation")}


def test_a_run_whose_opening_failed_halfway_gets_its_config_and_datasets_on_the_retry(tmp_path, monkeypatch):
    """The server fails once after the run is made (a sqlite file locked by another trial, a
    server restarting): the writer's retry must not take the run it just made for a resumed
    trial's and skip the rest. The failure is injected into a real client; the rest is real."""
    from mlflow import MlflowClient

    from detsweep.sweeps.experiment import as_run
    from detsweep.sweeps.spec import load_sweep

    calls: list[str] = []
    log_inputs = MlflowClient.log_inputs

    def fails_once(client, *args, **kwargs):
        calls.append("log_inputs")
        if len(calls) == 1:
            raise ConnectionError("the server went away")
        return log_inputs(client, *args, **kwargs)

    monkeypatch.setattr(MlflowClient, "log_inputs", fails_once)
    sweep = load_sweep(QUICKSTART_SWEEP)
    backend = resolve_backend(TrackingConfig(), cwd=tmp_path)
    link = open_sweep_run(sweep, str(tmp_path / "ray" / "quickstart"), backend, as_run(sweep))
    run = TrialRun(link, TrialIdentity("t_00002", "trial_t_00002"), sweep.base)
    assert run.close() is None and calls == ["log_inputs", "log_inputs"]  # failed, then retried
    client = MlflowClient(backend.uri)
    [found] = client.search_runs([link.experiment_id], filter_string="tags.`detsweep.trial_id` = 't_00002'")
    assert found.info.run_id == run.run_id
    assert {i.tags[0].value for i in found.inputs.dataset_inputs} == {"training", "validation"}
    assert found.data.params["train.num_steps"] == str(sweep.base.train.num_steps)
    assert "config.yaml" in {a.path for a in client.list_artifacts(run.run_id)}


def test_every_write_of_a_trial_run_that_fails_once_and_is_retried_is_written_as_if_it_had_not_failed(
        tmp_path, monkeypatch):
    """A server away while a worker failure and a restart's first report arrive: every tag and
    metrics call fails the first time it is made (the failure injected into a real client) and
    the writer runs its write again. A failure is counted once, not once per attempt, and what a
    replayed step carries to the next step survives the failed write of that step."""
    from mlflow import MlflowClient

    from detsweep.sweeps.experiment import as_run
    from detsweep.sweeps.spec import load_sweep

    sweep = load_sweep(QUICKSTART_SWEEP)
    backend = resolve_backend(TrackingConfig(), cwd=tmp_path)
    link = open_sweep_run(sweep, str(tmp_path / "ray" / "quickstart"), backend, as_run(sweep))
    attempts: list[tuple] = []
    for name in ("set_tag", "log_batch"):
        real = getattr(MlflowClient, name)

        def fails_the_first_time(client, *args, _real=real, _name=name, **kwargs):
            call = (_name, repr(args), repr(sorted(kwargs.items())))
            attempts.append(call)
            if attempts.count(call) == 1:  # each distinct write fails once, however many calls a write makes
                raise ConnectionError("the server went away")
            return _real(client, *args, **kwargs)

        monkeypatch.setattr(MlflowClient, name, fails_the_first_time)

    class Sooner:  # the writer's waits, a twentieth as long: what is written is checked here, not when
        @staticmethod
        def uniform(low: float, high: float) -> float:
            return random.uniform(low, high) / 20

    monkeypatch.setattr("detsweep.tracking.writer.random", Sooner)
    run = TrialRun(link, TrialIdentity("t_00003", "trial_t_00003"), sweep.base)
    run.log_report({"step": 10, "train/loss": 1.0})
    run.note_worker_failure("the worker died")
    run.log_report({"step": 10, "train/loss": 1.1, "restore/step": 0})  # the restart trains 10 again
    run.log_report({"step": 20, "train/loss": 0.5})
    run.note_worker_failure("the worker died again")
    assert run.close(60) is None and run.writer.lost == []
    assert len(set(attempts)) > 5 and all(attempts.count(call) >= 2 for call in attempts)  # failed, then went through
    monkeypatch.undo()
    client = MlflowClient(backend.uri)
    tags = client.get_run(run.run_id).data.tags
    assert tags["detsweep.worker_failures"] == "2: the worker died again"
    assert tags["detsweep.replayed_steps"] == "10-10"
    assert [(m.step, m.value) for m in client.get_metric_history(run.run_id, "train/loss")] == [(10, 1.0), (20, 0.5)]
    assert [(m.step, m.value) for m in client.get_metric_history(run.run_id, "restore/step")] == [(20, 0.0)]


def test_writes_lost_to_a_server_that_stays_away_past_a_trials_end_are_listed_in_its_log(tmp_path, caplog):
    """The README's promise: what could not be written is the run's ``detsweep.lost_writes`` tag
    when the server is back by the trial's end, and, while it is still away, a line of the
    trial's log. The run stays as the server last saw it."""
    import logging

    from mlflow import MlflowClient

    from detsweep.sweeps.experiment import as_run
    from detsweep.sweeps.spec import load_sweep

    from .mlflow_checks import mlflow_server

    sweep, port = load_sweep(QUICKSTART_SWEEP), free_port()
    with mlflow_server(tmp_path, port) as uri:
        link = open_sweep_run(sweep, str(tmp_path / "ray" / "quickstart"), resolve_backend(TrackingConfig(uri=uri)),
                              as_run(sweep))
        run = TrialRun(link, TrialIdentity("t_00000", "trial_t_00000"), sweep.base)
        run.log_report({"step": 10, "train/loss": 1.0})
        client = MlflowClient(uri)
        deadline = time.monotonic() + 60
        while not (run.run_id and client.get_metric_history(run.run_id, "train/loss")) and time.monotonic() < deadline:
            time.sleep(0.2)
    run.log_report({"step": 20, "train/loss": 0.5})  # the server is gone, and stays away past the trial's end
    with caplog.at_level(logging.WARNING, logger="detsweep.tracking.trial_run"):
        run.finish(timeout_s=3)
    [line] = [record.getMessage() for record in caplog.records if " lost " in record.getMessage()]
    assert line.startswith(f"MLflow: run {run.run_id} of trial t_00000 lost 2 writes (") and \
        line.endswith("): metrics at step 20; the run's end"), line
    with mlflow_server(tmp_path, port) as uri:  # back, after the trial's end
        client = MlflowClient(uri)
        seen = client.get_run(run.run_id)
        assert seen.info.status == "RUNNING" and "detsweep.lost_writes" not in seen.data.tags
        assert [m.step for m in client.get_metric_history(run.run_id, "train/loss")] == [10]


def test_a_trial_logs_its_datasets_when_another_trial_made_them_first(tmp_path, caplog):
    """Two trials of a sweep start together and both log the same new dataset: the other's
    write lands between MLflow's read (the dataset is not there) and its insert, which the
    datasets' key (experiment, name, digest) then refuses as a bad request. The interleaving
    is forced by a hook on SQLAlchemy's statements; the store, the file and both writes are real."""
    from mlflow import MlflowClient
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    from detsweep.sweeps.experiment import as_run
    from detsweep.sweeps.spec import load_sweep
    from detsweep.tracking.datasets import dataset_inputs

    sweep = load_sweep(QUICKSTART_SWEEP)
    backend = resolve_backend(TrackingConfig(), cwd=tmp_path)
    link = open_sweep_run(sweep, str(tmp_path / "ray" / "quickstart"), backend, as_run(sweep))
    other = MlflowClient(backend.uri)
    other_run = other.create_run(link.experiment_id, run_name="trial_t_00000").info.run_id
    raced: list[str] = []

    def the_other_trial_first(conn, cursor, statement, parameters, context, executemany):
        if statement.lstrip().upper().startswith("INSERT INTO DATASETS") and not raced:
            raced.append(threading.current_thread().name)
            writer = threading.Thread(target=other.log_inputs, args=(other_run,),
                                      kwargs={"datasets": dataset_inputs(sweep.base)})
            writer.start()
            writer.join(60)

    event.listen(Engine, "before_cursor_execute", the_other_trial_first)
    try:
        with caplog.at_level("INFO", logger="detsweep.tracking.trial_run"):
            run = TrialRun(link, TrialIdentity("t_00001", "trial_t_00001"), sweep.base)
            run.close(120)
    finally:
        event.remove(Engine, "before_cursor_execute", the_other_trial_first)
    assert raced == ["mlflow-writer"], raced  # the race happened, in the trial's writer
    assert "logging the datasets again after a conflict" in caplog.text and run.writer.lost == [], run.writer.lost
    for run_id in (other_run, run.run_id):
        inputs = MlflowClient(backend.uri).get_run(run_id).inputs.dataset_inputs
        assert {i.tags[0].value for i in inputs} == {"training", "validation"}, run_id


def test_a_sweep_uses_the_experiment_another_sweep_made_since_it_looked(tmp_path):
    """Two sweeps start into one new experiment: the one whose create comes second is refused
    (RESOURCE_ALREADY_EXISTS) and takes the other's. Its first look is made to come before
    the other's create; the store is real."""
    from mlflow import MlflowClient

    from detsweep.tracking.sweep_run import experiment_id

    backend = resolve_backend(TrackingConfig(), cwd=tmp_path)
    theirs = MlflowClient(backend.uri).create_experiment("shared")

    class LookedBefore(MlflowClient):
        looked = False

        def get_experiment_by_name(self, name):
            if not self.looked:  # the look that came before the other sweep's create
                self.looked = True
                return None
            return super().get_experiment_by_name(name)

    client = LookedBefore(backend.uri)
    assert experiment_id(client, "shared", backend) == theirs and client.looked


KILLED_MID_UPLOAD = """
import json, os, signal, sys, time
from pathlib import Path

import ray.train
from mlflow.store.artifact.http_artifact_repo import HttpArtifactRepository

from detsweep.sweeps.spec import load_sweep
from detsweep.tracking import RunLink, TrialIdentity, TrialRun
from detsweep.tracking.checkpoint_models import checkpoints

uri, experiment, folder, sweep_file = sys.argv[1:]
trial = TrialRun(RunLink(uri, experiment, None), TrialIdentity("t_00000", "trial_t_00000"), load_sweep(sweep_file).base)
first = ray.train.Checkpoint.from_directory(f"{folder}/step_10")
trial.log_report({"step": 10, "train/loss": 1.0, "eval/AP_best": 0.2}, first)
trial.opened.wait(60)  # the client is made as the run opens
while not checkpoints(trial.client, [experiment], trial.run_id):  # step 10's is READY
    time.sleep(0.2)
print(trial.run_id, flush=True)
upload = HttpArtifactRepository.log_artifact
sent = []

def one_file_then_killed(self, local_file, artifact_path=None):
    if sent:  # the second file of step 20's checkpoint: the node dies
        os.kill(os.getpid(), signal.SIGKILL)
    upload(self, local_file, artifact_path)
    sent.append(local_file)

HttpArtifactRepository.log_artifact = one_file_then_killed
trial.log_report({"step": 20, "train/loss": 0.5, "eval/AP_best": 0.5},
                 ray.train.Checkpoint.from_directory(f"{folder}/step_20"))
time.sleep(120)
"""


def test_a_trial_killed_mid_upload_leaves_a_pending_checkpoint_that_best_finetune_and_registration_never_read(
        tracking_stack, tmp_path, monkeypatch):
    """On the cluster's tracking stack (PostgreSQL, the bucket): a trial's process is killed
    (SIGKILL) after one of the three files of its better step-20 checkpoint reached the
    bucket. That checkpoint stays PENDING: ``best``, what ``finetune --from best:`` resolves
    and what registration reads are step 10's, complete. The trial, resumed, deletes it."""
    import ray.train
    from mlflow import MlflowClient

    from detsweep.sweeps.launch import best_in_mlflow
    from detsweep.sweeps.spec import load_sweep
    from detsweep.tracking.source import resolve_source

    for name, value in tracking_stack.client_env.items():
        monkeypatch.setenv(name, value)
    client = MlflowClient(tracking_stack.uri)
    experiment = client.create_experiment("killed-mid-upload")
    for step in (10, 20, 30):
        folder = tmp_path / f"step_{step}"
        folder.mkdir()
        (folder / "meta.json").write_text(json.dumps({"step": step}))
        (folder / "ckpt.index").write_bytes(b"i" * 1000)
        (folder / "ckpt.data-00000-of-00001").write_bytes(b"w" * 100_000)
    killed = run_bounded([sys.executable, "-c", KILLED_MID_UPLOAD, tracking_stack.uri, experiment, str(tmp_path),
                          str(QUICKSTART_SWEEP)], timeout=300, cwd=REPO)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    run_id = killed.stdout.split()[0]

    models = {step_of(m): m for m in checkpoints(client, [experiment], run_id, ready=False)}
    assert sorted(models) == [10, 20] and (str(models[10].status), str(models[20].status)) == ("READY", "PENDING")
    assert score(models[20], "eval/AP_best") == 0.5  # it scored better, but never finished
    partial = tracking_stack.s3.keys(tracking_stack.bucket, f"mlflow/{experiment}/models/{models[20].model_id}/")
    assert len(partial) == 1, partial  # some, not all, of its files reached the bucket
    complete = f"models:/{models[10].model_id}"
    shown = run_here("best", "killed-mid-upload", "--json", env=tracking_stack.client_env)
    assert shown.returncode == 0, shown.stderr
    [ranked] = json.loads(shown.stdout)["trials"]
    assert (ranked["checkpoint"], ranked["checkpoint_step"]) == (complete, 10)
    assert resolve_source("best:killed-mid-upload", resolve_backend(TrackingConfig())).location == complete
    link = RunLink(tracking_stack.uri, experiment, None)
    assert best_in_mlflow(link, {"trial_id": "t_00000", "mlflow_run_id": run_id}, load_sweep(QUICKSTART_SWEEP)) == (complete, None)

    resumed = TrialRun(link, TrialIdentity("t_00000", "trial_t_00000"), load_sweep(QUICKSTART_SWEEP).base)
    resumed.log_report({"step": 30, "train/loss": 0.4, "eval/AP_best": 0.1},
                       ray.train.Checkpoint.from_directory(str(tmp_path / "step_30")))
    resumed.finish()
    # its best (10) and latest (30) kept; the dead upload deleted
    assert sorted(step_of(m) for m in checkpoints(client, [experiment], run_id, ready=False)) == [10, 30]


def test_the_heads_server_without_its_secret_makes_its_own_says_its_runs_die_with_the_cluster_and_reads_files_as_data(
        s3, tmp_path):
    """The cluster file's start where Secrets Manager holds no head secret: the head makes its
    own admin password and session key (a 0600 file on the head), and serves a try-it-out
    server on its disk whose start says so in one line before the user's. The trials' file is
    data: a value shell would run is only text, and a head-only key in it is refused; so is a
    head secret naming one store of the two."""
    import requests

    from .mlflow_checks import cluster_mlflow_server

    ran = tmp_path / "ran"
    user = {"MLFLOW_TRACKING_USERNAME": "detsweep", "MLFLOW_TRACKING_PASSWORD": f"S3cret-$(touch {ran})"}
    with cluster_mlflow_server(tmp_path, user, s3.env) as server:
        uri, authority, head = server.uri, server.authority, tmp_path / "head-mlflow"
        warning, made = server.said.splitlines()
        assert re.fullmatch(
            rf"detsweep: MLflow keeps its runs in {re.escape(str(head))} on this node: they die with the cluster "
            r"\(ray down\); create the head's secret secretsmanager:detsweep-tests/\S+ with MLFLOW_BACKEND_STORE_URI "
            "and MLFLOW_ARTIFACTS_DESTINATION to keep them outside it", warning), warning
        assert made == "MLflow user detsweep: created"
        assert (head / "mlflow.db").is_file() and not ran.exists()
        assert (head / "basic_auth.ini").stat().st_mode & 0o777 == 0o600
        assert (head / "head.env").stat().st_mode & 0o777 == 0o600
        admin = dict(line.split("=", 1) for line in (head / "head.env").read_text().split())["MLFLOW_AUTH_ADMIN_PASSWORD"]
        for login in (tuple(user.values()), ("admin", admin)):
            answer = requests.get(f"{uri}/api/2.0/mlflow/experiments/search", params={"max_results": 1}, auth=login,
                                  verify=str(authority), timeout=30)
            assert answer.status_code == 200, answer.text[:300]

    start = [sys.executable, "-m", "detsweep.tracking.server", "start", str(tmp_path / "refused"), str(tmp_path / "mlflow.env"),
             str(free_port())]
    (tmp_path / "mlflow.env").write_text("MLFLOW_TRACKING_USERNAME=detsweep\nMLFLOW_TRACKING_PASSWORD=S3cret-for-tests\n"
                                         f"MLFLOW_AUTH_ADMIN_PASSWORD={admin}\n")
    refused = run_bounded(start, timeout=120, cwd=REPO)
    assert refused.returncode == 1 and refused.stderr.strip() == (
        f"{tmp_path / 'mlflow.env'}: found MLFLOW_AUTH_ADMIN_PASSWORD; expected only MLFLOW_TRACKING_USERNAME and "
        "MLFLOW_TRACKING_PASSWORD in the file every node gets (the admin's password, the session key and the stores "
        "belong in the head's secret: README, 'A cluster closed to strangers')")
    (tmp_path / "mlflow.env").write_text("MLFLOW_TRACKING_USERNAME=detsweep\nMLFLOW_TRACKING_PASSWORD=S3cret-for-tests\n")
    half = tmp_path / "half.env"
    half.write_text(f"MLFLOW_AUTH_ADMIN_PASSWORD={admin}\nMLFLOW_FLASK_SERVER_SECRET_KEY=k\n"
                    "MLFLOW_BACKEND_STORE_URI=postgresql://x/y\n")
    refused = run_bounded([*start, "--head-secret", str(half)], timeout=120, cwd=REPO)
    assert refused.returncode == 1 and refused.stderr.strip() == (
        f"{half}: found MLFLOW_BACKEND_STORE_URI alone; expected both of MLFLOW_BACKEND_STORE_URI and "
        "MLFLOW_ARTIFACTS_DESTINATION (runs and their artifacts outside the cluster) or neither (both on the head)")
    assert not (tmp_path / "refused" / "server.log").exists()  # refused before any server started
