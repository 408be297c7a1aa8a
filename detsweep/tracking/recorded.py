"""A sweep read back from MLflow alone, for when its Tune folder is gone: the latest sweep of
an experiment, its as-run sweep file, and each trial as its run ended it (the state
:func:`.sweep_run.end_trial_run` gave it, the reason it failed) with the histories of the
metrics asked for."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from detsweep.errors import DetsweepError

from .backend import Backend
from .best import find_experiment, sweep_runs
from .pages import metric_histories
from .sweep_run import RERUN_OF_TAG, TrialStatus, trial_runs
from .trial_run import INFEASIBLE_TAG, RunLink

SWEEP_ARTIFACT = "sweep.yaml"  # what the parent run keeps of the sweep (:func:`.sweep_run.open_sweep_run`)


@dataclass(frozen=True)
class RecordedTrial:
    """A trial as its MLflow run keeps it."""

    trial_id: str
    run: Any  # mlflow.entities.Run
    status: TrialStatus
    histories: dict[str, dict[int, float]]  # metric → step → value


def latest_sweep(client, name: str, backend: Backend) -> tuple[RunLink, str]:
    """The latest sweep of experiment ``name`` (a rerun of one aside): its parent run, and its
    ``sweep.yaml`` as text."""
    experiment = find_experiment(client, name, backend)
    sweeps = [run for run in sweep_runs(client, experiment.experiment_id) if RERUN_OF_TAG not in run.data.tags]
    if not sweeps:
        raise DetsweepError(f"experiment {name!r} at {backend.uri}: no sweep runs (expected a sweep's experiment)")
    parent = sweeps[0].info.run_id
    with tempfile.TemporaryDirectory(prefix="detsweep-sweep-") as folder:
        try:
            text = Path(client.download_artifacts(parent, SWEEP_ARTIFACT, folder)).read_text()
        except Exception as error:  # an artifact store it cannot read, or a run older than the file
            raise DetsweepError(f"experiment {name!r} at {backend.uri}: the latest sweep's run {parent} has no "
                                f"readable {SWEEP_ARTIFACT} ({error})") from None
    return RunLink(backend.uri, experiment.experiment_id, parent), text


def recorded_trials(client, link: RunLink, metrics: list[str]) -> list[RecordedTrial]:
    """Each trial run of the sweep at ``link``, with its ``metrics``' histories by step."""
    runs = sorted(trial_runs(client, link).items())
    read = metric_histories(client, [(run.info.run_id, metric) for _, run in runs for metric in metrics])
    return [RecordedTrial(trial_id, run, recorded_status(run), {metric: read[run.info.run_id, metric] for metric in metrics})
            for trial_id, run in runs]


def recorded_status(run) -> TrialStatus:
    """What a trial was, from how the sweep's end left its run (:data:`.sweep_run.RUN_STATUS`)."""
    if INFEASIBLE_TAG in run.data.tags:
        return TrialStatus.INFEASIBLE
    return {"FINISHED": TrialStatus.TERMINATED, "KILLED": TrialStatus.STOPPED,
            "FAILED": TrialStatus.ERROR}.get(run.info.status, TrialStatus.RUNNING)

