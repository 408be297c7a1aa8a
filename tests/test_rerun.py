"""Whether the winner is real (issue #78): the rerun's statistics on fixed numbers, and what
``detsweep rerun`` refuses before anything trains. The real rerun of a trained sweep is in
``test_pareto_sweep.py``, beside the sweep it reruns."""

from __future__ import annotations

import math

import pytest

from detsweep.errors import DetsweepError
from detsweep.evaluation.objectives import Objective
from detsweep.sweeps.experiment import SweepResults
from detsweep.sweeps.rerun import objective_table, on_the_front, paired_lead, plan_rerun
from detsweep.sweeps.spec import load_sweep

from .conftest import run_here
from .tiny_sweeps import tiny_sweep

T_95_2 = 2.919986  # Student's t, 95th percentile, 2 degrees of freedom (a 90 % two-sided interval over 3 seeds)


def test_a_lead_clear_of_its_interval_and_one_within_it_on_fixed_numbers():
    """Three seeds: B trails the leader by 0.10, 0.09, 0.11 (mean 0.10, sd 0.01): the interval
    0.10 ± t·0.01/√3 is clear of zero; C by 0.01, -0.01, 0.04: its interval holds zero."""
    leader, trailing, close = {1: 0.50, 2: 0.52, 3: 0.54}, {1: 0.40, 2: 0.43, 3: 0.43}, {1: 0.49, 2: 0.53, 3: 0.50}
    lead = paired_lead(leader, trailing, sign=1.0)
    half = T_95_2 * 0.01 / math.sqrt(3)
    assert (lead.value, lead.low, lead.high, lead.seeds) == pytest.approx((0.10, 0.10 - half, 0.10 + half, 3))
    near = paired_lead(leader, close, sign=1.0)
    differences = [0.01, -0.01, 0.04]
    mean = sum(differences) / 3
    spread = math.sqrt(sum((d - mean) ** 2 for d in differences) / 2)
    assert (near.value, near.low, near.high) == pytest.approx((mean, mean - T_95_2 * spread / math.sqrt(3),
                                                                mean + T_95_2 * spread / math.sqrt(3)))

    table = objective_table(Objective("eval/AP_best", "max"), [(2, "b", trailing), (1, "a", leader)])
    assert [(row.rank, row.lead is None) for row in table.rows] == [(1, True), (2, False)]  # the leader by mean
    assert table.rows[0].mean == pytest.approx(0.52) and table.rows[0].std == pytest.approx(0.02)
    assert table.verdict == (f"eval/AP_best: the lead of 0.100 over the 2nd holds: its 90% interval "
                             f"[{0.10 - half:.3f}, {0.10 + half:.3f}] is clear of zero")
    table = objective_table(Objective("eval/AP_best", "max"), [(1, "a", leader), (3, "c", close)])
    assert table.verdict.endswith("which holds zero: these are not told apart by 3 seeds"), table.verdict


def test_a_minimised_metric_leads_by_the_lower_mean_and_only_shared_seeds_are_paired():
    """On a loss the leader is the lower mean, its lead positive; a seed one configuration did
    not finish is left out of the pair (2 shared seeds), and with one shared seed there is no
    interval, which the verdict says."""
    table = objective_table(Objective("eval/loss", "min"), [(1, "a", {1: 2.0, 2: 2.2, 3: 2.1}),
                                                            (2, "b", {1: 1.5, 2: 1.8})])
    assert [row.trial_id for row in table.rows] == ["b", "a"]
    lead = table.rows[1].lead
    assert (lead.value, lead.seeds) == (pytest.approx(0.45), 2)
    alone = objective_table(Objective("eval/loss", "min"), [(1, "a", {1: 2.0, 2: 2.2}), (2, "b", {2: 1.8, 3: 1.0})])
    assert alone.verdict == ("eval/loss: the lead of 0.400 over the 2nd cannot be judged: they share 1 finished "
                             "seed(s), an interval needs 2")


def test_each_seed_has_its_own_pareto_front():
    """Two objectives over two seeds: on seed 1 a and b trade off (both on the front), on seed 2
    a is better on both."""
    loss = objective_table(Objective("eval/loss", "min"), [(1, "a", {1: 1.0, 2: 1.0}), (2, "b", {1: 2.0, 2: 2.0})])
    latency = objective_table(Objective("serve/latency_ms", "min"), [(1, "a", {1: 9.0, 2: 1.0}),
                                                                     (2, "b", {1: 3.0, 2: 3.0})])
    assert on_the_front([loss, latency], [Objective("eval/loss", "min"), Objective("serve/latency_ms", "min")]) == {
        "a": 2, "b": 1}


def test_a_pbt_sweep_and_one_with_a_single_configuration_that_ended_are_refused_in_one_line(tmp_path):
    from detsweep.sweeps.experiment import TrialOutcome
    from detsweep.tracking.sweep_run import TrialStatus

    space = """
  num_samples: 2
  space:
    optimizer.learning_rate.learning_rate_base: {values: [0.01, 0.02]}
"""
    pbt = load_sweep(tiny_sweep(tmp_path, space.replace("  space:", "  scheduler: {type: pbt, perturbation_interval: 5, "
                                                        "mutations: {optimizer.moving_average_decay: {values: [0.99, 0.999]}}}\n"
                                                        "  space:"), name="pbt"))
    with pytest.raises(DetsweepError, match=r"^pbt: search.scheduler.type: found 'pbt', expected a sweep whose trials "
                                            r"keep their values \(PBT's winners changed theirs as they trained\)$"):
        plan_rerun("pbt", pbt, SweepResults([], {}), 2, 2, [], False, tmp_path)
    plain = load_sweep(tiny_sweep(tmp_path, space, name="plain"))
    rate = "optimizer.learning_rate.learning_rate_base"
    ended = [TrialOutcome("a", TrialStatus.TERMINATED, {}, {rate: 0.01}, None, None, {}),
             TrialOutcome("b", TrialStatus.ERROR, {}, {rate: 0.02}, None, "diverged", {}),
             TrialOutcome("c", TrialStatus.STOPPED, {}, {rate: 0.01}, None, None, {})]  # a's configuration again
    with pytest.raises(DetsweepError, match=r"^plain: found 1 configuration\(s\) whose trials ended without error, "
                                            r"expected 2 or more to tell apart$"):
        plan_rerun("plain", plain, SweepResults(ended, {}), 2, 2, [], False, tmp_path)


def test_rerun_refuses_bad_requests_in_one_line_before_anything_trains(trained_sweep, tmp_path):
    """On the suite's ASHA sweep (one trial trained to the end, one stopped at its rung, one
    diverged: two configurations to rerun): a name that is no sweep, no configuration, more
    than it has, one seed: each one line, exit code 2, nothing started."""
    folder, _ = trained_sweep
    source = str(folder / "ray" / "source")
    asked = {"no such sweep": run_here("rerun", "nosuch", cwd=tmp_path),
             "--top 0": run_here("rerun", source, "--top", "0", cwd=folder),
             "--top 3": run_here("rerun", source, "--top", "3", cwd=folder),
             "--seeds 1": run_here("rerun", source, "--seeds", "1", cwd=folder)}
    said = {name: result.stderr.strip().splitlines()[-1] for name, result in asked.items()}
    assert all(result.returncode == 2 for result in asked.values()), said
    assert said["no such sweep"].startswith("detsweep: error: nosuch: found no sweep.yaml at ")
    assert said["--top 0"] == "detsweep: error: --top: found 0, expected 1 or more configurations"
    assert said["--top 3"] == ("detsweep: error: --top: found 3, expected at most 2 (the configurations of source "
                               "whose trials ended without error)")
    assert said["--seeds 1"] == "detsweep: error: --seeds: found 1, expected 2 or more (one seed has no spread)"
    assert not list((folder / "ray").glob("source-rerun-*"))  # nothing started
