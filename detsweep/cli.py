"""The ``detsweep`` command. Thin: parse arguments, call the library, print.

TensorFlow takes seconds to import, so commands import what they need when they run,
and ``detsweep --help`` or a config error answers at once.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from detsweep import console
from detsweep.cluster import check_address, check_storage
from detsweep.errors import DetsweepError
from detsweep.subcommands import OneLineParser, add_command, add_overrides, add_verbose

BEST_SHOWN = 20  # trials ``best`` shows (and looks up the checkpoints of) by default


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    console.hold_stderr()  # detsweep's lines alone on the terminal, from every command
    try:
        check_address(getattr(args, "address", None))  # a cluster that is not there: before any data is read
        if getattr(args, "storage", None):
            check_storage(args.storage)
        code = args.command(args)
        console.drop_scratch_log()
        return code
    except DetsweepError as error:
        console.drop_scratch_log()
        print(f"detsweep: error: {error}", file=console.err(), flush=True)
        return 2
    except KeyboardInterrupt:
        console.drop_scratch_log()
        print("detsweep: interrupted", file=console.err(), flush=True)
        return 130
    except BrokenPipeError:  # e.g. `detsweep … | head`: the reader left; say nothing more
        console.drop_scratch_log()
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as error:
        if console.log_path() is None:  # the terminal has it all: Python's own traceback
            raise
        traceback.print_exc()  # into the log
        print(f"detsweep: unexpected error: {type(error).__name__}: {error} (traceback in {console.log_path()})",
              file=console.err(), flush=True)
        return 1
    finally:
        console.release_stderr(drop_log=False)  # a short command's end; the log is kept or dropped above


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="detsweep",
        description="Hyperparameter sweeps for TensorFlow object detectors on Ray, tracked in MLflow.",
    )
    from detsweep import __version__

    parser.add_argument("--version", action="version", version=f"detsweep {__version__}")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", required=True)

    config = add_command(commands, "config", show_config, "validate a trial config and print it with every default")
    _config_arguments(config)
    config.add_argument("--json", action="store_true", help="print JSON instead of YAML")

    optimizer = add_command(commands, "optimizer", show_optimizer, "show the optimizer, moving average and schedule a config builds")
    _config_arguments(optimizer, what="a detsweep YAML, an OD API pipeline.config or optimizer text proto")
    optimizer.add_argument("--steps", help="steps to show: 0,4,8 or START:STOP[:STEP] (default: 11 points up to train.num_steps)")
    optimizer.add_argument("--json", action="store_true", help="print one JSON object")
    optimizer.add_argument("--plot", metavar="PNG", help="draw the learning-rate schedule into this PNG file")

    train = add_command(commands, "train", train_command, "train one config through Ray Train (a local Ray cluster unless --address)")
    _config_arguments(train)
    train.add_argument("--address", help="a running Ray cluster, e.g. ray://head:10001 or auto (default: start a local one)")
    train.add_argument("--name", help="the run's name in Ray's storage (default: the config's file name and the time)")
    train.add_argument("--storage", help="where Ray keeps results and checkpoints (default: ~/ray_results)")
    train.add_argument("--json", action="store_true", help='print {"steps", "metrics", "checkpoint"} at the end')
    add_verbose(train)

    from detsweep.sweeps.commands import add_sweep_commands

    add_sweep_commands(commands)

    best = add_command(commands, "best", best_command, "rank a sweep's trials from MLflow (no Ray results folder needed)")
    best.add_argument("experiment", help="the sweep's name (its MLflow experiment) or its sweep file")
    best.add_argument("--metric", help="rank by this metric (default: the sweep's)")
    best.add_argument("--mode", choices=("max", "min"), help="(default: the sweep's)")
    best.add_argument("--top", type=int, default=BEST_SHOWN,
                      help=f"show the first K trials (default {BEST_SHOWN}; 0: every trial)")
    best.add_argument("--pareto", action="store_true", help="the Pareto front over the sweep's objectives instead "
                                                           "(a sweep with search.objectives)")
    best.add_argument("--json", action="store_true", help='print {"experiment", "metric", "mode", "trials": […]} '
                                                          '(--pareto: {"experiment", "pareto": {…}})')

    finetune = add_command(commands, "finetune", finetune_command,
                        "keep training a checkpoint (a sweep's best) on more steps, new data or new classes")
    finetune.add_argument("config", nargs="?", help="a trial config merged over the source's as-run config")
    finetune.add_argument("--from", dest="source", required=True, metavar="SOURCE",
                          help="best:<experiment>, run:<mlflow run id> or checkpoint:<folder>")
    add_overrides(finetune, "override the merged config, e.g. --set model.num_classes=5")
    finetune.add_argument("--from-ema", action="store_true", help="start from the checkpoint's moving-average weights")
    finetune.add_argument("--keep-optimizer-state", action="store_true",
                          help="keep the optimizer's slots and step (default: a fresh optimizer and schedule at step 0)")
    finetune.add_argument("--sweep", metavar="SWEEP.yaml", help="run this sweep, every trial starting from the checkpoint")
    finetune.add_argument("--address", help="a running Ray cluster (default: start a local one)")
    finetune.add_argument("--storage", help="where Ray keeps results and checkpoints (default: ~/ray_results)")
    finetune.add_argument("--no-register", action="store_true", help="--sweep: do not register the best model")
    finetune.add_argument("--json", action="store_true", help="print one JSON object at the end")
    add_verbose(finetune)

    ui = add_command(commands, "ui", ui_command, "open the MLflow dashboard: mlflow ui on the embedded backend, or the server's URL")
    ui.add_argument("--config", help="a trial config or sweep file whose tracking.uri to use (default: $MLFLOW_TRACKING_URI, else mlflow.db here)")
    ui.add_argument("--port", type=int, default=5000, help="for mlflow ui (default: 5000)")

    evaluate = add_command(commands, "eval", eval_command, "COCO-evaluate a checkpoint, or score a COCO results file")
    evaluate.add_argument("--checkpoint", help="a detsweep checkpoint directory (evaluated on its config's data.val)")
    add_overrides(evaluate, "override the checkpoint's config, e.g. --set data.val.annotations=other.json")
    evaluate.add_argument("--detections", help="a COCO results JSON to score (with --annotations)")
    evaluate.add_argument("--annotations", help="the COCO ground-truth JSON for --detections")
    evaluate.add_argument("--json", action="store_true", help="print the metrics as one JSON object")

    from detsweep.data.commands import add_data_commands

    add_data_commands(commands)

    from detsweep.export.commands import add_export_commands

    add_export_commands(commands)

    odapi = add_command(commands, "import-odapi", import_odapi, "convert an OD API pipeline.config into a detsweep YAML")
    odapi.add_argument("pipeline", help="the OD API pipeline.config (text proto)")
    odapi.add_argument("-o", "--output", help="write the YAML here (default: print it)")
    return parser



def _config_arguments(parser: argparse.ArgumentParser, what: str = "a detsweep trial config (YAML)") -> None:
    parser.add_argument("config", help=what)
    add_overrides(parser, "override a field, e.g. --set optimizer.type=adam (repeatable; values are YAML scalars)")


# --- commands --------------------------------------------------------------------


def show_config(args: argparse.Namespace) -> int:
    from detsweep.config import load_trial_config

    config = load_trial_config(args.config, args.overrides).model_dump(mode="json")
    print(json.dumps(config, indent=2) if args.json else yaml.safe_dump(config, sort_keys=False), end="")
    if args.json:
        print()
    return 0


def show_optimizer(args: argparse.Namespace) -> int:
    from detsweep.config import load_trial_config

    config = load_trial_config(args.config, args.overrides)
    steps = parse_steps(args.steps) if args.steps is not None else default_steps(config.train.num_steps)
    if args.plot and not Path(args.plot).resolve().parent.is_dir():
        raise DetsweepError(f"--plot {args.plot}: the folder {Path(args.plot).parent} does not exist")
    from detsweep.optim.report import optimizer_report, plot_schedule

    report = optimizer_report(config, steps)
    if args.plot:
        last = max(config.train.num_steps, max(steps))
        title = f"{Path(args.config).name}: {config.optimizer.learning_rate.type} schedule"
        plot_schedule(config.optimizer.learning_rate, last, args.plot, title=title)
    if args.json:
        print(json.dumps(report))
    else:
        print(format_optimizer_report(report, config.optimizer.learning_rate.type))
        if args.plot:
            print(f"schedule plot: {args.plot}")
    return 0


def train_command(args: argparse.Namespace) -> int:
    import time

    from detsweep.config import load_trial_config
    from detsweep.preflight import Preflight, preflight
    from detsweep.preflight.capacity import check_worker_fits, cluster_capacity, this_machine
    from detsweep.trainables.trainer import run_train

    config = load_trial_config(args.config, args.overrides)
    joins = bool(args.address or os.environ.get("RAY_ADDRESS"))
    out = console.take_over(args.json, args.verbose)  # with --json, the progress lines go to stderr
    # a local cluster: what it will hold is known before it starts
    cleared = preflight(Preflight(config, args.config, capacity=None if joins else this_machine()))
    config = cleared.config  # its bucket data's version fixed
    for line in cleared.notes + cleared.summaries:
        print(line, file=console.err())
    name = args.name or f"{Path(args.config).stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    def check_cluster() -> None:  # a cluster joined: what its nodes (or node types) hold, once connected
        if joins:
            check_worker_fits(config.scaling, cluster_capacity()[0], f"{args.config}: scaling")

    outcome = run_train(config, name, address=args.address, storage_path=args.storage, check_cluster=check_cluster)
    if outcome.error:
        print(f"detsweep: training failed: {outcome.error}", file=console.err())
        return 1
    if args.json:
        print(json.dumps({"steps": outcome.steps, "metrics": outcome.metrics, "checkpoint": outcome.checkpoint}), file=out)
    else:
        shown = {k: v for k, v in outcome.metrics.items() if k.startswith("eval")}
        print("\n".join([f"finished at step {outcome.steps}"] + [f"  {k:<22} {v:.4f}" for k, v in sorted(shown.items())]
                        + [f"checkpoint: {outcome.checkpoint}"]), file=out)
    return 0


def best_command(args: argparse.Namespace) -> int:
    from mlflow import MlflowClient

    from detsweep.tracking import resolve_backend
    from detsweep.tracking.backend import check_readable
    from detsweep.tracking.best import rank_trials

    name, tracking = _experiment_of(args.experiment)
    backend = resolve_backend(tracking)
    check_readable(backend)
    if args.pareto:
        from detsweep.sweeps.commands import format_front
        from detsweep.tracking.best import front_of

        front = front_of(MlflowClient(backend.uri), name, backend)
        pareto = front.to_dict() if front else None
        none = f"experiment {name}: no trial trained to the end with every objective logged"
        print(json.dumps({"experiment": name, "tracking_uri": backend.uri, "pareto": pareto}) if args.json
              else "\n".join(format_front(pareto)) if pareto else none)
        return 0
    if args.top < 0:
        raise DetsweepError(f"--top: found {args.top}, expected 0 (every trial) or more")
    ranking = rank_trials(MlflowClient(backend.uri), name, backend, args.metric, args.mode, args.top or None)
    report = ranking.to_dict()
    print(json.dumps(report) if args.json else format_ranking(report))
    return 0


def _experiment_of(name_or_file: str):
    """A sweep file names its experiment and tracking server; a bare name uses the default server."""
    from detsweep.config import TrackingConfig

    if name_or_file.endswith((".yaml", ".yml")):
        from detsweep.sweeps.spec import load_sweep

        sweep = load_sweep(name_or_file)
        return sweep.base.tracking.experiment or sweep.name, sweep.base.tracking
    return name_or_file, TrackingConfig()


def format_ranking(report: dict[str, Any]) -> str:
    metric = report["metric"]
    lines = [f"experiment {report['experiment']} at {report['tracking_uri']}, ranked by {metric} ({report['mode']})",
             f"{'run':<34} {'trial':<14} {'status':<9} {metric:>14}  swept values"]
    for rank, trial in enumerate(report["trials"]):
        value = f"{trial['value']:.4g}" if trial["value"] is not None else "-"
        swept = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in trial["swept"].items())
        lines.append(f"{trial['run_id']:<34} {trial['trial_id'] or '-':<14} {trial['status']:<9} {value:>14}  {swept}")
        lines.append(f"{'':<34} checkpoint: {trial['checkpoint'] or 'none'}")
        if trial.get("rerun"):  # its configuration trained again over seeds (detsweep rerun)
            rerun = trial["rerun"]
            lines.append(f"{'':<34} rerun: mean {rerun['mean']:.4g} ± {rerun['std']:.2g} over {rerun['seeds']} seeds")
        if rank == 0 and trial.get("environment"):  # the best trial's; a run older than the tags has none
            lines.append(f"{'':<34} ran on: {ran_on(trial['environment'])}")
    if report["ranked"] > len(report["trials"]):
        lines.append(f"{report['ranked'] - len(report['trials'])} more (--top 0 shows every trial)")
    return "\n".join(lines)


def ran_on(environment: dict[str, str]) -> str:
    """``python 3.11.7, ray 2.60.0, …, lock 1a2b…``: what a trial's results were computed with."""
    return ", ".join(f"{name} {value}" for name, value in environment.items())


def finetune_command(args: argparse.Namespace) -> int:
    from detsweep.finetune import FineTuneRequest, finetune, finetune_sweep
    from detsweep.sweeps.commands import sweep_summary

    request = FineTuneRequest(args.source, args.config, tuple(args.overrides), args.from_ema, args.keep_optimizer_state)
    if args.sweep and args.config:
        raise DetsweepError("detsweep finetune --sweep: the sweep file's base is the config; drop CONFIG.yaml")
    out = console.take_over(args.json, args.verbose)
    if args.sweep:
        return sweep_summary(finetune_sweep(request, args.sweep, args.address, register=not args.no_register),
                             args.json, out)
    report = finetune(request, args.address, args.storage)  # with --json, its progress goes to stderr
    if report["error"]:
        print(f"detsweep: fine-tuning failed: {report['error']}", file=console.err())
    if args.json:
        print(json.dumps(report, default=str), file=out, flush=True)
    else:
        shown = {k: v for k, v in report["metrics"].items() if k.startswith("eval")}
        print("\n".join([f"finished at step {report['steps']}"] + [f"  {k:<22} {v:.4f}" for k, v in sorted(shown.items())]
                        + [f"checkpoint: {report['checkpoint']}", f"MLflow run: {report['mlflow']['run_id']}"]), file=out)
    return 1 if report["error"] else 0


def ui_command(args: argparse.Namespace) -> int:
    """A server's URL is printed (it is already serving); the embedded backend gets ``mlflow ui``."""
    from detsweep.tracking import resolve_backend
    from detsweep.tracking.backend import CERT_PATH, ui_command_line

    backend = resolve_backend(_tracking_of(args.config))
    if backend.is_server:
        authority = os.environ.get(CERT_PATH)
        trust = f" (a browser trusts it once it trusts {authority})" if authority and backend.uri.startswith("https") else ""
        print(f"MLflow: {backend.uri}{trust}")
        return 0
    command = ui_command_line(backend, args.port)
    print(f"MLflow: http://127.0.0.1:{args.port} ({' '.join(command)})", flush=True)
    console.release_stderr()  # mlflow ui's own output is the user's to see
    os.execvp(command[0], command)
    return 0  # not reached


def _tracking_of(path: str | None):
    from detsweep.config import TrackingConfig, load_trial_config, read_yaml_mapping

    if path is None:
        return TrackingConfig()
    if "search" in read_yaml_mapping(path):  # a sweep file
        from detsweep.sweeps.spec import load_sweep

        return load_sweep(path).base.tracking
    return load_trial_config(path).tracking


def eval_command(args: argparse.Namespace) -> int:
    if bool(args.checkpoint) == bool(args.detections):
        raise DetsweepError("detsweep eval: give either --checkpoint DIR or --detections FILE --annotations FILE")
    if args.detections:
        from detsweep.evaluation.files import score_files

        if not args.annotations:
            raise DetsweepError("--detections needs --annotations (the COCO ground truth)")
        metrics = score_files(args.detections, args.annotations)
    else:
        from detsweep.checkpoints import check_checkpoint, read_config

        read_config(check_checkpoint(args.checkpoint, "--checkpoint"), args.overrides)  # before TensorFlow loads
        from detsweep.train.evaluate import evaluate_checkpoint

        with console.working(f"evaluating {args.checkpoint}"):
            metrics = evaluate_checkpoint(args.checkpoint, args.overrides).metrics
    print(json.dumps(metrics) if args.json else "\n".join(f"{k:<22} {v:.4f}" for k, v in metrics.items()))
    return 0


def import_odapi(args: argparse.Namespace) -> int:
    from detsweep.config import TrialConfig, validate
    from detsweep.config.loader import read_text
    from detsweep.config.odapi import import_pipeline

    imported = import_pipeline(read_text(Path(args.pipeline)), source=args.pipeline)
    validate(TrialConfig, imported.tree, source=args.pipeline)  # never write a file we would reject
    header = [f"Imported from {args.pipeline} by `detsweep import-odapi`."] + imported.notes
    text = "".join(f"# {line}\n" for line in header) + yaml.safe_dump(imported.tree, sort_keys=False)
    for line in imported.not_carried + imported.notes:
        print(f"detsweep: not carried over: {line}" if line in imported.not_carried else f"detsweep: note: {line}",
              file=console.err())
    if args.output:
        write_atomically(Path(args.output), text)
        print(f"wrote {args.output}", file=console.err())
    else:
        print(text, end="")
    return 0


# --- helpers -----------------------------------------------------------------------


def parse_steps(text: str) -> list[int]:
    """``0,4,8`` or ``START:STOP[:STEP]`` (Python's range: STOP is excluded)."""
    try:
        if ":" in text:
            parts = [int(part) for part in text.split(":")]
            if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] <= 0):
                raise ValueError
            steps = list(range(*parts))
        else:
            steps = [int(part) for part in text.split(",")]
    except ValueError:
        raise DetsweepError(f"--steps: found {text!r}, expected 0,4,8 or START:STOP[:STEP] with a positive STEP") from None
    if not steps or min(steps) < 0:
        raise DetsweepError(f"--steps: found {text!r}, expected at least one step, none negative")
    return steps


def default_steps(num_steps: int) -> list[int]:
    stride = max(1, num_steps // 10)
    return sorted(set(range(0, num_steps + 1, stride)) | {num_steps})


def format_optimizer_report(report: dict[str, Any], schedule: str) -> str:
    hyper = report["hyperparameters"]
    # Keras's own ema_* settings are inert (use_ema is off: detsweep keeps the average itself).
    shown = {k: v for k, v in hyper.items() if v not in (None, False) and k != "name" and not k.startswith("ema_")}
    ema = report["moving_average"]
    lines = [
        f"optimizer        keras.optimizers.{report['optimizer']}",
        "hyperparameters  " + ", ".join(f"{k}={v}" for k, v in shown.items()),
        "moving average   " + (f"on, decay {ema['decay']}" + (" (dynamic warm-up)" if ema["dynamic"] else "") if ema["enabled"] else "off"),
        f"schedule         {schedule}",
        "",
        f"{'step':>10}  learning rate",
    ]
    lines += [f"{step:>10}  {rate:.6g}" for step, rate in zip(report["steps"], report["learning_rate"])]
    return "\n".join(lines)


def write_atomically(path: Path, text: str) -> None:
    """Write via a temporary file in the same folder, so a failure leaves nothing half-written."""
    if not path.parent.is_dir():
        raise DetsweepError(f"{path}: the folder {path.parent} does not exist")
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "w") as stream:
            stream.write(text)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


if __name__ == "__main__":
    sys.exit(main())
