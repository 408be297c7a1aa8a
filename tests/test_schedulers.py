"""Ray Tune's real searchers and schedulers, as a sweep file builds them, on trials that report
known curves instead of training (``detsweep replay`` too): what each decides is known in
advance, in seconds."""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

import numpy as np
import pytest
from ray import tune

from detsweep.sweeps import load_sweep
from detsweep.sweeps.closing import RunCloser
from detsweep.sweeps.tuner import build_tuner, param_space, search_and_scheduler, searcher
from detsweep.tracking.trial_run import RunLink
from detsweep.trainables.trial import swept_values

from .conftest import REPO, connected_to, run_cli

pytestmark = pytest.mark.upgrade_check  # the schedulers on Tune's interface: make upgrade-check runs them

LR = "optimizer.learning_rate.learning_rate_base"


def lr_reported(config: dict) -> None:
    """Steps 10 to 40, each reporting the trial's learning rate as its loss and as its AP: a
    scheduler on ``train/loss`` (min) and one on ``eval/AP_best`` (max) decide the opposite."""
    [rate] = swept_values(config, [LR]).values()
    for step in (10, 20, 30, 40):
        tune.report({"step": step, "train/loss": rate, "eval/AP_best": rate})


def lr_reported_from_checkpoints(config: dict) -> None:
    """``lr_reported``, with a checkpoint at every step, going on from one when given it (as
    HyperBand resumes a paused trial)."""
    [rate] = swept_values(config, [LR]).values()
    start = 0
    if checkpoint := tune.get_checkpoint():
        with checkpoint.as_directory() as folder:
            start = int(Path(folder, "step").read_text())
    for step in range(start + 10, 41, 10):
        with tempfile.TemporaryDirectory() as folder:
            Path(folder, "step").write_text(str(step))
            tune.report({"step": step, "train/loss": rate, "eval/AP_best": rate},
                        checkpoint=tune.Checkpoint.from_directory(folder))


def sweep_with(write, tmp_path, search: str, checkpoint_every: int = 0, eval_every: int = 10):
    return load_sweep(write("sweep.yaml", f"""
name: known-curves
storage: {tmp_path / "ray"}
base:
  from: {REPO / "configs" / "quickstart.yaml"}
  train: {{num_steps: 40, steps_per_loop: 10, eval_every: {eval_every}, checkpoint_every: {checkpoint_every}}}
search:
  metric: eval/AP_best
  mode: max
  max_concurrent_trials: 1
{search}"""))


# one trial at a time, in this grid order, stopped on the loss; the best is chosen by AP
ASHA_ON_THE_LOSS = f"""
  algorithm: grid
  num_samples: 1
  scheduler: {{type: asha, grace_period: 10, reduction_factor: 2, metric: train/loss, mode: min}}
  space:
    {LR}: {{grid: [0.01, 0.02, 0.08, 0.04]}}
"""


def test_asha_decides_on_its_own_metric_and_mode_not_on_the_objective(ray_driver, write, tmp_path):
    """One trial at a time, in grid order: the first (lowest rate, so lowest loss) passes every
    rung; each later one has a higher loss than all before it and stops at the first rung. On
    the objective (AP, max) the same trials would all go on."""
    sweep = sweep_with(write, tmp_path, ASHA_ON_THE_LOSS)
    results = build_tuner(sweep, 1, RunLink("sqlite:///unused.db", "0", None), runs=lr_reported).fit()
    assert not results.errors
    steps = {swept_values(result.config, [LR])[LR]: result.metrics["step"] for result in results}
    assert steps == {0.01: 40, 0.02: 10, 0.08: 10, 0.04: 10}


def test_tpe_optimises_the_objective_while_asha_stops_on_the_loss(ray_driver, write, tmp_path):
    """Each trial reports its rate as its loss (min) and as its AP (max), so the two pull apart:
    TPE, told results, suggests higher rates; ASHA stops the trials of higher rates."""
    sweep = sweep_with(write, tmp_path, f"""
  algorithm: optuna
  seed: 0
  num_samples: 3
  scheduler: {{type: asha, grace_period: 10, reduction_factor: 2, metric: train/loss, mode: min}}
  space:
    {LR}: {{distribution: log_uniform_values, min: 0.01, max: 0.08}}
""")
    # TPE as the sweep builds it, told each trial's last result as Tune tells it: Optuna's first 10
    # draws are random, the next 10 its model's, which go where the AP was high (on the loss: low)
    rates = tpe_suggestions(sweep, 20, lambda rate: {"step": 40, "train/loss": rate, "eval/AP_best": rate})
    assert np.median(rates[10:]) > np.median(rates[:10]), rates

    results = build_tuner(sweep, 1, RunLink("sqlite:///unused.db", "0", None), runs=lr_reported).fit()
    assert not results.errors and len(results) == 3  # Tune accepted the two metrics (it refuses a mix-up)
    # one trial at a time, in the order of Tune's results: where each ended is ASHA's rule on the loss
    losses = [swept_values(result.config, [LR])[LR] for result in results]
    on_the_loss = asha_ends_one_at_a_time(losses)
    assert on_the_loss != asha_ends_one_at_a_time([-loss for loss in losses])  # on the AP it would differ
    assert [result.metrics["step"] for result in results] == on_the_loss, losses


def tpe_suggestions(sweep, trials: int, result_of) -> list[float]:
    """The rates the sweep's searcher suggests, one trial at a time, each trial completed with
    ``result_of(rate)`` before the next is asked for (through Tune's searcher interface)."""
    search = searcher(sweep, 1)
    # Tune hands the searcher no metric when the scheduler has its own: it has the objective already
    search.set_search_properties(None, None, param_space(sweep, RunLink("sqlite:///unused.db", "0", None)))
    rates = []
    for trial_id in map(str, range(trials)):
        [rate] = swept_values(search.suggest(trial_id), [LR]).values()
        search.on_trial_complete(trial_id, result_of(rate))
        rates.append(rate)
    return rates


def asha_ends_one_at_a_time(losses: list[float], rungs: tuple[int, ...] = (10, 20), last: int = 40) -> list[int]:
    """Where ASHA (minimising, reduction factor 2) ends trials of constant ``losses`` that run one
    after another: each stops at the first rung where its loss is above the median of the
    losses recorded there before it (Tune's cutoff), else reaches ``last``."""
    recorded: dict[int, list[float]] = {rung: [] for rung in rungs}
    ends = []
    for loss in losses:
        end = last
        for rung in rungs:
            before = list(recorded[rung])
            recorded[rung].append(loss)
            if before and loss > np.percentile(before, 50):
                end = rung
                break
        ends.append(end)
    return ends


HAND_MADE = {  # rate: (loss at every step, AP at steps 10, 20, 30, 40)
    0.01: (1.0, [0.1, 0.2, 0.3, 0.4]),
    0.02: (2.0, [0.05, 0.1, 0.3, 0.6]),  # the best at the full budget, and the worst early
    0.08: (8.0, [0.5, 0.5, 0.5, 0.5]),
    0.04: (4.0, [0.0, 0.1, 0.2, 0.3]),
}


def curves_file(write, paths=(LR,)) -> str:
    # the val loss as the training loss: a scheduler may decide on either
    trials = [{"config": {LR: rate}, "reports": [{"step": 10 * (i + 1), "train/loss": loss, "eval/loss": loss,
                                                  "eval/AP_best": ap} for i, ap in enumerate(aps)]}
              for rate, (loss, aps) in HAND_MADE.items()]
    return str(write("curves.json", json.dumps({"recorded": "by hand", "paths": list(paths), "trials": trials})))


def replayed(write, sweep, *overrides: str, seeds: int = 1, callbacks: list | None = None) -> dict:
    """What ``detsweep replay --json --seeds … --set …`` prints of ``sweep`` on the hand-made curves, run
    in this process on the module's cluster (the command's own run is checked once above)."""
    from detsweep.sweeps.replay import load_curves, replay

    sweep = load_sweep(sweep.path, overrides)
    return json.loads(json.dumps(replay(sweep, load_curves(curves_file(write), sweep), seeds, callbacks=callbacks)))


def test_replay_spends_the_steps_a_hand_computation_gives_and_returns_that_trial(local_cluster, write, tmp_path):
    """ASHA on the loss, one trial at a time in grid order: 0.01 passes every rung, the others
    stop at step 10 (each loses more than all before it): 40 + 3 x 10 = 70 of FIFO's 160 steps.
    The sweep returns the best last AP, 0.08's 0.5 at step 10, whose full-budget AP is 0.5: a
    regret of 0.1 against 0.02's 0.6. 0.08 first reported when 40 + 10 + 10 steps were spent."""
    sweep = sweep_with(write, tmp_path, ASHA_ON_THE_LOSS)
    with connected_to(local_cluster):
        report = replayed(write, sweep)
    [run] = report["runs"]
    assert (run["steps"], run["fifo_steps"], run["share_of_fifo"]) == (70, 160, pytest.approx(70 / 160))
    assert (run["returned"], run["regret"], report["best_recorded"]) == (0.5, pytest.approx(0.1), 0.6)
    assert run["steps_until_returned_seen"] == 60 and run["nearest"] == 0
    assert report["median"]["steps"] == 70
    # AP's early ranks against the final ones, by hand: 1 - 6 x 6 / (4 x 15) at step 10; with ties
    # sharing ranks, 0.5 / sqrt(4.5 x 5) at 20 and 3 / sqrt(4.5 x 5) at 30; 1 at the end. The loss,
    # constant per trial and ranked unlike the final AP, says nothing
    signal = report["early_signal"]
    assert signal["eval/AP_best"] == pytest.approx({"10": 0.4, "20": 0.5 / 22.5 ** 0.5, "30": 3 / 22.5 ** 0.5, "40": 1.0})
    assert signal["train/loss"] == pytest.approx({"10": 0.0, "20": 0.0, "30": 0.0, "40": 0.0})
    # the command itself, once: what it prints
    shown = run_cli("replay", curves_file(write), str(sweep.path), "--signal", "--importance", "--set",
                    "search.scheduler.type=fifo", "--set", "search.scheduler.metric=null", "--set",
                    "search.scheduler.mode=null", timeout=300)
    assert shown.returncode == 0, shown.stderr[-3000:]  # FIFO: every step, and the best at the end
    assert "share of FIFO's steps" in shown.stdout and " 100% " in shown.stdout
    assert re.search(r"regret against the best recorded +0 +0 +0", shown.stdout), shown.stdout
    assert re.search(r"\neval/AP_best +0\.40 +0\.11 +0\.\d\d +1\.00\n", shown.stdout), shown.stdout
    # which settings mattered, as a sweep of four trials would say: it cannot tell (the replayed
    # sweep's own study, from its Tune folder)
    assert shown.stdout.strip().splitlines()[-1] == ("importance in the replay with seed 0: 4 trials reached one "
                                                     "evaluated step; importance needs 20 at one step"), shown.stdout


def test_replay_refuses_curves_that_do_not_match_the_sweep_in_one_line(write, tmp_path):
    sweep = sweep_with(write, tmp_path, f"""
  num_samples: 2
  space:
    {LR}: {{distribution: log_uniform_values, min: 0.01, max: 0.08}}
    optimizer.moving_average_decay: {{values: [0.99, 0.995]}}
""")
    result = run_cli("replay", curves_file(write), str(sweep.path), timeout=120)
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [
        f"detsweep: error: {tmp_path / 'curves.json'}: paths: found ['{LR}'], expected the swept paths of "
        f"{sweep.path}: ['{LR}', 'optimizer.moving_average_decay']"]


def test_a_finished_experiments_full_curves_replay_as_the_file_does(local_cluster, write, tmp_path, monkeypatch):
    """The same hand-made curves, logged to MLflow as a FIFO sweep's trials would be (plus one
    stopped early, which has no full curve to replay): read back from the experiment, they
    replay to the figures the curves file gives."""
    from detsweep.sweeps.experiment import as_run
    from detsweep.sweeps.replay import curves_file, load_curves, replay_once
    from detsweep.tracking import TrialIdentity, TrialRun, open_sweep_run, resolve_backend

    monkeypatch.chdir(tmp_path)  # MLflow's embedded default: mlflow.db here
    sweep = sweep_with(write, tmp_path, ASHA_ON_THE_LOSS)
    link = open_sweep_run(sweep, str(tmp_path / "ray" / sweep.name), resolve_backend(sweep.base.tracking), as_run(sweep))
    for number, (rate, (loss, aps)) in enumerate([*HAND_MADE.items(), (0.03, (3.0, [0.9]))]):
        run = TrialRun(link, TrialIdentity(f"t_{number:05d}", f"trial_t_{number:05d}", {LR: rate}, "eval/AP_best", "max"), sweep.base)
        for index, ap in enumerate(aps):
            run.log_report({"step": 10 * (index + 1), "train/loss": loss, "eval/AP_best": ap})
        run.finish()
    curves = load_curves(sweep.name, sweep)
    assert sorted(zip([config[LR] for config in curves.configs], curves.reports)) == sorted(
        (rate, [{"step": 10 * (i + 1), "train/loss": loss, "eval/AP_best": ap} for i, ap in enumerate(aps)])
        for rate, (loss, aps) in HAND_MADE.items())
    with connected_to(local_cluster):  # after MLflow's writes: none adds a variable while Ray's threads run
        run = replay_once(sweep, curves, seed=0)
    assert (run["steps"], run["fifo_steps"], run["returned"], run["steps_until_returned_seen"]) == (70, 160, 0.5, 60)
    # written as a curves file (bench/record_curves.py does), they read back the same
    saved = tmp_path / "curves.json"
    saved.write_text(json.dumps(curves_file(curves, "today, here", sweep="sweep.yaml")))
    assert load_curves(str(saved), sweep) == curves
    assert json.loads(saved.read_text())["recorded"] == "today, here"


def bohb_on_the_rate(num_samples: int, factor: int) -> str:
    """The search block of a BOHB sweep over the learning rate (seed 0)."""
    return f"""
  algorithm: bohb
  seed: 0
  num_samples: {num_samples}
  scheduler: {{type: hyperband, reduction_factor: {factor}}}
  space:
    {LR}: {{distribution: log_uniform_values, min: 0.01, max: 0.08}}
"""


def test_bohb_replay_pauses_trials_at_hyperbands_rungs_and_resumes_them_where_they_paused(
        local_cluster, write, tmp_path, monkeypatch):
    """BOHB's HyperBand counts reports (one every 10 steps here, 4 in all): with a factor of 2
    its largest bracket takes these 4 trials and ranks them at 1, 2 and 4 reports. Each waits,
    paused, at steps 10 and 20 for the others, and the better half goes on from its checkpoint
    there: 4 × 10 + 2 × 10 + 1 × 20 = 80 steps, none reported twice. The replayed sweep as an
    Optuna study (made from its Tune folder, as a sweep's end makes it): the two stopped at
    step 10 and the one at 20 PRUNED there, the last COMPLETE at 40, every report an
    intermediate value at its step, each trial its Tune id and seed."""
    from detsweep.sweeps import replay as replay_module
    from detsweep.sweeps.experiment import read_results
    from detsweep.sweeps.importance import ready_before_ray
    from detsweep.sweeps.study import study_of

    studied = []

    def with_its_study(path, sweep):  # the folder is gone once the replay ends
        studied.extend(study_of(sweep, read_results(path, sweep)))
        return importance_of(path, sweep)

    importance_of = replay_module.replayed_importance
    monkeypatch.setattr(replay_module, "replayed_importance", with_its_study)
    sweep = sweep_with(write, tmp_path, bohb_on_the_rate(4, 2), checkpoint_every=10)
    ready_before_ray()  # as ``replay --importance`` does
    with connected_to(local_cluster):
        report = json.loads(json.dumps(replay_module.replay(
            sweep, replay_module.load_curves(curves_file(write), sweep), with_importance=True)))
    [run] = report["runs"]
    assert sorted((t.state.name, max(t.intermediate_values)) for t in studied) == [
        ("COMPLETE", 40), ("PRUNED", 10), ("PRUNED", 10), ("PRUNED", 20)], studied
    for trial in studied:
        assert sorted(trial.intermediate_values) == list(range(10, max(trial.intermediate_values) + 1, 10))
        assert trial.value == trial.intermediate_values[max(trial.intermediate_values)]
        assert trial.user_attrs["trial_id"] and trial.user_attrs["seed"] == sweep.base.train.seed
        assert 0.01 <= trial.params[LR] <= 0.08
    assert run["trials"] == 4 and run["resumed"] >= 1 and run["reported_twice"] == 0, run
    assert (run["steps"], run["fifo_steps"]) == (80, 160), run
    assert run["nearest"] == 4  # BOHB draws rates of its own: each replays the nearest recorded one
    from detsweep.sweeps.commands import format_replay  # what the command prints without --json

    assert f"note: trials went on from a checkpoint {run['resumed']} time(s) after the scheduler paused them at a rung" in format_replay(report)


class ClosesSeen(RunCloser):
    """The sweep's run closer, telling what it would close (and when a trial twice) instead of
    writing it: the replay's trials have no MLflow runs."""

    def __init__(self, *args):
        super().__init__(*args)
        self.seen, self.twice = {}, []

    def close(self, trial, error) -> None:
        ended = self.ended(trial, error)
        if trial.trial_id in self.seen:
            self.twice.append(trial.trial_id)
        self.seen[trial.trial_id] = (str(ended["status"]), ended["metrics"]["step"])


def test_halving_replay_ranks_every_trial_at_its_rung_before_any_goes_on_and_spends_what_a_hand_count_gives(
        ray_driver, write, tmp_path):
    """Synchronous halving on the val loss while the objective is AP, one trial at a time in grid
    order, its only rung at step 20 (factor 3: the next, 60, lies past the budget of 40). All 4
    pause there; ranked on the loss, 0.01 and 0.02 (ceil(4 / 3) = 2) go on from their
    checkpoints to step 40, 0.08 and 0.04 stop: 4 x 20 + 2 x 20 = 120 of FIFO's 160 steps. The
    sweep returns 0.02's AP 0.6, the best recorded (regret 0), although 0.02 had the worst AP
    but one at step 20: on AP the rung would have kept 0.08 and 0.01 (returning 0.5)."""
    sweep = sweep_with(write, tmp_path, f"""
  algorithm: grid
  num_samples: 1
  scheduler: {{type: halving, grace_period: 20, reduction_factor: 3, metric: eval/loss, mode: min}}
  space:
    {LR}: {{grid: [0.01, 0.02, 0.08, 0.04]}}
""", checkpoint_every=10)
    closes = ClosesSeen(RunLink("sqlite:///unused.db", "0", None), 40, sweep.base.scaling)
    report = replayed(write, sweep, callbacks=[closes])
    [run] = report["runs"]
    assert run["trials"] == 4 and run["resumed"] == 2 and run["reported_twice"] == 0, run
    assert (run["steps"], run["fifo_steps"], run["returned"], run["regret"]) == (120, 160, 0.6, 0), run
    # each trial's run closed once, as Tune completed it: none at its pause (the two that went on
    # paused at 20 too), the two stopped there as stopped, the two that went on at their end
    assert sorted(closes.seen.values()) == [("STOPPED", 20)] * 2 + [("TERMINATED", 40)] * 2, closes.seen
    assert closes.twice == []
    [on_ap] = replayed(write, sweep, "search.scheduler.metric=null", "search.scheduler.mode=null")["runs"]
    assert (on_ap["steps"], on_ap["returned"]) == (120, 0.5), on_ap


def test_bohbs_model_learns_from_the_results_hyperband_ranks(ray_driver, write, tmp_path):
    """TuneBOHB fits its model only on results its scheduler marked with their budget (Tune
    hands both the same result), and only with 2 × (parameters + 1) of them at one budget: 4
    here. 4 reports and a factor of 4: a bracket of 4 trials ranked at their first report,
    whose best trains to the fourth; one of 2 trials that run to the end; then another like
    the first. Every ranked result reaches the model, also those of trials stopped on their own
    report (Tune hands a searcher only the results of trials that go on): 8 at budget 1 and
    4 at budget 4, and it is fitted on both. (hpbandster drops a result below the largest
    budget it has a model for; the model at budget 4 comes with the sweep's last result.)"""
    sweep = sweep_with(write, tmp_path, bohb_on_the_rate(10, 4), checkpoint_every=10)
    bohb, hyperband = search_and_scheduler(sweep, 1)
    tuner = tune.Tuner(lr_reported_from_checkpoints, param_space=param_space(sweep, RunLink("sqlite:///unused.db", "0", None)),
                       tune_config=tune.TuneConfig(metric="eval/AP_best", mode="max", num_samples=10, search_alg=bohb,
                                                   scheduler=hyperband),
                       run_config=tune.RunConfig(storage_path=str(tmp_path / "ray"), name="bohb", verbose=0))
    assert not tuner.fit().errors
    learned = {budget: len(losses) for budget, losses in bohb.bohber.losses.items()}
    assert learned == {1: 8, 4: 4}, learned
    assert set(bohb.bohber.kde_models) == {1, 4}  # its densities, fitted on them (statsmodels' KDE)


def test_bohbs_survivors_train_to_max_t_where_it_is_no_power_of_the_factor(ray_driver, write, tmp_path):
    """4 reports and a factor of 3: HyperBand's largest bracket takes 3 trials and ranks them
    at their first report. Tune's own would then train the one it keeps to report 3 (the first
    rung, rounded down from 4/3, times 3); it trains to the last, step 40: 3 × 10 + 30 steps."""
    sweep = sweep_with(write, tmp_path, bohb_on_the_rate(3, 3), checkpoint_every=10)
    [run] = replayed(write, sweep)["runs"]
    assert (run["trials"], run["steps"], run["reported_twice"]) == (3, 60, 0), run


def test_a_replay_reports_where_the_sweep_evaluates_not_at_every_recorded_step(ray_driver, write, tmp_path):
    """Curves recorded every 10 steps, a sweep that evaluates every 20: HyperBand counts 2
    reports, and with a factor of 2 ranks 2 trials at the first, step 20 (not at the recorded
    step 10): 2 × 20 + 20 steps."""
    sweep = sweep_with(write, tmp_path, bohb_on_the_rate(2, 2), checkpoint_every=20, eval_every=20)
    [run] = replayed(write, sweep)["runs"]
    assert (run["trials"], run["steps"], run["reported_twice"]) == (2, 60, 0), run


class Controller:
    """What Tune hands a scheduler (``get_trials``, ``stop_trial``), as Tune's acts: a paused
    trial stopped is removed from the scheduler while still PAUSED, then TERMINATED; and what it
    writes to the experiment's saved state (``_mark_trial_to_checkpoint``, the adapter's call)."""

    def __init__(self, scheduler, trials: list):
        self.scheduler, self.trials, self.saved = scheduler, trials, []

    def get_trials(self) -> list:
        return self.trials

    def stop_trial(self, trial) -> None:
        from ray.tune.experiment import Trial

        if trial.status in (Trial.PENDING, Trial.PAUSED):
            self.scheduler.on_trial_remove(self, trial)
        trial.set_status(Trial.TERMINATED)

    def _mark_trial_to_checkpoint(self, trial) -> None:
        self.saved.append((trial.trial_id, trial.status))

    def add(self, trial) -> None:
        self.trials.append(trial)
        self.scheduler.on_trial_add(self, trial)

    def starts(self, trial) -> None:
        """Tune starts a PENDING trial by itself, a PAUSED one when the scheduler chooses it."""
        from ray.tune.experiment import Trial

        if trial.status == Trial.PAUSED:
            assert self.scheduler.choose_trial_to_run(self) is trial
        trial.set_status(Trial.RUNNING)

    def placed(self) -> list:
        """The scheduler's brackets, once it placed every trial added (it does at its next hook)."""
        self.scheduler.holding_slots()
        return self.scheduler.brackets

    def reports(self, trial, step: int, value: float) -> str:
        """The scheduler's decision on the report, carried out as Tune would."""
        from ray.tune.experiment import Trial

        result = {"step": step, "eval/AP": value}
        trial.update_last_result(dict(result))
        decision = self.scheduler.on_trial_result(self, trial, result)
        if decision == "PAUSE":
            trial.set_status(Trial.PAUSED)
        elif decision == "STOP":
            self.scheduler.on_trial_complete(self, trial, result)
            trial.set_status(Trial.TERMINATED)
        return decision


def stub_trials(*names: str) -> list:
    """Trials as Tune creates them, each tagged with its creation count."""
    from ray.tune.experiment import Trial

    return [Trial("__fake", stub=True, trial_id=name, config={}, experiment_tag=f"{at}_x={at}")
            for at, name in enumerate(names, 1)]


def halving_of(trials: int, max_concurrent: int | None = 1, first_rung: int = 1, max_t: int = 3, eta: float = 3):
    from detsweep.sweeps.rungs import halving

    return halving(trials=trials, first_rung=first_rung, max_t=max_t, eta=eta, every=1, max_concurrent=max_concurrent,
                   metric="eval/AP", mode="max")


def test_a_hyperband_bracket_whose_only_trial_errored_takes_no_more_trials():
    """A bracket is ranked when its last live trial leaves it, here by erroring at its first
    report, and its rung moves on: a trial joining it then would skip the first rung, so it
    takes none. HyperBand with 9 reports and a factor of 3 opens with a bracket of 9 trials
    (s = 2), then one of 5 (s = 1)."""
    from ray.tune.experiment import Trial

    from detsweep.sweeps.rungs import hyperband

    scheduler = hyperband(max_t=9, eta=3, every=1, max_concurrent=1, metric="eval/AP", mode="max", bohb=None)
    errored, later = stub_trials("errored", "later")
    controller = Controller(scheduler, [])
    controller.add(errored)
    errored.set_status(Trial.ERROR)
    scheduler.on_trial_error(controller, errored)
    controller.add(later)
    first, joined = controller.placed()
    assert (first.size, first.rungs, first.finished) == (9, [1, 3, 9], True)
    assert (joined.size, joined.rungs, list(joined.members)) == (5, [3, 9], ["later"])


def test_a_bracket_fills_as_trials_arrive_though_its_first_trials_ended():
    """HyperBand's bracket without a rung before max_t (s = 0) holds 2 trials here: one that ran
    to the end and left still counts, so the next joins it and the third opens the next band,
    instead of every later trial joining a bracket that never fills (and never stops one)."""
    from detsweep.sweeps.rungs import hyperband

    scheduler = hyperband(max_t=3, eta=3, every=1, max_concurrent=1, metric="eval/AP", mode="max", bohb=None)
    trials = stub_trials(*"abcdef")
    controller = Controller(scheduler, [])
    for trial in trials[:3]:  # the first bracket (s = 1): 3 trials ranked at report 1
        controller.add(trial)
    assert [b.size for b in controller.placed()] == [3]
    controller.add(trials[3])  # the bracket of s = 0
    controller.starts(trials[0])  # (the first bracket's trials are first in line)
    scheduler.on_trial_complete(controller, trials[3], {})  # ended, before the next arrives
    controller.add(trials[4])
    controller.add(trials[5])
    assert [(b.size, list(b.members)) for b in controller.placed()] == [(3, ["a", "b", "c"]), (2, ["d", "e"]),
                                                                         (3, ["f"])]


def test_hyperband_keeps_every_trial_left_when_fewer_live_than_it_plans_to_keep():
    """A bracket of 9 (max_t 9, factor 3) plans to keep 3 at its first rung; 7 of its trials
    errored before it, so the 2 that reported both go on."""
    from ray.tune.experiment import Trial

    from detsweep.sweeps.rungs import hyperband

    scheduler = hyperband(max_t=9, eta=3, every=1, max_concurrent=1, metric="eval/AP", mode="max", bohb=None)
    trials = stub_trials(*(f"t{i}" for i in range(9)))
    controller = Controller(scheduler, [])
    for trial in trials:
        controller.add(trial)
    for trial in trials[2:]:
        controller.starts(trial)
        trial.set_status(Trial.ERROR)
        scheduler.on_trial_error(controller, trial)
    controller.starts(trials[0])
    assert controller.reports(trials[0], 1, 0.2) == "PAUSE"
    controller.starts(trials[1])
    assert controller.reports(trials[1], 1, 0.9) == "CONTINUE"
    assert scheduler.choose_trial_to_run(controller) is None  # one runs: the bound
    assert trials[0].status == "PAUSED" and not scheduler.brackets[0].waiting(scheduler.brackets[0].members["t0"])


def test_a_bracket_whose_last_trial_paused_while_another_still_saved_is_ranked_while_other_brackets_run():
    """HyperBand (max_t 3, factor 3): a, b and c in the first bracket, ranked at report 1; d
    trains in the next. c reaches the rung while b still saves its pause, so c only pauses;
    once b is PAUSED the bracket is ranked at the next chance to start a trial, though d still
    runs (ranking waited for the whole sweep to go idle): the best goes on, the others stop.
    A bracket is never ranked while one of its own trials runs, nor does a result wait in a
    buffer (each decides at its rung)."""
    from ray.tune.experiment import Trial

    from detsweep.sweeps.rungs import hyperband

    scheduler = hyperband(max_t=3, eta=3, every=1, max_concurrent=None, metric="eval/AP", mode="max", bohb=None)
    a, b, c, d = stub_trials("a", "b", "c", "d")
    controller = Controller(scheduler, [])
    for trial in (a, b, c, d):
        controller.add(trial)
        controller.starts(trial)
    assert controller.reports(a, 1, 0.2) == "PAUSE"
    assert scheduler.on_trial_result(controller, b, {"step": 1, "eval/AP": 0.9}) == "PAUSE"
    b.temporary_state.saving_to = object()  # Tune saves b's checkpoint before it is PAUSED
    assert controller.reports(c, 1, float("nan")) == "PAUSE"  # diverged: NaN ranks last
    assert scheduler.choose_trial_to_run(controller) is None  # b, of this bracket, still runs (saving)
    b.temporary_state.saving_to = None
    b.set_status(Trial.PAUSED)
    assert d.status == Trial.RUNNING and scheduler.choose_trial_to_run(controller) is b
    assert (a.status, c.status) == (Trial.TERMINATED, Trial.TERMINATED)
    assert not scheduler.supports_buffered_results


def test_a_trial_ranked_out_while_its_pause_is_still_saving_is_stopped():
    """a and b pause at the rung, b still saving its checkpoint (RUNNING, saving) when c errors
    and the bracket is ranked: b, the worse, is stopped all the same, not left to pause for good."""
    from ray.tune.experiment import Trial

    scheduler = halving_of(3, max_concurrent=None)
    a, b, c = stub_trials("a", "b", "c")
    controller = Controller(scheduler, [])
    for trial in (a, b, c):
        controller.add(trial)
        controller.starts(trial)
    assert controller.reports(a, 1, 0.9) == "PAUSE"
    assert scheduler.on_trial_result(controller, b, {"step": 1, "eval/AP": 0.1}) == "PAUSE"
    b.temporary_state.saving_to = object()  # Tune saves b's checkpoint before it is PAUSED
    c.set_status(Trial.ERROR)
    scheduler.on_trial_error(controller, c)
    assert (a.status, b.status) == ("PAUSED", "TERMINATED")


def test_halving_ranks_its_bracket_only_once_every_trial_of_the_sweep_is_in_it():
    """3 trials, one at a time, a rung at the first report (factor 3). The first pauses at its
    rung; the second errors before reporting. A bracket ranked then would keep the paused trial
    alone. Halving waits for the third, ranks the two that reported, and keeps ceil(2 / 3) = 1:
    the better, resumed; the third, worse, stops on its report. A trial paused at the rung holds
    no slot: the generator may draw the next."""
    from ray.tune.experiment import Trial

    scheduler = halving_of(3)
    first, errored, third = stub_trials("first", "errored", "third")
    controller = Controller(scheduler, [])
    controller.add(first)
    controller.starts(first)
    assert controller.reports(first, 1, 0.5) == "PAUSE"
    assert scheduler.holding_slots() == 0
    controller.add(errored)
    controller.starts(errored)
    errored.set_status(Trial.ERROR)
    scheduler.on_trial_error(controller, errored)
    assert scheduler.choose_trial_to_run(controller) is None and scheduler.brackets[0].ranked == 0
    controller.add(third)
    controller.starts(third)
    assert controller.reports(third, 1, 0.1) == "STOP"
    assert scheduler.holding_slots() == 1  # the kept trial is owed its slot
    controller.starts(first)
    assert controller.reports(first, 2, 0.6) == "CONTINUE" and controller.reports(first, 3, 0.7) == "STOP"


def test_paused_trials_go_on_one_at_a_time_within_the_bound_and_a_stopped_one_is_saved_terminated():
    """4 trials, 1 at a time, factor 2, rungs at 1 and 2 reports: the first 3 pause at the first;
    the last to report there is ranked with them at once: it and the worst stop, the best 2 go
    on, one at a time. The one stopped while paused is written to the experiment state as it
    leaves (still PAUSED there: TERMINATED right after)."""
    scheduler = halving_of(4, max_concurrent=1, max_t=2, eta=2)
    trials = stub_trials(*"abcd")
    controller = Controller(scheduler, [])
    for trial in trials:
        controller.add(trial)
    for trial, value in zip(trials, (0.1, 0.4, 0.3, 0.2)):
        controller.starts(trial)
        assert controller.reports(trial, 1, value) == ("PAUSE" if trial.trial_id != "d" else "STOP")
    assert controller.saved == [("a", "PAUSED")]
    assert [t.status for t in trials] == ["TERMINATED", "PAUSED", "PAUSED", "TERMINATED"]
    controller.starts(trials[1])
    assert scheduler.choose_trial_to_run(controller) is None  # one runs: the bound; c waits its turn
    assert controller.reports(trials[1], 2, 0.5) == "PAUSE"  # at max_t, until c is there too
    controller.starts(trials[2])
    assert controller.reports(trials[2], 2, 0.6) == "STOP" and trials[1].status == "TERMINATED"


def restored(names_and_states: list[tuple[str, str, int | None, float | None]]) -> list:
    """Trials as Tune restores them: each with its status and last result (``None``: it never
    reported), its unfinished ones PENDING, and in another order than they were created."""
    from ray.tune.experiment import Trial

    trials = stub_trials(*(name for name, *_ in names_and_states))
    for trial, (_, status, step, value) in zip(trials, names_and_states):
        if step is not None:
            trial.update_last_result({"step": step, "eval/AP": value})
        trial.set_status(status if status in (Trial.TERMINATED, Trial.ERROR) else Trial.PENDING)
    return trials[::-1]


def test_a_resumed_halving_sweep_rebuilds_its_bracket_and_trains_no_trial_past_an_unranked_rung():
    """The driver died after the first rung's ranking (factor 2, rungs at 1, 2 and 4 reports): a
    and b went on (a reached report 2 and paused, b trains toward it), c and d were stopped at
    report 1. The new scheduler, handed the restored trials in another order, ranks nothing
    again: it sets a (waiting at rung 2) and b back to PAUSED, chooses b only, and ranks rung 2
    once b reaches it; c and d are never started."""
    trials = restored([("a", "PAUSED", 2, 0.5), ("b", "RUNNING", 1, 0.4), ("c", "TERMINATED", 1, 0.3),
                       ("d", "TERMINATED", 1, 0.2)])
    scheduler = halving_of(4, max_concurrent=2, max_t=4, eta=2)
    controller = Controller(scheduler, [])
    for trial in trials:
        controller.add(trial)
    a, b = (next(t for t in trials if t.trial_id == name) for name in "ab")
    assert (a.status, b.status) == ("PAUSED", "PAUSED")
    controller.starts(b)
    assert scheduler.brackets[0].ranked == 1 and scheduler.choose_trial_to_run(controller) is None
    assert controller.reports(b, 2, 0.45) == "STOP"  # ranked at rung 2: a (0.5) goes on, b stops
    controller.starts(a)
    assert controller.reports(a, 3, 0.6) == "CONTINUE" and controller.reports(a, 4, 0.7) == "STOP"


def test_a_resumed_sweep_whose_trials_all_wait_at_a_rung_ranks_it_once_and_stops_none_twice():
    """The driver died while the trials were paused at the first rung, one of them not yet
    ranked (factor 3: 3 trials, rungs 1 and 3). On resume none is started before the ranking,
    which keeps the best; the two it stops while paused are written to the experiment state."""
    trials = restored([("a", "PAUSED", 1, 0.2), ("b", "PAUSED", 1, 0.9), ("c", "RUNNING", 1, 0.5)])
    scheduler = halving_of(3, max_concurrent=1)
    controller = Controller(scheduler, [])
    for trial in trials:
        controller.add(trial)
    assert {t.status for t in trials} == {"PAUSED"} and controller.placed()[0].ranked == 0
    b = scheduler.choose_trial_to_run(controller)  # none runs: ranked now, once
    assert b.trial_id == "b" and scheduler.brackets[0].ranked == 1
    assert sorted(controller.saved) == [("a", "PAUSED"), ("c", "PAUSED")]
    assert sorted(t.trial_id for t in trials if t.status == "TERMINATED") == ["a", "c"]


def test_trials_are_placed_in_the_order_tune_created_them_whatever_order_they_arrive_in():
    from detsweep.sweeps.rungs import hyperband

    scheduler = hyperband(max_t=9, eta=3, every=1, max_concurrent=1, metric="eval/AP", mode="max", bohb=None)
    trials = stub_trials(*(f"t{i}" for i in range(12)))
    controller = Controller(scheduler, [])
    for trial in reversed(trials):
        controller.add(trial)
    assert [list(b.members) for b in controller.placed()] == [[f"t{i}" for i in range(9)], ["t9", "t10", "t11"]]


def test_the_replay_clock_lets_trials_report_in_step_order_however_late_they_ask():
    """Two slots, three trials in Tune's order x, w, v (their ids sort the other way, as a
    searcher's random ids may). ``x`` asks late every time and ends at step 40; ``w`` asks at
    once; ``v`` is started into the slot ``x`` freed, late, and starts at its time, 40. Grants
    go by time, ties to the trial Tune made first, never past a live trial that has not asked
    yet."""
    import asyncio

    from detsweep.sweeps.replay import StepClock

    clock, granted, ended = StepClock(slots=2, trials=3, patience_s=5), [], {}

    async def trial(name: str, place: int, steps: list[int], delay: float, after: str = "") -> None:
        if after:  # Tune starts it once that trial has ended
            await ended[after].wait()
        await clock.start(name, place)
        for step in steps:
            await asyncio.sleep(delay)
            await clock.until(name, step)
            granted.append((name, clock.now))
        await asyncio.sleep(delay)
        await clock.leave(name)
        ended[name].set()

    async def sweep() -> None:
        ended.update({name: asyncio.Event() for name in "xwv"})
        await asyncio.gather(trial("x", 0, [20, 20], 0.05), trial("w", 1, [30, 30, 30], 0),
                             trial("v", 2, [10, 10], 0.1, after="x"))

    asyncio.run(sweep())
    assert granted == [("x", 20), ("w", 30), ("x", 40), ("v", 50), ("w", 60), ("v", 60), ("w", 90)]
    assert clock.late == 0


def test_the_replay_clock_lets_the_earliest_go_and_counts_it_when_a_live_trial_never_asks():
    import asyncio

    from detsweep.sweeps.replay import StepClock

    clock = StepClock(slots=2, trials=2, patience_s=0.2)

    async def sweep() -> None:
        await clock.start("silent", 0)
        await clock.start("asking", 1)
        await clock.until("asking", 10)

    asyncio.run(sweep())
    assert (clock.now, clock.late) == (10, 1)


def test_replay_at_two_trials_at_a_time_decides_the_same_on_every_run(ray_driver, write, tmp_path):
    """ASHA on the loss, two trials at a time in grid order: 0.01 and 0.02 reach step 10 at
    the same time, and 0.01 (the earlier trial) reports first, so 0.02 is ranked against it and
    stops; 0.08 starts in its slot at step 10 and stops at its first rung, as 0.04 does after
    it: 40 + 3 x 10 = 70 steps. 0.08, returned, first reported when 20 + 10 + 10 were spent.
    Three seeds (a grid draws the same trials): three equal runs, none out of order."""
    sweep = sweep_with(write, tmp_path, ASHA_ON_THE_LOSS)
    report = replayed(write, sweep, "search.max_concurrent_trials=2", seeds=3)
    assert [(run["steps"], run["returned"], run["steps_until_returned_seen"], run["out_of_order"])
            for run in report["runs"]] == [(70, 0.5, 40, 0)] * 3
