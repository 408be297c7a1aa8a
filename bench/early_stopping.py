"""Early stopping pays: the same sampled configurations of ``sweeps/quickstart.yaml`` run with
FIFO (every trial to the full budget) and with the sweep's own scheduler; training steps spent
and the best AP found by each. Then FIFO's two best configurations rerun over 3 seeds
(``detsweep rerun``, recorded as ``rerun``): the seeds' spread the scheduler's regret is
judged against, and whether FIFO's own winner beats its runner-up.

    .venv/bin/python -m bench.early_stopping [--smoke] [--samples 16] [--set path=value ...]

Both sweeps use the quickstart's seeded random search, so they draw the same configurations
(checked); the time budget is lifted so that only the scheduler stops trials. They train the
recorded curves' budget (``RECORDING``: 300 steps, evaluated every 20), longer than the demo's
160. On 2 cores the full run takes about 1.5 hours; ``--set base.train.num_steps=…`` runs a
shorter one.
``--smoke`` runs two trials of 4 steps, evaluated every 2, ranked at step 2, and reruns them
over 2 seeds.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from statistics import median

from .common import REPO, Entry, Target, arguments, record

SWEEP = REPO / "sweeps" / "quickstart.yaml"
NAMES = {"asha": "ASHA", "halving": "synchronous halving", "hyperband": "HyperBand", "pbt": "PBT"}
# bench/curves_sweep.yaml's budget and cadence, which the replay (bench/replay_settings.py) judged
RECORDING = ["base.train.num_steps=300", "base.train.eval_every=20", "base.train.checkpoint_every=20"]
SMOKE = ["base.train.num_steps=4", "base.train.steps_per_loop=2", "base.train.eval_every=2",
         "base.train.checkpoint_every=2", "base.data.train.num_images=16", "base.data.val.num_images=8",
         "search.scheduler.grace_period=2", "base.optimizer.learning_rate.total_steps=4",
         "base.optimizer.learning_rate.warmup_steps=1"]


def run_sweep(scheduler: str, samples: int, overrides: list[str], folder: Path) -> dict:
    """``detsweep launch`` of the quickstart sweep with ``scheduler``; its ``--json`` object."""
    from detsweep.sweeps import load_sweep
    from detsweep.sweeps.launch import launch

    sweep = load_sweep(SWEEP, [f"name=bench-{scheduler}", f"storage={folder / 'ray'}", f"search.num_samples={samples}",
                               "search.time_budget_s=null", f"search.scheduler.type={scheduler}",
                               f"base.tracking.uri=sqlite:///{folder / 'mlflow.db'}", *overrides])
    return launch(sweep, register=False)


def rerun_top(report: dict, top: int, seeds: int, folder: Path) -> dict:
    """``detsweep rerun`` of the sweep ``report`` ran: its ``top`` configurations over ``seeds``
    seeds, FIFO to the same budget; the rerun's ``--json`` object."""
    from detsweep.sweeps.launch import launch, sweep_results
    from detsweep.sweeps.rerun import plan_rerun

    source, results, _ = sweep_results(report["path"], with_runs=False)
    return launch(plan_rerun(report["path"], source, results, top, seeds, [], False, folder), register=False)


def scheduler_settings(overrides: list[str]) -> dict:
    """The sweep's scheduler, and what decides how early it can stop a trial: its rungs and how
    often trials evaluate."""
    from detsweep.sweeps import load_sweep

    sweep = load_sweep(SWEEP, overrides)
    scheduler = sweep.search.scheduler
    return {"scheduler": scheduler.type, "grace_period": scheduler.grace_period,
            "reduction_factor": scheduler.reduction_factor, "decides_on": sweep.search.decided_by[0],
            "eval_every": sweep.base.train.eval_every, "num_steps": sweep.base.train.num_steps}


def steps_spent(report: dict) -> int:
    return sum(int(trial["metrics"].get("step", 0)) for trial in report["trials"])


def configuration(trial: dict) -> tuple:
    """A trial's drawn values, comparable across the two sweeps."""
    return tuple(sorted(trial["config"].items()))


def configurations(report: dict) -> list[tuple]:
    return sorted(configuration(trial) for trial in report["trials"])


def repeat_gaps(fifo: dict, other: dict, metric: str, num_steps: int) -> list[float]:
    """For each configuration both sweeps trained to ``num_steps``: how far apart its two final
    ``metric`` values are. The same configuration trained twice, so this is run-to-run noise."""
    def finals(report: dict) -> dict[tuple, float]:
        return {configuration(trial): trial["metrics"][metric] for trial in report["trials"]
                if trial["metrics"].get("step") == num_steps and metric in trial["metrics"]}

    theirs = finals(other)
    return sorted(abs(value - theirs[config]) for config, value in finals(fifo).items() if config in theirs)


def noise_note(gaps: list[float], metric: str, num_steps: int) -> str:
    if not gaps:
        return f"No configuration trained all {num_steps} steps in both sweeps: no measure of run-to-run noise."
    same = sum(gap == 0 for gap in gaps)
    return (f"Run-to-run noise: {len(gaps)} configurations trained all {num_steps} steps in both sweeps, {same} of "
            f"them to the same final {metric}, to the last digit; it differed by {median(gaps):.3f} in the median, "
            f"{gaps[-1]:.3f} at most.")


def main() -> None:
    parser = arguments(__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args()
    samples, overrides = (2, SMOKE + args.overrides) if args.smoke else (args.samples, RECORDING + args.overrides)
    seeds = 2 if args.smoke else 3
    settings = scheduler_settings(overrides)
    name = NAMES.get(settings["scheduler"], settings["scheduler"])
    with tempfile.TemporaryDirectory() as folder:
        fifo = run_sweep("fifo", samples, overrides, Path(folder))
        stopping = run_sweep(settings["scheduler"], samples, overrides, Path(folder))
        rerun = rerun_top(fifo, 2, seeds, Path(folder))
    metric = fifo["metric"]
    best = {"FIFO": fifo["best"]["metrics"][metric], name: stopping["best"]["metrics"][metric]}
    steps = {"FIFO": steps_spent(fifo), name: steps_spent(stopping)}
    same = configurations(fifo) == configurations(stopping)
    full = settings["num_steps"]
    stopped = sum(trial["metrics"].get("step", 0) < full for trial in stopping["trials"])
    rows = [["scheduler", "trials", "training steps", f"best {metric}", "trials stopped early"],
            ["FIFO (full budget)", len(fifo["trials"]), steps["FIFO"], best["FIFO"], 0],
            [name, len(stopping["trials"]), steps[name], best[name], stopped]]
    share, gap = steps[name] / steps["FIFO"], best["FIFO"] - best[name]
    gaps = repeat_gaps(fifo, stopping, metric, full)
    record("early_stopping", Entry(
        title=f"Early stopping: FIFO vs the quickstart's {name} on the same configurations (bench/early_stopping.py)",
        settings={"sweep": "sweeps/quickstart.yaml", "samples": samples, "overrides": overrides,
                  **settings},
        rows=rows,
        targets=[Target(f"{name}'s steps / FIFO's", "<= 33%", share, share <= 0.33),
                 Target(f"FIFO's best {metric} - {name}'s", "<= 0.02", gap, gap <= 0.02)],
        notes=["Both sweeps drew the same configurations." if same else
               "**The two sweeps drew different configurations**: compare with care.",
               noise_note(gaps, metric, settings["num_steps"]), regret_note(name, gap, rerun["rerun"], metric)],
    ), args.out)
    record_rerun(rerun, fifo, metric, settings, args.out)


def regret_note(name: str, gap: float, rerun: dict, metric: str) -> str:
    """The scheduler's regret beside the spread of FIFO's best configuration over the rerun's seeds."""
    leader, *others = [row for row in rerun["rows"] if row["objective"] == metric]
    lead = f"; FIFO's runner-up trails it by {others[0]['lead']:.3f} [{others[0]['lead_low']:.3f}, " \
           f"{others[0]['lead_high']:.3f}]" if others and others[0]["lead_low"] is not None else ""
    return (f"{name}'s regret {gap:.3f} beside the seeds' spread: rerun over {len(rerun['seeds'])} seeds, the better "
            f"of FIFO's two best configurations scores {leader['mean']:.3f} ± {leader['std']:.3f}{lead}. "
            f"{rerun['verdicts'][0]}")


def record_rerun(rerun: dict, fifo: dict, metric: str, settings: dict, out) -> None:
    """The rerun's table, as ``detsweep rerun`` prints it: each configuration's seeds, mean,
    spread and the leader's paired lead with its interval."""
    seeds = rerun["rerun"]["seeds"]
    rows = [["rank in the FIFO sweep", "its single run", *(f"seed {seed}" for seed in seeds), "mean", "std",
             "lead of the leader", "90 % low", "90 % high"]]
    single = {trial["trial_id"]: trial["metrics"].get(metric) for trial in fifo["trials"]}
    for row in rerun["rerun"]["rows"]:
        if row["objective"] == metric:
            rows.append([row["rank"], single.get(row["trial_id"]), *(row["seeds"].get(str(seed)) for seed in seeds),
                         row["mean"], row["std"], row["lead"] if row["lead"] is not None else "leader",
                         row["lead_low"] if row["lead"] is not None else "-",
                         row["lead_high"] if row["lead"] is not None else "-"])
    record("rerun", Entry(
        title="Whether the winner is real: FIFO's two best quickstart configurations rerun over seeds (bench/early_stopping.py)",
        settings={"sweep": "sweeps/quickstart.yaml, FIFO", "top": 2, "seeds": seeds,
                  "num_steps": settings["num_steps"], "metric": metric},
        rows=rows, notes=rerun["rerun"]["verdicts"]), out)


if __name__ == "__main__":
    main()
