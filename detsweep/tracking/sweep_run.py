"""The MLflow parent run of a sweep, written by the driver: opened before the first trial,
closed after the last with the sweep's results. ``detsweep resume`` reopens the same run."""

from __future__ import annotations

import csv
import enum
import io
import json
import subprocess
from pathlib import Path
from typing import Any

import yaml

import detsweep

from .backend import Backend
from .pages import AT_ONCE, every_run
from .provenance import run_environment_tags
from .trial_run import ERROR_TAG, INFEASIBLE_TAG, PARENT_TAG, ROLE_TAG, TRIAL_TAG, RunLink, flatten

RESULTS_TAG = "detsweep.results_path"
OBJECTIVES_TAG = "detsweep.objectives"
RERUN_OF_TAG = "detsweep.rerun_of"  # on a rerun's parent run (detsweep rerun): its source sweep's parent run
RERUNS_TAG = "detsweep.reruns"  # on a source's parent run: its reruns' parent runs
RERUN_TRIAL_TAG = "detsweep.rerun_of_trial"  # on a rerun's trial run: the source trial it trains again
RERUN_RANK_TAG = "detsweep.rerun_rank"  # … and that trial's place in the source



class TrialStatus(str, enum.Enum):  # noqa: UP042 (StrEnum would change str() of a member)
    """A trial's state as Tune names it, ``STOPPED``: ended by the scheduler (or the sweep's
    time budget) before ``train.num_steps``, and ``INFEASIBLE``: never trained, its architecture
    breaks the sweep's constraints. Compares equal to its name (JSON)."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    PAUSED = "PAUSED"
    TERMINATED = "TERMINATED"
    STOPPED = "STOPPED"
    ERROR = "ERROR"
    INFEASIBLE = "INFEASIBLE"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def of(cls, tune_status: str, step: int, num_steps: int, infeasible: bool = False) -> TrialStatus:
        """What a trial Tune calls ``tune_status`` is, at ``step`` of a sweep of ``num_steps``."""
        if infeasible:
            return cls.INFEASIBLE
        if tune_status == cls.TERMINATED and step < num_steps:
            return cls.STOPPED
        return cls(tune_status)

    @property
    def finished(self) -> bool:
        """It will not run again: it trained to the end, was stopped, or failed."""
        return self in (TrialStatus.TERMINATED, TrialStatus.STOPPED, TrialStatus.ERROR, TrialStatus.INFEASIBLE)


CURVES_DRAWN = 8  # learning curves drawn as lines in sweep.png; the others' as a band

# How a trial's outcome ends its MLflow run.
RUN_STATUS = {TrialStatus.TERMINATED: "FINISHED", TrialStatus.STOPPED: "KILLED", TrialStatus.ERROR: "FAILED",
              TrialStatus.INFEASIBLE: "FINISHED"}


def experiment_id(client, name: str, backend: Backend) -> str:
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        if experiment.lifecycle_stage == "deleted":
            client.restore_experiment(experiment.experiment_id)
        return experiment.experiment_id
    from mlflow.exceptions import MlflowException

    location = f"{backend.artifact_root}/{name}" if backend.artifact_root else None
    try:
        # The kind makes the MLflow UI open the experiment on its training runs, not on GenAI traces.
        return client.create_experiment(name, artifact_location=location,
                                        tags={"mlflow.experimentKind": "custom_model_development"})
    except MlflowException as refused:  # another sweep made it since we looked: use theirs
        theirs = client.get_experiment_by_name(name) if refused.error_code == "RESOURCE_ALREADY_EXISTS" else None
        if theirs is None:
            raise
        return theirs.experiment_id


def open_sweep_run(sweep, results_path: str, backend: Backend, as_run: dict[str, Any],
                   tags: dict[str, str] | None = None) -> RunLink:
    """A new parent run for a launched sweep (a resumed one keeps the run its trials were given)."""
    from mlflow import MlflowClient

    client = MlflowClient(backend.uri)
    experiment = experiment_id(client, sweep.base.tracking.experiment or sweep.name, backend)
    run = client.create_run(experiment, run_name=sweep.name, tags=sweep_tags(sweep, results_path) | (tags or {}))
    run_id = run.info.run_id
    client.log_batch(run_id, params=search_params(as_run["search"]))
    client.log_text(run_id, yaml.safe_dump(as_run, sort_keys=False), "sweep.yaml")
    client.log_text(run_id, yaml.safe_dump(as_run["base"], sort_keys=False), "base_config.yaml")
    return RunLink(backend.uri, experiment, run_id)


def reopen_sweep_run(link: RunLink) -> None:
    from mlflow import MlflowClient

    MlflowClient(link.uri).update_run(link.parent_run_id, status="RUNNING")


def sweep_tags(sweep, results_path: str) -> dict[str, str]:
    """What the sweep is, and what its driver ran on (each trial's run says what its own process ran on)."""
    tags = {ROLE_TAG: "sweep", "detsweep.sweep": sweep.name, RESULTS_TAG: results_path,
            "detsweep.algorithm": sweep.search.algorithm, "detsweep.scheduler": sweep.search.scheduler.type,
            "detsweep.version": detsweep.__version__} | run_environment_tags()
    if sweep.search.objectives:  # what ``detsweep best --pareto`` draws the front over
        tags[OBJECTIVES_TAG] = json.dumps([o.model_dump() for o in sweep.search.objectives])
    commit = git_commit(sweep.path.parent)
    if commit:
        tags["mlflow.source.git.commit"] = commit
    return tags


def git_commit(folder: Path) -> str | None:
    try:
        answer = subprocess.run(["git", "rev-parse", "HEAD"], cwd=folder, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return answer.stdout.strip() if answer.returncode == 0 else None


def search_params(search: dict[str, Any]):
    """The search block as params: ``space.<path>`` holds each parameter's spec."""
    from mlflow.entities import Param

    space = {f"space.{path}": spec for path, spec in search.get("space", {}).items()}
    rest = {k: v for k, v in search.items() if k != "space"}
    flat = {**{f"search.{k}": v for k, v in flatten(rest).items()},
            **{k: yaml.safe_dump(v, default_flow_style=True).strip() for k, v in space.items()}}
    return [Param(k, v[:6000]) for k, v in flat.items()][:100]


def trial_runs(client, link: RunLink) -> dict[str, Any]:
    """The sweep's trial runs by trial id (a fine-tune from its best is a child run too, not a trial)."""
    runs = every_run(client, [link.experiment_id],
                     f"tags.`{PARENT_TAG}` = '{link.parent_run_id}' and tags.`{ROLE_TAG}` = 'trial'")
    return {run.data.tags[TRIAL_TAG]: run for run in runs if TRIAL_TAG in run.data.tags}


def close_sweep_run(link: RunLink, report: dict[str, Any], paths: list[str], curves: dict[str, dict[int, float]],
                    front=None) -> dict[str, Any]:
    """Close the trial runs still open (the driver closes each as Tune completes it:
    ``sweeps/closing.py``), then log the sweep's results on the parent: ``best/*`` metrics,
    ``trials.csv`` and ``sweep.png`` (from ``curves``: each trial's metric by step), and a
    multi-objective sweep's Pareto ``front`` (:mod:`.front`): ``pareto.csv``, ``pareto.png``,
    ``pareto/hypervolume``. The requests do not grow with the trials closed already (a page
    of runs is one). Returns ``{trial_id: run_id}``."""
    from concurrent.futures import ThreadPoolExecutor

    from mlflow import MlflowClient
    from mlflow.entities import Metric

    client = MlflowClient(link.uri)
    runs = trial_runs(client, link)
    left = [(runs[trial["trial_id"]], trial) for trial in report["trials"]
            if trial["trial_id"] in runs and not closed(runs[trial["trial_id"]], trial)]
    with ThreadPoolExecutor(AT_ONCE) as pool:  # independent requests: the server's latency overlaps
        list(pool.map(lambda pair: end_trial_run(client, *pair), left))
    best = report.get("best")
    if best:
        values = {f"best/{k}": float(v) for k, v in best["metrics"].items() if isinstance(v, (int, float))}
        client.log_batch(link.parent_run_id, metrics=[Metric(k, v, 0, 0) for k, v in values.items()])
        client.set_tag(link.parent_run_id, "detsweep.best_trial", best["trial_id"])
        if best["trial_id"] in runs:
            client.set_tag(link.parent_run_id, "detsweep.best_run_id", runs[best["trial_id"]].info.run_id)
    # What the sweep cost: each trial's on its run, their sum on the sweep's.
    client.log_batch(link.parent_run_id, metrics=[Metric(k, v, 0, 0) for k, v in report["cost"].items()])
    run_ids = {trial_id: run.info.run_id for trial_id, run in runs.items()}
    client.log_text(link.parent_run_id, trials_csv(report, paths, run_ids), "trials.csv")
    client.log_figure(link.parent_run_id, sweep_figure(report, paths, curves), "sweep.png")
    if front is not None:
        front = front.with_runs(run_ids)
        client.log_text(link.parent_run_id, front.csv(), "pareto.csv")
        client.log_figure(link.parent_run_id, front.figure(), "pareto.png")
        client.log_metric(link.parent_run_id, "pareto/hypervolume", front.hypervolume)
    errored = sum(trial["status"] == TrialStatus.ERROR for trial in report["trials"])
    client.set_tag(link.parent_run_id, "detsweep.errored_trials", str(errored))
    client.set_terminated(link.parent_run_id, "FINISHED")
    return run_ids


def closed(run, trial: dict[str, Any]) -> bool:
    """Whether ``end_trial_run`` has left ``run`` as ``trial`` ended: its status, and its cost
    logged (the last writes before the status; a trial that finished sets its status itself)."""
    return (run.info.status == RUN_STATUS.get(trial["status"], "KILLED")
            and all(name in run.data.metrics for name in trial["cost"]))


def end_trial_run(client, run, trial: dict[str, Any]) -> None:
    """``run`` ended as ``trial`` did: its cost, why it stopped or failed, and its status."""
    from mlflow.entities import Metric

    status = RUN_STATUS.get(trial["status"], "KILLED")  # PENDING/RUNNING: cut by the time budget
    run_id = run.info.run_id
    step = int(trial["metrics"].get("step", 0))
    client.log_batch(run_id, metrics=[Metric(k, v, 0, step) for k, v in trial["cost"].items()])
    if status == "KILLED":
        client.set_tag(run_id, "early_stopped", "true")
    if trial.get("infeasible") and INFEASIBLE_TAG not in run.data.tags:  # its own write was lost
        client.set_tag(run_id, INFEASIBLE_TAG, trial["infeasible"])
    if status == "FAILED" and trial.get("error") and ERROR_TAG not in run.data.tags:
        client.set_tag(run_id, ERROR_TAG, trial["error"][:5000])
    if run.info.status != status:
        client.set_terminated(run_id, status)


def trials_csv(report: dict[str, Any], paths: list[str], run_ids: dict[str, str]) -> str:
    metric = report["metric"]
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["trial_id", "status", "step", metric, *paths, "cpu_hours", "gpu_hours", "mlflow_run_id",
                     "checkpoint", "error"])
    for trial in report["trials"]:
        writer.writerow([trial["trial_id"], trial["status"], trial["metrics"].get("step", ""),
                         trial["metrics"].get(metric, ""), *(trial["config"].get(p, "") for p in paths),
                         f"{trial['cost']['cost/cpu_hours']:.4g}", f"{trial['cost']['cost/gpu_hours']:.4g}", run_ids.get(trial["trial_id"], ""), trial["checkpoint"] or "", trial["error"] or ""])
    return out.getvalue()


def sweep_figure(report: dict[str, Any], paths: list[str], curves: dict[str, dict[int, float]]):
    """The metric against each swept hyperparameter, and the learning curves: the best
    ``CURVES_DRAWN`` trials' as lines, every other trial's within a band (the lowest and highest
    value at each step), so that it reads the same at 2 000 trials as at 20."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metric = report["metric"]
    panels = len(paths) + 1
    figure, axes = plt.subplots(1, panels, figsize=(4.5 * panels, 3.8), layout="constrained", squeeze=False)
    for axis, path in zip(axes[0], paths):
        points = [(t["config"].get(path), t["metrics"].get(metric)) for t in report["trials"]]
        points = [(x, y) for x, y in points if y is not None and x is not None]
        xs = [x if isinstance(x, (int, float)) else str(x) for x, _ in points]
        axis.scatter(xs, [y for _, y in points], s=12 if len(points) > CURVES_DRAWN else None)
        if path.endswith(("learning_rate_base", "learning_rate")) and all(isinstance(x, float) and x > 0 for x in xs):
            axis.set_xscale("log")
        axis.set(xlabel=path.rsplit(".", 1)[-1], ylabel=metric, title=path)
        axis.grid(alpha=0.3)
    axis = axes[0][-1]
    drawn = [trial["trial_id"] for trial in report["trials"] if curves.get(trial["trial_id"])]  # best first
    rest = [curves[trial_id] for trial_id in drawn[CURVES_DRAWN:]]
    if rest:
        steps = sorted({step for curve in rest for step in curve})
        at = [[curve[step] for curve in rest if step in curve] for step in steps]
        axis.fill_between(steps, [min(values) for values in at], [max(values) for values in at], alpha=0.25,
                          color="grey", label=f"the other {len(rest)}")
    for trial_id in drawn[:CURVES_DRAWN]:
        points = sorted(curves[trial_id].items())
        axis.plot([step for step, _ in points], [value for _, value in points], marker=".", label=trial_id)
    axis.set(xlabel="step", ylabel=metric, title="learning curves" + (f" (the best {CURVES_DRAWN})" if rest else ""))
    axis.grid(alpha=0.3)
    if drawn:
        axis.legend(fontsize="small")
    plt.close(figure)
    return figure
