"""What ``detsweep validate``, ``launch``, ``resume`` and ``status`` do: check a sweep, run it
on Ray, finish it after an interruption, and summarise its trials (``commands.py`` parses
their arguments and prints what they return)."""

from __future__ import annotations

import os
import random
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from detsweep import console
from detsweep.cluster import connect, remove_run_folders
from detsweep.config.loader import plain
from detsweep.errors import DetsweepError, failure_reason
from detsweep.preflight import Capacity, Preflight, preflight
from detsweep.preflight.capacity import cluster_capacity, from_cluster_config, nodes_alive, this_machine
from detsweep.tracking.sweep_run import TrialStatus

from .experiment import (
    SWEEP_FILE,
    SweepResults,
    as_run,
    experiment_path,
    find_experiment,
    read_results,
    recorded_results,
    save_sweep,
    storage_path,
    stored_run_link,
)
from .resources import check_fits, trials_at_once
from .spec import Sweep, grid_of, grid_points_that_cannot_train, trial_count


def validation_report(sweep: Sweep, capacity: Capacity, strict: bool = True, on_a_node: bool = True,
                      samples: int = 5) -> dict[str, Any]:
    """What ``detsweep validate`` shows: nothing is started. Not ``strict`` (no cluster was
    named, this machine stands in for it), resources that do not fit and data that is not
    there are notes, not errors. Not ``on_a_node`` (a cluster config, before ``ray up``), the
    data's bucket URIs are checked, and its folders left to the nodes (a note names them)."""
    cleared = preflight(Preflight(sweep.base, str(sweep.path), "base.", capacity=capacity, varied=varied(sweep),
                                  read_data=False, local=on_a_node, strict=strict))
    base = sweep.base.model_dump(mode="json")
    space = sweep.search.space
    grid = grid_of(sweep)
    scaling = sweep.base.scaling
    rng = random.Random(sweep.search.seed)
    trials = trial_count(sweep)
    return {
        "name": sweep.name,
        "base": base,
        "space": {path: parameter.model_dump(exclude_none=True) for path, parameter in space.items()},
        "algorithm": sweep.search.algorithm,
        "scheduler": sweep.search.scheduler.type,
        "ranked_on": [f"{o.metric} ({o.mode})" for o in sweep.search.ranked_on],
        "constraints": sweep.search.constraints,
        "trials": trials,
        "grid_points": len(grid),
        "grid_points_that_cannot_train": [{"point": point, "reason": reason}
                                          for point, reason in grid_points_that_cannot_train(sweep)],
        "resources_per_trial": {"workers": scaling.num_workers, "cpus_per_worker": scaling.cpus_per_worker,
                                "gpus_per_worker": scaling.gpus_per_worker if scaling.use_gpu else 0},
        "trials_at_once": min(trials_at_once(sweep, capacity), sweep.search.max_concurrent_trials or 10**9),
        "sized_against": capacity.source,
        "samples": [sample(sweep, rng, grid[i % len(grid)] if grid else {}) for i in range(min(samples, trials))],
        "notes": cleared.notes,
    }


def varied(sweep: Sweep) -> dict[str, list[str]]:
    """The fields the sweep varies, by where it names them (a whole detector's preset fixes some)."""
    return {"search.space": list(sweep.search.space), "search.scheduler.mutations": list(sweep.search.scheduler.mutations)}


def sample(sweep: Sweep, rng: random.Random, point: dict[str, Any]) -> dict[str, Any]:
    """One sampled assignment of the space's paths (as the random searcher would draw it)."""
    import numpy as np
    from ray.tune.search.sample import Domain

    drawn = dict(point)
    for dotted, parameter in sweep.search.space.items():
        if parameter.is_grid or dotted in point:  # a grid's value, or a point's (search.points), stands
            continue
        domain = parameter.domain()
        value = domain.sample(random_state=np.random.RandomState(rng.randrange(2**31))) if isinstance(domain, Domain) else domain
        drawn[dotted] = plain(value)
    return drawn


def configured(cluster_config: str | None) -> Capacity | None:
    """The node types of ``--cluster-config``, read before Ray starts."""
    return from_cluster_config(cluster_config) if cluster_config else None


def sized_to_fit(sweep: Sweep, address: str | None, given: Capacity | None) -> Capacity:
    """What the trials are sized against once Ray is connected, checked: the node types given,
    or on a cluster joined by address those of the config ``ray up`` left on its head, else
    its nodes alive (a line says so), or this process's own local cluster."""
    if given is not None:
        return given
    capacity, note = cluster_capacity() if address or os.environ.get("RAY_ADDRESS") else (nodes_alive(), None)
    check_fits(sweep, capacity)
    if note:
        console.say(f"detsweep: {note}")
    return capacity


def launch(sweep: Sweep, address: str | None = None, register: bool = True,
           tags: dict[str, str] | None = None, callbacks: list | None = None,
           cluster_config: str | None = None) -> dict[str, Any]:
    """Run the sweep to the end; returns the ``detsweep launch --json`` object. ``tags``: more
    tags for its MLflow run (a fine-tuning sweep's source); ``callbacks``: more Ray Tune callbacks;
    ``cluster_config``: the cluster's config file (its node types size the trials)."""
    from detsweep.tracking import open_sweep_run, resolve_backend

    from .closing import RunCloser
    from .progress import SweepProgress
    from .serving import measure_architectures
    from .space import swept_paths
    from .tuner import build_tuner

    given = configured(cluster_config)
    joins = bool(address or os.environ.get("RAY_ADDRESS"))  # else a local cluster: refused before it starts
    backend = resolve_backend(sweep.base.tracking)
    cleared = preflight(Preflight(sweep.base, str(sweep.path), "base.", storage=sweep.storage or "",
                                  earlier_sweep=f"{experiment_path(sweep)}/{SWEEP_FILE}",
                                  capacity=given or (None if joins else this_machine()), backend=backend,
                                  varied=varied(sweep)))
    sweep = replace(sweep, base=cleared.config)  # its bucket data's version fixed for every trial
    for line in cleared.notes + cleared.summaries:
        console.say(line)
    # before Ray starts and any trial trains: no training beside the measurements
    serving = measure_architectures(sweep, console.say) if sweep.search.measures_serving else None
    connect_driver(address)
    capacity = sized_to_fit(sweep, address, given)
    fits = trials_at_once(sweep, capacity)
    path = save_sweep(sweep)
    console.keep_log_in(path, f"launch-{time.strftime('%Y%m%d-%H%M%S')}.log")
    if sweep.rerun and sweep.rerun.source_run:
        from detsweep.tracking.sweep_run import RERUN_OF_TAG

        tags = {RERUN_OF_TAG: sweep.rerun.source_run, **(tags or {})}
    link = open_sweep_run(sweep, path, backend, as_run(sweep), tags)
    console.say(f"MLflow: run {link.parent_run_id} of experiment {link.experiment_id} at {backend.uri}")
    progress = SweepProgress(swept_paths(sweep), sweep.search.metric, sweep.base.train.num_steps, capacity=capacity,
                             mode=sweep.search.mode)
    closer = RunCloser(link, sweep.base.train.num_steps, sweep.base.scaling)
    try:
        build_tuner(sweep, max(1, fits), link, callbacks=[progress, closer, *(callbacks or [])], serving=serving).fit()
    finally:
        progress.close()  # a live table leaves the terminal as it found it, also on an interrupt
    return finish(path, sweep, link, register)


def resume(name_or_path: str, address: str | None = None, retry_errored: bool = False,
           register: bool = True, cluster_config: str | None = None) -> dict[str, Any]:
    """Finish an interrupted sweep: unfinished trials continue from their last checkpoints,
    finished ones are not run again; errored ones too with ``retry_errored``. The trials keep
    writing to the MLflow runs they had."""
    from ray import tune

    from detsweep.tracking import backend_of, reopen_sweep_run

    from .tuner import trainable

    path, sweep = find_experiment(name_or_path)
    if not tune.Tuner.can_restore(path):
        raise DetsweepError(f"{name_or_path}: {path} holds no Tune experiment state to resume from")
    link = stored_run_link(path)
    given = configured(cluster_config)
    preflight(Preflight(sweep.base, str(sweep.path), "base.", capacity=given, backend=backend_of(link), inputs=False))
    console.keep_log_in(path, f"resume-{time.strftime('%Y%m%d-%H%M%S')}.log")
    connect_driver(address)
    sized_to_fit(sweep, address, given)
    reopen_sweep_run(link)
    tune.Tuner.restore(path, trainable(), resume_errored=retry_errored).fit()
    return finish(path, sweep, link, register)


def connect_driver(address: str | None) -> None:
    """Ray connected for a sweep's driver, which says at the end which settings mattered."""
    from detsweep.tracking import trial_environment

    from .importance import ready_before_ray

    ready_before_ray()
    connect(address, env=trial_environment())


def finish(path: str, sweep: Sweep, link, register: bool) -> dict[str, Any]:
    """The summary of the sweep's folder (read once), recorded in MLflow (:func:`record_end`)."""
    results = read_results(path, sweep)
    report = summary(path, sweep, results)
    remove_run_folders(storage_path(sweep), f"{sweep.name}-train-")  # those of trials stopped mid-run
    return record_end(report, sweep, link, register, results)


def record_end(report: dict[str, Any], sweep: Sweep, link, register: bool, results: SweepResults) -> dict[str, Any]:
    """The summary of ``results``, with each trial's MLflow run; the parent run closed; the
    study and importance made (:func:`record_study`); the best registered (or a line saying why
    not), and with objectives, the Pareto front (on the parent run, each of its models
    registered)."""
    from detsweep.tracking import close_sweep_run

    from .space import swept_paths

    front = pareto_of(report, sweep)
    curves = {trial_id: by_metric.get(sweep.search.metric, {}) for trial_id, by_metric in results.curves.items()}
    run_ids = close_sweep_run(link, report, swept_paths(sweep), curves, front)
    for trial in report["trials"]:
        trial["mlflow_run_id"] = run_ids.get(trial["trial_id"])
    report["study"], report["importance"] = record_study(report["path"], sweep, link, results, run_ids)
    if sweep.search.objectives:
        front = front.with_runs(run_ids) if front else None
        report["pareto"] = front.to_dict() if front else None
    if sweep.rerun:
        from .rerun import record_rerun

        report["rerun"], leader = record_rerun(sweep, results, link, run_ids)
        registered, why_not = (register_mean(report, sweep, link, leader) if register and sweep.rerun.register_mean
                               else (None, "a rerun registers its best mean only with --register"))
    else:
        registered, why_not = register_models(report, sweep, link, front) if register else (None, "--no-register")
    if why_not:
        console.say(f"MLflow: nothing registered: {why_not}")
    report["mlflow"] = {"tracking_uri": link.uri, "experiment_id": link.experiment_id,
                        "parent_run_id": link.parent_run_id, "registered_model": registered, "not_registered": why_not}
    return report


def record_study(path: str, sweep: Sweep, link, results: SweepResults,
                 run_ids: dict[str, str]) -> tuple[str | None, list | str]:
    """The sweep as an Optuna study (:mod:`.study`) on its parent run, ``study.journal``, and
    in its folder when that is local (a bucket holds no file that takes a lock); and which
    settings mattered (:mod:`.importance`), said and logged there too. The study's local path
    and the importance rows (or the line that says why there are none). One line instead when
    they cannot be made: ``detsweep study`` and ``detsweep importance`` make them later."""
    from mlflow import MlflowClient

    from .importance import importance_figure, importance_lines, importance_rows, sweep_importances
    from .study import STUDY_FILE, study_of, write_study

    local, client = "://" not in path, MlflowClient(link.uri)
    try:
        trials = study_of(sweep, results, run_ids)
        with tempfile.TemporaryDirectory(prefix="detsweep-study-") as scratch:
            written = write_study(sweep, trials, Path(path if local else scratch) / STUDY_FILE)
            client.log_artifact(link.parent_run_id, str(written))
        found = sweep_importances(sweep, trials)
    except Exception as error:  # the sweep's results are whole without them
        console.say(f"MLflow: no Optuna study of the sweep: {failure_reason(error)} (detsweep study makes it)")
        return None, f"no study: {failure_reason(error)}"
    if isinstance(found, str):
        console.say(f"importance: {found}")
        return (str(written) if local else None), found
    for line in importance_lines(found):
        console.say(line)
    rows = importance_rows(found)
    log_importance(client, link.parent_run_id, rows, importance_figure(found))
    return (str(written) if local else None), rows


def log_importance(client, run_id: str, rows: list[dict], figure) -> None:
    """``importance/<objective>/<parameter>`` metrics, ``importance.csv`` and ``importance.png``."""
    import csv
    import io

    from mlflow.entities import Metric

    client.log_batch(run_id, metrics=[Metric(f"importance/{row['objective']}/{row['parameter']}", row["share"], 0,
                                             row["step"]) for row in rows])
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    client.log_text(run_id, text.getvalue(), "importance.csv")
    client.log_figure(run_id, figure, "importance.png")


def pareto_of(report: dict[str, Any], sweep: Sweep):
    """The Pareto front of the trials trained to the end (within the constraints: the others were
    never trained), over the sweep's objectives; None without objectives or such trials."""
    from detsweep.tracking.front import Candidate, pareto_front

    if not sweep.search.objectives:
        return None
    metrics = [o.metric for o in sweep.search.objectives]
    candidates = [Candidate(t["trial_id"], None, t["config"], {m: float(t["metrics"][m]) for m in metrics})
                  for t in report["trials"] if t["status"] == TrialStatus.TERMINATED
                  and all(isinstance(t["metrics"].get(m), (int, float)) for m in metrics)]
    references = {o.metric: o.reference for o in sweep.search.objectives}
    return pareto_front(candidates, sweep.search.ranked_on, references)


def register_models(report: dict[str, Any], sweep: Sweep, link, front) -> tuple[dict[str, Any] | None, str | None]:
    """The best trial's model, crowned ``champion`` unless an earlier sweep's scored better;
    each model on the front too, tagged with its place there. Returns the best's registration,
    or None and why the best trial's model was not registered."""
    best = report["best"]
    on_front = {member.trial_id: front.place(member.trial_id) for member in front.front} if front else {}
    objectives = ", ".join(f"{o.metric} {o.mode}" for o in sweep.search.objectives)
    trials = {trial["trial_id"]: trial for trial in report["trials"]}
    registered, why_not = None, None if best else "no trial reached a result (each failed, or none ran)"
    for trial_id in ([best["trial_id"]] if best else []) + [t for t in on_front if not best or t != best["trial_id"]]:
        is_best = best is not None and trial_id == best["trial_id"]
        tags = {"pareto_place": on_front[trial_id], "pareto_objectives": objectives} if trial_id in on_front else {}
        done, missing = register_one(link, sweep, trials[trial_id], tags, crown=is_best)
        if is_best:
            registered, why_not = done, missing
        elif missing:
            console.say(f"MLflow: not registered from the Pareto front: {missing}")
        if done:
            where = f", place {on_front[trial_id]} on the Pareto front" if trial_id in on_front else ""
            crowned = ("" if not is_best else ", the champion" if done["champion"] == done["version"]
                       else f", version {done['champion']} stays the champion (it scored better)")
            console.say(f"MLflow: registered {done['name']} version {done['version']}{where}{crowned}")
    return registered, why_not


def register_mean(report: dict[str, Any], sweep: Sweep, link, leader) -> tuple[dict[str, Any] | None, str | None]:
    """A rerun's best configuration by its mean (``leader``, a :class:`.rerun.RerunRow` on the
    sweep's metric) registered as the source's champion, whatever the champion scored in one
    run (a mean is another claim): its seed nearest the mean stands for it, the table and the
    seeds in the version's description and tags. Once: a resumed rerun finds its version."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    from detsweep.export.registry import CHAMPION
    from detsweep.tracking.pages import every_model_version

    from .rerun import SEED, configuration

    if leader is None:
        return None, f"no configuration finished a seed with {sweep.search.metric}"
    seed = min(leader.values, key=lambda each: abs(leader.values[each] - leader.mean))
    trial = next((t for t in report["trials"] if t["config"].get(SEED) == seed
                  and configuration(t["config"]) == sweep.search.points[leader.rank - 1]), None)
    if trial is None or not trial.get("mlflow_run_id"):
        return None, f"the leader's seed {seed} has no trial run in MLflow"
    client, name = MlflowClient(link.uri), sweep.rerun.source_name
    seeds = ",".join(map(str, sorted(leader.values)))
    try:
        if found := [v for v in every_model_version(client, f"run_id = '{trial['mlflow_run_id']}'") if v.name == name]:
            console.say(f"MLflow: {name} version {found[0].version} already holds this rerun's mean")
            return {"name": name, "version": int(found[0].version), "model_uri": found[0].source, "champion": None}, None
        tags = {"rerun_mean": repr(leader.mean), "rerun_std": repr(leader.std), "rerun_seeds": seeds,
                "rerun_of_trial": leader.trial_id, "rerun_run_id": link.parent_run_id}
        done, missing = register_one(link, sweep, trial, tags, crown=False)
        if not done:
            return None, missing
        version = str(done["version"])
        # the claim is the mean's: the champion it replaces scored one run, which is not comparable
        client.set_model_version_tag(name, version, "metric", f"mean {sweep.search.metric} over {len(leader.values)} seeds")
        client.set_model_version_tag(name, version, "score", repr(leader.mean))
        client.update_model_version(name, version, description="\n".join(report["rerun"]["lines"]))
        client.set_registered_model_alias(name, CHAMPION, version)
    except (MlflowException, OSError) as error:  # refused, or the server went away
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        return None, f"the rerun's mean: MLflow at {link.uri} refused or failed ({first})"
    console.say(f"MLflow: registered {name} version {version}, the champion by its mean over seeds {seeds} "
                f"(trial {trial['trial_id']}'s weights, seed {seed}, nearest the mean)")
    return done | {"champion": done["version"]}, None


def register_one(link, sweep: Sweep, trial: dict[str, Any], tags: dict[str, str],
                 crown: bool) -> tuple[dict[str, Any] | None, str | None]:
    """The trial's best checkpoint registered under the sweep's name; or None and why not."""
    from mlflow.exceptions import MlflowException

    from detsweep.export.registry import register_trial  # imports mlflow.pyfunc: only at a sweep's end

    try:
        checkpoint, missing = best_in_mlflow(link, trial, sweep)
        if not checkpoint:
            return None, missing
        with console.working(f"registering trial {trial['trial_id']}'s model in MLflow"):
            name = sweep.rerun.source_name if sweep.rerun else sweep.name  # a rerun's models are its source's
            return register_trial(link, name, trial, checkpoint, sweep.search.metric, sweep.search.mode, tags,
                                  crown=crown), None
    except (MlflowException, OSError) as error:  # refused, or the server went away (requests' errors are OSErrors)
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        return None, f"trial {trial['trial_id']}'s model: MLflow at {link.uri} refused or failed ({first})"


def best_in_mlflow(link, trial: dict[str, Any], sweep: Sweep) -> tuple[str | None, str | None]:
    """The trial's best complete checkpoint in MLflow (``models:/…``), what registration reads;
    or None and why there is none."""
    from mlflow import MlflowClient

    from detsweep.tracking.checkpoint_models import best_checkpoint, model_uri

    if not trial["mlflow_run_id"]:
        return None, f"trial {trial['trial_id']} has no MLflow run in experiment {link.experiment_id}"
    found = best_checkpoint(MlflowClient(link.uri), link.experiment_id, trial["mlflow_run_id"], sweep.search.metric,
                            sweep.search.mode)
    if found is None:
        return None, (f"trial {trial['trial_id']} has no complete checkpoint in MLflow that scored "
                      f"{sweep.search.metric}")
    return model_uri(found), None


def status(name_or_path: str) -> dict[str, Any]:
    """The trials of a sweep, read from its folder; nothing is started."""
    path, sweep = find_experiment(name_or_path)
    return summary(path, sweep, read_results(path, sweep))


def study(name_or_path: str, out: str | None = None) -> tuple[Path, list]:
    """``detsweep study``: the sweep's trials as an Optuna journal file at ``out`` (default: in
    its folder, or ``./NAME.journal`` for a sweep in a bucket or read from MLflow alone); the
    file and its trials."""
    from .study import STUDY_FILE, write_study

    if out and "://" in out:
        raise DetsweepError(f"--out: found {out}, expected a local file (a journal takes a lock, which a bucket "
                            "cannot hold)")
    sweep, trials, path = swept_trials(name_or_path)
    local = path is not None and "://" not in path
    target = Path(out) if out else Path(path) / STUDY_FILE if local else Path.cwd() / f"{sweep.name}.journal"
    return write_study(sweep, trials, target), trials


def importance(name_or_path: str, objective: str | None = None) -> list | str:
    """``detsweep importance``: which settings mattered in the sweep (:mod:`.importance`), for
    each objective or ``objective`` alone, or the line that says why it cannot tell."""
    from .importance import sweep_importances

    sweep, trials, _ = swept_trials(name_or_path, with_runs=False)
    objectives = [o.metric for o in sweep.search.ranked_on]
    if objective is not None and objective not in objectives:
        raise DetsweepError(f"--objective: found {objective}, expected one of the sweep's objectives: "
                            f"{', '.join(objectives)}")
    return sweep_importances(sweep, trials, objective=objective)


def swept_trials(name_or_path: str, with_runs: bool = True) -> tuple[Sweep, list, str | None]:
    """The sweep's study trials (:mod:`.study`) and its folder, as :func:`sweep_results` reads them."""
    from .study import study_of

    sweep, results, path = sweep_results(name_or_path, with_runs)
    return sweep, study_of(sweep, results), path


def sweep_results(name_or_path: str, with_runs: bool = True) -> tuple[Sweep, SweepResults, str | None]:
    """The sweep, its results and its folder, from Tune's folder (the trials' MLflow runs asked
    of its server ``with_runs``); when there is none and ``name_or_path`` names an experiment
    (a bare name, a sweep file), from its latest sweep in MLflow alone, without a folder."""
    try:
        path, sweep = find_experiment(name_or_path)
    except DetsweepError as no_folder:
        named = name_or_path.endswith((".yaml", ".yml")) or ("/" not in name_or_path and not Path(name_or_path).exists())
        if not named:
            raise
        try:
            sweep, results = recorded_results(name_or_path)
        except DetsweepError as no_runs:
            raise DetsweepError(f"{no_folder}; nor in MLflow: {no_runs}") from None
        return sweep, results, None
    results = read_results(path, sweep)
    return sweep, replace(results, run_ids=stored_run_ids(results.link)) if with_runs else results, path


def stored_run_ids(link) -> dict[str, str]:
    """Each trial's MLflow run (``link``: the sweep's runs, as its folder names them), when its
    tracking server answers; none (and a line) when not."""
    from mlflow import MlflowClient

    from detsweep.tracking.sweep_run import trial_runs

    try:
        if link is None:
            raise DetsweepError("no trial of this sweep has an MLflow run")
        return {trial_id: run.info.run_id for trial_id, run in trial_runs(MlflowClient(link.uri), link).items()}
    except Exception as error:  # the study stands without them
        console.say(f"MLflow: the trials' runs are not named in the study: {failure_reason(error)}")
        return {}


def summary(path: str, sweep: Sweep, results: SweepResults) -> dict[str, Any]:
    trials = [asdict(row) for row in results.outcomes]
    finished = [row for row in trials if row["status"] in (TrialStatus.TERMINATED, TrialStatus.STOPPED)]
    cost = {key: sum(trial["cost"][key] for trial in trials) for key in ("cost/cpu_hours", "cost/gpu_hours")}
    return {"name": sweep.name, "path": path, "metric": sweep.search.metric, "mode": sweep.search.mode,
            "trials": trials, "best": finished[0] if finished else None, "cost": cost}
