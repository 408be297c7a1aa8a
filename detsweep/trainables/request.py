"""What a process asks of Ray Train for one training: built once, by whoever starts the
training (a sweep's trial in ``trial.run_trial``, ``detsweep train``, ``detsweep finetune``),
handed to Ray Train's workers as it is, and unpacked once there (``worker.train_loop_per_worker``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from detsweep.config import TrialConfig
from detsweep.startup import StartupClock


@dataclass(frozen=True)
class TrainingRequest:
    config: TrialConfig  # validated where it was read: the workers trust it
    name: str  # Ray Train's run: a new one at every start (a trial's next start must not resume it)
    storage: str | None = None  # Ray Train's storage: a folder or a bucket's URI (default: Ray's)
    restore_from: str | None = None  # a checkpoint to start from while Ray Train has none of its own
    pictures: bool = False  # rank 0 draws its detections at every evaluation, for MLflow
    system_metrics: bool = False  # each node's first worker logs its node's system metrics to the MLflow run
    startup: StartupClock = field(default_factory=StartupClock)  # started when the training was asked for
    # A sweep's sampled values (dotted path → value): the workers refuse to train what differs
    # from them (train/trained_with.py); none outside a sweep (`detsweep train`, a lone `finetune`).
    sampled: dict[str, Any] = field(default_factory=dict)
