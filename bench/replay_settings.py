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

import time

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
    return [f"search.scheduler.{key}={value}" for key, value in chosen.items()]


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
               _table(rank_rows)],
    ), args.out)


def winner_ranks(curves, objective: str) -> dict[str, dict[int, int]]:
    """For each metric at each step every trial reported it: the rank (1 = first) of the trial
    whose final ``objective`` is best, among all recorded, losses ranked lowest first."""
    finals = [curves.final(index, objective) for index in range(len(curves.configs))]
    winner = max(range(len(finals)), key=finals.__getitem__)
    ranks: dict[str, dict[int, int]] = {}
    for metric, steps in curves.at_common_steps().items():
        sign = 1 if metric.endswith("loss") else -1
        for step, values in steps.items():
            order = sorted(range(len(values)), key=lambda index: sign * values[index])  # ties: by trial
            ranks.setdefault(metric, {})[step] = order.index(winner) + 1
    return ranks


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
