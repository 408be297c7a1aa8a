"""How a training's reports travel from its Ray Train workers to the process that owns the run.

Ray Train's ``ray.train.report`` is made for checkpoints: each worker has a result queue of
one entry, and the controller empties it when it polls its workers (every 2 s by Ray's
default, 0.5 s by detsweep's unless the user sets it: :data:`detsweep.adapters.ray.POLL_INTERVAL`).
A worker that reported every loop trained at most one loop per poll. Ray's guidance is to
send per-step metrics to experiment tracking from the workers themselves; ours go to the
process that owns the MLflow run (the trial's, or ``detsweep train``'s driver) through a
:class:`RunChannel`, an actor that process owns:

- every loop, rank 0 hands its metrics to :class:`LoopSender`, whose thread puts them on the
  channel: the training thread never waits for a poll;
- at a milestone (an evaluation or a checkpoint) every worker calls ``ray.train.report``, as
  Ray Train requires, once rank 0's sender has delivered every loop before it: a worker group
  restarted from that checkpoint has lost nothing that came before it;
- Ray Train's controller puts every report it receives on the same channel
  (:class:`ForwardReports`), and :func:`in_step_order` merges the two: each step once, in
  order, a milestone as Ray Train's report of it with its checkpoint, so Tune and fault
  tolerance see exactly what they saw when every loop went through Ray Train;
- with ``train.evaluation: async`` a milestone's checkpoint is evaluated by a Ray task of its
  own (Ray Train's ``ValidationConfig``, :mod:`.evaluator`), which puts the metrics on the same
  channel; the merge adds them to the milestone's report, so Tune, MLflow and the progress lines
  see them at the checkpoint's step, as if the workers had evaluated inline;
- pictures (PNG files an evaluation drew, and the schedule's with the first loop) travel beside
  the metrics, from rank 0 or the evaluation task, never through Ray Train: the owner gets each
  step as one :class:`Report` (metrics, checkpoint, pictures);
- a training that diverged ends its run rather than fail its workers: Ray Train restarts failed
  workers from their last checkpoint (``scaling.max_failures``), where the same steps would
  diverge again. Rank 0 sends the reason after its last loop (:class:`TrainingFailed`), and the
  merge raises it once every step before it was passed on; so it does the reason
  ``trainer.fit()`` raised, which ends the run (:class:`RunEnded`). A worker whose devices are
  not what the trial was sized for, or that built other than what the trial sampled, says so
  before its first loop (``at_start``), and the merge raises at once: Ray Train's restarts would
  find the same.

Six kinds of message in all: a loop, Ray Train's report, an evaluation (or its failure),
failed workers, a failed training, the end.

The channel carries three values the other way, published by the owner: the MLflow run the
workers log their nodes' system metrics to (known only once the owner opened it, which it
does while Ray Train starts the workers), the last evaluated step the owner passed on (an
evaluation task waits for it before Ray Train may delete the checkpoint), and that Tune is
stopping the trial (:data:`STOPPING`). Tune ends a stopped trial's process, and its workers
with it, where no ``finally`` runs: each node's monitor publishes when it started under its
node (:data:`MONITOR` + node id: a restarted worker group's replaces the one before it), logs
its last sample when the owner says stop, and publishes the same time under
:data:`MONITOR_ENDED` + node id, which the owner waits for.
"""

from __future__ import annotations

import asyncio
import queue as local
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import ray.train

from detsweep.errors import failure_reason
from detsweep.startup import NewSteps

STOPPING = "stopping"  # published by the owner when Tune stops the trial
MONITOR, MONITOR_ENDED = "monitor/", "monitor_ended/"  # + a node's id: when its monitor started, and ended


class RunChannel:
    """A run's reports, in the order they were put, and the values its owner publishes; an
    actor on the owner's node (Ray Train puts its controller there too), so that a worker node
    lost mid-run takes only workers with it. Its handle travels to the workers, the controller
    and the evaluation tasks."""

    def __init__(self):
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        self.actor = ray.remote(ChannelActor).options(num_cpus=0, scheduling_strategy=here).remote()

    def put(self, item: Any) -> None:
        ray.get(self.actor.put.remote(item))

    def get(self) -> Any:
        """The next report; waits for one."""
        return ray.get(self.actor.get.remote())

    def qsize(self) -> int:
        """Reports put and not yet taken."""
        return ray.get(self.actor.qsize.remote())

    def publish(self, name: str, value: Any) -> None:
        ray.get(self.actor.publish.remote(name, value))

    def read(self, name: str, timeout_s: float, at_least: Any = None) -> Any:
        """The value published as ``name`` (once it is ``at_least``), waiting up to ``timeout_s``; None if none came."""
        return ray.get(self.actor.read.remote(name, timeout_s, at_least))

    def named(self, prefix: str) -> dict[str, Any]:
        """Every value published so far under a name that starts with ``prefix``; nothing waits."""
        return ray.get(self.actor.named.remote(prefix))


class ChannelActor:
    def __init__(self):
        self.reports: asyncio.Queue = asyncio.Queue()
        self.values: dict[str, Any] = {}
        self.published = asyncio.Condition()

    async def put(self, item: Any) -> None:
        self.reports.put_nowait(item)

    async def get(self) -> Any:
        return await self.reports.get()

    async def qsize(self) -> int:
        return self.reports.qsize()

    async def publish(self, name: str, value: Any) -> None:
        async with self.published:
            self.values[name] = value
            self.published.notify_all()

    async def named(self, prefix: str) -> dict[str, Any]:
        return {name: value for name, value in self.values.items() if name.startswith(prefix)}

    async def read(self, name: str, timeout_s: float, at_least: Any) -> Any:
        def ready() -> bool:
            return name in self.values and (at_least is None or self.values[name] >= at_least)

        async def wait() -> Any:
            async with self.published:
                await self.published.wait_for(ready)
                return self.values[name]

        try:
            return await asyncio.wait_for(wait(), timeout_s)
        except TimeoutError:
            return None


@dataclass(frozen=True)
class LoopMetrics:
    """One loop's metrics and pictures, from rank 0; ``milestone``: Ray Train gets a report of
    this step too; ``evaluated_elsewhere``: and an evaluation task gets its checkpoint."""

    step: int
    metrics: dict[str, Any]
    milestone: bool
    at: float = 0.0  # when the loop ended, by rank 0's clock (time.time())
    evaluated_elsewhere: bool = False
    pictures: dict[str, bytes] = field(default_factory=dict)  # artifact path → PNG bytes


@dataclass(frozen=True)
class RayReport:
    """A report as Ray Train's controller received it (rank 0's metrics), with its checkpoint."""

    step: int
    metrics: dict[str, Any]
    checkpoint: ray.train.Checkpoint | None


@dataclass(frozen=True)
class Evaluation:
    """The metrics and pictures of a checkpoint evaluated off the training path, and when that
    ran (time.time()); or, with ``failure``, why it could not be scored."""

    step: int
    metrics: dict[str, Any]
    started: float = 0.0
    ended: float = 0.0
    pictures: dict[str, bytes] = field(default_factory=dict)
    failure: str | None = None


@dataclass(frozen=True)
class TrainingFailed:
    """From rank 0, after its last loop: training ended for a reason a restart would not mend.
    ``at_start``: from any worker, before its first loop (its devices are not what the trial
    was sized for, or what it built is not what was sampled): the run ends at once, before Ray
    Train restarts the group to no avail."""

    reason: str
    at_start: bool = False


class RunError(RuntimeError):
    """The run cannot go on; the message is why, in one line."""


class EvaluationError(RunError):
    """An evaluation off the training path failed: the run has no score at that step."""


@dataclass(frozen=True)
class WorkersFailed:
    """Ray Train's poll found failed workers: it restarts the group from its latest checkpoint,
    or, past ``max_failures``, ends the run."""

    reason: str


@dataclass(frozen=True)
class RunEnded:
    """``trainer.fit()`` returned, or raised for ``failure``: nothing more will come."""

    failure: str | None = None


@dataclass(frozen=True)
class Report:
    """One step as the run's owner gets it: its metrics, the checkpoint saved at it, and the
    pictures drawn at it (artifact path → PNG bytes)."""

    step: int
    metrics: dict[str, Any]
    checkpoint: ray.train.Checkpoint | None = None
    pictures: dict[str, bytes] = field(default_factory=dict)


class ForwardReports(ray.train.UserCallback):
    """Runs in Ray Train's controller: every report it receives goes on the run's channel."""

    def __init__(self, reports: RunChannel):
        self.reports = reports

    def after_report(self, run_context, metrics, checkpoint) -> None:
        self.reports.put(RayReport(int(metrics[0]["step"]), metrics[0], checkpoint))

    def after_exception(self, run_context, worker_exceptions: dict[int, Exception]) -> None:
        reasons = sorted({failure_reason(error) for error in worker_exceptions.values()})
        self.reports.put(WorkersFailed("; ".join(reasons)))


class RunNotes(Protocol):
    """What the owner of a run is told beside its reports: it never changes what is passed on."""

    def note_replayed(self, step: int) -> None:
        """``step`` was trained again after it was passed on (a restart went back to a checkpoint)."""

    def note_worker_failure(self, reason: str) -> None:
        """Ray Train found failed workers (and restarts them from the latest checkpoint)."""


class _NoNotes:
    def note_replayed(self, step: int) -> None:
        pass

    def note_worker_failure(self, reason: str) -> None:
        pass


NO_NOTES = _NoNotes()


class LoopSender:
    """Rank 0's end of the channel: :meth:`send` returns at once, a thread delivers in order."""

    def __init__(self, reports: RunChannel):
        self.reports = reports
        self.pending: local.Queue[LoopMetrics | TrainingFailed] = local.Queue()
        self.failure: BaseException | None = None
        threading.Thread(target=self._deliver, name="detsweep-loop-sender", daemon=True).start()

    def send(self, loop: LoopMetrics | TrainingFailed) -> None:
        self.pending.put(loop)

    def flush(self) -> None:
        """Wait until everything sent so far is on the channel."""
        self.pending.join()
        if self.failure is not None:
            raise RuntimeError(f"the run's report channel is gone: {self.failure}") from self.failure

    def _deliver(self) -> None:
        while True:
            loop = self.pending.get()
            try:
                if self.failure is None:
                    self.reports.put(loop)
            except BaseException as error:  # the owner of the channel is gone; flush() says so
                self.failure = error
            finally:
                self.pending.task_done()


def in_step_order(reports: RunChannel | local.Queue, settled: Callable[[int], None] = lambda step: None,
                  notes: RunNotes = NO_NOTES) -> Iterator[Report]:
    """Every step once, in step order, until the run ends: a loop's metrics, or for a milestone
    Ray Train's report of it with its checkpoint, and the evaluation of that checkpoint when it
    ran elsewhere (the loops after a milestone wait here, never in the worker, until all of it
    arrived), with the pictures drawn at it. A step trained again after a restart replaces one
    not yet passed on; one already passed on is dropped (:class:`detsweep.startup.NewSteps`),
    and ``notes`` hears of it (a restart that went back further than its checkpoint shows
    there), as of failed workers. ``settled(step)`` is called once an evaluated step was passed
    on (and its consumer returned) or dropped: only then may Ray Train delete that checkpoint.
    Raises :class:`EvaluationError` when an evaluation failed, and :class:`RunError` at the end
    of a run whose training failed (every step before passed on)."""
    loops: dict[int, LoopMetrics] = {}
    received: dict[int, RayReport] = {}
    evaluations: dict[int, Evaluation] = {}
    steps = NewSteps()
    failed: str | None = None
    ended: RunEnded | None = None
    while ended is None:
        item = reports.get()
        if isinstance(item, RunEnded):
            ended = item
        elif isinstance(item, TrainingFailed) and item.at_start:
            raise RunError(item.reason)
        elif isinstance(item, TrainingFailed):
            failed = item.reason
        elif isinstance(item, WorkersFailed):  # a restarted group sends its own reason if it fails again
            failed = None
            notes.note_worker_failure(item.reason)
        elif isinstance(item, Evaluation) and item.failure is not None:
            raise EvaluationError(f"the evaluation of step {item.step} failed: {item.failure}")
        elif isinstance(item, Evaluation):
            evaluations[item.step] = item
        elif isinstance(item, RayReport):
            received[item.step] = item
        else:
            loops[item.step] = item
        for step in sorted(loops.keys() | received.keys() | evaluations.keys()):
            loop, report, evaluation = loops.get(step), received.get(step), evaluations.get(step)
            if ended is None and _incomplete(loop, report, evaluation):
                break  # its report (with the checkpoint) or its evaluation is on the way
            loops.pop(step, None), received.pop(step, None), evaluations.pop(step, None)
            source = report or loop
            metrics = steps.admit(step, source.metrics if source else {"step": step})
            if metrics is None:
                notes.note_replayed(step)
            else:
                steps.passed(step)
                pictures = (loop.pictures if loop else {}) | (evaluation.pictures if evaluation else {})
                yield Report(step, metrics | evaluation.metrics if evaluation else metrics,
                             report.checkpoint if report else None, pictures)
            if evaluation is not None:
                settled(step)
    if failed is not None or ended.failure is not None:
        raise RunError(failed if failed is not None else ended.failure)


def _incomplete(loop: LoopMetrics | None, report: RayReport | None, evaluation: Evaluation | None) -> bool:
    if loop is None:  # rank 0 sends a loop before its report; an evaluation comes after both
        return report is None
    return (loop.milestone and report is None) or (loop.evaluated_elsewhere and evaluation is None)
