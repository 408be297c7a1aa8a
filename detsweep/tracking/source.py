"""Where a fine-tune, an export or a prediction starts: ``--from`` names a checkpoint.

- ``best:<experiment>``: the best trial's best checkpoint, ranked by the sweep's own metric;
- ``run:<run_id>``: a trial's (or a fine-tune's) best checkpoint in MLflow;
- ``checkpoint:<path>``: a detsweep checkpoint directory (a Ray results folder, say), or its
  URI in a bucket (``s3://…``, ``gs://…``: a sweep's storage).

MLflow checkpoints are READY LoggedModels of a trial's run, named by their URI
(``models:/<model_id>``), which every node of a cluster can download; a copy is fetched here
only to read it.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from detsweep.checkpoints import check_checkpoint, is_uri, local_folder
from detsweep.errors import DetsweepError

from .backend import Backend, check_readable
from .best import rank_trials
from .checkpoint_models import best_checkpoint, best_of, checkpoints, model_uri
from .trial_run import PARENT_TAG, ranked_by

KINDS = ("best:", "run:", "checkpoint:")


@dataclass(frozen=True)
class CheckpointSource:
    spec: str  # what the user wrote
    location: str  # a local directory, a bucket's URI, or models:/<model_id>
    run_id: str | None = None  # the MLflow run it comes from
    parent_run_id: str | None = None  # that run's sweep
    experiment_id: str | None = None

    @property
    def in_mlflow(self) -> bool:
        return self.run_id is not None


def resolve_source(spec: str, backend: Backend) -> CheckpointSource:
    """Check what ``spec`` names and that it holds a checkpoint; downloads nothing."""
    kind, _, value = spec.partition(":")
    if f"{kind}:" not in KINDS or not value:
        raise DetsweepError(f"--from: found {spec!r}, expected best:<experiment>, run:<run_id> or checkpoint:<path>")
    if kind == "checkpoint":
        return local_source(spec, value if is_uri(value) else Path(value))
    check_readable(backend)
    from mlflow import MlflowClient

    client = MlflowClient(backend.uri)
    if kind == "best":
        run, checkpoint = best_run(client, value, backend)
    else:
        run = get_run(client, value, backend)
        checkpoint = best_checkpoint(client, run.info.experiment_id, run.info.run_id, *ranked_by(run))
    if checkpoint is None:
        raise DetsweepError(f"--from {spec}: run {run.info.run_id} has no complete checkpoint in MLflow "
                            "(expected a READY checkpoint model that scored the run's metric; did it reach an evaluation?)")
    return CheckpointSource(spec, model_uri(checkpoint), run.info.run_id, run.data.tags.get(PARENT_TAG),
                            run.info.experiment_id)


def local_source(spec: str, directory: str | Path) -> CheckpointSource:
    """A checkpoint folder (made absolute) or a bucket's URI, as given."""
    checked = check_checkpoint(directory, f"--from {spec}")
    return CheckpointSource(spec, checked if isinstance(checked, str) else str(checked.resolve()))


def get_run(client, run_id: str, backend: Backend):
    from mlflow.exceptions import MlflowException

    try:
        return client.get_run(run_id)
    except MlflowException:
        raise DetsweepError(f"--from run:{run_id}: no such run at {backend.uri}") from None


def best_run(client, experiment: str, backend: Backend):
    """The best trial's run that has a complete checkpoint, and its best checkpoint: the
    trials' checkpoints looked up in the ranking's order until one has one."""
    ranking = rank_trials(client, experiment, backend, top=0)
    for row in ranking.trials:
        models = checkpoints(client, [row.run.info.experiment_id], row.run.info.run_id)
        if (best := best_of(models, ranking.metric, ranking.mode)) is not None:
            return row.run, best
    raise DetsweepError(f"--from best:{experiment}: no trial of the experiment at {backend.uri} "
                        "has a complete checkpoint in MLflow")


@contextlib.contextmanager
def fetched(source: CheckpointSource, backend: Backend) -> Iterator[Path]:
    """A local directory holding the source's checkpoint, for the duration of the block."""
    with local_copy(source.location, backend.uri) as directory:
        yield directory


@contextlib.contextmanager
def local_copy(location: str, tracking_uri: str) -> Iterator[Path]:
    """``location`` (a folder, a bucket's URI, or an MLflow URI) as a local folder, for the block."""
    if not location.startswith(("runs:/", "models:/")):
        with local_folder(location) as directory:
            yield directory
        return
    from mlflow import MlflowClient
    from mlflow.artifacts import download_artifacts

    if location.startswith("models:/"):  # MLflow 3.17 resolves these with the global tracking URI, not this one
        location = MlflowClient(tracking_uri).get_logged_model(location.removeprefix("models:/")).artifact_location
    with tempfile.TemporaryDirectory(prefix="detsweep-checkpoint-") as scratch:
        yield Path(download_artifacts(artifact_uri=location, dst_path=scratch, tracking_uri=tracking_uri))
