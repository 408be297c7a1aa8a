"""The MLflow child run of one trial, as the trial's own process writes it (what others add to
it: ``trainables/trial.py``).

A trial that Ray Train restarts after a worker failure, or that ``detsweep resume`` runs
again, finds its run by the ``detsweep.trial_id`` tag and continues it: params already
logged are not logged again, and metrics at steps already logged are skipped (the steps
between a checkpoint and a failure are trained twice; the run keeps the first values). The
steps trained twice are not hidden: the run's ``detsweep.replayed_steps`` tag lists them as
ranges (``12-16, 32-36``), so a restart that went back further than its last checkpoint shows;
``detsweep.worker_failures`` counts Ray Train's restarts of the workers, with the last reason.

Each checkpoint becomes a LoggedModel of the run (:mod:`.checkpoint_models`): complete when
READY, and only the best and the latest are kept.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from detsweep.config import TrialConfig
from detsweep.startup import NewSteps

from .backend import use_writer_settings
from .checkpoint_models import keep_best_and_latest, log_checkpoint
from .datasets import dataset_inputs
from .pages import first_run
from .provenance import run_environment_tags
from .writer import RetryingWriter

log = logging.getLogger(__name__)

TRIAL_TAG = "detsweep.trial_id"
ROLE_TAG = "detsweep.role"
PARENT_TAG = "mlflow.parentRunId"
METRIC_TAG, MODE_TAG = "detsweep.metric", "detsweep.mode"  # what ranks the run's checkpoints
REPLAYED_TAG = "detsweep.replayed_steps"
ERROR_TAG = "detsweep.error"  # why a trial failed, as its run ended
INFEASIBLE_TAG = "detsweep.infeasible"  # why a trial was never trained: the constraints its architecture breaks
WORKER_FAILURES_TAG = "detsweep.worker_failures"
MAX_PARAMS_PER_CALL = 100  # MLflow's log_batch limit


@dataclass(frozen=True)
class RunLink:
    """What a trial needs to find its sweep's runs; it travels in Tune's ``param_space``."""

    uri: str
    experiment_id: str
    parent_run_id: str | None  # None: a run of its own (a fine-tune from a checkpoint folder)

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def flatten(tree: Any, prefix: str = "") -> dict[str, str]:
    """A nested config as MLflow params with dotted keys; lists as their YAML flow text."""
    if isinstance(tree, dict):
        flat: dict[str, str] = {}
        for key, value in tree.items():
            flat.update(flatten(value, f"{prefix}{key}."))
        return flat
    text = yaml.safe_dump(tree, default_flow_style=True).strip().removesuffix("...").strip()
    return {prefix.rstrip("."): text}


def ranked_by(run) -> tuple[str, str]:
    """The metric and mode that rank a trial run's checkpoints (a run older than the tags: the default sweep's)."""
    return run.data.tags.get(METRIC_TAG, "eval/AP_best"), run.data.tags.get(MODE_TAG, "max")


def find_trial_run(client, link: RunLink, trial_id: str):
    nested = f" and tags.`{PARENT_TAG}` = '{link.parent_run_id}'" if link.parent_run_id else ""
    return first_run(client, [link.experiment_id], f"tags.`{TRIAL_TAG}` = '{trial_id}'{nested}")


@dataclass(frozen=True)
class TrialIdentity:
    """Which trial a run records (Tune's id and name), the values the sweep gave it, and what
    ranks its checkpoints."""

    trial_id: str
    name: str
    swept: dict[str, Any] = field(default_factory=dict)
    metric: str = "eval/AP_best"
    mode: str = "max"


class TrialRun:
    """Logs one trial's reports; every call returns at once (see :class:`RetryingWriter`)."""

    def __init__(self, link: RunLink, trial: TrialIdentity, config: TrialConfig, start_step: int = 0,
                 tags: dict[str, str] | None = None):
        """``start_step``: where a resumed trial starts (its swept values are logged there);
        ``tags``: for a new run, beyond the ones every trial's run has (a fine-tune's source).
        Returns at once: MLflow is imported (about 2 s) and the run opened on the writer's thread."""
        use_writer_settings()  # a trial's process has them from its start: then this writes nothing
        self.client = None  # made by the first write (``_open``)
        self.link, self.trial_id, self.trial_name, self.config = link, trial.trial_id, trial.name, config
        self.metric, self.mode = trial.metric, trial.mode
        self.tags = {TRIAL_TAG: trial.trial_id, ROLE_TAG: "trial", METRIC_TAG: trial.metric, MODE_TAG: trial.mode}
        self.tags |= {PARENT_TAG: link.parent_run_id} if link.parent_run_id else {}
        self.tags |= run_environment_tags() | (tags or {})  # what this process, the trial's, runs on
        self.run_id: str | None = None
        self.reopened = False  # the run was found: a resumed trial's
        self.opened = threading.Event()  # run_id is known
        self.steps = NewSteps()  # the last step logged; what a replayed start carried (start-up, restore)
        self.replayed = ReplayedSteps()
        self.notices = itertools.count()  # numbers each report and note: a retried write counts its replay once
        self.counted_notice = -1  # the last of them whose replay is in ``replayed``
        self.earlier_failures = 0  # worker failures the run's tag held when it was reopened
        self.noted_failures = 0  # worker failures this object was told of
        self.logged: tuple[int, list] | None = None  # the last step logged and its points, for its checkpoint
        # Checkpoints are uploaded from copies: Ray Train drops its own (num_to_keep) on its
        # schedule, which need not wait for a writer that lags behind a slow server.
        self.snapshots = Path(tempfile.mkdtemp(prefix="detsweep-checkpoints-"))
        self.writer = RetryingWriter()
        self.writer.submit("opening the run", self._open)
        numeric = {f"hparams/{path}": float(v) for path, v in trial.swept.items() if isinstance(v, (int, float))}
        # Swept values as metrics too: PBT changes them mid-run, and params cannot change.
        self.writer.submit("the swept values", lambda: self._log_metrics(start_step, numeric, force=True))

    def _open(self) -> None:
        """Finds the trial's run (a resumed trial) or makes it. A retry after a partial failure
        goes on from where the last attempt stopped: a run this object made is never taken for
        a resumed one, and its config and datasets are still written."""
        if self.client is None:
            from mlflow import MlflowClient

            self.client = MlflowClient(self.link.uri)
        if self.run_id is None:
            run = find_trial_run(self.client, self.link, self.trial_id)
            if run is not None:
                self._reopen(run)
                # A first start killed before it wrote its config (a driver killed as its trials
                # opened their runs): written now; a run that has its params keeps them (PBT's
                # next values are its hparams/ metrics, and params cannot change).
                if not run.data.params:
                    self._log_config()
                elif not (run.inputs and run.inputs.dataset_inputs):
                    self._log_datasets()
                self.reopened = True
                return
            self.run_id = self.client.create_run(self.link.experiment_id, run_name=self.trial_name,
                                                 tags=self.tags).info.run_id
            self.opened.set()
        elif self.reopened:
            return
        self._log_config()

    def _reopen(self, run) -> None:
        """A resumed trial's run: where it got to. ``run_id`` is set last, so a retry after a
        failed read finds the run again rather than skipping what was not read; ``reopened`` is
        set once what its first start left unwritten is written (a retry writes the config)."""
        self.client.update_run(run.info.run_id, status="RUNNING")
        history = self.client.get_metric_history(run.info.run_id, "train/loss")
        self.steps = NewSteps(max((m.step for m in history), default=-1))
        self.replayed = ReplayedSteps.parse(run.data.tags.get(REPLAYED_TAG, ""))
        failures = run.data.tags.get(WORKER_FAILURES_TAG)
        self.earlier_failures = int(failures.split(":")[0]) if failures else 0
        self.run_id = run.info.run_id
        self.opened.set()

    def _log_config(self) -> None:
        """Params, ``config.yaml`` and the dataset inputs; each is the same when written twice."""
        from mlflow.entities import Param

        params = [Param(k, v) for k, v in flatten(self.config.model_dump(mode="json")).items()]
        for start in range(0, len(params), MAX_PARAMS_PER_CALL):
            self.client.log_batch(self.run_id, params=params[start:start + MAX_PARAMS_PER_CALL])
        self.client.log_text(self.run_id, yaml.safe_dump(self.config.model_dump(mode="json"), sort_keys=False),
                             "config.yaml")
        self._log_datasets()

    def _log_datasets(self, attempts: int = 3) -> None:
        """The run's dataset inputs. Trials that start together log the same new datasets, and
        one may make a dataset between MLflow's read (not there) and its insert: MLflow refuses
        that insert as a bad request (the datasets' key is experiment, name and digest). Logging
        inputs writes only what is missing, so the next attempt finds the other's dataset; any
        other failure goes to the writer's retries."""
        from mlflow.exceptions import MlflowException

        datasets = dataset_inputs(self.config)  # reads the annotation files' sizes: once
        for attempt in range(1, attempts + 1):
            try:
                self.client.log_inputs(self.run_id, datasets=datasets)
                return
            except MlflowException as refused:
                if refused.error_code != "BAD_REQUEST" or attempt == attempts:
                    raise
                log.info("MLflow: logging the datasets again after a conflict with another trial: %s", refused)

    def when_open(self, call: Callable[[dict[str, str]], None]) -> None:
        """``call`` with this run's id and tracking URI (``run_id``, ``uri``) once it is open, on the
        writer's thread: the trial publishes them for its workers' system metrics."""
        def publish() -> None:
            try:
                call({"run_id": self.run_id, "uri": self.link.uri})
            except Exception as error:  # a courtesy: the workers go on without system metrics
                log.warning("MLflow: the run's id did not reach the workers: %s", error)

        self.writer.submit("the run's id, for the workers", publish)

    def log_dict(self, value: dict[str, Any], name: str) -> None:
        """A JSON artifact (``warm_start.json``: what a fine-tune restored)."""
        self.writer.submit(name, lambda: self.client.log_dict(self.run_id, value, name))

    def log_report(self, metrics: dict[str, Any], checkpoint=None, pictures: dict[str, bytes] | None = None) -> None:
        """One step's report: its metrics at its step, its checkpoint when it has one, and the
        pictures drawn at it as files (artifact path → PNG bytes; a step trained twice, after
        a restart, overwrites its own)."""
        step, now, notice = int(metrics.get("step", 0)), int(time.time() * 1000), next(self.notices)
        values = {k: float(v) for k, v in metrics.items() if "/" in k and isinstance(v, (int, float))}
        self.writer.submit(f"metrics at step {step}", lambda: self._log_metrics(step, values, now, notice))
        for path, png in (pictures or {}).items():
            self.writer.submit(path, functools.partial(self._log_picture, path, png))
        if checkpoint is not None:
            copy = self._snapshot(checkpoint, step)
            self.writer.submit(f"the checkpoint at step {step}", lambda: self._log_checkpoint(copy, step))

    def note_infeasible(self, reason: str) -> None:
        """The trial's architecture breaks the sweep's constraints: it is never trained."""
        self.writer.submit("why it is not trained", lambda: self.client.set_tag(self.run_id, INFEASIBLE_TAG, reason))

    def note_replayed(self, step: int) -> None:
        """``step`` was trained again after it was reported (a restart from an earlier checkpoint)."""
        notice = next(self.notices)
        self.writer.submit(f"the replayed step {step}", lambda: self._note_replayed(step, notice))

    def note_worker_failure(self, reason: str) -> None:
        """Ray Train found failed workers; it restarts them from the latest checkpoint. Counted
        here, once: the writer may run the tag's write several times while a server is away."""
        self.noted_failures += 1
        noted = self.noted_failures
        self.writer.submit("a worker failure", lambda: self.client.set_tag(
            self.run_id, WORKER_FAILURES_TAG, f"{self.earlier_failures + noted}: {reason}"[:5000]))

    def _note_replayed(self, step: int, notice: int | None) -> None:
        if notice is None or notice != self.counted_notice:  # not a retry of a write that failed after counting it
            self.replayed.add(step)
            self.counted_notice = notice if notice is not None else self.counted_notice
        self.client.set_tag(self.run_id, REPLAYED_TAG, str(self.replayed))

    def _log_metrics(self, step: int, values: dict[str, float], now: int | None = None, notice: int | None = None,
                     force: bool = False) -> None:
        from mlflow.entities import Metric

        if force:  # values from here on; never at a step this key already has
            step = max(step, self.steps.last + 1)
        elif (admitted := self.steps.admit(step, values)) is None:  # a resumed trial went back to its checkpoint
            self._note_replayed(step, notice)
            self.logged = None  # a checkpoint at this step is not what scored the run's values here
            return
        else:
            values = admitted  # with what was carried, until written: a failed write is retried whole
        if not values:
            return
        points = [Metric(k, v, now or int(time.time() * 1000), step) for k, v in values.items()]
        self.client.log_batch(self.run_id, metrics=points)
        if not force:
            self.steps.passed(step)
            self.logged = (step, points)
            self.replayed.close_range()

    def _log_picture(self, path: str, png: bytes) -> None:
        """``png`` as the run's artifact ``path`` (``detections/step_000200.png``)."""
        folder, _, name = path.rpartition("/")
        with tempfile.TemporaryDirectory() as scratch:
            (Path(scratch) / name).write_bytes(png)
            self.client.log_artifact(self.run_id, str(Path(scratch) / name), folder or None)

    def _snapshot(self, checkpoint, step: int) -> Path:
        """The checkpoint's files under this run's scratch folder: hard links where the
        filesystem allows (instant, and they outlive Ray deleting the original), else copies."""
        copy = self.snapshots / f"step_{step:06d}"
        shutil.rmtree(copy, ignore_errors=True)  # a step trained twice, after a restart
        with checkpoint.as_directory() as directory:
            shutil.copytree(directory, copy, copy_function=_link_or_copy)
        return copy

    def _log_checkpoint(self, directory: Path, step: int) -> None:
        """A new READY checkpoint, scored by what the run logged at its step; then the run keeps
        only its best and latest. A retry after a partial upload starts a new model: the
        unfinished one stays PENDING until this prune deletes it."""
        scored = self.logged[1] if self.logged and self.logged[0] == step else []
        log_checkpoint(self.client, self.link.experiment_id, self.run_id, directory, step, scored)
        keep_best_and_latest(self.client, self.link.experiment_id, self.run_id, self.metric, self.mode)
        shutil.rmtree(directory, ignore_errors=True)

    def finish(self, error: str | None = None, timeout_s: float = 120.0) -> None:
        """The trial ended on its own: FINISHED, or FAILED with its reason."""
        if error is not None:
            self.writer.submit("the error", lambda: self._log_error(error))
        status = "FAILED" if error is not None else "FINISHED"
        self.writer.submit("the run's end", lambda: self.client.set_terminated(self.run_id, status))
        self.close(timeout_s)

    def _log_error(self, error: str) -> None:
        self.client.log_text(self.run_id, error + "\n", "error.txt")
        self.client.set_tag(self.run_id, ERROR_TAG, error[:5000])

    def close(self, timeout_s: float = 10.0) -> None:
        lost = self.writer.close(timeout_s)
        shutil.rmtree(self.snapshots, ignore_errors=True)
        if lost and (reason := self._tag_lost_writes(lost)):  # the server is still away: into the trial's log
            log.warning("MLflow: run %s of trial %s lost %d writes (%s): %s", self.run_id, self.trial_id, len(lost),
                        reason, "; ".join(lost))

    def _tag_lost_writes(self, lost: list[str]) -> str | None:
        """Lists ``lost`` on the run's ``detsweep.lost_writes`` tag; why it could not, if it could not."""
        if self.run_id is None:
            return "the run was never opened"
        try:
            self.client.set_tag(self.run_id, "detsweep.lost_writes", "; ".join(lost)[:5000])
            return None
        except Exception as error:
            return type(error).__name__


class ReplayedSteps:
    """Steps reported again, as ranges: a restart that went back replays one, split where a
    step arrives for the first time (one the lost worker never passed on)."""

    def __init__(self, ranges: list[list[int]] | None = None):
        self.ranges = ranges or []
        self.open = False  # the last range grows until a new step is logged

    def add(self, step: int) -> None:
        if self.open and step > self.ranges[-1][1]:
            self.ranges[-1][1] = step
        else:
            self.ranges.append([step, step])
            self.open = True

    def close_range(self) -> None:
        self.open = False

    def __str__(self) -> str:
        return ", ".join(f"{first}-{last}" for first, last in self.ranges)

    @classmethod
    def parse(cls, text: str) -> ReplayedSteps:
        return cls([[int(n) for n in part.split("-")] for part in text.split(", ") if part])


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:  # another filesystem, or one without hard links
        shutil.copy2(source, target)
