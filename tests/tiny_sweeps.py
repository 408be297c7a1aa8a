"""Tiny quickstart sweeps, as the sweep tests launch them (``test_sweep_runs``, the two-node
cluster's, the fine-tuning sweep's), and what they read back."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

from .conftest import REPO, run_cli

QUICKSTART = REPO / "configs" / "quickstart.yaml"


def tiny_sweep(tmp_path: Path, search: str, num_steps: int = 20, every: int = 5, name: str = "tiny",
               scaling: str = "{}", data: str = "{train: {num_images: 16}, val: {num_images: 8}}",
               loop: int | None = None, storage: str | None = None) -> Path:
    """A sweep file of tiny quickstart trials, evaluated and checkpointed ``every`` steps, a
    report every ``loop`` steps (default: ``every``), its results kept under ``storage``
    (default: ``tmp_path/ray``)."""
    path = tmp_path / f"{name}.yaml"
    path.write_text(f"""
name: {name}
storage: {storage or tmp_path / "ray"}
base:
  from: {QUICKSTART}
  data: {data}
  train: {{num_steps: {num_steps}, steps_per_loop: {loop or every}, eval_every: {every}, checkpoint_every: {every}}}
  optimizer:
    learning_rate: {{total_steps: {num_steps}, warmup_steps: 2, warmup_learning_rate: 0.00001}}
  scaling: {scaling}
search:
{search}
""")
    return path


def results_of(experiment: Path) -> dict[str, list[dict]]:
    """Every result Tune recorded, per trial id, in the order they arrived."""
    rows = {}
    for trial_dir in sorted(experiment.glob("trial_*")):
        text = (trial_dir / "result.json").read_text() if (trial_dir / "result.json").exists() else ""
        rows[trial_dir.name.removeprefix("trial_")] = result_rows(text)
    return rows


def results_in_bucket(s3, experiment: str) -> dict[str, list[dict]]:
    """``results_of`` for a sweep kept in a bucket (``s3://bucket/prefix``)."""
    bucket, prefix = experiment.removeprefix("s3://").split("/", 1)
    found = sorted(key for key in s3.keys(bucket, f"{prefix}/")
                   if re.fullmatch(rf"{re.escape(prefix)}/trial_[^/]+/result\.json", key))
    return {key.split("/")[-2].removeprefix("trial_"): result_rows(s3.read(f"s3://{bucket}/{key}")) for key in found}


def result_rows(text: str) -> list[dict]:
    """The rows of one trial's ``result.json``."""
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def launch_json(*args: str, cwd: Path, env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess, dict]:
    """``detsweep launch … --json`` in ``cwd``: MLflow's embedded default lands there. Its one
    line holds exactly the keys README lists."""
    result = run_cli("launch", *args, "--json", cwd=cwd, env=env)
    assert result.stdout.count("\n") == 1, f"--json must print one line, got:\n{result.stdout[-2000:]}"
    report = json.loads(result.stdout)
    check_launch_keys(report)
    return result, report


LAUNCH_KEYS = {"name", "path", "metric", "mode", "trials", "best", "mlflow", "cost", "study", "importance"}
TRIAL_KEYS = {"trial_id", "status", "metrics", "config", "checkpoint", "error", "infeasible", "mlflow_run_id", "cost"}
MLFLOW_KEYS = {"tracking_uri", "experiment_id", "parent_run_id", "registered_model", "not_registered"}
REGISTERED_KEYS = {"name", "version", "model_uri", "champion"}
COST_KEYS = {"cost/cpu_hours", "cost/gpu_hours"}


def check_launch_keys(report: dict) -> None:
    """The keys of ``launch --json``, no more and no fewer (README, ``detsweep launch``)."""
    multi_objective = "pareto" in report  # a sweep with search.objectives: its front too
    assert set(report) == LAUNCH_KEYS | ({"pareto"} if multi_objective else set()), sorted(report)
    assert set(report["cost"]) == COST_KEYS, sorted(report["cost"])
    for trial in report["trials"] + ([report["best"]] if report["best"] else []):
        assert set(trial) == TRIAL_KEYS and set(trial["cost"]) == COST_KEYS, sorted(trial)
    assert set(report["mlflow"]) == MLFLOW_KEYS, sorted(report["mlflow"])
    registered = report["mlflow"]["registered_model"]
    assert registered is None or set(registered) == REGISTERED_KEYS, sorted(registered)
    assert (registered is None) == bool(report["mlflow"]["not_registered"]), report["mlflow"]  # one or the other


def lr_of(trial: dict) -> float:
    return trial["config"]["optimizer.learning_rate.learning_rate_base"]


def shapes_in_bucket(s3, tmp_path: Path, bucket: str) -> str:
    """A synthetic COCO dataset that exists only in the bucket; its prefix's URI."""
    shapes = tmp_path / "shapes"
    made = run_cli("data", "synth", "--out", str(shapes), "--num-images", "16", "--image-size", "128",
                   "--classes", "3", "--seed", "1", timeout=120)
    assert made.returncode == 0, made.stderr
    uri = s3.upload(shapes, bucket, "datasets/shapes")
    shutil.rmtree(shapes)
    return uri
