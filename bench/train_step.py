"""Train-step throughput: detsweep's step under Ray Train (one worker) against the same model,
data, batch size and optimizer trained with plain Keras ``model.fit`` in one process (what a
user would write by hand), and against detsweep's own loop without Ray; each with glibc's
malloc and with tcmalloc. One run, each contender in a process of its own; images/s over
windows of ``steps_per_loop`` steps, the first window (tracing) and the last (a final
checkpoint) left out. Then, at 2, 10 and 40 steps per loop, Ray Train's wall-clock rate
against the worker's own compute-only rate and against the bare loop: ``--repeats`` pairs of
runs, the bare loop then Ray Train, each pair's ratio taken back to back (single runs of one
contender differ by up to 10 % here, more than the gap the targets judge). First, where Ray
Train's gap goes: the same repeats of the bare loop alone, beside an idle local cluster, beside
an idle Ray Train run and under Ray Train, back to back (the pairs take their runs from these).

    .venv/bin/python -m bench.train_step [--smoke] [--windows N] [--repeats N] [--set path=value ...]
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from detsweep.cluster import fast_allocator

from .common import REPO, Entry, Target, arguments, median, record

CONFIG = REPO / "configs" / "quickstart.yaml"


def bench_config(windows: int, steps_per_loop: int, smoke: bool, overrides: list[str]):
    """The quickstart trial without evaluation: ``windows`` loops, every core to the one worker."""
    from detsweep.config import load_trial_config

    steps = windows * steps_per_loop
    return load_trial_config(CONFIG, [
        f"data.train.num_images={16 if smoke else 128}", "data.val=null", f"train.num_steps={steps}",
        f"train.steps_per_loop={steps_per_loop}", f"train.eval_every={steps}", f"train.checkpoint_every={steps}",
        f"optimizer.learning_rate.total_steps={steps}", "optimizer.learning_rate.warmup_steps=0",
        f"scaling.cpus_per_worker={os.cpu_count()}", *overrides,
    ])


def keras_fit(config) -> list[tuple[int, float]]:
    """``model.compile(optimizer)`` and ``model.fit`` as keras-hub's RetinaNet documents them:
    its default losses (focal, Huber), the optimizer's own EMA in place of detsweep's."""
    import keras

    from detsweep.data import load_dataset
    from detsweep.data.pipeline import training_dataset
    from detsweep.data.processing import InputSpec
    from detsweep.models import build_model
    from detsweep.optim import build_optimizer
    from detsweep.train.strategy import use_worker_cpus

    use_worker_cpus(config.scaling.cpus_per_worker)
    keras.utils.set_random_seed(config.train.seed)
    train_set = load_dataset(config.data.train)
    model, _ = build_model(config.model, len(train_set.categories))
    optimizer = build_optimizer(config.optimizer, clip_norm=config.train.gradient_clipping_by_norm)
    if config.optimizer.use_moving_average:  # as the constructor's use_ema=True would (read at build)
        optimizer.use_ema, optimizer.ema_momentum = True, config.optimizer.moving_average_decay
    model.compile(optimizer=optimizer)
    batches = training_dataset(train_set, InputSpec(config.model.image_size), config.data.augmentation,
                               batch_size=config.train.batch_size, seed=config.train.seed)
    marks: list[tuple[int, float]] = []
    window = config.train.steps_per_loop

    class Marks(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            marks.append((0, time.time()))

        def on_epoch_end(self, epoch, logs=None):
            marks.append(((epoch + 1) * window, time.time()))

    model.fit(batches, steps_per_epoch=window, epochs=config.train.num_steps // window, callbacks=[Marks()], verbose=0)
    return marks


def own_loop(config) -> list[tuple[int, float, float]]:
    """detsweep's loop in this process, as a Ray Train worker runs it."""
    from detsweep.train import run_training

    marks = []

    def mark(metrics: dict, checkpoint, milestone, pictures) -> None:  # (step, loop end, compute-only images/s)
        marks.append((int(metrics["step"]), time.time(), metrics["train/images_per_sec"]))

    run_training(config, mark)
    return marks


def without_preload() -> dict[str, str]:
    """This process's environment less LD_PRELOAD: each contender chooses its own allocator."""
    return {key: value for key, value in os.environ.items() if key != "LD_PRELOAD"}


IDLE_CLUSTER = "from detsweep.cluster import connect; import sys; connect(None); print(flush=True); sys.stdin.read()"

# An idle Ray Train run: what a trial starts beside its training (the controller, its helper
# actors, one worker, a Ray queue like the trial's report channel), the worker asleep. A line
# once the worker runs, none if it failed.
IDLE_RAY_TRAIN = """
import os, sys, threading, time
import ray.train
from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer
from ray.util.queue import Queue
from detsweep.cluster import connect

def sleep(config):
    config["queue"].put("running")
    threading.Event().wait()

connect(None)
queue = Queue(actor_options={"num_cpus": 0})
trainer = DataParallelTrainer(sleep, train_loop_config={"queue": queue}, scaling_config=ray.train.ScalingConfig(
    num_workers=1, resources_per_worker={"CPU": os.cpu_count()}), run_config=ray.train.RunConfig(
    storage_path=sys.argv[1], name="idle"))
fit = threading.Thread(target=trainer.fit, daemon=True)
fit.start()
deadline = time.monotonic() + 300  # a worker that cannot be placed would wait for Ray Train's 30 min
while fit.is_alive() and queue.empty() and time.monotonic() < deadline:
    time.sleep(0.5)
if fit.is_alive() and not queue.empty():
    print(flush=True)
    sys.stdin.read()
os._exit(0)  # the sleeping worker would hold fit() forever; Ray ends with its driver
"""


def loop_beside(driver: str, config) -> list[tuple[int, float, float]]:
    """detsweep's loop in this process while ``driver``, a process of its own started without
    this process's allocator (as ``detsweep launch`` starts the cluster), keeps Ray idle beside
    it: the share of Ray Train's cost that is other processes taking CPU from the training
    threads, not the worker's own."""
    with tempfile.TemporaryDirectory() as storage:
        beside = subprocess.Popen([sys.executable, "-c", driver, storage], cwd=REPO, env=without_preload(), text=True,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        try:
            if not beside.stdout.readline():
                raise SystemExit("the idle Ray processes beside the loop did not start")
            return own_loop(config)
        finally:
            beside.stdin.close()  # the driver ends, and Ray with it
            try:
                beside.wait(timeout=120)
            except subprocess.TimeoutExpired:  # not to hide the loop's result or error
                beside.kill()


def loop_beside_ray(config) -> list[tuple[int, float, float]]:
    """Beside an idle local cluster: Ray's daemons (GCS, raylet, dashboard, log monitor)."""
    return loop_beside(IDLE_CLUSTER, config)


def loop_beside_ray_train(config) -> list[tuple[int, float, float]]:
    """Beside an idle Ray Train run on such a cluster: the daemons and Ray Train's own processes."""
    return loop_beside(IDLE_RAY_TRAIN, config)


def under_ray_train(config) -> list[tuple[int, float, float]]:
    """detsweep's loop in a Ray Train worker, as ``detsweep train`` runs it; each loop timed
    when it ended, by the worker's clock (a driver reading the queue late changes nothing)."""
    from detsweep.cluster import connect
    from detsweep.trainables.channel import LoopMetrics, RunChannel
    from detsweep.trainables.request import TrainingRequest
    from detsweep.trainables.trainer import make_trainer

    connect(None)
    reports = RunChannel()
    with tempfile.TemporaryDirectory() as storage:
        make_trainer(TrainingRequest(config, "bench-train-step", storage), reports).fit()
    loops = [item for item in (reports.get() for _ in range(reports.qsize())) if isinstance(item, LoopMetrics)]
    return [(loop.step, loop.at, loop.metrics["train/images_per_sec"]) for loop in loops]


CONTENDERS = {  # name → (function, how many windows to leave out at the start)
    "fit": (keras_fit, 1),
    "loop": (own_loop, 0),
    "beside": (loop_beside_ray, 0),
    "beside_train": (loop_beside_ray_train, 0),
    "ray": (under_ray_train, 0),
}


@dataclass(frozen=True)
class Rate:
    wall: float  # images/s by the clock, over the span
    compute: float | None  # the worker's own images/s over the same windows, time in the step only


_measured: dict[tuple, Future] = {}
_runs = ThreadPoolExecutor(1)  # one run at a time, in the order asked for: back to back, as the pairs need


def tcmalloc_for(name: str) -> dict[str, str]:
    """The environment that gives contender ``name`` tcmalloc: Ray Train's workers get it from
    detsweep (the driver's own allocator changes nothing), every other contender preloads it."""
    return {} if name == "ray" else fast_allocator()


def run_contender(name: str, allocator: dict[str, str], args, windows: int, steps_per_loop: int,
                  repeat: int = 0) -> Rate:
    """Images/s of one contender in a process of its own (a previous training in the same
    process leaves its memory behind and changes the next one's speed). A contender asked for
    again with the same settings and ``repeat`` gives the figure it measured the first time:
    the split's runs are the main table's and, at its loop length, the pairs'."""
    return start_contender(name, allocator, args, windows, steps_per_loop, repeat).result()


def start_contender(name: str, allocator: dict[str, str], args, windows: int, steps_per_loop: int,
                    repeat: int = 0) -> Future:
    """``run_contender``'s run, queued: its ``Rate`` once it ran."""
    key = (name, tuple(sorted(allocator.items())), windows, steps_per_loop, args.smoke, tuple(args.overrides), repeat)
    if key not in _measured:
        _measured[key] = _runs.submit(_measure, name, allocator, args, windows, steps_per_loop)
    return _measured[key]


def _measure(name: str, allocator: dict[str, str], args, windows: int, steps_per_loop: int) -> Rate:
    command = [sys.executable, "-m", "bench.train_step", "--contender", name, "--windows", str(windows),
               "--steps-per-loop", str(steps_per_loop), *(["--smoke"] if args.smoke else []),
               *[flag for override in args.overrides for flag in ("--set", override)]]
    env = without_preload() | allocator
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"{name} failed:\n{result.stderr[-3000:]}")
    marks = json.loads(result.stdout.strip().splitlines()[-1])
    return span_rate(marks[CONTENDERS[name][1]:], args.batch_size)


def span_rate(marks: list, batch_size: int) -> Rate:
    """Images/s from the end of the first window (tracing) to the end of the last but one (the
    last window ends in a checkpoint); a contender that marks compute-only rates gives their
    mean over the same windows."""
    (first_step, first_time, *_), (last_step, last_time, *_) = marks[0], marks[-2]
    inside = [mark[2] for mark in marks[1:-1] if len(mark) > 2]
    return Rate((last_step - first_step) * batch_size / (last_time - first_time),
                sum(inside) / len(inside) if inside else None)


def main() -> None:
    parser = arguments(__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=30)
    parser.add_argument("--steps-per-loop", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3, help="pairs of runs (bare loop, Ray Train) per loop length")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--contender", choices=CONTENDERS, help="(internal) run one contender, print its marks")
    args = parser.parse_args()
    if args.smoke:
        args.windows, args.steps_per_loop, args.repeats = 4, 2, 1
    config = bench_config(args.windows, args.steps_per_loop, args.smoke, args.overrides)
    if args.contender:
        print(json.dumps(CONTENDERS[args.contender][0](config)))
        return
    args.batch_size = config.train.batch_size
    if args.smoke:
        two_at_a_time(args)
    where_the_gap_goes(args)  # first: the tables below take their back-to-back pairs from these runs
    contenders(args, config)
    loop_lengths(args)


def two_at_a_time(args) -> None:
    """The smoke's runs two at a time, model.fit's queued first (the split's start beside it):
    the smoke's figures are not read, and the suite's time is counted."""
    global _runs
    _runs = ThreadPoolExecutor(2)
    start_contender("fit", {}, args, args.windows, args.steps_per_loop)


def contenders(args, config) -> None:
    """Ray Train against ``model.fit`` and the bare loop, at one loop length."""
    tcmalloc = fast_allocator()
    runs = {  # the smoke run keeps one of each kind
        "Keras model.fit, plain python": ("fit", {}),
        "Keras model.fit, tcmalloc": ("fit", tcmalloc_for("fit")),
        "detsweep loop, no Ray, plain python": ("loop", {}),
        "detsweep loop, no Ray, tcmalloc, an idle Ray cluster beside it": ("beside", tcmalloc_for("beside")),
        "detsweep loop, no Ray, tcmalloc": ("loop", tcmalloc_for("loop")),  # the split's first repeat
        f"detsweep under Ray Train, 1 worker{' (tcmalloc)' if tcmalloc else ''}": ("ray", tcmalloc_for("ray")),
    }
    if args.smoke:
        runs = {name: run for name, run in runs.items() if "model.fit, t" not in name and "Ray, plain" not in name}
    rates = {name: run_contender(kind, allocator, args, args.windows, args.steps_per_loop).wall
             for name, (kind, allocator) in runs.items()}
    fit = rates["Keras model.fit, plain python"]
    fit_tcmalloc = rates.get("Keras model.fit, tcmalloc", fit)
    loop = rates["detsweep loop, no Ray, tcmalloc"]
    beside = rates["detsweep loop, no Ray, tcmalloc, an idle Ray cluster beside it"]
    ray_train = list(rates.values())[-1]
    against_loop = median(pair_ratios(paired_runs(args, args.windows, args.steps_per_loop)))
    rows = [["contender", "images/s", "vs model.fit, plain python"]]
    rows += [[name, rate, rate / fit] for name, rate in rates.items()]
    record("train_step", Entry(
        title="Train-step throughput: Ray Train vs model.fit vs the bare loop (bench/train_step.py)",
        settings={"config": "configs/quickstart.yaml", "batch_size": args.batch_size,
                  "steps_per_loop": args.steps_per_loop, "windows": args.windows,
                  "threads": config.scaling.cpus_per_worker, "overrides": args.overrides},
        rows=rows,
        targets=[Target("Ray Train vs model.fit (plain python)", ">= 1.0", ray_train / fit, ray_train / fit >= 1.0),
                 Target("Ray Train vs model.fit (tcmalloc)", ">= 1.0", ray_train / fit_tcmalloc,
                        ray_train / fit_tcmalloc >= 1.0),
                 Target("Ray Train vs the bare loop (tcmalloc), median of paired runs", ">= 0.95", against_loop,
                        against_loop >= 0.95)],
        notes=[f"Where the wrapper's cost goes, in these single runs: an idle Ray cluster beside the bare loop "
               f"slows it by {1 - beside / loop:.1%}; Ray Train costs {1 - ray_train / beside:.1%} more, its "
               "idle processes and its worker together (the split table takes them apart over the repeats).",
               f"Ray Train against the bare loop: the median of {args.repeats} pairs of runs, each pair back to "
               f"back (the loop-length table below); the single runs above give {ray_train / loop:.3f}.",
               "Each contender runs in a process of its own; images/s from the end of the first window "
               "(tracing) to the end of the last but one (the last ends in a checkpoint). model.fit's "
               "first window is left out too.",
               "model.fit uses keras-hub's default losses and the Keras optimizer's own EMA; the detsweep loop "
               "computes the same losses term by term and keeps its EMA in a MovingAverage.",
               "Ray Train workers get tcmalloc from detsweep (LD_PRELOAD) when the machine has it."],
    ), args.out)


SPLIT = {  # contender → what runs beside the bare loop's training threads
    "loop": "nothing",
    "beside": "an idle local cluster (GCS, raylet, dashboard, agents)",
    "beside_train": "an idle Ray Train run on it (controller, helper actors, a sleeping worker, a Ray queue)",
    "ray": "nothing: the loop is Ray Train's worker",
}


def where_the_gap_goes(args) -> None:
    """The bare loop alone, beside an idle cluster, beside an idle Ray Train run, and under Ray
    Train: four runs back to back, ``args.repeats`` times, each at the main table's settings
    with tcmalloc (``tcmalloc_for``): what other processes take from the training threads,
    against what is left to the worker itself. Recorded as ``train_step_split``."""
    # The smoke run leaves out the idle Ray Train run (its start is the table's slowest): the
    # suite's time is counted.
    split = {name: what for name, what in SPLIT.items() if not (args.smoke and name == "beside_train")}
    runs = [{name: run.result().wall for name, run in repeat_runs(args, split, repeat).items()}
            for repeat in range(args.repeats)]
    ratios = {name: [run[name] / run["loop"] for run in runs] for name in split}
    share = {name: median(each) for name, each in ratios.items()}
    rows = [["the bare loop's training, beside", "images/s (median)", "/ the loop alone (median of runs)",
             "/ the loop alone, each run"]]
    rows += [[what, median([run[name] for run in runs]), share[name], ", ".join(f"{ratio:.3f}" for ratio in ratios[name])]
             for name, what in split.items()]
    record("train_step_split", Entry(
        title="Where Ray Train's gap goes: the bare loop beside Ray's idle processes (bench/train_step.py)",
        settings={"config": "configs/quickstart.yaml", "batch_size": args.batch_size,
                  "steps_per_loop": args.steps_per_loop, "windows": args.windows, "repeats": args.repeats,
                  "overrides": args.overrides},
        rows=rows,
        notes=[f"The cluster's processes cost the loop {1 - share['beside']:.1%}; Ray Train's own processes "
               f"{share['beside'] - share.get('beside_train', math.nan):.1%} more; what is left, "
               f"{share.get('beside_train', math.nan) - share['ray']:.1%}, is the worker's own or the spread of "
               "single runs.",
               "Each figure one run in a process of its own, tcmalloc for every one; the four runs of a repeat "
               "back to back. The idle processes are started by a driver of their own, as detsweep launch "
               "starts them; beside an idle Ray Train run the loop starts once its sleeping worker runs."],
    ), args.out)


def repeat_runs(args, split: dict, repeat: int) -> dict[str, Future]:
    """One repeat's runs, all queued before any is waited for (the smoke's run two at a time)."""
    return {name: start_contender(name, tcmalloc_for(name), args, args.windows, args.steps_per_loop, repeat)
            for name in split}


LOOP_LENGTHS = (2, 10, 40)  # steps per loop; 2 stands in for a GPU, whose loops take a fraction of a second


def paired_runs(args, windows: int, steps_per_loop: int) -> list[tuple[Rate, Rate]]:
    """The bare loop, then Ray Train, ``args.repeats`` times: two runs back to back see the same
    machine, where runs minutes apart may not (its speed drifts by more than the gap judged)."""
    return [(run_contender("loop", tcmalloc_for("loop"), args, windows, steps_per_loop, repeat),
             run_contender("ray", tcmalloc_for("ray"), args, windows, steps_per_loop, repeat))
            for repeat in range(args.repeats)]


def pair_ratios(pairs: list[tuple[Rate, Rate]]) -> list[float]:
    """Ray Train's wall-clock rate over the bare loop's, pair by pair."""
    return [ray.wall / loop.wall for loop, ray in pairs]


def loop_lengths(args) -> None:
    """Under Ray Train, wall-clock images/s against the worker's own compute-only images/s and
    against the bare loop, from short loops to long: a worker that waited for anything between
    loops (Ray Train's 2 s poll, say) loses the more, the shorter its loops."""
    steps = args.windows * args.steps_per_loop
    rows = [["steps per loop", "seconds per loop", "bare loop images/s", "Ray Train images/s",
             "Ray Train worker's compute-only images/s", "Ray Train / bare loop (median of pairs)",
             "Ray Train / bare loop (range)", "wall / compute-only"]]
    ratios = {}
    for steps_per_loop in (LOOP_LENGTHS if not args.smoke else (args.steps_per_loop,)):
        windows = max(4, steps // steps_per_loop)
        pairs = paired_runs(args, windows, steps_per_loop)
        rays = [ray for _, ray in pairs]
        each = pair_ratios(pairs)
        ratios[steps_per_loop] = median(each)
        compute = median([ray.compute for ray in rays])
        rows.append([steps_per_loop, steps_per_loop * args.batch_size / compute, median([loop.wall for loop, _ in pairs]),
                     median([ray.wall for ray in rays]), compute, ratios[steps_per_loop],
                     f"{min(each):.3f}-{max(each):.3f}", median([ray.wall / ray.compute for ray in rays])])
    targets = [Target(f"Ray Train vs the bare loop, {n} steps per loop (median of pairs)", ">= 0.95", ratio,
                      ratio >= 0.95) for n, ratio in ratios.items() if n in (2, 10)]
    record("train_step_loops", Entry(
        title="Ray Train against the worker's own speed, by loop length (bench/train_step.py)",
        settings={"config": "configs/quickstart.yaml", "batch_size": args.batch_size, "steps": steps,
                  "repeats": args.repeats, "overrides": args.overrides},
        rows=rows, targets=targets,
        notes=[f"{args.repeats} pairs of runs per loop length, the bare loop then Ray Train, each run a process of "
               "its own, tcmalloc for both; images/s are medians, and the ratio is the median of each pair's own "
               "ratio. Seconds per loop from the worker's compute-only rate. At the main table's loop length the "
               "pairs are the split table's runs (with the two runs beside idle Ray processes between the bare "
               "loop and Ray Train), and the first is the main table's own.",
               "Before the report channel (every loop through ray.train.report, which the controller drains "
               "once per 2 s poll), see the hand-written figures above the tables."],
    ), args.out)


if __name__ == "__main__":
    main()
