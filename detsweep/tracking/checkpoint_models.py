"""A trial's checkpoints in MLflow, the durable record of them: each one a LoggedModel of the
trial's run (MLflow 3's record for deep-learning checkpoints), with its step and the metrics
it scored, listed on the run's page.

A checkpoint is PENDING while its files upload and READY once all of them are there. "Best"
and "latest" are searches over a run's READY checkpoints, never folders written over in
place: a trial killed mid-upload leaves a PENDING model that nothing reads, and its earlier
checkpoints stay what ``best``, registration and ``finetune --from best:`` use.

A run keeps its best and its latest checkpoint; the others are deleted as soon as a newer
one is READY. MLflow's deletion only marks them: ``mlflow gc`` on the tracking server's host
removes their files (``cluster/mlflow_server.sh`` schedules it on the cluster's head).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path

from .pages import every_logged_model

KIND = "detsweep-checkpoint"  # the models' model_type: registered pyfunc models are not checkpoints
STEP_TAG = "detsweep.step"


def model_uri(model) -> str:
    """What every node of a cluster can download the checkpoint by."""
    return f"models:/{model.model_id}"


def step_of(model) -> int:
    return int(model.tags[STEP_TAG])


def log_checkpoint(client, experiment_id: str, run_id: str, directory: Path, step: int, metrics: Iterable = ()):
    """Upload ``directory`` as a checkpoint of the run at ``step``; returns the READY model.

    ``metrics``: ``mlflow.entities.Metric`` points the run already has (same key, value, step
    and timestamp), linked to the checkpoint; MLflow keeps a run's identical points once.
    Called again after a failure part-way (a writer's retry: the server restarted, an answer
    lost), it finishes what the first call began: the PENDING model is uploaded into again,
    a READY one is kept; never a second model for one step."""
    from mlflow.entities import LoggedModelOutput, Metric

    earlier = [model for model in checkpoints(client, [experiment_id], run_id, ready=False) if step_of(model) == step]
    model = next((m for m in earlier if is_ready(m)), None) or next(iter(earlier), None) or client.create_logged_model(
        experiment_id, name=f"checkpoint-{step:06d}", source_run_id=run_id, tags={STEP_TAG: str(step)}, model_type=KIND)
    if not is_ready(model):
        linked = [Metric(m.key, m.value, m.timestamp, m.step, model_id=model.model_id) for m in metrics]
        if linked:
            client.log_batch(run_id, metrics=linked)
        client.log_model_artifacts(model.model_id, str(directory))
        model = client.finalize_logged_model(model.model_id, "READY")
    outputs = client.get_run(run_id).outputs
    if model.model_id not in {output.model_id for output in (outputs.model_outputs if outputs else [])}:
        client.log_outputs(run_id, [LoggedModelOutput(model.model_id, step)])  # the run page's "Logged models"
    return model


def checkpoints(client, experiment_ids: list[str], run_id: str | None = None, ready: bool = True) -> list:
    """The checkpoints of the run (every run of the experiments without ``run_id``); only the
    READY ones unless ``ready`` is False."""
    clauses = [f"model_type = '{KIND}'"] + ([f"source_run_id = '{run_id}'"] if run_id else [])
    found = every_logged_model(client, experiment_ids, " AND ".join(clauses))
    return [model for model in found if not ready or is_ready(model)]


def is_ready(model) -> bool:
    """Every file uploaded. Not a search filter: MLflow 3.17 stores the status as a number and
    compares it with the text 'READY'."""
    return str(model.status) == "READY"


def score(model, metric: str) -> float | None:
    values = [m for m in model.metrics or [] if m.key == metric and not math.isnan(m.value)]
    return max(values, key=lambda m: (m.step, m.timestamp)).value if values else None


def best_of(models: list, metric: str, mode: str):
    """The checkpoint that scored best on ``metric`` (the later one on a tie); None if none scored it."""
    scored = [(value, step_of(model), model) for model in models if (value := score(model, metric)) is not None]
    if not scored:
        return None
    sign = 1.0 if mode == "max" else -1.0
    return max(scored, key=lambda row: (sign * row[0], row[1]))[2]


def latest_of(models: list):
    return max(models, key=step_of, default=None)


def best_checkpoint(client, experiment_id: str, run_id: str, metric: str, mode: str):
    return best_of(checkpoints(client, [experiment_id], run_id), metric, mode)


def keep_best_and_latest(client, experiment_id: str, run_id: str, metric: str, mode: str) -> list[str]:
    """Delete the run's checkpoints but its best and its latest READY ones (PENDING ones too:
    uploads that died). Returns the deleted models' ids."""
    every = checkpoints(client, [experiment_id], run_id, ready=False)
    ready = [model for model in every if is_ready(model)]
    kept = {model.model_id for model in (best_of(ready, metric, mode), latest_of(ready)) if model is not None}
    doomed = [model.model_id for model in every if model.model_id not in kept]
    for model_id in doomed:
        client.delete_logged_model(model_id)
    return doomed
