"""Trial start-up: seconds from Tune starting a trial to its first training step, against the
floor: a bare Python process that imports TensorFlow and builds the same model. The trial's
time is broken down by the ``startup/*`` metrics its first report carries.

    .venv/bin/python -m bench.startup [--smoke] [--repeats N] [--workers N]
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .common import REPO, Entry, Target, arguments, median, record

CONFIG = REPO / "configs" / "quickstart.yaml"
# Ordered as they happen; "rest" is Tune's own part: starting the trial's process and
# bringing the first result back.
PHASES = ("mlflow", "trainer", "workers", "imports", "strategy", "data", "model", "first_loop")


def floor_process() -> None:
    """Run as ``--floor``: import TensorFlow, build the model, then trace and run one step
    (detsweep's loop, in-process); print the moments as JSON."""
    started = float(sys.argv[sys.argv.index("--floor") + 1])
    import keras  # noqa: F401
    import keras_hub  # noqa: F401
    import tensorflow  # noqa: F401

    imported = time.time()
    from detsweep.config import load_trial_config
    from detsweep.models import build_model

    config = load_trial_config(CONFIG, ["data.val=null", "train.num_steps=1", "train.steps_per_loop=1"])
    build_model(config.model, config.data.train.classes)
    built = time.time()
    from detsweep.train import run_training

    run_training(config, lambda metrics, checkpoint, milestone: None)
    print(json.dumps({"imports": imported - started, "model": built - imported, "first_step": time.time() - built}))


def start_floor() -> subprocess.Popen:
    """``--floor`` in a process of its own, its clock started now; ``floor_of`` reads its figures."""
    return subprocess.Popen([sys.executable, "-m", "bench.startup", "--floor", repr(time.time())],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def floor_of(process: subprocess.Popen) -> dict[str, float]:
    output, errors = process.communicate()
    if process.returncode != 0:
        raise subprocess.CalledProcessError(process.returncode, process.args, output, errors)
    return json.loads(output.strip().splitlines()[-1])


def floor() -> dict[str, float]:
    return floor_of(start_floor())


def sweep_file(folder: Path, trials: int, workers: int) -> Path:
    """One trial after another, each reporting its first step to Tune (``train/loss``)."""
    path = folder / "startup.yaml"
    path.write_text(f"""
name: bench-startup
storage: {folder / "ray"}
base:
  from: {CONFIG}
  data: {{train: {{num_images: 16}}, val: {{num_images: 8}}}}
  train: {{num_steps: 2, steps_per_loop: 1, eval_every: 1000, checkpoint_every: 1000}}
  scaling: {{num_workers: {workers}}}
  tracking: {{uri: sqlite:///{folder / "mlflow.db"}}}
search:
  metric: train/loss
  mode: min
  num_samples: {trials}
  max_concurrent_trials: 1
  space:
    optimizer.learning_rate.learning_rate_base: {{values: [0.01, 0.02]}}
""")
    return path


def trial_starts(trials: int, workers: int) -> list[dict[str, float]]:
    """Per trial: Tune's start → first result, and the phases of its first report."""
    from ray import tune

    from detsweep.sweeps import load_sweep
    from detsweep.sweeps.launch import launch

    class FirstResults(tune.Callback):
        def __init__(self):
            self.started, self.first = {}, {}

        def on_trial_start(self, iteration, trials, trial, **info):
            self.started[trial.trial_id] = time.time()

        def on_trial_result(self, iteration, trials, trial, result, **info):
            if trial.trial_id not in self.first:
                self.first[trial.trial_id] = {"tune": time.time() - self.started[trial.trial_id],
                                              **{key[len("startup/"):-2]: value for key, value in result.items()
                                                 if key.startswith("startup/")}}

    timing = FirstResults()
    with tempfile.TemporaryDirectory() as folder:
        launch(load_sweep(sweep_file(Path(folder), trials, workers)), register=False, callbacks=[timing])
    return list(timing.first.values())


def main() -> None:
    if "--floor" in sys.argv:
        return floor_process()
    parser = arguments(__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()
    repeats = 1 if args.smoke else args.repeats
    if args.smoke:  # the floor beside the trial: the smoke's figures are not read, and the suite's time is counted
        beside = start_floor()
        starts, floors = trial_starts(repeats, args.workers), [floor_of(beside)]
    else:
        floors = [floor() for _ in range(repeats)]
        starts = trial_starts(repeats, args.workers)
    floor_build = median([f["imports"] + f["model"] for f in floors])
    floor_step = median([f["imports"] + f["model"] + f["first_step"] for f in floors])
    trial = median([s["tune"] for s in starts])
    rows = [["phase", "seconds (median)", "share"]]
    phases = {phase: median([s.get(phase, 0.0) for s in starts]) for phase in PHASES}
    phases["rest (Tune: trial process, first result back)"] = median([s["tune"] - s["total"] for s in starts])
    rows += [[phase, seconds, f"{seconds / trial:.0%}"] for phase, seconds in phases.items()]
    rows += [["**Tune start → first step**", trial, "100%"],
             ["floor: python + import TensorFlow + build the model", floor_build, ""],
             ["floor + data and the first step (detsweep's loop, no Ray)", floor_step, ""]]
    record(f"startup_{args.workers}w", Entry(
        title=f"Trial start-up, {args.workers} worker(s) (bench/startup.py)",
        settings={"config": "configs/quickstart.yaml", "workers": args.workers, "repeats": repeats},
        rows=rows,
        targets=[Target("Tune start → first step vs the floor", "<= 1.5x", trial / floor_build, trial / floor_build <= 1.5)],
        notes=["Phases: mlflow = the trial opens its MLflow run; trainer = it builds its Ray Train trainer; "
               "workers = Ray Train starts the worker group; imports = the worker imports TensorFlow and detsweep; "
               "strategy, data, model = the worker's set-up; first_loop = tracing the train step and running it once.",
               f"Against the floor with data and the first step: {trial / floor_step:.2f}x."],
    ), args.out)


if __name__ == "__main__":
    main()
