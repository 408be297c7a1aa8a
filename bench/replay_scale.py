"""Replay at a sweep's size (bench/replay_scale.py): ``detsweep replay`` of N trials against
Tune's own bookkeeping of as many trials and reports, in the same run.

    .venv/bin/python -m bench.replay_scale [--smoke] [--sizes 200 1000 2000]

Each size replays ``bench/curves.json`` under FIFO with random search, 32 trials at once,
15 reports a trial (every 20 steps to 300), in step order (the replay's clock). The peer is
Tune alone on the same local node: as many trials, each a function that reports 15 times
and does nothing else (no clock, no recorded curve, no detsweep callback), its actors
reused as the replay's are. The difference is what detsweep's replay adds.
"""

from __future__ import annotations

import tempfile
import time

from .common import BENCH, Entry, Target, arguments, record

AT_ONCE = 32
REPORTS = list(range(20, 301, 20))  # the steps bench/curves.json is evaluated at
TARGET_S = 120.0  # a replay of 2 000 trials, the target


def replayed(count: int) -> tuple[float, int]:
    """Seconds to replay ``count`` trials of the recorded sweep, and the results Tune heard."""
    from detsweep.sweeps.replay import load_curves, replay_once
    from detsweep.sweeps.spec import load_sweep

    sweep = load_sweep(BENCH / "curves_sweep.yaml", [f"search.num_samples={count}",
                                                     f"search.max_concurrent_trials={AT_ONCE}"])
    curves = load_curves(str(BENCH / "curves.json"), sweep)
    started = time.perf_counter()
    run = replay_once(sweep, curves, seed=0)
    return time.perf_counter() - started, run["trials"] * len(REPORTS)


def tune_alone(count: int) -> float:
    """Seconds for Tune to run ``count`` trials that only report, ``AT_ONCE`` at a time."""
    from ray import tune

    def reports(config: dict) -> None:
        for step in REPORTS:
            tune.report({"step": step, "eval/AP_best": config["rate"] * step})

    with tempfile.TemporaryDirectory(prefix="bench-tune-alone-") as folder:
        tuner = tune.Tuner(tune.with_resources(reports, {"cpu": 0.01}),
                           param_space={"rate": tune.loguniform(0.01, 0.1)},
                           tune_config=tune.TuneConfig(num_samples=count, max_concurrent_trials=AT_ONCE,
                                                       metric="eval/AP_best", mode="max", reuse_actors=True),
                           run_config=tune.RunConfig(storage_path=folder, name="alone", verbose=0))
        started = time.perf_counter()
        tuner.fit()
        return time.perf_counter() - started


def main() -> None:
    parser = arguments(__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", help="trials per replay (default 200 1000 2000)")
    args = parser.parse_args()
    sizes = args.sizes or ([40] if args.smoke else [200, 1000, 2000])
    import ray

    ray.init(num_cpus=AT_ONCE, include_dashboard=False, logging_level="ERROR")
    rows = [["trials", "replay, s", "Tune alone, s", "replay per result, ms", "Tune alone per result, ms",
             "detsweep adds per result, ms"]]
    try:
        for count in sizes:
            alone = tune_alone(count)
            seconds, results = replayed(count)
            rows.append([count, seconds, alone, 1000 * seconds / results, 1000 * alone / results,
                         1000 * (seconds - alone) / results])
    finally:
        ray.shutdown()
    largest = rows[-1]
    record("replay_scale", Entry(
        title="Replay at a sweep's size against Tune alone (bench/replay_scale.py)",
        settings={"curves": "bench/curves.json", "scheduler": "fifo", "search": "random", "at_once": AT_ONCE,
                  "reports_per_trial": len(REPORTS), "ray": f"a local node of {AT_ONCE} logical CPUs"},
        rows=rows,
        targets=[Target(f"a replay of {largest[0]} trials", f"<= {TARGET_S:.0f} s", largest[1],
                        largest[1] <= TARGET_S)] if largest[0] >= 2000 else [],
    ), args.out)


if __name__ == "__main__":
    main()
