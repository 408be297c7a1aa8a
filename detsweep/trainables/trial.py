"""The Tune function trainable: one trial = one Ray Train run of the trial's config.

Every loop's report reaches the trial's own process in step order (:mod:`.channel`) as one
:class:`.channel.Report`: metrics, checkpoint, pictures. This process writes it to the trial's
MLflow run, then passes those that carry the sweep's metric (the evaluations, with their
checkpoints) on to Tune. So Tune's schedulers decide on ``eval/…`` at training-step
granularity, and Tune keeps its own copies of the checkpoints (for PBT, pausing, ``resume``).

Who writes the trial's MLflow run:

- this process, everything the trial reports: params, config and datasets, every step's
  metrics, pictures (as files), checkpoints (each a LoggedModel; only the best and latest are
  kept), replayed steps and worker failures; when Tune stops the trial, its stop waits for
  these writes before Tune ends the process (:func:`ending_on_stop`);
- each node's first worker, that node's system metrics (``worker.NodeMonitor``, MLflow's own
  monitor, on the run this process publishes once it is open), its last sample too when this
  process says that Tune stops the trial (:func:`last_samples`);
- the sweep's driver, as Tune completes the trial (``sweeps/closing.py``; at the sweep's end
  what is left, ``tracking.sweep_run.close_sweep_run``): the status of a run its trial could
  not end itself (KILLED for a stopped trial), ``early_stopped`` and what the trial cost.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import ray.tune
from ray.tune.trainable.function_trainable import wrap_function

from detsweep.checkpoints import checkpoint_uri, read_step
from detsweep.cluster import remove_run_folders
from detsweep.config import TrialConfig, validate
from detsweep.config.loader import get_path, plain, set_path
from detsweep.errors import DetsweepError
from detsweep.evaluation.objectives import Constraint, broken
from detsweep.startup import StartupClock
from detsweep.tracking.trial_run import RunLink, TrialIdentity, TrialRun

from .channel import MONITOR, MONITOR_ENDED, STOPPING, Report, RunChannel
from .request import TrainingRequest
from .trainer import ProgressLines, stream_training

log = logging.getLogger(__name__)

INFEASIBLE = "infeasible"  # in a trial's Tune result: why it was not trained (the constraints it breaks)


def trial_tree(tune_config: dict[str, Any]) -> dict[str, Any]:
    """The trial's config tree: the sampled tree, plus the grid point's dotted overrides, in
    Python's own types (BOHB draws NumPy scalars: ``np.str_('sgd')``, ``np.int64(30)``)."""
    tree = copy.deepcopy(tune_config.get("trial", {}))
    for dotted, value in tune_config.get("point", {}).items():
        set_path(tree, dotted, value)
    return plain(tree)


def trial_config(tune_config: dict[str, Any]) -> TrialConfig:
    """Validated as a config file is: a combination the searcher drew that cannot train is
    the trial's one-line failure (``path: found X, expected Y``)."""
    return validate(TrialConfig, trial_tree(tune_config), "the trial's sampled config")


def swept_values(tune_config: dict[str, Any], paths: list[str]) -> dict[str, Any]:
    """The values a trial's Tune config gives to the swept ``paths`` (grid points included)."""
    tree = trial_tree(tune_config)
    return {dotted: get_path(tree, dotted) for dotted in paths}


def serving_cost(tune_config: dict[str, Any], config: TrialConfig) -> dict[str, float]:
    """The trial's architecture's ``serve/*`` metrics, when the sweep measured them."""
    costs = tune_config.get("serving")  # each architecture's as (metric, value) pairs
    return dict(costs[config.model.architecture_key(config.model.num_classes or 0)]) if costs else {}


def run_trial(tune_config: dict[str, Any]) -> None:
    startup = StartupClock()
    try:
        config = trial_config(tune_config)
    except DetsweepError as error:
        raise TrialFailed(str(error)) from None
    context = ray.tune.get_context()
    restore = ray.tune.get_checkpoint()  # PBT's exploit, or a resumed sweep
    run = open_trial_run(tune_config, config, restore)  # on its writer's thread, while Ray Train starts
    # A new Ray Train run at every start: one with the same name would resume from its own
    # latest checkpoint, not from the one Tune hands over (PBT's exploit must win).
    started = time.strftime("%Y%m%d-%H%M%S")
    runs = f"{context.get_experiment_name()}-train-{context.get_trial_id()}-"
    name = f"{runs}{started}"
    metric = tune_config["search"]["metric"]
    serving = serving_cost(tune_config, config)
    if serving:  # the architecture's, measured before the sweep's trials started (sweeps/serving.py)
        run.log_report({"step": 0, **serving})
    if reason := broken([Constraint.parse(text, "") for text in tune_config["search"].get("constraints", [])], serving):
        not_trained(tune_config, run, reason, serving)
        return

    def to_tune(report: Report) -> None:
        if metric in report.metrics:  # the evaluations: what schedulers and searchers decide on
            # Tune's own class, on the same filesystem: a checkpoint in a bucket stays there.
            checkpoint = report.checkpoint
            reported = ray.tune.Checkpoint(checkpoint.path, checkpoint.filesystem) if checkpoint else None
            ray.tune.report(report.metrics | serving, checkpoint=reported)

    request = training_request(tune_config, config, name, restore, startup)
    channel = RunChannel()
    end = TrialEnd(run, tune_config.get("storage"), runs, channel)
    try:
        reason = train_and_log(request, run, to_tune, channel=channel)
    except BaseException:  # Tune stopped it at a report (SystemExit there), or training broke
        end()
        raise
    end(reason, finished=True)
    if reason:
        raise TrialFailed(reason)


def training_request(tune_config: dict[str, Any], config: TrialConfig, name: str, restore: ray.tune.Checkpoint | None,
                     startup: StartupClock) -> TrainingRequest:
    """What the trial asks of Ray Train: its config, from ``restore`` (a Tune checkpoint) when
    there is one, pictures and system metrics for its run, and its sampled values, which the
    workers hold what they build to (``train/trained_with.py``)."""
    return TrainingRequest(config, name, tune_config.get("storage"), checkpoint_uri(restore) if restore else None,
                           pictures=True, system_metrics=True, startup=startup,
                           sampled=swept_values(tune_config, tune_config["search"]["swept"]))


def not_trained(tune_config: dict[str, Any], run: TrialRun, reason: str, serving: dict[str, float]) -> None:
    """A trial whose architecture breaks a constraint: its run says why and holds its serving
    cost; Tune hears the cost, and NaN for what only training would tell (the objectives, the
    sweep's metric), so that every searcher and scheduler takes the trial as scoring nothing."""
    search = tune_config["search"]
    untold = {metric: float("nan") for metric in [search["metric"], *search.get("objectives", [])]
              if metric not in serving}
    run.note_infeasible(reason)
    run.finish()
    ray.tune.report({"step": 0, **serving, **untold, INFEASIBLE: reason})


def train_and_log(request: TrainingRequest, run: TrialRun, on_report: Callable[[Report], None],
                  progress: bool = False, channel: RunChannel | None = None) -> str | None:
    """Train as ``request`` asks through Ray Train; every report goes to ``run`` (MLflow: its
    metrics, checkpoint and pictures), to this process's console when ``progress``, then to
    ``on_report``; a step trained again after a restart, and failed workers, are noted on
    ``run``. The workers start while ``run`` opens, and (``request.system_metrics``) log their
    nodes' system metrics to it once it is open. ``channel``: the training's, when the caller
    keeps it (a trial's, to ask for the last samples when Tune stops it). Returns why training
    failed, or None."""
    channel = channel or RunChannel()
    run.when_open(lambda target: channel.publish("system_metrics", target))
    lines = ProgressLines(request.config.train.num_steps) if progress else None

    def log(report: Report) -> None:
        run.log_report(report.metrics, report.checkpoint, report.pictures)
        if lines:
            lines(report)
        on_report(report)

    return stream_training(request, log, notes=run, channel=channel)


def open_trial_run(tune_config: dict[str, Any], config: TrialConfig, restore) -> TrialRun:
    start_step = 0
    if restore is not None:
        with restore.as_directory() as directory:
            start_step = read_step(directory)
    context = ray.tune.get_context()
    search = tune_config["search"]
    trial = TrialIdentity(context.get_trial_id(), context.get_trial_name(), swept_values(tune_config, search["swept"]),
                          search["metric"], search["mode"])
    return TrialRun(RunLink(**tune_config["tracking"]), trial, config, start_step)


TRIAL_ACTOR = "Trial"  # the class name Ray lists a trial's actor by (ending_on_stop sets it)

# How long a trial that Tune stops may take to write what it reported (its last checkpoint,
# above all) before Tune ends its process; the writer retries a server that is away every 10 s.
STOP_GRACE_S = 60.0
# How long it waits first for its nodes' last system metrics (a monitor still starting imports MLflow):
# a stopped trial's process may take this and STOP_GRACE_S before Tune ends it.
LAST_SAMPLES_GRACE_S = 15.0


class TrialEnd:
    """What a trial leaves however it ends, done once: its MLflow run closed with every write
    done (or listed on it as lost), and, when its training ended, its Ray Train runs' folders
    deleted. The trial's own thread ends it when training returns or breaks, Tune's stop when
    Tune stops the trial (:func:`ending_on_stop`)."""

    current: TrialEnd | None = None  # this process's trial: Tune runs one trial per process

    def __init__(self, run: TrialRun, storage: str | None, runs: str, channel: RunChannel | None = None):
        self.run, self.storage, self.runs, self.channel = run, storage, runs, channel
        self.lock = threading.Lock()  # a second caller waits until the first is done
        self.ended = False
        TrialEnd.current = self

    def __call__(self, error: str | None = None, finished: bool = False) -> None:
        """``finished``: training ended on its own (FINISHED, or FAILED with ``error``);
        otherwise the run stays as it is for the sweep's driver to end, and the trial's Ray Train
        runs for its next start or the sweep's end to delete (a stopped or paused trial)."""
        with self.lock:
            if self.ended:
                return
            self.ended = True
            if not finished:  # stopped: Tune waits here, so only for what must not be lost
                if self.channel is not None:
                    last_samples(self.channel)
                self.run.close(STOP_GRACE_S)
                return
            self.run.finish(error=error)
            # Tune copied every checkpoint it was handed into the trial's folder, and a trial that
            # starts again (PBT, a resumed sweep) starts a new Ray Train run from one of those: the
            # trial's runs would only pile up in the storage, one a start. A stopped trial's go at
            # its next start's end, or at the sweep's (``sweeps/launch.py:finish``).
            remove_run_folders(self.storage, self.runs)


def last_samples(channel: RunChannel, grace_s: float = LAST_SAMPLES_GRACE_S) -> None:
    """Tune is about to end this process, and the trial's workers with it: each node's monitor
    that started logs its last system metrics first (``worker.NodeMonitor``), within ``grace_s``
    for them all."""
    try:
        started = channel.named(MONITOR)
        if not started:
            return
        channel.publish(STOPPING, True)
        deadline = time.monotonic() + grace_s
        late = [name for name, since in started.items()
                if channel.read(MONITOR_ENDED + name.removeprefix(MONITOR), max(0.0, deadline - time.monotonic()),
                                at_least=since) is None]
        if late:
            log.warning("the last system metrics of %d of %d nodes did not come within %.0f s", len(late),
                        len(started), grace_s)
    except Exception as error:  # a courtesy, like the metrics themselves: the stop goes on
        log.warning("the nodes' last system metrics were not asked for: %s", error)


def ending_on_stop(function: Callable[[dict[str, Any]], None]) -> type:
    """``function`` as Tune's trainable, whose :class:`TrialEnd` runs before Tune ends its
    process. Tune stops a trial (a scheduler's STOP or PAUSE, a PBT exploit, the sweep's end or
    time budget) with ``stop``, which releases the trial's thread at its report (SystemExit
    there) and returns; Tune then ends the process, threads and all. Ending the trial in
    ``stop`` first gives the trial's own writer the time to upload what it reported: nobody
    else uploads its checkpoints. Tune reusing the actor for another trial (``reuse_actors``, as
    ``bench/large_sweep.py --reuse`` does) ends the trial the same way first.
    ``function`` may carry its resources (``tune.with_resources``)."""

    class Trial(wrap_function(function)):  # with ``function``'s resources (``tune.with_resources``)
        def cleanup(self) -> None:
            try:
                super().cleanup()
            finally:
                if TrialEnd.current is not None:
                    TrialEnd.current()

        def reset_config(self, new_config: dict[str, Any]) -> bool:
            # Tune hands this actor the next trial (``reuse_actors``) once this one's thread is
            # gone, and waits for it only a moment: the trial ends first, as at a stop.
            if TrialEnd.current is not None:
                TrialEnd.current()
            return super().reset_config(new_config)

    Trial.__qualname__ = TRIAL_ACTOR
    return Trial


class TrialFailed(RuntimeError):
    """The trial's training failed; the message is its reason in one line."""


