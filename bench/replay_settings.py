"""Scheduler settings judged on recorded learning curves (``bench/curves.json``): each setting's
sweep replayed over many seeds through Ray Tune's real searchers and schedulers; the training
steps it spends against FIFO's on the same draws, and the regret of the trial it returns
against the best recorded configuration. Also which metric carries early signal.

    .venv/bin/python -m bench.replay_settings [--smoke] [--seeds 20] [--samples 16]

Record the curves first (``bench/record_curves.py``, about an hour). The settings below are
overrides of ``bench/curves_sweep.yaml``; ``quickstart`` is ``sweeps/quickstart.yaml``'s own
scheduler and cadence, the one ``make demo`` runs.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator

from .common import BENCH, REPO, Entry, Target, arguments, record

CURVES = BENCH / "curves.json"
SWEEP = BENCH / "curves_sweep.yaml"

ASHA = ["search.scheduler.type=asha", "search.scheduler.reduction_factor=3"]


def asha(metric: str, mode: str, grace: int) -> list[str]:
    return [*ASHA, f"search.scheduler.grace_period={grace}", f"search.scheduler.metric={metric}",
            f"search.scheduler.mode={mode}"]


SETTINGS = {
    "FIFO": ["search.scheduler.type=fifo"],
    "ASHA on eval/AP_best from step 40": asha("eval/AP_best", "max", 40),
    "ASHA on eval/AP_best from step 80": asha("eval/AP_best", "max", 80),
    "ASHA on eval/loss from step 60": asha("eval/loss", "min", 60),
    "ASHA on eval/box_loss from step 60": asha("eval/box_loss", "min", 60),
    "ASHA on train/box_loss from step 40": asha("train/box_loss", "min", 40),
    "TPE + ASHA on eval/AP_best from step 80": ["search.algorithm=optuna", *asha("eval/AP_best", "max", 80)],
    # HyperBand resumes a paused trial from a checkpoint where it paused: one at every evaluation
    "BOHB + HyperBand on eval/AP_best (factor 3)": ["search.algorithm=bohb", "search.scheduler.type=hyperband",
                                                    "search.scheduler.reduction_factor=3", "base.train.checkpoint_every=20"],
}

SIGNAL_METRICS = ("eval/AP_best", "eval_ema/AP50", "eval/loss", "eval_ema/loss", "eval/box_loss",
                  "eval/classification_loss", "train/loss", "train/box_loss", "train/classification_loss")
SIGNAL_STEPS = (20, 40, 60, 80, 100, 140, 200, 300)


def quickstart_settings() -> list[str]:
    """``sweeps/quickstart.yaml``'s scheduler, as overrides of the recording's sweep."""
    from detsweep.sweeps import load_sweep

    scheduler = load_sweep(REPO / "sweeps" / "quickstart.yaml").search.scheduler
    chosen = {"type": scheduler.type} | scheduler.model_dump(exclude_defaults=True)
    overrides = [f"search.scheduler.{key}={value}" for key, value in chosen.items()]
    if scheduler.pauses:  # it resumes a paused trial from a checkpoint at every evaluation
        overrides.append(f"base.train.checkpoint_every={load_sweep(SWEEP).base.train.eval_every}")
    return overrides


def main() -> None:
    parser = arguments(__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--samples", type=int, default=16, help="trials per replayed sweep")
    parser.add_argument("--curves", default=str(CURVES))
    args = parser.parse_args()
    import ray

    from detsweep.sweeps import load_sweep
    from detsweep.sweeps.replay import early_signal, load_curves, replay

    settings = {**SETTINGS, "quickstart (sweeps/quickstart.yaml)": quickstart_settings()}
    if args.smoke:
        settings = {name: settings[name] for name in ("FIFO", "quickstart (sweeps/quickstart.yaml)")}
    seeds, samples = (1, 4) if args.smoke else (args.seeds, args.samples)
    ray.init(address="local", include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    rows = [["setting", "median share of FIFO's steps (min-max)", "median regret (max)",
             "median returned eval/AP_best", "seconds"]]
    figures = {}
    for name, overrides in settings.items():
        sweep = load_sweep(SWEEP, [f"search.num_samples={samples}", *overrides])
        curves = load_curves(args.curves, sweep)
        started = time.monotonic()
        report = replay(sweep, curves, seeds)
        figures[name] = report
        rows.append([name, f"{report['median']['share_of_fifo']:.0%} ({report['min']['share_of_fifo']:.0%}-"
                           f"{report['max']['share_of_fifo']:.0%})",
                     f"{report['median']['regret']:.3f} ({report['max']['regret']:.3f})",
                     round(report["median"]["returned"], 3), round(time.monotonic() - started)])
        print(rows[-1], flush=True)
    ray.shutdown()
    shipped = figures["quickstart (sweeps/quickstart.yaml)"]
    signal = early_signal(curves, "eval/AP_best")
    signal_rows = [["metric", *[f"step {step}" for step in SIGNAL_STEPS]]]
    for metric in SIGNAL_METRICS:
        by_step = signal.get(metric, {})
        signal_rows.append([metric, *["-" if by_step.get(step) is None else round(by_step[step], 2) for step in SIGNAL_STEPS]])
    best = shipped["best_recorded"]
    ranks = winner_ranks(curves, "eval/AP_best")
    rank_rows = [["metric", *[f"step {step}" for step in SIGNAL_STEPS]]]
    for metric in SIGNAL_METRICS:
        rank_rows.append([metric, *[ranks.get(metric, {}).get(step, "-") for step in SIGNAL_STEPS]])
    bound_rows = halving_bound_rows(curves, signal, samples)
    record("replay_settings", Entry(
        title="Scheduler settings replayed on recorded curves (bench/replay_settings.py)",
        settings={"curves": _shown(args.curves), "recorded": _recorded(args.curves), "sweep": "bench/curves_sweep.yaml",
                  "samples": samples, "seeds": seeds, "concurrency": 2},
        rows=rows,
        targets=[Target("quickstart settings: median regret (eval/AP_best)", "<= 0.02", shipped["median"]["regret"],
                        shipped["median"]["regret"] <= 0.02),
                 Target("quickstart settings: median share of FIFO's steps", "<= 33%", shipped["median"]["share_of_fifo"],
                        shipped["median"]["share_of_fifo"] <= 0.33)],
        notes=[f"Best recorded configuration: eval/AP_best {best:.3f}, of {len(curves.configs)} recorded. Regret is "
               "the recorded full-budget score of the trial a sweep returns, below that best; a FIFO sweep's regret "
               f"comes from drawing {samples} configurations only.",
               "Rank correlation (Spearman) of each metric at a step with the final eval/AP_best, over the recorded "
               "trials (negative for a loss: lower loss, higher AP):", _table(signal_rows),
               f"Where the best recorded configuration ranks among all {len(curves.configs)} at each step (1: first; "
               "a loss ranks lowest first). A rung keeps it only where it ranks within the share the rung keeps:",
               _table(rank_rows),
               f"The most any synchronous successive halving (one or two rungs, the cheapest early stopping by rank) "
               f"within 33 % of FIFO's steps could keep the best recorded configuration to the end, in sweeps of "
               f"{samples} that contain it: for each metric, the likelihood, the rungs (step: trials kept) and the "
               "rank correlation there (of the halvings that keep it most often, the cheapest); with rungs anywhere, "
               "with none before step 40, and only where the metric's rank correlation with the final eval/AP_best "
               "is at least 0.5, or at most -0.5 for a loss (a rung that ranks signal). An upper bound, and an "
               "in-sample one: the halving is chosen for the one configuration it is judged on.",
               _table(bound_rows)],
    ), args.out)


def halving_bound_rows(curves, signal: dict[str, dict[int, float | None]], samples: int) -> list[list]:
    """``best_halving`` within 33 %: with rungs anywhere, with none before step 40 (at step 20 no
    metric ranks configurations: rank correlation 0.07-0.25 on the recording), and with rungs
    only where the metric ranks signal."""
    def shown(kept: float, rungs: Rungs | None, metric: str) -> str:
        if rungs is None:
            return "no halving within 33 %"
        where = ", ".join(f"{step}: {trials}" for step, trials in rungs)
        correlations = ", ".join("-" if signal[metric].get(step) is None else f"{signal[metric][step]:.2f}"
                                 for step, _ in rungs)
        return f"{kept:.2f} ({where}; rank correlation {correlations})"

    def ranks_signal(metric: str, step: int) -> bool:  # a loss ranks well where it falls as AP rises
        correlation = signal[metric].get(step) or 0
        return -lowest_first(metric) * correlation >= 0.5

    bounds = [best_halving(curves, "eval/AP_best", "max", SIGNAL_METRICS, samples, 0.33, allowed)
              for allowed in (lambda metric, step: True, lambda metric, step: step >= 40, ranks_signal)]
    return [["metric", "rungs anywhere", "rungs from step 40", "rungs that rank signal"],
            *[[metric, *[shown(*bound[metric], metric) for bound in bounds]] for metric in bounds[0]]]


def winner_ranks(curves, objective: str) -> dict[str, dict[int, int]]:
    """For each metric at each step every trial reported it: the rank (1 = first) of the trial
    whose final ``objective`` is best, among all recorded, losses ranked lowest first."""
    winner = best_recorded(curves, objective, "max")
    ranks: dict[str, dict[int, int]] = {}
    for metric, steps in curves.at_common_steps().items():
        sign = lowest_first(metric)
        for step, values in steps.items():
            order = sorted(range(len(values)), key=lambda index: sign * values[index])  # ties: by trial
            ranks.setdefault(metric, {})[step] = order.index(winner) + 1
    return ranks


Rungs = tuple[tuple[int, int], ...]  # (step, how many of the sweep's trials go on past it)


def halving_schedules(steps: list[int], trials: int, last: int, budget: float) -> Iterator[Rungs]:
    """Every synchronous successive halving of ``trials`` trials of ``last`` steps with one or
    two rungs at ``steps`` that spends at most ``budget`` training steps. For given rungs it
    spends the least: ASHA lets more trials past them, HyperBand adds brackets that start later."""
    for first in steps:
        for kept in range(1, trials):
            candidates = [((first, kept),), *(((first, kept), (second, further))
                                              for second in steps if second > first for further in range(1, kept))]
            yield from (rungs for rungs in candidates if spent(rungs, trials, last) <= budget)


def spent(rungs: Rungs, trials: int, last: int) -> int:
    """Training steps a synchronous halving with ``rungs`` spends on ``trials`` trials."""
    ends = [step for step, _ in rungs[1:]] + [last]
    return trials * rungs[0][0] + sum(kept * (end - step) for (step, kept), end in zip(rungs, ends))


def best_halving(curves, objective: str, mode: str, metrics: tuple[str, ...], samples: int, share: float,
                 rung_allowed: Callable[[str, int], bool], draws: int = 1000,
                 seed: int = 0) -> dict[str, tuple[float, Rungs | None]]:
    """For each of ``metrics`` recorded: the synchronous halving within ``share`` of FIFO's
    steps, with rungs only where ``rung_allowed(metric, step)``, most likely to keep the best
    recorded configuration (by its final ``objective``) to the end (the cheapest such), and
    that likelihood over ``draws`` sweeps of ``samples`` configurations that contain it, the
    rest drawn at random; none where no halving fits. A trial that trains to the end is
    ranked by its final objective, so one the halving keeps is the one the sweep returns."""
    winner = best_recorded(curves, objective, mode)
    others = [index for index in range(len(curves.configs)) if index != winner]
    samples = min(samples, len(curves.configs))
    sweeps = [_draw(random.Random(seed + draw), winner, others, samples) for draw in range(draws)]
    last = max(int(report["step"]) for report in curves.reports[winner])
    recorded = curves.at_common_steps()
    best: dict[str, tuple[float, Rungs | None]] = {}
    for metric in (metric for metric in metrics if metric in recorded):
        at, sign = recorded[metric], lowest_first(metric)
        steps = [step for step in at if step < last and rung_allowed(metric, step)]
        scored = [(sum(winner in _survivors(sweep, rungs, at, sign) for sweep in sweeps) / draws, rungs)
                  for rungs in halving_schedules(steps, samples, last, share * samples * last)]
        best[metric] = max(scored, key=lambda pair: (pair[0], -spent(pair[1], samples, last)), default=(0.0, None))
    return best


def best_recorded(curves, objective: str, mode: str) -> int:
    """The recorded trial whose final ``objective`` is best."""
    finals = [curves.final(index, objective) for index in range(len(curves.configs))]
    return (max if mode == "max" else min)(range(len(finals)), key=finals.__getitem__)


def lowest_first(metric: str) -> int:
    """1 where a metric ranks lowest first (a loss), -1 where highest first: a sort key's sign."""
    return 1 if metric.endswith("loss") else -1


def _draw(rng: random.Random, winner: int, others: list[int], samples: int) -> list[int]:
    """A sweep of ``samples`` that holds ``winner`` at a random place: a tie at a rung goes
    to whichever was drawn first, so neither to the winner nor against it."""
    sweep = rng.sample(others, samples - 1)
    sweep.insert(rng.randrange(samples), winner)
    return sweep


def _survivors(trials: list[int], rungs: Rungs, at: dict[int, list[float]], sign: int) -> list[int]:
    for step, kept in rungs:
        trials = sorted(trials, key=lambda index: sign * at[step][index])[:kept]
    return trials


def _shown(path: str) -> str:
    """A path inside the repository as a relative one (results.json is kept in it)."""
    from pathlib import Path

    full = Path(path).resolve()
    return str(full.relative_to(REPO)) if full.is_relative_to(REPO) else path


def _recorded(path: str) -> str:
    import json
    from pathlib import Path

    return json.loads(Path(path).read_text()).get("recorded", "")


def _table(rows: list[list]) -> str:
    lines = ["| " + " | ".join(map(str, row)) + " |" for row in rows]
    return "\n".join([lines[0], "|" + "---|" * len(rows[0]), *lines[1:]])


if __name__ == "__main__":
    main()
