"""``detsweep finetune``: keep training a sweep's winner (or any checkpoint) on more steps,
new data or new classes.

The fine-tune's config is the source's as-run config, merged with the given config file and
``--set`` overrides; ``train.fine_tune`` names the checkpoint, and the workers restore what
fits from it (:mod:`detsweep.train.warm_start`). That is checked here first, so a checkpoint
that does not fit fails before anything starts. Training runs through Ray Train like
``detsweep train``; the MLflow run is nested under the source's sweep and tagged with its source.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from detsweep import console
from detsweep.checkpoints import read_config_tree
from detsweep.cluster import run_folder
from detsweep.config import TrackingConfig, TrialConfig, read_trial_tree, validate
from detsweep.config.loader import merge_trees, read_yaml_mapping, resolve_data_paths
from detsweep.errors import stderr_held_back
from detsweep.preflight import Preflight, preflight
from detsweep.tracking.backend import Backend, check_backend, resolve_backend
from detsweep.tracking.source import CheckpointSource, fetched, resolve_source

SOURCE_RUN_TAG = "detsweep.source_run_id"
SOURCE_CHECKPOINT_TAG = "detsweep.source_checkpoint"
DEFAULT_EXPERIMENT = "finetune"


@dataclass(frozen=True)
class FineTuneRequest:
    """What the user asked for on the command line."""

    source: str  # best:<experiment> | run:<run_id> | checkpoint:<path>
    config_path: str | None = None
    overrides: tuple[str, ...] = ()
    from_moving_average: bool = False
    keep_optimizer_state: bool = False

    def fine_tune_section(self, source: CheckpointSource) -> dict[str, Any]:
        return {"checkpoint": source.location, "from_moving_average": self.from_moving_average,
                "keep_optimizer_state": self.keep_optimizer_state}


def finetune(request: FineTuneRequest, address: str | None = None, storage_path: str | None = None) -> dict[str, Any]:
    """Fine-tune once, with progress lines on the console; returns the ``detsweep finetune --json`` object."""
    backend = backend_for(request)
    with stderr_held_back():  # an error below is one line, not TensorFlow's start-up or a progress bar
        source = resolve_source(request.source, backend)
        config = fine_tune_config(request, source, backend)
        # Ray Train (a second to import) loads only once the source and config above passed
        cleared = preflight(Preflight(config, request.config_path or request.source))
        config = cleared.config  # its bucket data's version fixed
    from detsweep.cluster import connect
    from detsweep.tracking.backend import trial_environment, use_writer_settings
    from detsweep.trainables.request import TrainingRequest
    from detsweep.trainables.trainer import LastReport
    from detsweep.trainables.trial import train_and_log

    for line in cleared.notes + cleared.summaries:
        print(line, file=console.err())
    plan = cleared.plan
    name = f"finetune-{time.strftime('%Y%m%d-%H%M%S')}"
    console.keep_log_in(run_folder(storage_path, name), "finetune.log")
    use_writer_settings()  # its run logs as a trial's does; set before Ray's threads run
    connect(address, env=trial_environment())
    run = open_finetune_run(config, source, backend, name, plan)
    print(f"MLflow: fine-tune run {name} at {backend.uri}", file=console.err(), flush=True)
    last = LastReport()
    request = TrainingRequest(config, name, storage_path, pictures=True, system_metrics=True)
    error = train_and_log(request, run, last, progress=True)
    run.finish(error=error)
    return {"name": name, "source": source_dict(source), "warm_start": plan_summary(plan),
            "steps": int(last.metrics.get("step", 0)), "metrics": last.metrics, "checkpoint": last.checkpoint,
            "error": error, "mlflow": {"tracking_uri": backend.uri, "run_id": run.run_id}}


def finetune_sweep(request: FineTuneRequest, sweep_path: str, address: str | None = None,
                   register: bool = True) -> dict[str, Any]:
    """A sweep whose every trial starts from the source checkpoint (its base gets ``train.fine_tune``)."""
    from detsweep.sweeps.spec import load_sweep

    backend = resolve_backend(load_sweep(sweep_path, request.overrides).base.tracking)
    with stderr_held_back():
        source = resolve_source(request.source, backend)
    from detsweep.sweeps.launch import launch  # Ray's import: only for a source that exists

    section = request.fine_tune_section(source)
    pinned = [f"base.train.fine_tune.{key}={value}" for key, value in section.items()] + [f"base.tracking.uri={backend.uri}"]
    sweep = load_sweep(sweep_path, [*request.overrides, *pinned])
    return launch(sweep, address, register=register, tags=source_tags(source))


def backend_for(request: FineTuneRequest) -> Backend:
    """The tracking server named by the given config (file or ``--set``), else the default one."""
    tree = read_yaml_mapping(request.config_path) if request.config_path else {}
    tracking = validate(TrackingConfig, tree.get("tracking") or {}, request.config_path or "--set",
                        [o.removeprefix("tracking.") for o in request.overrides if o.startswith("tracking.")])
    backend = resolve_backend(tracking)
    check_backend(backend)
    return backend


def fine_tune_config(request: FineTuneRequest, source: CheckpointSource, backend: Backend) -> TrialConfig:
    """The source's as-run config ← the given config file ← ``--set``; ``train.fine_tune`` names the source."""

    with fetched(source, backend) as directory:
        tree = read_config_tree(directory)
    if request.config_path:
        given = read_trial_tree(request.config_path)
        resolve_data_paths(given, Path(request.config_path).parent)
        merge_trees(tree, given)
    tree.setdefault("train", {})["fine_tune"] = request.fine_tune_section(source)
    tree.setdefault("tracking", {})["uri"] = backend.uri  # the workers download the checkpoint from there
    return validate(TrialConfig, tree, request.config_path or f"the config of {request.source}", request.overrides)


def open_finetune_run(config: TrialConfig, source: CheckpointSource, backend: Backend, name: str, plan):
    """A child run of the source's sweep (a run of its own when the source is a folder)."""
    from mlflow import MlflowClient

    from detsweep.tracking.sweep_run import experiment_id
    from detsweep.tracking.trial_run import ROLE_TAG, RunLink, TrialIdentity, TrialRun

    experiment = source.experiment_id or experiment_id(MlflowClient(backend.uri),
                                                       config.tracking.experiment or DEFAULT_EXPERIMENT, backend)
    link = RunLink(backend.uri, experiment, source.parent_run_id)
    tags = source_tags(source) | {ROLE_TAG: "finetune", "detsweep.warm_start.restored": str(len(plan.restored)),
                                  "detsweep.warm_start.fresh": str(len(plan.fresh))}
    run = TrialRun(link, TrialIdentity(name, name), config, tags=tags)
    run.log_dict(plan.to_dict(), "warm_start.json")
    return run


def source_tags(source: CheckpointSource) -> dict[str, str]:
    tags = {SOURCE_CHECKPOINT_TAG: source.location}
    if source.run_id:
        tags[SOURCE_RUN_TAG] = source.run_id
    if source.parent_run_id:
        tags["mlflow.parentRunId"] = source.parent_run_id
    return tags


def source_dict(source: CheckpointSource) -> dict[str, Any]:
    return {"spec": source.spec, "checkpoint": source.location, "run_id": source.run_id}


def plan_summary(plan) -> dict[str, Any]:
    return {"restored": len(plan.restored), "fresh": plan.fresh, "step": plan.step,
            "optimizer_restored": plan.optimizer_restored}


