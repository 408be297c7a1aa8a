"""The training of one trial on one worker: strategy, train step, evaluation, checkpoints."""

from .loop import Milestone, Reporter, TrainingDiverged, WorkerContext, run_training, with_first_report_extras
from .strategy import DevicesNotAsSized, NoGPUVisible
from .trained_with import NotAsSampled

__all__ = ["DevicesNotAsSized", "Milestone", "NoGPUVisible", "NotAsSampled", "Reporter", "TrainingDiverged", "WorkerContext",
           "run_training", "with_first_report_extras"]
