"""After a sweep: ``detsweep best`` reads the winner from MLflow, ``detsweep finetune`` keeps
training it (one run, or a sweep of fine-tuning runs) with new classes or more steps.

One real sweep is the source of every test here (``conftest.trained_sweep``: its best trial
trained long enough to detect something; the export tests ship its checkpoint too); each
fine-tune is a real Ray Train run that downloads the checkpoint from MLflow.
"""

from __future__ import annotations

import json
import math
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest

from .conftest import REPO, run_cli, run_here, side_by_side
from .mlflow_checks import free_port
from .tiny_sweeps import tiny_sweep

AP_NOISE = 0.01
CLASS_LOGITS = {"classification_head/logits_layer/kernel", "classification_head/logits_layer/bias"}
LIBRARIES = ("ray", "tensorflow", "keras", "keras-hub", "mlflow", "optuna")
ENVIRONMENT_TAGS = {"python": "detsweep.python"} | {name: f"detsweep.version.{name}" for name in LIBRARIES} | {
    "lock": "detsweep.lock"}  # as `detsweep best` names them, in its order


def finetune_json(folder: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict | None]:
    result = run_cli("finetune", *args, "--storage", str(folder / "ray"), "--json", cwd=folder)
    return result, json.loads(result.stdout) if result.returncode in (0, 1) and result.stdout.strip() else None


def trainable_weights(checkpoint: Path, use_average: bool = False) -> dict[str, np.ndarray]:
    from detsweep.train.restore import load_trained_model

    trained = load_trained_model(checkpoint)
    if use_average:
        trained.moving_average.swap()
    return {w.path: w.numpy() for w in trained.model.trainable_weights}


def this_process_environment() -> dict[str, str]:
    """What this process runs on, read here: the sweep's driver and trials run from this checkout and venv."""
    import hashlib
    import platform
    from importlib.metadata import version

    return {"python": platform.python_version()} | {name: version(name) for name in LIBRARIES} | {
        "lock": hashlib.sha256((REPO / "uv.lock").read_bytes()).hexdigest()[:16]}


def best_in_mlflow(report: dict) -> str:
    """The best trial's best READY checkpoint in MLflow, as ``models:/<model_id>``."""
    from mlflow import MlflowClient

    from detsweep.tracking.checkpoint_models import best_checkpoint, model_uri

    found = best_checkpoint(MlflowClient(report["mlflow"]["tracking_uri"]), report["mlflow"]["experiment_id"],
                            report["best"]["mlflow_run_id"], report["metric"], report["mode"])
    return model_uri(found)


def downloaded(uri: str, tracking_uri: str, into: Path) -> Path:
    import shutil

    from detsweep.tracking.source import local_copy

    with local_copy(uri, tracking_uri) as folder:
        return Path(shutil.copytree(folder, into / "checkpoint"))


def test_best_ranks_the_trials_from_mlflow_alone(trained_sweep):
    folder, report = trained_sweep
    shown = run_here("best", "source", "--json", cwd=folder)
    table = run_here("best", str(folder / "source.yaml"), cwd=folder)  # by sweep file, as a table
    assert shown.returncode == 0, shown.stderr
    ranking = json.loads(shown.stdout)
    assert ranking["metric"] == "eval/AP_best" and ranking["mode"] == "max"
    assert ranking["parent_run_ids"] == [report["mlflow"]["parent_run_id"]]
    trial, stopped, failed = ranking["trials"]  # the trial ASHA stopped at step 75 second, the diverged one last
    assert failed["value"] is None and failed["swept"] == {"optimizer.learning_rate.learning_rate_base": 1e12}, failed
    assert trial["run_id"] == report["best"]["mlflow_run_id"] and trial["trial_id"] == report["best"]["trial_id"]
    assert stopped["swept"] == {"optimizer.learning_rate.learning_rate_base": 0.00001} and stopped["value"] < trial["value"]
    assert trial["value"] == pytest.approx(report["best"]["metrics"]["eval/AP_best"])
    assert trial["swept"] == {"optimizer.learning_rate.learning_rate_base": 0.04}
    assert trial["checkpoint"] == best_in_mlflow(report) and trial["checkpoint_step"] == 150
    assert table.returncode == 0 and trial["run_id"] in table.stdout and f"checkpoint: {trial['checkpoint']}" in table.stdout
    # what each run ran on, from its own process: the driver's and the trial's, both this checkout's
    from mlflow import MlflowClient

    client = MlflowClient(report["mlflow"]["tracking_uri"])
    here = this_process_environment()
    for run_id in (report["mlflow"]["parent_run_id"], trial["run_id"]):
        tags = client.get_run(run_id).data.tags
        assert {name: tags.get(tag) for name, tag in ENVIRONMENT_TAGS.items()} == here, run_id
    assert trial["environment"] == here
    assert "ran on: " + ", ".join(f"{name} {value}" for name, value in here.items()) in table.stdout, table.stdout


@pytest.fixture(scope="module")
def fine_tunes(trained_sweep, s3, tmp_path_factory) -> dict:
    """The two fine-tunes below, side by side (each is mostly a Ray Train trial's start and its
    waits, and the machine has two cores): ``more``, the result of the run with more steps
    into a bucket (its bucket's name beside it); ``tuned``, the fine-tuning sweep's result and
    what its terminal was sent."""
    import sys

    from .conftest import cli_environment, run_on_terminal

    folder, report = trained_sweep
    more = tmp_path_factory.mktemp("more") / "more.yaml"
    more.write_text("train: {num_steps: 160, eval_every: 50}\n")
    bucket = s3.new_bucket("finetuned")
    # A learning rate of 0 keeps every trainable weight where the restore put it, at every checkpoint.
    # The budget counts from the sweep's start and must hold the trial's start beside the other run
    # and its first 10 steps: over 45 s once, and over 60 s on a machine half as fast (seen in a clean
    # clone: the budget ran out before the first report).
    sweep = tiny_sweep(folder, """
  metric: eval/AP_best
  mode: max
  algorithm: grid
  num_samples: 1
  time_budget_s: 90
  space:
    optimizer.learning_rate.learning_rate: {grid: [0.0]}
""", num_steps=2000, every=10, name="tuned", data="{train: {num_images: 16}, val: {num_images: 8}}")
    source_run = report["best"]["mlflow_run_id"]  # named by its MLflow run this time
    more_steps, tuned = side_by_side([
        lambda: run_cli("finetune", str(more), "--from", "best:source", "--keep-optimizer-state",
                        "--set", "optimizer.learning_rate.total_steps=160", "--storage", f"s3://{bucket}/finetune",
                        "--json", cwd=folder, env=s3.env),
        lambda: run_on_terminal(
            [sys.executable, "-m", "detsweep.cli", "finetune", "--sweep", str(sweep), "--from", f"run:{source_run}",
             "--from-ema", "--no-register", "--json", "--set", "base.model.num_classes=5",
             "--set", "base.optimizer.learning_rate.type=constant"], cwd=folder, env=cli_environment({"COLUMNS": "160"}))])
    return {"more": (more_steps, bucket), "tuned": tuned}


@pytest.mark.upgrade_check
def test_more_steps_from_the_best_trial_keep_its_optimizer_and_do_not_lose_what_it_found(trained_sweep, fine_tunes, tmp_path):
    """The user story: the sweep's winner, trained on. Its optimizer state and step are kept,
    the schedule is stretched to the new end; the run is nested under the source's sweep. A
    positional CONFIG.yaml is merged over the checkpoint's own config, then ``--set``; its
    results are in a bucket, as a cluster keeps them."""
    folder, report = trained_sweep
    before = report["best"]["metrics"]["eval/AP_best"]
    result, bucket = fine_tunes["more"]
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout)
    assert out["warm_start"]["fresh"] == [] and out["warm_start"]["step"] == 150 and out["warm_start"]["optimizer_restored"] > 0
    assert out["steps"] == 160 and out["source"]["run_id"] == report["best"]["mlflow_run_id"]
    assert out["checkpoint"].startswith(f"s3://{bucket}/finetune/")
    assert "fine-tune: " in result.stderr and "weights restored, 0 fresh; training starts at step 150" in result.stderr
    # The source detects something (150 steps scored as low as 0.048 here), well above the
    # allowance below, so the comparison means something.
    assert before > 3 * AP_NOISE, before
    # 10 more steps on the same trajectory keep most of it: a restart from step 0 scores ~0
    # after 10 steps (the source itself scored 0.0007 at step 50). Measured here: 10 more steps
    # moved the source's AP by +0.0006 (0.0877 to 0.0883); 50 more steps, by -0.018 to +0.016.
    assert out["metrics"]["eval/AP_best"] >= before / 2, (out["metrics"], before)

    from mlflow import MlflowClient

    from detsweep.config import TrackingConfig
    from detsweep.tracking import resolve_backend
    from detsweep.tracking.best import rank_trials
    from detsweep.tracking.checkpoint_models import checkpoints, score, step_of

    client = MlflowClient(out["mlflow"]["tracking_uri"])
    run = client.get_run(out["mlflow"]["run_id"])
    assert run.info.status == "FINISHED" and run.data.tags["detsweep.role"] == "finetune"
    assert run.data.tags["mlflow.parentRunId"] == report["mlflow"]["parent_run_id"]  # nested under the source's sweep
    assert run.data.tags["detsweep.source_run_id"] == report["best"]["mlflow_run_id"]
    assert {name: run.data.tags.get(tag) for name, tag in ENVIRONMENT_TAGS.items()} == this_process_environment()
    assert run.data.params["train.fine_tune.checkpoint"] == out["source"]["checkpoint"]
    assert run.data.params["train.fine_tune.keep_optimizer_state"] == "true"
    params = run.data.params  # the file's, then --set's, over the checkpoint's own
    assert (params["train.num_steps"], params["train.eval_every"], params["optimizer.learning_rate.total_steps"]) == (
        "160", "50", "160")
    assert params["train.checkpoint_every"] == "75" and params["data.train.format"] == "synthetic"  # the checkpoint's own
    assert [m.step for m in client.get_metric_history(run.info.run_id, "train/loss")] == [160]
    # the schedule was stretched: the last step (159) trained at the cosine's rate one step
    # before 0 at the new end, 160 (4e-6; the old end, 150, would have made it 0), by hand from
    # the source's rate (0.04) and warm-up (2 steps, tiny_sweep)
    [lr] = client.get_metric_history(run.info.run_id, "train/lr")
    assert lr.step == 160 and lr.value == pytest.approx(0.5 * 0.04 * (1 + math.cos(math.pi * (159 - 2) / (160 - 2))),
                                                        rel=1e-2), lr
    plan = json.loads(Path(client.download_artifacts(run.info.run_id, "warm_start.json", str(tmp_path))).read_text())
    assert plan["fresh"] == [] and "conv1_conv/kernel" in plan["restored"]
    assert {"config.yaml", "warm_start.json"} <= {a.path for a in client.list_artifacts(run.info.run_id)}
    [kept] = checkpoints(client, [run.info.experiment_id], run.info.run_id)  # its one checkpoint, at step 160
    assert step_of(kept) == 160 and score(kept, "eval/AP_best") == pytest.approx(out["metrics"]["eval/AP_best"])
    # fine-tunes are not trials: ranked here, as `detsweep best` ranks (its command: the test above)
    ranked = rank_trials(client, "source", resolve_backend(TrackingConfig(uri=out["mlflow"]["tracking_uri"])))
    assert [t["run_id"] for t in ranked.to_dict()["trials"]][:1] == [report["best"]["mlflow_run_id"]]
    assert len(ranked.to_dict()["trials"]) == len(report["trials"])

    # and shipped: the export of a checkpoint from MLflow is logged back to its run
    exported = run_here("export", "--from", f"run:{run.info.run_id}", "--out", str(tmp_path / "export"), "--json", cwd=folder)
    assert exported.returncode == 0, exported.stderr[-2000:]
    assert json.loads(exported.stdout)["run_id"] == run.info.run_id and (tmp_path / "export" / "saved_model.pb").is_file()
    assert "export/saved_model/saved_model.pb" in {a.path for a in client.list_artifacts(run.info.run_id, "export/saved_model")}


def test_a_fine_tuning_sweep_from_a_run_with_new_classes_restores_all_but_the_class_logits_until_its_time_budget(
        trained_sweep, fine_tunes):
    """``finetune --sweep`` from the best trial's run, with 5 classes for its 3: every weight
    but the class logits is the source's averaged one. Run as a person at a terminal runs it
    (the report into a file), with ``search.time_budget_s``: the trial, far from its last
    step when the budget is spent, is stopped by Tune, ``STOPPED`` in the report, its MLflow
    run ends ``KILLED``, and the terminal showed it live."""
    from .conftest import plain

    folder, report = trained_sweep
    result, drawn = fine_tunes["tuned"]
    terminal = plain(drawn)
    assert result.returncode == 0, terminal[-3000:]
    assert "weights restored, 2 fresh (classification_head/logits_layer/kernel, classification_head/logits_layer/bias)" \
        in terminal
    out = json.loads(result.stdout)
    [trial] = out["trials"]
    assert trial["status"] == "STOPPED" and 10 <= trial["metrics"].get("step", 0) < 2000, trial
    # the terminal: the trial's events, and the live table drawn under them, redrawn as the trial
    # moves, gone (cursor back) at the end; Ray's lines went to the log
    assert f"trial {trial['trial_id']} started: " in terminal and f"trial {trial['trial_id']} step 10/2000" in terminal
    assert terminal.count("┃ trial ") >= 3 and f"│ {trial['trial_id']} │ RUNNING " in terminal, terminal[-3000:]
    assert drawn.index("\x1b[?25l") < drawn.rindex(f"│ {trial['trial_id']} │") < drawn.rindex("\x1b[?25h")
    assert "1 running; 0 min" in terminal and "pid=" not in terminal
    assert "reading and checking data.train (synthetic)" in terminal  # long work shows, then gives way to its line

    tuned = trainable_weights(Path(trial["checkpoint"]))
    with tempfile.TemporaryDirectory() as scratch:
        source = downloaded(best_in_mlflow(report), out["mlflow"]["tracking_uri"],
                            Path(scratch))
        averaged = trainable_weights(source, use_average=True)
    assert set(tuned) == set(averaged)
    for name in set(tuned) - CLASS_LOGITS:  # --from-ema: the source's averaged weights
        np.testing.assert_array_equal(tuned[name], averaged[name], err_msg=name)
    kernel = "classification_head/logits_layer/kernel"
    assert tuned[kernel].shape[-1] == 9 * 5 and averaged[kernel].shape[-1] == 9 * 3

    from mlflow import MlflowClient

    client = MlflowClient(out["mlflow"]["tracking_uri"])
    parent = client.get_run(out["mlflow"]["parent_run_id"])
    assert parent.data.tags["detsweep.source_run_id"] == report["best"]["mlflow_run_id"]
    child = client.get_run(trial["mlflow_run_id"])
    assert child.data.params["train.fine_tune.checkpoint"] == best_in_mlflow(report)
    assert child.data.params["train.fine_tune.from_moving_average"] == "true" and child.data.params["model.num_classes"] == "5"
    assert child.info.status == "KILLED" and child.data.tags.get("early_stopped") == "true", (child.info, child.data.tags)


def test_what_cannot_be_fine_tuned_is_refused_in_one_line(trained_sweep, tmp_path):
    folder, report = trained_sweep
    from mlflow import MlflowClient

    client = MlflowClient(report["mlflow"]["tracking_uri"])
    runs_before = len(client.search_runs([report["mlflow"]["experiment_id"]]))

    def refused(*args: str, env: dict | None = None, cwd: Path = folder) -> str:
        result = run_cli(*args, cwd=cwd, env=env)
        assert result.returncode == 2, (args, result.stdout, result.stderr[-2000:])
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("detsweep: error: ") and "Traceback" not in result.stderr, args
        return lines[0]

    sweep_run = report["mlflow"]["parent_run_id"]  # the sweep's own run holds no checkpoint
    [diverged] = [trial["mlflow_run_id"] for trial in report["trials"] if trial["status"] == "ERROR"]  # nor its first loop
    down = f"http://127.0.0.1:{free_port()}"
    misfit = "image encoder (resnet_tiny) does not fit this model's (resnet18)"
    # a local checkpoint folder with a positional CONFIG.yaml: the config's backbone is merged
    # over the checkpoint's own, and found not to fit, before anything starts
    local = downloaded(best_in_mlflow(report), report["mlflow"]["tracking_uri"], tmp_path / "local")
    bigger = tmp_path / "bigger.yaml"
    bigger.write_text("model: {backbone: resnet18}\n")
    empty = _with_empty_experiment(folder)
    # what each refusal's one line says; the two misfits first, side by side: the slowest
    # (TensorFlow builds both models)
    expected = [
        (misfit, lambda: refused("finetune", "--from", "best:source", "--set", "model.backbone=resnet18")),
        (misfit, lambda: refused("finetune", str(bigger), "--from", f"checkpoint:{local}")),
        ("no trial runs", lambda: refused("best", "empty", cwd=empty)),
        (f"run {sweep_run} has no complete checkpoint in MLflow", lambda: refused("finetune", "--from", f"run:{sweep_run}")),
        (f"run {diverged} has no complete checkpoint in MLflow", lambda: refused("finetune", "--from", f"run:{diverged}")),
        ("no such run", lambda: refused("finetune", "--from", "run:0123456789abcdef")),
        (f"no MLflow server answers at {down}", lambda: refused("best", "source", env={"MLFLOW_TRACKING_URI": down})),
        ("is not a detsweep checkpoint", lambda: refused("finetune", "--from", f"checkpoint:{tmp_path}")),
    ]
    for (words, _), line in zip(expected, side_by_side([call for _, call in expected])):
        assert words in line, (words, line)
    assert len(client.search_runs([report["mlflow"]["experiment_id"]])) == runs_before  # nothing started


def _with_empty_experiment(folder: Path) -> Path:
    """A copy of the sweep's database with one more experiment, which holds no runs."""
    import shutil

    from mlflow import MlflowClient

    copy = folder / "empty"
    copy.mkdir(exist_ok=True)
    shutil.copy(folder / "mlflow.db", copy / "mlflow.db")
    MlflowClient(f"sqlite:///{copy / 'mlflow.db'}").create_experiment("empty")
    return copy
