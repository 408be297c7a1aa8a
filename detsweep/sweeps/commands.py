"""``detsweep validate``, ``launch``, ``rerun``, ``status``, ``study``, ``importance``, ``resume`` and ``replay``, and how a
sweep's trials are printed (``finetune --sweep`` prints its sweep the same way).

Commands import Ray, Tune and MLflow when they run, so ``detsweep --help`` answers at once.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

import yaml

from detsweep import console
from detsweep.errors import DetsweepError
from detsweep.subcommands import add_command, add_overrides, add_verbose
from detsweep.tracking.sweep_run import TrialStatus

SWEEP_HELP = "the sweep's folder, its sweep file, or its name under ~/ray_results"
RESULTS_HELP = ("the sweep's folder, its sweep file, or its name under ~/ray_results; with no folder, a name or sweep "
                "file is read from its MLflow experiment's latest sweep (the default server's, or the file's)")
CLUSTER_CONFIG_HELP = ("a Ray cluster config (ray up's YAML): size trials against the node types the cluster can start "
                       "(default with --address: ~/ray_bootstrap_config.yaml on the head, else the nodes alive)")


def add_sweep_commands(commands: Any) -> None:
    """Add the sweep commands to the main parser's subparsers."""
    validate = add_command(commands, "validate", validate_command, "check a sweep file and show what it would run (starts nothing)")
    validate.add_argument("sweep", help="a sweep file, e.g. sweeps/quickstart.yaml")
    add_overrides(validate, "override the sweep or its base config, e.g. --set base.train.num_steps=40")
    validate.add_argument("--address", help="size the sweep for this running Ray cluster (default: this machine)")
    validate.add_argument("--cluster-config", metavar="FILE", help=CLUSTER_CONFIG_HELP)
    validate.add_argument("--json", action="store_true", help="print one JSON object")

    launch = add_command(commands, "launch", launch_command, "run a sweep on Ray (a local cluster unless --address)")
    launch.add_argument("sweep", help="a sweep file, e.g. sweeps/quickstart.yaml")
    add_overrides(launch, "override the sweep or its base config, e.g. --set search.num_samples=2")
    launch.add_argument("--address", help="a running Ray cluster, e.g. auto or ray://head:10001")
    launch.add_argument("--cluster-config", metavar="FILE", help=CLUSTER_CONFIG_HELP)
    launch.add_argument("--json", action="store_true", help='print {"name", "path", "trials", "best", "mlflow"} at the end')
    add_verbose(launch)
    launch.add_argument("--no-register", action="store_true", help="do not register the best model in MLflow")

    rerun = add_command(commands, "rerun", rerun_command, "train a finished sweep's best configurations again over "
                        "seeds, and say whether the winner's lead is larger than their spread")
    rerun.add_argument("sweep", help=RESULTS_HELP)
    rerun.add_argument("--top", type=int, default=3, metavar="K",
                       help="the K best configurations trained to the end (default: 3)")
    rerun.add_argument("--seeds", type=int, default=3, metavar="S",
                       help="seeds per configuration, the same for each, none the sweep used (default: 3)")
    add_overrides(rerun, "override the rerun's sweep, e.g. --set base.train.num_steps=40")
    rerun.add_argument("--address", help="a running Ray cluster, e.g. auto or ray://head:10001")
    rerun.add_argument("--cluster-config", metavar="FILE", help=CLUSTER_CONFIG_HELP)
    rerun.add_argument("--json", action="store_true", help='print launch --json\'s object with "rerun": the tables')
    rerun.add_argument("--register", action="store_true",
                       help="make the best configuration by its mean the registered champion (a mean is another claim "
                            "than one run's score: it replaces the champion whatever that scored)")
    add_verbose(rerun)

    status = add_command(commands, "status", status_command, "show the trials of a sweep, finished or not (starts nothing)")
    status.add_argument("sweep", help=SWEEP_HELP)
    status.add_argument("--json", action="store_true", help="print the same object as launch --json")

    study = add_command(commands, "study", study_command,
                        "write a sweep's trials as an Optuna study: a journal file optuna-dashboard and Optuna open")
    study.add_argument("sweep", help=RESULTS_HELP)
    study.add_argument("--out", metavar="FILE",
                       help="the journal file to write (default: study.journal in the sweep's folder; ./NAME.journal "
                            "for a sweep in a bucket or read from MLflow)")

    importance = add_command(commands, "importance", importance_command,
                             "which swept settings mattered: each one's share for each objective, with an interval")
    importance.add_argument("sweep", help=RESULTS_HELP)
    importance.add_argument("--objective", metavar="METRIC", help="this objective's importance alone (default: each of "
                                                                   "the sweep's objectives)")
    importance.add_argument("--json", action="store_true",
                            help='print {"importance": [{"objective", "parameter", "share", "low", "high", "fanova", '
                                 '"step", "trials", "quantile", "resamples"}]} or {"importance": null, "why": LINE}')

    resume = add_command(commands, "resume", resume_command, "finish an interrupted sweep; finished trials are not run again")
    resume.add_argument("sweep", help=SWEEP_HELP)
    resume.add_argument("--retry-errored", action="store_true", help="also continue errored trials from their last checkpoints")
    resume.add_argument("--address", help="a running Ray cluster (default: start a local one)")
    resume.add_argument("--cluster-config", metavar="FILE", help=CLUSTER_CONFIG_HELP)
    resume.add_argument("--json", action="store_true", help="print the same object as launch --json")
    add_verbose(resume)
    resume.add_argument("--no-register", action="store_true", help="do not register the best model in MLflow")

    replay = add_command(commands, "replay", replay_command,
                         "judge a sweep's searcher and scheduler in seconds on recorded learning curves (no training)")
    replay.add_argument("curves", metavar="CURVES|EXPERIMENT",
                        help="a curves file (.json), or a finished sweep's MLflow experiment (its full-budget trials)")
    replay.add_argument("sweep", help="the sweep file whose search settings to replay")
    add_overrides(replay, "override the sweep, e.g. --set search.scheduler.grace_period=40")
    replay.add_argument("--seeds", type=int, default=1, help="replay with this many seeds from the sweep's own (default 1)")
    replay.add_argument("--signal", action="store_true",
                        help="also show each metric's rank correlation with the final objective, by step")
    replay.add_argument("--importance", action="store_true",
                        help="also say which settings mattered in each replayed sweep (detsweep importance), as a "
                             "sweep of this size would")
    replay.add_argument("--json", action="store_true",
                        help="print one JSON object: every seed's run, median, min, max, and the early signal")


# --- commands --------------------------------------------------------------------


def validate_command(args: argparse.Namespace) -> int:
    from detsweep.preflight.capacity import cluster_capacity, from_cluster_config, this_machine
    from detsweep.sweeps.launch import validation_report
    from detsweep.sweeps.spec import load_sweep

    sweep = load_sweep(args.sweep, args.overrides)
    note = None
    if args.cluster_config:  # nothing to connect to: the file says what the cluster can grow to
        capacity = from_cluster_config(args.cluster_config)
    elif args.address:
        from detsweep.cluster import connect

        # Only the cluster's size is asked: a raylet's warning (a full disk) must not join the
        # one-line answer.
        connect(args.address, cluster_logs=False)
        capacity, note = cluster_capacity()
    else:
        capacity = this_machine()
    report = validation_report(sweep, capacity, strict=bool(args.address or args.cluster_config),
                               on_a_node=not args.cluster_config or bool(args.address))
    report["notes"] += [note] if note else []
    if args.json:
        print(json.dumps(report))
        return 0
    print(yaml.safe_dump({"base": report["base"]}, sort_keys=False), end="")
    print(yaml.safe_dump({k: report[k] for k in ("space", "algorithm", "scheduler", "trials", "grid_points",
                                                  "resources_per_trial", "trials_at_once", "sized_against")}, sort_keys=False), end="")
    print("samples:")
    for drawn in report["samples"]:
        print("  - " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in drawn.items()))
    refused = report["grid_points_that_cannot_train"]
    if refused:
        first = refused[0]
        point = ", ".join(f"{k}={v}" for k, v in first["point"].items())
        print(f"note: {len(refused)} of {report['grid_points']} grid points cannot train (their trials will fail "
              f"at their start), e.g. {point}: {first['reason']}")
    for note in report["notes"]:
        print(f"note: {note}")
    print(f"{args.sweep}: valid")
    return 0


def launch_command(args: argparse.Namespace) -> int:
    from detsweep.sweeps.launch import launch
    from detsweep.sweeps.spec import load_sweep

    sweep = load_sweep(args.sweep, args.overrides)
    out = console.take_over(args.json, args.verbose)
    return sweep_summary(launch(sweep, args.address, register=not args.no_register, cluster_config=args.cluster_config),
                         args.json, out)


def status_command(args: argparse.Namespace) -> int:
    from detsweep.sweeps.launch import status

    sweep_summary(status(args.sweep), args.json, sys.stdout)
    return 0


def rerun_command(args: argparse.Namespace) -> int:
    import tempfile
    from pathlib import Path

    from detsweep.sweeps.launch import launch, sweep_results
    from detsweep.sweeps.rerun import plan_rerun

    source, results, _ = sweep_results(args.sweep, with_runs=False)
    with tempfile.TemporaryDirectory(prefix="detsweep-rerun-") as folder:
        sweep = plan_rerun(args.sweep, source, results, args.top, args.seeds, args.overrides, args.register, Path(folder))
        out = console.take_over(args.json, args.verbose)
        report = launch(sweep, args.address, register=args.register, cluster_config=args.cluster_config)
    return sweep_summary(report, args.json, out)


def study_command(args: argparse.Namespace) -> int:
    from collections import Counter

    from detsweep.sweeps.launch import study

    written, trials = study(args.sweep, args.out)
    states = Counter(trial.state.name.lower() for trial in trials)
    counted = ", ".join(f"{count} {state}" for state, count in sorted(states.items()))
    print(f"{written}: {len(trials)} trials ({counted}); open it with: optuna-dashboard {written}")
    return 0


def importance_command(args: argparse.Namespace) -> int:
    from detsweep.sweeps.importance import importance_lines, importance_rows
    from detsweep.sweeps.launch import importance

    found = importance(args.sweep, args.objective)
    if args.json:
        print(json.dumps({"importance": None, "why": found} if isinstance(found, str)
                         else {"importance": importance_rows(found)}))
    else:
        print("\n".join([f"importance: {found}"] if isinstance(found, str) else importance_lines(found)))
    return 0


def resume_command(args: argparse.Namespace) -> int:
    from detsweep.sweeps.launch import resume

    out = console.take_over(args.json, args.verbose)
    report = resume(args.sweep, args.address, retry_errored=args.retry_errored, register=not args.no_register,
                    cluster_config=args.cluster_config)
    return sweep_summary(report, args.json, out)


def replay_command(args: argparse.Namespace) -> int:
    from detsweep.sweeps.replay import load_curves, replay
    from detsweep.sweeps.spec import load_sweep

    if args.seeds < 1:
        raise DetsweepError(f"--seeds: found {args.seeds}, expected 1 or more")
    sweep = load_sweep(args.sweep, args.overrides)
    curves = load_curves(args.curves, sweep)
    out = console.take_over(args.json)  # Tune's own lines: into a scratch log, dropped at the end
    import ray

    if args.importance:
        from detsweep.sweeps.importance import ready_before_ray

        ready_before_ray()
    ray.init(address="local", include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    with console.working(f"replaying {args.sweep} on {len(curves.configs)} recorded trials, {args.seeds} seed(s)"):
        report = replay(sweep, curves, args.seeds, with_importance=args.importance)
    text = format_replay(report) + ("\n" + format_signal(report) if args.signal else "")
    text += "".join("\n" + format_importance(run) for run in report["runs"] if args.importance)
    print(json.dumps(report) if args.json else text, file=out, flush=True)
    return 0


def format_importance(run: dict[str, Any]) -> str:
    """A replayed sweep's importance: a parameter a line, or why there is none."""
    rows = run["importance"]
    head = f"importance in the replay with seed {run['seed']}:"
    if isinstance(rows, str):
        return f"{head} {rows}"
    width = max(len(row["parameter"]) for row in rows)
    return "\n".join([head] + [f"  {row['objective']} at step {row['step']} ({row['trials']} trials): "
                                f"{row['parameter']:<{width}}  {row['share']:.2f} [{row['low']:.2f}, {row['high']:.2f}]"
                                for row in rows])


def format_signal(report: dict[str, Any], columns: int = 10) -> str:
    """The early-signal table: a row per metric, at most ``columns`` steps spread over the budget."""
    steps = sorted({step for by_step in report["early_signal"].values() for step in by_step})
    shown = [steps[round(i * (len(steps) - 1) / (columns - 1))] for i in range(columns)] if len(steps) > columns else steps
    shown = sorted(set(shown))
    lines = [f"rank correlation (Spearman) with the final {report['metric']}, by step:",
             f"{'metric':<28}" + "".join(f"{step:>8}" for step in shown)]
    for metric, by_step in report["early_signal"].items():
        cells = [by_step.get(step) for step in shown]
        lines.append(f"{metric:<28}" + "".join(f"{'-' if cell is None else format(cell, '.2f'):>8}" for cell in cells))
    return "\n".join(lines)


def format_replay(report: dict[str, Any]) -> str:
    rows = [("training steps spent", "steps", "{:.0f}"), ("share of FIFO's steps", "share_of_fifo", "{:.0%}"),
            (f"returned trial's final {report['metric']}", "returned", "{:.4g}"),
            ("regret against the best recorded", "regret", "{:.4g}"),
            ("steps spent before it first reported", "steps_until_returned_seen", "{:.0f}")]
    lines = [f"replay of {report['sweep']} on {report['recorded_trials']} recorded trials, {len(report['runs'])} seed(s); "
             f"best recorded {report['metric']} {report['best_recorded']:.4g}",
             f"{'':<40} {'median':>9} {'min':>9} {'max':>9}"]
    lines += [f"{label:<40} " + " ".join(f"{form.format(report[which][key]):>9}" for which in ("median", "min", "max"))
              for label, key, form in rows]
    nearest = sum(run["nearest"] for run in report["runs"])
    if nearest:
        lines.append(f"note: {nearest} drawn configuration(s) were not recorded and replayed the nearest recorded one")
    resumed = sum(run.get("resumed", 0) for run in report["runs"])
    if resumed:
        lines.append(f"note: trials went on from a checkpoint {resumed} time(s) after the scheduler paused them at a rung")
    late = sum(run.get("out_of_order", 0) for run in report["runs"])
    if late:
        lines.append(f"note: {late} report(s) waited past the replay's patience and may have come out of step order")
    return "\n".join(lines)


def sweep_summary(report: dict[str, Any], as_json: bool, out: TextIO) -> int:
    """Print the trials; exit code 1 when any trial errored, each with its reason."""
    print(json.dumps(report, default=str) if as_json else format_trials(report, report["metric"]), file=out, flush=True)
    errored = [trial for trial in report["trials"] if trial["status"] == TrialStatus.ERROR]
    for trial in errored:
        full = f"{report['path'].rstrip('/')}/trial_{trial['trial_id']}/error.txt"  # a bucket's URI keeps its //
        print(f"detsweep: trial {trial['trial_id']} failed: {trial['error']} (full log: {full})", file=console.err())
    infeasible = [trial for trial in report["trials"] if trial["status"] == TrialStatus.INFEASIBLE]
    if report["trials"] and len(infeasible) == len(report["trials"]):
        reasons = sorted({trial["infeasible"] for trial in infeasible})
        print(f"detsweep: no trial met search.constraints, so none was trained: {'; '.join(reasons)}",
              file=console.err())
        return 1
    return 1 if errored else 0


def format_front(pareto: dict[str, Any]) -> list[str]:
    """The Pareto front: each trial on it with its objectives, best first on the first."""
    objectives = [o["metric"] for o in pareto["objectives"]]
    reference = ", ".join(f"{pareto['reference'][m]:.4g}" for m in objectives)
    over = ", ".join(f"{o['metric']} ({o['mode']})" for o in pareto["objectives"])
    lines = [f"Pareto front over {over}: "
             f"{len(pareto['trials'])} of {pareto['candidates']} trial(s) trained to the end, hypervolume "
             f"{pareto['hypervolume']:.4g} up to ({reference})"]
    for member in pareto["trials"]:
        values = ", ".join(f"{m} {member['values'][m]:.4g}" for m in objectives)
        swept = ", ".join(f"{k}={v}" for k, v in member["swept"].items())
        lines.append(f"  {member['place']}: trial {member['trial_id']}: {values}  ({swept})")
    return lines


def format_trials(report: dict[str, Any], metric: str) -> str:
    lines = [f"{'trial':<14} {'status':<11} {'step':>6} {metric:>14}  swept values"]
    for trial in report["trials"]:
        value = trial["metrics"].get(metric)
        shown = f"{value:.4g}" if isinstance(value, (int, float)) else "-"
        swept = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in trial["config"].items())
        lines.append(f"{trial['trial_id']:<14} {trial['status']:<11} {trial['metrics'].get('step', 0):>6} {shown:>14}  {swept}")
    best = report["best"]
    if best:
        also = ", ".join(f"{key} {best['metrics'][key]:.3f}" for key in ("eval/AP50", "eval_ema/AP50")
                         if key != metric and isinstance(best["metrics"].get(key), (int, float)))
        lines += ["", f"best trial {best['trial_id']}: {metric} = {best['metrics'].get(metric)}" + (f" ({also})" if also else ""),
                  f"  config: {best['config']}", f"  checkpoint: {best['checkpoint']}"]
    if report.get("pareto"):
        lines += ["", *format_front(report["pareto"])]
    cost = report["cost"]
    lines.append(f"cost: {cost['cost/cpu_hours']:.3g} CPU-hours, {cost['cost/gpu_hours']:.3g} GPU-hours "
                 "(what the trials' workers held while they ran)")
    lines.append(f"results: {report['path']}")
    unfinished = [t for t in report["trials"] if not TrialStatus(t["status"]).finished]
    if unfinished:
        lines.append(f"{len(unfinished)} trial(s) unfinished: detsweep resume {report['path']}")
    return "\n".join(lines)
