"""The training of one trial on one worker: strategy, train step, evaluation, checkpoints."""

from .loop import Milestone, Reporter, TrainingDiverged, WorkerContext, run_training

__all__ = ["Milestone", "Reporter", "TrainingDiverged", "WorkerContext", "run_training"]
