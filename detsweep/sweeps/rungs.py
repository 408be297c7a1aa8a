"""Synchronous successive halving in brackets, as a Tune ``TrialScheduler`` that keeps its own
state and decides CONTINUE, PAUSE or STOP in its hooks: detsweep's ``halving`` (one bracket
holding every trial of the sweep) and BOHB's HyperBand (HyperBand's brackets, the largest first).

Time counts reports of the metric (one every ``every`` steps): HyperBand's rungs fall at
max_t / eta^s, and counted in steps most would fall between two reports.

How a bracket decides:

- It takes ``size`` trials as they arrive; its rungs are ``r0``, ``r0·eta``, … (rounded down),
  the last at ``max_t``, whatever power of ``eta`` that is.
- A trial trains to its bracket's next rung and pauses there, its workers freed.
- Once the bracket is whole (all its trials arrived; halving: or the sweep drew its last) and
  every live trial reached the rung, it is ranked on the metric: the best go on from their
  checkpoint at the rung, the rest stop; at ``max_t`` every trial stops, finished. Halving keeps
  1 in ``eta`` (rounded up) of the trials ranked; HyperBand keeps ``ceil(n / eta)`` of its
  ``n`` planned at the rung before, as HyperBand's paper and Tune do.
- A paused trial resumes only while fewer than ``max_concurrent`` trials run or wait to start:
  a trial's own process asks for no CPU, and unbounded, every trial a ranking kept would resume
  at once, their workers queueing for the CPUs of the few that fit.
- A trial that errors or ends leaves its bracket. A bracket whose live trials all wait at its
  rung is ranked once none of them runs (halving: only once whole), whatever other brackets
  do; one ranked takes no more trials.
- BOHB's model hears every ranked result (marked with its budget), also a stopped trial's.

It resumes: Tune (2.60) never saves a scheduler, and a restored sweep gets this object as it
was built. Its brackets follow from the trials Tune restores, taken in the order they were
created, from their last results: a rung was ranked once a trial trained past it or was stopped
at it, and a trial waits at a rung until it is. Each restored trial that reported and has not
ended is set back to PAUSED as Tune adds it, so that Tune starts it only when this scheduler
chooses it: never one waiting at a rung that is not ranked yet (one that never reported stays
PENDING, for Tune to start as any new trial).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ray.tune.experiment import Trial
from ray.tune.schedulers import TrialScheduler
from ray.tune.search import BasicVariantGenerator

from detsweep.adapters import ray as adapter

ENDED = (Trial.TERMINATED, Trial.ERROR)


@dataclass
class Member:
    """A trial in its bracket: how far it got and what it scored there."""

    trial: Trial
    time: int = 0
    value: float | None = None
    ended: bool = False


@dataclass(eq=False)
class Bracket:
    size: int  # the trials it takes
    rungs: list[int]  # in reports, the last max_t
    members: dict[str, Member] = field(default_factory=dict)  # in arrival order
    ranked: int = 0  # how many of its rungs were ranked

    @property
    def rung(self) -> int:
        """The rung its live trials train to (the last, once it finished)."""
        return self.rungs[min(self.ranked, len(self.rungs) - 1)]

    @property
    def finished(self) -> bool:
        return self.ranked >= len(self.rungs)

    def live(self) -> list[Member]:
        return [member for member in self.members.values() if not member.ended]

    def whole(self) -> bool:
        """It takes no more trials: all arrived, or it was ranked before its last rung (a trial
        joining then would skip a rung)."""
        return min(self.ranked, len(self.rungs) - 1) > 0 or len(self.members) >= self.size

    def waiting(self, member: Member) -> bool:
        return member.time >= self.rung


class Rungs(TrialScheduler):
    """The scheduler. ``plan`` gives the k-th bracket opened (from 0) its size and rungs, or None
    for a shape with no rung (HyperBand skips it). ``whole_sweep``: halving's rules (see the
    module's docstring); ``bohb``: TuneBOHB, told of pauses and of every ranked result."""

    def __init__(self, *, metric: str | None, mode: str | None, max_t: int, eta: float, every: int,
                 max_concurrent: int | None, whole_sweep: bool, plan: Callable[[int], tuple[int, list[int]] | None],
                 bohb: Any = None):
        super().__init__()
        self.metric_name, self.mode = metric, mode
        self.max_t, self.eta, self.every = max_t, eta, every
        self.max_concurrent, self.whole_sweep, self.plan, self.bohb = max_concurrent, whole_sweep, plan, bohb
        self.draws: PacedVariants | None = None  # halving's generator, which asks how many slots are held
        self.brackets: list[Bracket] = []
        self.of: dict[str, Bracket] = {}
        self.arrived: list[Trial] = []  # added, not yet placed in a bracket

    # --- Tune's hooks ------------------------------------------------------------------------------

    @property
    def metric(self) -> str | None:
        return self.metric_name

    @property
    def supports_buffered_results(self) -> bool:
        return False  # each result decides: buffered, a trial would train past its rung before it paused

    def set_search_properties(self, metric: str | None, mode: str | None, **spec) -> bool:
        if (self.metric_name and metric) or (self.mode and mode):
            return False
        self.metric_name, self.mode = self.metric_name or metric, self.mode or mode
        return True

    def on_trial_add(self, tune_controller, trial: Trial) -> None:
        if trial.status not in ENDED and reported(trial):
            trial.set_status(Trial.PAUSED)  # restored: it starts when chosen (see the module's docstring)
        self.arrived.append(trial)

    def on_trial_result(self, tune_controller, trial: Trial, result: dict) -> str:
        self._place_arrivals()
        bracket, member = self._find(trial)
        member.time, member.value = self.time_of(result), result.get(self.metric_name)
        if self.bohb is not None:
            adapter.bohb_budget(result, bracket.rung if bracket.waiting(member) else None)
        if not bracket.waiting(member):
            return self.CONTINUE
        others = [m for m in bracket.live() if m is not member]
        if bracket.whole() and all(bracket.waiting(m) and m.trial.status == Trial.PAUSED for m in others):
            decision = self._rank(tune_controller, bracket, current=trial)
        else:
            decision = self.PAUSE
        if decision == self.PAUSE and self.bohb is not None:
            self.bohb.on_pause(trial.trial_id)
        if decision == self.STOP and self.bohb is not None:
            # Tune hands a searcher only the results of trials that go on: without this, BOHB's model
            # never heard of a trial ranked out on its own report, nor of the last to reach max_t.
            self.bohb.on_trial_result(trial.trial_id, result)
        return decision

    def on_trial_complete(self, tune_controller, trial: Trial, result: dict) -> None:
        self.on_trial_remove(tune_controller, trial)

    def on_trial_error(self, tune_controller, trial: Trial) -> None:
        self.on_trial_remove(tune_controller, trial)

    def on_trial_remove(self, tune_controller, trial: Trial) -> None:
        self._place_arrivals()
        bracket, member = self._find(trial)
        member.ended = True
        if trial.status == Trial.PAUSED:  # stopped while paused: TERMINATED before Tune next saves
            adapter.save_stopped_trial(tune_controller, trial)
        if bracket.ranked == 0 and self._may_rank(bracket):
            self._rank(tune_controller, bracket)

    def choose_trial_to_run(self, tune_controller) -> Trial | None:
        self._place_arrivals()
        trials = tune_controller.get_trials()
        if self.max_concurrent is not None and sum(t.status in (Trial.RUNNING, Trial.PENDING) for t in trials) \
                >= self.max_concurrent:
            return None
        chosen = self._runnable()
        if chosen is None:  # a bracket whose last trial paused while another still saved, or errored
            for bracket in self.brackets:
                statuses = [m.trial.status for m in bracket.live()]
                if self._may_rank(bracket) and Trial.PAUSED in statuses and Trial.RUNNING not in statuses:
                    self._rank(tune_controller, bracket)
            chosen = self._runnable()
        return chosen

    def debug_string(self) -> str:
        return "; ".join(f"bracket of {b.size}: rung {b.rung} ({b.ranked} ranked), {len(b.live())} live"
                         for b in self.brackets)

    # --- slots, for the generator that draws halving's trials ------------------------------------

    def holding_slots(self) -> int:
        """Trials that run, wait to start, or were ranked to go on (owed their slot)."""
        self._place_arrivals()
        held = 0
        for bracket in self.brackets:
            for member in bracket.live():
                status = member.trial.status
                held += status in (Trial.RUNNING, Trial.PENDING) or (status == Trial.PAUSED and not bracket.waiting(member))
        return held

    # --- the brackets ------------------------------------------------------------------------------

    def time_of(self, result: dict) -> int:
        return math.ceil(result["step"] / self.every)

    def _find(self, trial: Trial) -> tuple[Bracket, Member]:
        bracket = self.of[trial.trial_id]
        return bracket, bracket.members[trial.trial_id]

    def _place_arrivals(self) -> None:
        """Place the trials added since the last hook, in the order they were created (Tune adds
        restored ones in another), each with what it reported before (a restored trial)."""
        arrived, self.arrived = sorted(self.arrived, key=adapter.creation_order), []
        joined = []
        for trial in arrived:
            bracket = self._open_bracket()
            member = Member(trial, ended=trial.status in ENDED)
            if reported(trial):
                member.time, member.value = self.time_of(trial.last_result), trial.last_result.get(self.metric_name)
            bracket.members[trial.trial_id] = member
            self.of[trial.trial_id] = bracket
            if bracket not in joined:
                joined.append(bracket)
        for bracket in joined:  # all placed first: a restored rung ranked closes no bracket early
            self._catch_up(bracket)

    def _open_bracket(self) -> Bracket:
        if self.brackets and not self.brackets[-1].whole():
            return self.brackets[-1]
        planned = None
        while planned is None:
            planned = self.plan(len(self.brackets))
            if planned is None:  # a shape with no rung: skipped, as HyperBand skips it
                self.brackets.append(Bracket(0, [self.max_t], ranked=1))
        self.brackets.append(Bracket(*planned))
        return self.brackets[-1]

    def _catch_up(self, bracket: Bracket) -> None:
        """A rung of a restored bracket was ranked if a trial trained past it or stopped at it."""
        for member in bracket.members.values():
            while not bracket.finished and (member.time > bracket.rung or (
                    member.trial.status == Trial.TERMINATED and member.time == bracket.rung < self.max_t)):
                bracket.ranked += 1

    def _may_rank(self, bracket: Bracket) -> bool:
        whole = bracket.whole() or (self.whole_sweep and self.draws is not None and self.draws.is_finished())
        if self.whole_sweep and not whole:
            return False
        return all(bracket.waiting(m) for m in bracket.live())

    def _keep(self, bracket: Bracket, ranked: int) -> int:
        if self.whole_sweep:
            return math.ceil(ranked / self.eta)
        kept = bracket.size
        for _ in range(bracket.ranked + 1):
            kept = math.ceil(kept / self.eta)
        return kept

    def _rank(self, tune_controller, bracket: Bracket, current: Trial | None = None) -> str:
        """Rank the bracket at its rung (again at the next, if every live trial is there already):
        stop the worse, let the better go on; at max_t stop them all. Returns the decision for
        ``current``, the trial reporting now."""
        decision = self.PAUSE
        while True:
            live = bracket.live()
            if bracket.ranked >= len(bracket.rungs) - 1:  # at max_t: finished
                bracket.ranked = len(bracket.rungs)
                for member in live:
                    decision = self._stop(tune_controller, member, current) or decision
                return decision
            ordered = sorted(live, key=self._score)
            keep = min(self._keep(bracket, len(live)), len(ordered))
            good, bad = ordered[len(ordered) - keep:], ordered[:len(ordered) - keep]
            bracket.ranked += 1  # first: stopping a paused trial calls back into on_trial_remove
            for member in bad:
                decision = self._stop(tune_controller, member, current) or decision
            for member in good:
                if bracket.waiting(member):
                    continue
                if member.trial is current:
                    decision = self.CONTINUE
                elif self.bohb is not None:
                    self.bohb.on_unpause(member.trial.trial_id)
            if not all(bracket.waiting(m) for m in bracket.live()):
                return decision

    def _stop(self, tune_controller, member: Member, current: Trial | None) -> str | None:
        member.ended = True
        if member.trial is current:
            return self.STOP
        if member.trial.status == Trial.PAUSED or member.trial.is_saving:  # paused, or pausing (its checkpoint)
            tune_controller.stop_trial(member.trial)
        return None

    def _score(self, member: Member) -> float:
        """Higher is better; no score, or NaN (a diverged trial), ranks last."""
        if member.value is None or math.isnan(member.value):
            return -math.inf
        return member.value if self.mode == "max" else -member.value

    def _runnable(self) -> Trial | None:
        for bracket in self.brackets:
            for member in bracket.live():
                status = member.trial.status
                if status == Trial.PENDING or (status == Trial.PAUSED and not bracket.waiting(member)):
                    return member.trial
        return None


def reported(trial: Trial) -> bool:
    """Whether the trial reported before: a restored one that trained."""
    return trial.last_result.get("step") is not None


class PacedVariants(BasicVariantGenerator):
    """Tune's random and grid generator, drawing while fewer than ``max_concurrent`` trials hold a
    slot by the scheduler's count: a trial paused at a rung holds none, so the trials paused at
    the first rung do not keep the generator from drawing the rest of the bracket."""

    def __init__(self, scheduler: Rungs, max_concurrent: int | None, **options: Any):
        super().__init__(**options)
        self.scheduler, self.pace = scheduler, max_concurrent
        scheduler.draws = self

    def next_trial(self):
        if self.pace is not None and self.scheduler.holding_slots() >= self.pace:
            return None
        return super().next_trial()

    # Tune saves the generator's state (its ``__dict__``) with the experiment and restores it into
    # the generator a resumed sweep builds: without these two, that would ask the saved scheduler.
    def get_state(self) -> dict | bool:
        state = super().get_state()
        return {k: v for k, v in state.items() if k not in ("scheduler", "pace")} if state else state

    def set_state(self, state: dict) -> None:
        scheduler, pace = self.scheduler, self.pace
        super().set_state(state)
        self.scheduler, self.pace = scheduler, pace


def rungs(first: int, count: int, max_t: int, eta: float) -> list[int]:
    """``count`` rungs from ``first``, each ``eta`` times the last (rounded down, at most
    ``max_t``), the last at ``max_t`` whatever power of ``eta`` that is."""
    found = [first]
    while len(found) < count - 1:
        found.append(int(min(found[-1] * eta, max_t)))
    return [*found[:count - 1], max_t]


def halving(*, trials: int, first_rung: int, max_t: int, eta: float, every: int, max_concurrent: int | None,
            metric: str | None, mode: str | None) -> Rungs:
    """Synchronous successive halving of the whole sweep: one bracket of every trial, its rungs
    from ``first_rung`` by ``eta`` up to ``max_t``."""
    count, rung = 1, first_rung
    while rung < max_t:
        count, rung = count + 1, int(rung * eta)
    whole = (trials, rungs(first_rung, count, max_t, eta))

    def plan(index: int) -> tuple[int, list[int]] | None:
        return whole if index == 0 else (trials, [max_t])  # the sweep has no trial beyond the one bracket

    return Rungs(metric=metric, mode=mode, max_t=max_t, eta=eta, every=every, max_concurrent=max_concurrent,
                 whole_sweep=True, plan=plan)


def hyperband(*, max_t: int, eta: float, every: int, max_concurrent: int | None, metric: str | None,
              mode: str | None, bohb: Any) -> Rungs:
    """HyperBand's brackets as BOHB opens them: the largest first (s = s_max … 0), then again;
    bracket s takes ``ceil(s_max_1 / (s + 1) · eta^s)`` trials from rung ``max_t · eta^-s``."""
    s_max_1 = int(round(math.log(max_t) / math.log(eta))) + 1

    def plan(index: int) -> tuple[int, list[int]] | None:
        s = s_max_1 - 1 - index % s_max_1
        first = int(max_t * eta ** -s)
        return (int(math.ceil(s_max_1 / (s + 1) * eta ** s)), rungs(first, s + 1, max_t, eta)) if first else None

    return Rungs(metric=metric, mode=mode, max_t=max_t, eta=eta, every=every, max_concurrent=max_concurrent,
                 whole_sweep=False, plan=plan, bohb=bohb)
