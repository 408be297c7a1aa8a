"""Trial start-up: seconds from the moment Tune asks Ray for a trial's process to the trial's
first step reaching Tune, for a fresh start and for a resume (a synchronous-halving rung's
survivor going on from its checkpoint), against the floor: a bare Python process that
imports TensorFlow, builds the model once, traces the step and runs it.

When Tune asks is read from Ray's State API: the creation time of the trial actor's creation
task (every start and every resume is a new actor). The trial's own phases come from the
``startup/*`` metrics of its first report; the floor marks the same phases with the same
clock. Beside them, each Ray process a start asked for: when it was asked for and running,
and its fork to ready, from the State API's task and worker records.

    .venv/bin/python -m bench.startup [--smoke] [--repeats N] [--workers N] [--name NAME]
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from .common import REPO, Entry, Target, arguments, median, record

CONFIG = REPO / "configs" / "quickstart.yaml"
# The same overrides for the trials and the floor: two steps a loop, no val set (nothing to evaluate).
SETTINGS = ["data.train.num_images=16", "data.val=null", "train.num_steps=4", "train.steps_per_loop=2",
            "train.eval_every=2", "train.checkpoint_every=2"]
# Ordered as they happen: the trial's process (mlflow, trainer), Ray Train (workers), then the
# worker, which the floor does alone (imports, strategy, data, model, first_loop).
TRIAL_PHASES = ("mlflow", "trainer", "workers")
WORKER_PHASES = ("imports", "strategy", "data", "model", "first_loop")
TRIAL_CLASS = "Trial"  # a trial's actor: detsweep.trainables.trial.TRIAL_ACTOR (no Ray import here)
GOAL = 1.7


def floor_process() -> None:
    """Run as ``--floor ORIGIN``: import TensorFlow and detsweep's loop, then train to the first
    step with the trial's clock; print its phases as JSON, counted from ORIGIN."""
    from detsweep.startup import StartupClock

    clock = StartupClock(origin=float(sys.argv[sys.argv.index("--floor") + 1]))
    from detsweep.config import load_trial_config
    from detsweep.train import WorkerContext, run_training  # TensorFlow loads here

    clock.mark("imports")
    config = load_trial_config(CONFIG, [*SETTINGS, "train.num_steps=2"])  # its first loop
    run_training(config, lambda metrics, checkpoint, milestone, pictures: None, WorkerContext(startup=clock))
    print(json.dumps(clock.phases))


def start_floor() -> subprocess.Popen:
    """``--floor`` in a process of its own, its clock started now; ``floor_of`` reads its phases."""
    return subprocess.Popen([sys.executable, "-m", "bench.startup", "--floor", repr(time.time())],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def floor_of(process: subprocess.Popen) -> dict[str, float]:
    output, errors = process.communicate()
    if process.returncode != 0:
        raise subprocess.CalledProcessError(process.returncode, process.args, output, errors)
    return json.loads(output.strip().splitlines()[-1])


def sweep_file(folder: Path, trials: int, factor: int, workers: int) -> Path:
    """``trials`` trials one after another, halved at step 2 by ``factor``: each starts fresh
    and pauses there, and the survivors go on from their checkpoints (a resume each). Ranked
    on the learning rate itself, lowest first: the survivors are the first trials, which all
    paused (the last to arrive, ranked on its own report, would go on without a pause)."""
    rates = ", ".join(str(0.01 + 0.001 * index) for index in range(trials))
    path = folder / "startup.yaml"
    path.write_text(f"""
name: bench-startup
storage: {folder / "ray"}
base:
  from: {CONFIG}
  scaling: {{num_workers: {workers}}}
  tracking: {{uri: sqlite:///{folder / "mlflow.db"}}}
search:
  metric: train/lr
  mode: min
  algorithm: grid
  num_samples: 1
  max_concurrent_trials: 1
  scheduler: {{type: halving, grace_period: 2, reduction_factor: {factor}}}
  space:
    optimizer.learning_rate.learning_rate_base: {{grid: [{rates}]}}
""")
    return path


def starts_callback():
    """A Tune callback: every start of a trial (fresh, or a resume) in order, the driver's time
    its first result arrived and the ``startup/*`` metrics it carried; and, at the sweep's end,
    Ray's records of the actors it asked for (the State API lives as long as the cluster).
    Defined here, not at the top: the floor imports this module, and must not import Ray."""
    from ray import tune

    class Starts(tune.Callback):
        def __init__(self):
            self.starts: list[dict] = []  # {"trial", "resume", "first", "phases"}
            self.waiting: dict[str, dict] = {}  # started, no result yet
            self.actors: list = []
            self.workers: dict[int, object] = {}

        def on_trial_start(self, iteration, trials, trial, **info):
            start = {"trial": trial.trial_id, "resume": any(s["trial"] == trial.trial_id for s in self.starts)}
            self.starts.append(start)
            self.waiting[trial.trial_id] = start

        def on_trial_result(self, iteration, trials, trial, result, **info):
            if (start := self.waiting.pop(trial.trial_id, None)) is not None:
                start["first"] = time.time()
                start["phases"] = {key[len("startup/"):-2]: value for key, value in result.items()
                                   if key.startswith("startup/") and key != "startup/total_s"}

        def on_experiment_end(self, trials, **info):
            import ray
            from ray.util.state import list_tasks, list_workers

            here = ray.get_runtime_context().gcs_address  # this sweep's cluster, whatever else runs here
            self.actors = list_tasks(here, filters=[("type", "=", "ACTOR_CREATION_TASK")], detail=True,
                                     limit=10_000, raise_on_missing_output=False)
            self.workers = {worker.pid: worker for worker in list_workers(here, detail=True, limit=10_000,
                                                                          raise_on_missing_output=False)}

    return Starts()


def class_of(task) -> str:
    return task.func_or_class_name.split(".")[0]


def fork_to_ready(task, workers: dict) -> float | None:
    """Seconds from the raylet launching the actor's process to that process registering."""
    worker = workers.get(task.worker_pid)
    if worker is None or not worker.worker_launch_time_ms or not worker.worker_launched_time_ms:
        return None
    return (worker.worker_launched_time_ms - worker.worker_launch_time_ms) / 1000


def timed_starts(callback) -> list[dict]:
    """Each start with ``asked`` (Tune asked Ray for its process), ``total`` (to its first result)
    and ``ray``: per Ray process asked for until then, (asked, running) after ``asked`` and its fork to ready."""
    trial_actors = sorted((task for task in callback.actors if class_of(task) == TRIAL_CLASS),
                          key=lambda task: task.creation_time_ms)
    if len(trial_actors) != len(callback.starts):
        raise RuntimeError(f"{len(trial_actors)} trial actors for {len(callback.starts)} trial starts: "
                           "Tune reused an actor, or Ray dropped a record")
    for start, actor in zip(callback.starts, trial_actors):
        asked = actor.creation_time_ms / 1000
        start["asked"], start["total"] = asked, start["first"] - asked
        start["ray"] = [(class_of(task), task.creation_time_ms / 1000 - asked,
                         (task.start_time_ms or 0) / 1000 - asked, fork_to_ready(task, callback.workers))
                        for task in callback.actors if asked * 1000 <= task.creation_time_ms <= start["first"] * 1000]
    return callback.starts


def trial_starts(trials: int, factor: int, workers: int) -> list[dict]:
    from detsweep.sweeps import load_sweep
    from detsweep.sweeps.launch import launch

    callback = starts_callback()
    with tempfile.TemporaryDirectory() as folder:
        sweep = load_sweep(sweep_file(Path(folder), trials, factor, workers), [f"base.{s}" for s in SETTINGS])
        launch(sweep, register=False, callbacks=[callback])
    return timed_starts(callback)


def phase_rows(starts: list[dict], floors: list[dict]) -> list[list]:
    """Per phase, the median seconds of fresh starts, of resumes and of the floor."""
    kinds = [[s for s in starts if not s["resume"]], [s for s in starts if s["resume"]]]

    def process_up(start: dict) -> float:  # Tune asked → the trial's function runs: Ray's part
        return start["total"] - sum(start["phases"].values())

    rows = [["phase", "fresh start (s)", "resume (s)", "floor (s)"],
            ["Tune asks → the trial's process runs its function (Ray), and its first result back to Tune",
             *[median([process_up(s) for s in kind]) for kind in kinds], 0.0]]
    for phase in (*TRIAL_PHASES, *WORKER_PHASES):
        rows.append([phase, *[median([s["phases"].get(phase, 0.0) for s in kind]) for kind in kinds],
                     median([f.get(phase, 0.0) for f in floors]) if phase in WORKER_PHASES else 0.0])
    rows.append(["**Tune asks → first step at Tune**", *[median([s["total"] for s in kind]) for kind in kinds],
                 median([sum(f.values()) for f in floors])])
    return rows


def ray_processes(starts: list[dict]) -> str:
    """A markdown table: each Ray process a fresh start asked for, medians over the starts."""
    by_class: dict[str, list[tuple]] = defaultdict(list)
    for start in starts:
        if not start["resume"]:
            for name, asked, running, fork in start["ray"]:
                by_class[name].append((asked, running, fork))
    lines = ["| Ray process (actor class) | per start | asked, s after Tune asked | running at | fork to ready (s) |",
             "|---|---|---|---|---|"]
    fresh = sum(1 for start in starts if not start["resume"])
    for name, seen in sorted(by_class.items(), key=lambda item: median([asked for asked, _, _ in item[1]])):
        forks = [fork for _, _, fork in seen if fork is not None]
        lines.append(f"| {name} | {len(seen) / fresh:.2g} | {median([a for a, _, _ in seen]):.1f} | "
                     f"{median([r for _, r, _ in seen]):.1f} | {median(forks):.1f} |" if forks else
                     f"| {name} | {len(seen) / fresh:.2g} | {median([a for a, _, _ in seen]):.1f} | "
                     f"{median([r for _, r, _ in seen]):.1f} | (a process Ray had started) |")
    return "\n".join(lines)


def main() -> None:
    if "--floor" in sys.argv:
        return floor_process()
    parser = arguments(__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="resumes (and 3x as many fresh starts)")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--name", default="", help="the entry's name (default startup_<workers>w)")
    args = parser.parse_args()
    # halving by 3 keeps a third: 3 x repeats trials give repeats resumes; the smoke: 2 and 1
    trials, factor = (2, 2) if args.smoke else (3 * args.repeats, 3)
    if args.smoke:  # the floor beside the trials: the smoke's figures are not read, and the suite's time counts
        beside = start_floor()
        starts, floors = trial_starts(trials, factor, args.workers), [floor_of(beside)]
    else:
        floors = [floor_of(start_floor()) for _ in range(args.repeats)]
        starts = trial_starts(trials, factor, args.workers)
    rows = phase_rows(starts, floors)
    fresh, resume, floor_total = rows[-1][1:]
    record(args.name or f"startup_{args.workers}w", Entry(
        title=f"Trial start-up, {args.workers} worker(s): Tune asking for the trial → its first step (bench/startup.py)",
        settings={"config": "configs/quickstart.yaml", "workers": args.workers, "fresh starts": trials,
                  "resumes": sum(1 for s in starts if s["resume"]), "floors": len(floors)},
        rows=rows,
        targets=[Target("a fresh start vs the floor", f"<= {GOAL}x", fresh / floor_total, fresh / floor_total <= GOAL),
                 Target("a resume vs the floor", f"<= {GOAL}x", resume / floor_total, resume / floor_total <= GOAL)],
        notes=["Phases: mlflow = the trial waits for MLflow (its import and its run: before the run opened beside Ray Train's start); trainer = it builds its Ray Train trainer; "
               "workers = Ray Train starts its controller and worker group, up to the worker's loop; imports = "
               "the worker imports TensorFlow and detsweep's loop; strategy, data, model = its set-up; first_loop "
               "= tracing the train step and running it once. The floor: a bare process from its fork to its "
               "first step, the same phases by the same clock.",
               "The Ray processes a fresh start asked for (Ray's State API: each actor's creation task, the "
               "raylet's launch and registration of its process), medians over the fresh starts:",
               ray_processes(starts)],
    ), args.out)


if __name__ == "__main__":
    main()
