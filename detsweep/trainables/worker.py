"""``train_loop_per_worker``: what Ray Train runs in each worker process of a trial."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from pathlib import Path

import ray.train

from detsweep.config import TrialConfig
from detsweep.startup import StartupClock

from .channel import MONITOR, MONITOR_ENDED, STOPPING, LoopMetrics, LoopSender, RunChannel, TrainingFailed
from .request import TrainingRequest

LIFETIME_S = 7 * 24 * 3600.0  # a monitor waits this long for a stop: longer than any trial


def quiet_info_logging() -> None:
    """Warnings and errors only from this worker's loggers: Ray Train sets the root logger at INFO,
    and logs every report there in full; our progress lines already say what matters, and
    detsweep's own workers log nothing below a warning."""
    logging.getLogger().setLevel(logging.WARNING)


def fine_tune_source(config: TrialConfig) -> contextlib.AbstractContextManager[Path]:
    """``train.fine_tune.checkpoint`` as a local folder: a ``models:/`` or ``runs:/`` source is downloaded
    from the run's tracking server into a scratch folder that lasts the block."""
    from detsweep.tracking.backend import resolve_backend
    from detsweep.tracking.source import local_copy

    return local_copy(config.train.fine_tune.checkpoint, resolve_backend(config.tracking).uri)


def schedule_picture(config: TrialConfig) -> dict[str, bytes]:
    """The learning-rate schedule's picture, for the run's first report: drawn here, where
    TensorFlow is loaded already (the run's owner has none)."""
    from detsweep.evaluation.pictures import SCHEDULE_FILE
    from detsweep.optim.report import schedule_png

    return {SCHEDULE_FILE: schedule_png(config)}


class NodeMonitor:
    """MLflow's system metrics of this node (CPU, memory, disk, network; GPUs with nvidia-ml-py)
    on the trial's run, from the node's first worker, named ``system/node<rank>/…`` when the
    trial spans several nodes. Started after the first loop, off the training thread: MLflow's
    import and the wait for the run (which the trial's process opens while the workers start)
    stay off the start-up's path. It logs a sample at once and its last at the trial's end,
    whatever its length: at ``close`` when training ends on its own, and when the trial's owner
    publishes :data:`STOPPING` (Tune is about to end the process, and the workers with it).
    MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL sets how often it samples in between (10 s)."""

    def __init__(self, channel: RunChannel, node_id: str | None):
        self.channel, self.node_id, self.monitor = channel, node_id, None
        self.started, self.lock, self.ended = threading.Event(), threading.Lock(), False
        self.node, self.since = ray.get_runtime_context().get_node_id(), time.time()
        try:  # before the owner can look: a stop waits for this monitor's last sample
            channel.publish(MONITOR + self.node, self.since)
        except Exception as error:  # a courtesy: training goes on without it
            logging.getLogger(__name__).warning("no last system metrics at a stop: %s", error)
        threading.Thread(target=self._run, name="detsweep-system-metrics", daemon=True).start()

    def _run(self) -> None:
        self._start()
        self.started.set()
        try:
            if self.channel.read(STOPPING, timeout_s=LIFETIME_S) is not None:
                self.close()
                self.channel.publish(MONITOR_ENDED + self.node, self.since)
        except Exception as error:  # the channel went with its owner: nobody waits for the last sample
            logging.getLogger(__name__).warning("no stop came through the run's channel: %s", error)

    def _start(self) -> None:
        try:
            target = self.channel.read("system_metrics", timeout_s=60)
            if target is None:
                raise TimeoutError("the trial's MLflow run was not open within 60 s")
            from detsweep.adapters.mlflow import start_system_metrics

            self.monitor = start_system_metrics(target["run_id"], target["uri"], self.node_id)
        except Exception as error:  # a courtesy, like the pictures: training goes on without it
            logging.getLogger(__name__).warning("no system metrics: %s", error)

    def close(self) -> None:
        """The last sample, once, whoever asks first (the training's end or the owner's stop)."""
        self.started.wait(timeout=60)
        with self.lock:
            if self.monitor is None or self.ended:
                return
            self.ended = True
            try:  # a tracking server away at the training's end must not fail the training
                self.monitor.finish()
            except Exception as error:
                logging.getLogger(__name__).warning("the node's last system metrics were not logged: %s", error)


def node_label() -> str | None:
    """``node<rank>`` when the trial's workers span several nodes, else None."""
    context = ray.train.get_context()
    return f"node{context.get_node_rank()}" if context.get_local_world_size() < context.get_world_size() else None


def train_loop_per_worker(loop_config: dict) -> None:
    """Train as the run's :class:`TrainingRequest` asks: resume from Ray's latest checkpoint when
    there is one (a restarted worker group), else from ``request.restore_from`` (a Tune
    checkpoint: PBT, a resumed sweep); train; rank 0 sends every loop's metrics down the run's
    channel, and every worker reports each milestone to Ray Train (Ray keeps rank 0's metrics;
    checkpoints come from rank 0), see :mod:`.channel`."""
    request: TrainingRequest = loop_config["request"]
    channel: RunChannel = loop_config["channel"]
    latest = ray.train.get_checkpoint()
    # A worker group Ray Train restarted times its own start: the trial's began long before.
    startup = request.startup if not latest else StartupClock()
    startup.mark("workers")
    from detsweep.train import (  # TensorFlow loads here only
        DevicesNotAsSized,
        Milestone,
        NotAsSampled,
        TrainingDiverged,
        WorkerContext,
        run_training,
        with_first_report_extras,
    )

    startup.mark("imports")
    quiet_info_logging()
    config = request.config
    rank = ray.train.get_context().get_world_rank()
    sender = LoopSender(channel) if rank == 0 else None
    monitors = request.system_metrics and ray.train.get_context().get_local_rank() == 0
    monitor: NodeMonitor | None = None

    def first_report_extras() -> tuple[dict, dict[str, bytes]]:
        """The start-up's phases, and the schedule's picture (drawn after the first loop)."""
        return startup.metrics(), (schedule_picture(config) if request.pictures and sender else {})

    def report(metrics: dict, checkpoint_dir: Path | None, milestone: Milestone, pictures: dict[str, bytes]) -> None:
        nonlocal monitor
        if monitors and monitor is None:  # after the first loop: see NodeMonitor
            monitor = NodeMonitor(channel, node_label())
        elsewhere = milestone is Milestone.EVALUATE
        if sender:
            sender.send(LoopMetrics(int(metrics["step"]), metrics, milestone is not Milestone.NONE, time.time(),
                                    evaluated_elsewhere=elsewhere, pictures=pictures))
        if milestone is Milestone.NONE:
            return
        if sender:  # every loop before this checkpoint is delivered: a restart from it loses none
            sender.flush()
        checkpoint = ray.train.Checkpoint.from_directory(str(checkpoint_dir)) if checkpoint_dir and rank == 0 else None
        # Ray Train takes the validation request from the worker whose checkpoint it keeps: rank 0.
        ray.train.report(metrics, checkpoint=checkpoint, validation=elsewhere and checkpoint is not None)

    if latest is None and request.restore_from:
        latest = ray.train.Checkpoint(request.restore_from)
    try:
        with contextlib.ExitStack() as stack:
            restore_from = Path(stack.enter_context(latest.as_directory())) if latest else None
            # A fine-tune starts from another training's checkpoint unless it resumes its own.
            fine_tune = config.train.fine_tune if restore_from is None else None
            fine_tune_from = stack.enter_context(fine_tune_source(config)) if fine_tune else None
            context = WorkerContext(rank=rank, restore_from=restore_from, pictures=request.pictures,
                                    startup=startup, fine_tune_from=fine_tune_from, sampled=request.sampled)
            run_training(config, with_first_report_extras(report, first_report_extras), context)
    except TrainingDiverged as diverged:
        # Not a fault for Ray Train to restart the workers from (max_failures): from their last
        # checkpoint the same steps diverge again. Every worker ends here, at the same step (the
        # loss is all-reduced), and the run ends with the reason.
        if sender:
            sender.send(TrainingFailed(str(diverged)))
    except (DevicesNotAsSized, NotAsSampled) as wrong:
        # Devices not as sized, or a sampled value not in what was built: the same at every
        # restart, so not a failure for Ray Train to restart the group from (max_failures):
        # whichever worker finds it tells the run's owner, which ends the run at once (a worker
        # still waiting for this one at the strategy ends with it).
        channel.put(TrainingFailed(str(wrong), at_start=True))
    finally:
        if sender:  # a failed training's loops, too, reach the run before its error does
            sender.flush()
        if monitor:
            monitor.close()
