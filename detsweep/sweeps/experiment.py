"""A sweep's experiment folder: the as-run sweep file in it, finding it by name, reading its
trials (or, when the folder is gone, reading them from MLflow alone).

``detsweep launch`` writes ``sweep.yaml`` (the sweep with ``--set`` applied, the base
config inline and every default filled in) next to Tune's own experiment state, so that
``detsweep status`` and ``detsweep resume`` need nothing but the folder, on any machine.
"""

from __future__ import annotations

import math
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from detsweep.checkpoints import checkpoint_uri
from detsweep.cluster import RAY_RESULTS, check_bucket
from detsweep.config import ScalingConfig
from detsweep.errors import DetsweepError, failure_reason
from detsweep.tracking.sweep_run import TrialStatus
from detsweep.tracking.trial_run import RunLink
from detsweep.trainables.trial import INFEASIBLE, swept_values

from .space import swept_paths
from .spec import Sweep, load_sweep

SWEEP_FILE = "sweep.yaml"


def storage_path(sweep: Sweep) -> str | None:
    """The sweep's ``storage``: URIs as given, folders made absolute against the sweep file."""
    if sweep.storage is None or "://" in sweep.storage:
        return sweep.storage
    return os.path.abspath(os.path.join(sweep.path.parent, sweep.storage))


def experiment_path(sweep: Sweep) -> str:
    root = storage_path(sweep) or os.path.expanduser(RAY_RESULTS)
    return f"{root.rstrip('/')}/{sweep.name}"


def as_run(sweep: Sweep) -> dict[str, Any]:
    """The sweep file that reproduces this sweep on its own."""
    search = sweep.search.model_dump(mode="json", exclude={"include", "space", "scheduler"})
    search["space"] = {path: p.model_dump(mode="json", exclude_none=True) for path, p in sweep.search.space.items()}
    scheduler = sweep.search.scheduler.model_dump(mode="json", exclude={"mutations"})
    scheduler["mutations"] = {path: p.model_dump(mode="json", exclude_none=True)
                              for path, p in sweep.search.scheduler.mutations.items()}
    search["scheduler"] = scheduler
    rerun = {"rerun": sweep.rerun.model_dump(mode="json")} if sweep.rerun else {}
    return {"name": sweep.name, "base": sweep.base.model_dump(mode="json"), "search": search,
            "storage": storage_path(sweep), **rerun}


def save_sweep(sweep: Sweep) -> str:
    """Write ``sweep.yaml`` into the experiment folder (local or a bucket); returns the folder."""
    import pyarrow.fs

    path = experiment_path(sweep)
    filesystem, folder = pyarrow.fs.FileSystem.from_uri(path if "://" in path else os.path.abspath(path))
    filesystem.create_dir(folder, recursive=True)
    with filesystem.open_output_stream(f"{folder}/{SWEEP_FILE}") as out:
        out.write(yaml.safe_dump(as_run(sweep), sort_keys=False).encode())
    return path


def find_experiment(name_or_path: str) -> tuple[str, Sweep]:
    """A sweep folder (or a bucket's URI), a sweep file (its ``storage``/``name``), or a name
    under ``~/ray_results``."""
    candidates = [name_or_path]
    if name_or_path.endswith((".yaml", ".yml")) and Path(name_or_path).is_file():
        candidates = [experiment_path(load_sweep(name_or_path))]
    elif "/" not in name_or_path and not Path(name_or_path).exists():
        candidates = [os.path.join(os.path.expanduser(RAY_RESULTS), name_or_path)]
    path = candidates[0] if "://" in candidates[0] else os.path.abspath(candidates[0])
    if "://" in path and not path.startswith("file://"):  # a bucket it cannot reach is bad input, like launch's storage
        check_bucket(path, "sweep")
    text = _read_text(f"{path.rstrip('/')}/{SWEEP_FILE}")
    if text is None:
        raise DetsweepError(f"{name_or_path}: found no {SWEEP_FILE} at {path}, expected a folder made by "
                            f"detsweep launch, a sweep file, or a sweep name under {RAY_RESULTS}")
    return path, sweep_of(text)


def sweep_of(text: str) -> Sweep:
    """The sweep an as-run ``sweep.yaml``'s ``text`` holds."""
    with tempfile.TemporaryDirectory() as folder:  # load_sweep reads files; the text may come from a bucket
        local = Path(folder, SWEEP_FILE)
        local.write_text(text)
        return load_sweep(local)


def _read_text(uri: str) -> str | None:
    import pyarrow.fs

    filesystem, path = pyarrow.fs.FileSystem.from_uri(uri)
    if filesystem.get_file_info(path).type != pyarrow.fs.FileType.File:
        return None
    with filesystem.open_input_stream(path) as stream:
        return stream.readall().decode()


@dataclass
class TrialOutcome:
    trial_id: str
    status: TrialStatus
    metrics: dict[str, Any]
    config: dict[str, Any]  # the swept values, by dotted path
    checkpoint: str | None  # the trial's best checkpoint by the sweep's metric
    error: str | None
    cost: dict[str, float]  # cost/cpu_hours, cost/gpu_hours: what its workers held, for as long as it ran
    infeasible: str | None = None  # the constraints its architecture breaks: it was never trained


def trial_cost(seconds: float, scaling: ScalingConfig) -> dict[str, float]:
    """A trial's Ray Train workers' CPUs and GPUs, held for ``seconds`` (Tune's ``time_total_s``:
    the time it ran, up to its last report), in hours of each."""
    hours = seconds / 3600
    gpus = scaling.gpus_per_worker if scaling.use_gpu else 0.0
    return {"cost/cpu_hours": scaling.num_workers * scaling.cpus_per_worker * hours,
            "cost/gpu_hours": scaling.num_workers * gpus * hours}


Curves = dict[str, dict[str, dict[int, float]]]  # trial id → metric → step → value


@dataclass(frozen=True)
class SweepResults:
    """A sweep's trials, the best first; each one's objectives by step; its MLflow run, where
    known; the sweep's MLflow runs (its tracking server and parent run)."""

    outcomes: list[TrialOutcome]
    curves: Curves
    run_ids: dict[str, str] = field(default_factory=dict)
    link: RunLink | None = None


def read_results(path: str, sweep: Sweep) -> SweepResults:
    """Every trial of the experiment at ``path`` and its curves, from Tune's saved state (read once)."""
    from ray.tune import ExperimentAnalysis, ResultGrid

    analysis = ExperimentAnalysis(path, default_metric=sweep.search.metric, default_mode=sweep.search.mode)
    paths = swept_paths(sweep)
    rows = []
    for trial, result in zip(analysis.trials, ResultGrid(analysis)):
        metrics = {k: v for k, v in (trial.last_result or {}).items() if "/" in k or k == "step"}
        infeasible = (trial.last_result or {}).get(INFEASIBLE)
        rows.append(TrialOutcome(
            trial.trial_id, TrialStatus.of(trial.status, metrics.get("step", 0), sweep.base.train.num_steps,
                                           bool(infeasible)), metrics,
            swept_values(trial.config, paths), _best_checkpoint(result, sweep),
            failure_reason(trial.get_error()) if trial.status == TrialStatus.ERROR else None,
            trial_cost(float((trial.last_result or {}).get("time_total_s", 0.0)), sweep.base.scaling), infeasible,
        ))
    objectives = [objective.metric for objective in sweep.search.ranked_on]
    curves = {trial_id: {metric: {int(step): float(value) for step, value in zip(frame["step"], frame[metric])
                                  if not math.isinf(_number(value))}
                         for metric in objectives if "step" in frame and metric in frame}
              for trial_id, frame in analysis.trial_dataframes.items()}
    link = next((RunLink(**trial.config["tracking"]) for trial in analysis.trials if trial.config.get("tracking")), None)
    return SweepResults(ranked(rows, sweep), curves, link=link)


def recorded_results(name_or_file: str) -> tuple[Sweep, SweepResults]:
    """The latest sweep of an MLflow experiment (a name on the default server, or a sweep
    file's experiment and server), read from MLflow alone: for when its folder is gone."""
    from mlflow import MlflowClient

    from detsweep.config import TrackingConfig
    from detsweep.tracking import resolve_backend
    from detsweep.tracking.backend import check_readable
    from detsweep.tracking.recorded import latest_sweep, recorded_trials
    from detsweep.tracking.trial_run import ERROR_TAG, INFEASIBLE_TAG

    name, tracking = name_or_file, TrackingConfig()
    if name_or_file.endswith((".yaml", ".yml")):
        given = load_sweep(name_or_file)
        name, tracking = given.base.tracking.experiment or given.name, given.base.tracking
    backend = resolve_backend(tracking)
    check_readable(backend)
    client = MlflowClient(backend.uri)
    link, text = latest_sweep(client, name, backend)
    sweep = sweep_of(text)
    paths = swept_paths(sweep)
    trials = recorded_trials(client, link, [objective.metric for objective in sweep.search.ranked_on])
    rows = [TrialOutcome(trial.trial_id, trial.status, dict(trial.run.data.metrics), recorded_values(trial.run, paths),
                         None, trial.run.data.tags.get(ERROR_TAG),
                         {key: trial.run.data.metrics.get(key, 0.0) for key in ("cost/cpu_hours", "cost/gpu_hours")},
                         trial.run.data.tags.get(INFEASIBLE_TAG))
            for trial in trials]
    return sweep, SweepResults(ranked(rows, sweep), {trial.trial_id: trial.histories for trial in trials},
                               {trial.trial_id: trial.run.info.run_id for trial in trials}, link)


def recorded_values(run, paths: list[str]) -> dict[str, Any]:
    """A trial run's swept values by dotted path, typed again: MLflow keeps each config leaf as
    its YAML text (a dict-valued choice as its leaves); a PBT trial's latest as ``hparams/*``."""
    values = {}
    for path in paths:
        if f"hparams/{path}" in run.data.metrics:
            values[path] = run.data.metrics[f"hparams/{path}"]
        elif path in run.data.params:
            values[path] = yaml.safe_load(run.data.params[path])
        elif leaves := {key.removeprefix(f"{path}."): text for key, text in run.data.params.items()
                        if key.startswith(f"{path}.")}:
            values[path] = _nested(leaves)
    return values


def _nested(leaves: dict[str, str]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for dotted, text in leaves.items():
        *parents, last = dotted.split(".")
        node = tree
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = yaml.safe_load(text)
    return tree


def ranked(rows: list[TrialOutcome], sweep: Sweep) -> list[TrialOutcome]:
    """``rows`` the best first by the sweep's metric's last value, as Tune ranks; none last."""
    sign = -1 if sweep.search.mode == "max" else 1

    def rank(row: TrialOutcome) -> tuple[bool, float]:
        value = _number(row.metrics.get(sweep.search.metric))
        return math.isinf(value), sign * value if not math.isinf(value) else 0.0

    return sorted(rows, key=rank)


def stored_run_link(path: str) -> RunLink:
    """The MLflow runs the sweep at ``path`` writes to, as its trials were given them."""
    from ray.tune import ExperimentAnalysis

    for trial in ExperimentAnalysis(path).trials:
        if trial.config.get("tracking"):
            return RunLink(**trial.config["tracking"])
    raise DetsweepError(f"{path}: no trial of this sweep has an MLflow run to continue")


def _best_checkpoint(result, sweep: Sweep) -> str | None:
    ranked = [(checkpoint, metrics) for checkpoint, metrics in (result.best_checkpoints or [])
              if not math.isinf(_number(metrics.get(sweep.search.metric)))]
    if not ranked:
        return checkpoint_uri(result.checkpoint) if result.checkpoint else None
    pick = max if sweep.search.mode == "max" else min
    return checkpoint_uri(pick(ranked, key=lambda pair: pair[1][sweep.search.metric])[0])


def _number(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not math.isnan(value) else math.inf

