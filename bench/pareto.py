"""A shipped multi-objective sweep, launched as a user would: its Pareto front (AP against the
float32 TFLite latency), the hypervolume, what it cost, and the front's picture kept beside
the results (``bench/pareto_<name>.png``, the one README shows).

    .venv/bin/python -m bench.pareto [SWEEP.yaml] [--set path=value ...] [--out FILE]

Runs one sweep to its end (``sweeps/pareto.yaml`` by default: about 10 minutes on 2 cores;
``sweeps/raccoon_pareto.yaml`` on the raccoon photos): run it alone, on an otherwise quiet
machine, as ``bench.demo``. ``make bench`` leaves it out. ``--smoke`` trains every trial 4
steps on a few images (it checks the script, not the figures).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from .common import REPO, Entry, arguments, record

SMOKE = ["base.train.num_steps=4", "base.train.steps_per_loop=2", "base.train.eval_every=2",
         "base.train.checkpoint_every=2", "base.data.train.num_images=16", "base.data.val.num_images=8",
         "search.num_samples=3", "search.scheduler.grace_period=2", "base.optimizer.learning_rate.total_steps=4",
         "base.optimizer.learning_rate.warmup_steps=1"]


def front_rows(report: dict) -> list[list]:
    """The front as a table: place, trial, its swept values, then each objective."""
    pareto = report["pareto"]
    metrics = [o["metric"] for o in pareto["objectives"]]
    paths = sorted({path for member in pareto["trials"] for path in member["swept"]})
    rows = [["place", "trial", *paths, *metrics]]
    for member in pareto["trials"]:
        rows.append([member["place"], member["trial_id"], *(member["swept"].get(path) for path in paths),
                     *(round(member["values"][metric], 4) for metric in metrics)])
    return rows


def counts(report: dict) -> dict[str, int]:
    """How many trials ended each way."""
    found: dict[str, int] = {}
    for trial in report["trials"]:
        found[str(trial["status"])] = found.get(str(trial["status"]), 0) + 1
    return found


def main() -> None:
    parser = arguments(__doc__.splitlines()[0])
    parser.add_argument("sweep", nargs="?", default=str(REPO / "sweeps" / "pareto.yaml"))
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args()

    from detsweep.sweeps import load_sweep
    from detsweep.sweeps.launch import launch, pareto_of

    overrides = (SMOKE if args.smoke else []) + args.overrides
    with tempfile.TemporaryDirectory() as folder:
        sweep = load_sweep(args.sweep, [f"storage={folder}/ray", f"base.tracking.uri=sqlite:///{folder}/mlflow.db",
                                        *overrides])
        start = time.monotonic()
        report = launch(sweep, register=False)
        minutes = (time.monotonic() - start) / 60
        front = pareto_of(report, sweep)
        picture = Path(folder, "pareto.png")
        front.figure().savefig(picture, dpi=110)
        kept = REPO / "bench" / f"pareto_{sweep.name}{'_smoke' if args.smoke else ''}.png"
        shutil.copyfile(picture, kept)
    pareto = report["pareto"]
    reference = ", ".join(f"{metric} {value:g}" for metric, value in pareto["reference"].items())
    record(f"pareto_{sweep.name}", Entry(
        title=f"The Pareto front of {Path(args.sweep).name} (bench/pareto.py)",
        settings={"sweep": str(Path(args.sweep).resolve().relative_to(REPO)), "overrides": overrides,
                  "trials": len(report["trials"]), "num_steps": sweep.base.train.num_steps,
                  "constraints": sweep.search.constraints, "picture": str(kept.relative_to(REPO))},
        rows=front_rows(report),
        notes=[f"Hypervolume {pareto['hypervolume']:.4g} up to ({reference}); {len(pareto['trials'])} of "
               f"{pareto['candidates']} trials trained to the end are on the front.",
               "Trials by how they ended: " + ", ".join(f"{n} {status}" for status, n in sorted(counts(report).items()))
               + f"; the sweep took {minutes:.1f} min from launch to its end (measuring the architectures included).",
               "Latency: float32 TFLite in LiteRT on this machine's CPU, 2 threads, batch 1 (random weights; "
               "the suppression fed a fixed 1000 candidates), not a target device's."],
    ), args.out)


if __name__ == "__main__":
    main()
