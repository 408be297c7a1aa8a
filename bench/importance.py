"""Which settings mattered, measured (bench/importance.py): from which step a sweep's importance
can be trusted, on the recorded curves; a known-answer set at two sizes; and what the
bootstrap costs at 2 000 trials against one PED-ANOVA evaluation in the same run.

    .venv/bin/python -m bench.importance [--smoke]

On ``bench/curves.json`` (24 configurations trained to step 300, evaluated every 20 steps)
each trial is valued at each evaluated step in turn: the rank correlation of that step's
importances with step 300's says how early the sweep's answer settles, and the intervals
how sure it is. The known-answer set is :func:`known_answer`'s (the learning rate alone sets
the metric; the optimizer, its momentum and the seed are noise).
"""

from __future__ import annotations

import json
import math
import tempfile
import time
from pathlib import Path

import numpy as np

from .common import BENCH, REPO, Entry, Target, arguments, record

LR = "optimizer.learning_rate.learning_rate_base"
MOMENTUM = "optimizer.momentum_optimizer_value"
# The known-answer sweep's search block (the tests' too): a conditional setting, a log scale, an integer.
KNOWN_SEARCH = """
  metric: eval/AP_best
  mode: max
  algorithm: random
  num_samples: 4
  space:
    optimizer.type: {values: [momentum, adam]}
    optimizer.momentum_optimizer_value: {distribution: uniform, min: 0.8, max: 0.99}
    optimizer.learning_rate.learning_rate_base: {distribution: log_uniform_values, min: 0.001, max: 0.1}
    train.seed: {distribution: int_uniform, min: 0, max: 9}
"""


def known_answer(count: int, seed: int = 0, sign: float = 1.0, deepest: int = 0) -> tuple[list, dict]:
    """``count`` trials whose AP is set by the learning rate alone (best at 0.01), the optimizer,
    its momentum (only momentum's) and the seed noise; every third stopped at step 100, the
    rest reaching 200 (``deepest`` of them: 300). ``sign`` -1: the metric negated. Returns the
    trials' outcomes and their curves (``eval/AP_best`` by step)."""
    from detsweep.sweeps.experiment import TrialOutcome
    from detsweep.tracking.sweep_run import TrialStatus

    rng = np.random.default_rng(seed)
    outcomes, curves = [], {}
    for index in range(count):
        values = {LR: float(10 ** rng.uniform(-3, -1)), "optimizer.type": ["momentum", "adam"][index % 2],
                  MOMENTUM: float(rng.uniform(0.8, 0.99)), "train.seed": int(rng.integers(0, 10))}
        ap = sign * (0.5 - (math.log10(values[LR]) + 2) ** 2 / 4 + 0.01 * rng.normal())
        steps = [100] if index % 3 == 0 else [100, 200] + ([300] if index < deepest else [])
        curves[str(index)] = {"eval/AP_best": {step: ap + 0.01 * (step // 100) for step in steps}}
        status = TrialStatus.STOPPED if index % 3 == 0 else TrialStatus.TERMINATED
        outcomes.append(TrialOutcome(str(index), status, {"eval/AP_best": ap, "step": steps[-1]}, values, None, None, {}))
    return outcomes, curves


def known_sweep(folder: Path):
    from detsweep.sweeps.spec import load_sweep

    path = folder / "known.yaml"
    path.write_text(f"name: known\nbase: {{from: {REPO / 'configs' / 'quickstart.yaml'}, optimizer: {{learning_rate: "
                    f"{{warmup_learning_rate: 0.00001}}}}}}\nsearch:{KNOWN_SEARCH}")
    return load_sweep(path)


def recorded_study(until: int | None = None):
    """bench/curves.json's trials as a study, each valued at its steps up to ``until``."""
    from detsweep.sweeps.experiment import TrialOutcome
    from detsweep.sweeps.spec import load_sweep
    from detsweep.sweeps.study import study_trials
    from detsweep.tracking.sweep_run import TrialStatus

    recorded = json.loads((BENCH / "curves.json").read_text())
    sweep = load_sweep(BENCH / "curves_sweep.yaml")
    outcomes, curves = [], {}
    for index, trial in enumerate(recorded["trials"]):
        reports = [r for r in trial["reports"] if until is None or r["step"] <= until]
        curves[str(index)] = {"eval/AP_best": {r["step"]: r["eval/AP_best"] for r in reports}}
        outcomes.append(TrialOutcome(str(index), TrialStatus.TERMINATED, reports[-1], trial["config"], None, None, {}))
    return sweep, study_trials(sweep, outcomes, curves)


def spearman(xs: list[float], ys: list[float]) -> float:
    from detsweep.sweeps.replay import spearman as rank_correlation

    return rank_correlation(xs, ys) or 0.0


def by_step(resamples: int, steps: list[int]) -> tuple[list[list], object]:
    """Importance at each of ``steps`` against step 300's, on the recorded curves; step 300's."""
    from detsweep.sweeps.importance import sweep_importances

    sweep, trials = recorded_study()
    [final] = sweep_importances(sweep, trials, resamples)
    names = sorted(final.shares, key=final.shares.get, reverse=True)
    rows = []
    for step in steps:
        sweep, trials = recorded_study(step)
        [found] = sweep_importances(sweep, trials, resamples)
        top = max(found.shares, key=found.shares.get)
        low, high = found.intervals[top]
        rows.append([step, found.trials, spearman([found.shares[n] for n in names], [final.shares[n] for n in names]),
                     top, found.shares[top], low, high])
    return rows, final


def known(count: int, resamples: int) -> dict:
    """The known-answer set of ``count`` trials (two thirds of them compared, at step 200)."""
    from detsweep.sweeps.importance import sweep_importances
    from detsweep.sweeps.study import study_trials

    with tempfile.TemporaryDirectory() as folder:
        sweep = known_sweep(Path(folder))
        [found] = sweep_importances(sweep, study_trials(sweep, *known_answer(count)), resamples)
    others = max(found.intervals[name][1] for name in found.shares if name != LR)
    return {"trials": found.trials, "share": found.shares[LR], "low": found.intervals[LR][0],
            "high": found.intervals[LR][1], "others_high": others, "first": max(found.shares, key=found.shares.get) == LR}


def timed(count: int, resamples: int) -> dict:
    """Seconds at ``count`` trials: one PED-ANOVA evaluation on a study of the compared trials
    (Optuna's own, the peer), fANOVA on it, and importance whole with ``resamples`` and with
    none (their difference is the bootstrap's cost)."""
    import optuna
    from optuna.importance import FanovaImportanceEvaluator, PedAnovaImportanceEvaluator

    from detsweep.sweeps import importance
    from detsweep.sweeps.study import quiet_optuna, study_trials

    with tempfile.TemporaryDirectory() as folder:
        sweep = known_sweep(Path(folder))
        trials = study_trials(sweep, *known_answer(count))
    with quiet_optuna():
        _, valued = importance.common_step([(t, dict(t.intermediate_values)) for t in trials])
        plain = optuna.create_study(direction="maximize")
        plain.add_trials([optuna.trial.create_trial(params=t.params, distributions=t.distributions, value=v)
                          for t, v in valued])
        one = seconds(lambda: optuna.importance.get_param_importances(plain, evaluator=PedAnovaImportanceEvaluator()))
        fanova = seconds(lambda: optuna.importance.get_param_importances(
            plain, evaluator=FanovaImportanceEvaluator(seed=0)))
    whole = seconds(lambda: importance.sweep_importances(sweep, trials, resamples))
    once = seconds(lambda: importance.sweep_importances(sweep, trials, 1))
    return {"trials": count, "compared": len(valued), "one_evaluation_s": one, "fanova_s": fanova,
            "bootstrap_s": (whole - once) * resamples / (resamples - 1), "whole_s": whole}


def seconds(call) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def main() -> None:
    parser = arguments(__doc__.splitlines()[0])
    args = parser.parse_args()
    resamples, steps, sizes, large = (20, [60, 300], (30, 60), 90) if args.smoke else (
        200, list(range(20, 301, 20)), (60, 240), 2000)
    rows, final = by_step(resamples, steps)
    if not args.smoke:  # README's picture of a recorded sweep's importance
        from detsweep.sweeps.importance import importance_figure

        importance_figure([final]).savefig(BENCH / "importance.png", dpi=100)
    small, big = (known(count, resamples) for count in sizes)
    cost = timed(large, resamples)
    table = [["step", "trials compared", "rank correlation with step 300's", "top setting", "its share",
              "90 % low", "90 % high"], *rows]
    table += [["known answer", each["trials"], "-", LR, each["share"], each["low"], each["high"]] for each in (small, big)]
    table += [["cost at trials", cost["trials"], f"{cost['compared']} compared", what, seconds, "-", "-"]
              for what, seconds in (("one PED-ANOVA evaluation, s", cost["one_evaluation_s"]),
                                    ("fANOVA, s", cost["fanova_s"]),
                                    (f"the bootstrap ({resamples} resamples), s", cost["bootstrap_s"]),
                                    (f"all of it ({resamples} resamples), s", cost["whole_s"]))]
    settled = next((row[0] for row in rows if all(later[2] >= 0.8 for later in rows[rows.index(row):])), None)
    record("importance", Entry(
        title="Which settings mattered: importance by step on the recorded curves, a known answer, the cost (bench/importance.py)",
        settings={"curves": "bench/curves.json (24 configurations, step 300)", "resamples": resamples, "level": 0.9,
                  "known_answer": "the learning rate alone sets the metric; optimizer, momentum, seed are noise",
                  "final_shares": {name: [share, *final.intervals[name]] for name, share in final.shares.items()},
                  "known": [small, big], "settled_from_step": settled},
        rows=table,
        targets=[Target(f"known answer at {big['trials']} compared trials: the learning rate first, its interval "
                        "clear of every other setting's", "apart", big["low"] - big["others_high"],
                        big["first"] and big["low"] > big["others_high"]),
                 Target(f"the bootstrap's {resamples} resamples at {cost['trials']} trials", "a few seconds",
                        cost["bootstrap_s"], cost["bootstrap_s"] <= 5)],
        notes=[f"Rank correlation with step 300's importances stays at 0.8 or more from step {settled}." if settled
               else "The rank correlation with step 300's importances does not settle at 0.8 or more.",
               f"With {small['trials']} compared trials the learning rate's interval is [{small['low']:.2f}, "
               f"{small['high']:.2f}] against the others' highest {small['others_high']:.2f}."],
    ), args.out)


if __name__ == "__main__":
    main()
