"""The training of one trial on one worker: strategy, train step, evaluation, checkpoints."""

from .loop import Reporter, TrainingDiverged, WorkerContext, run_training

__all__ = ["Reporter", "TrainingDiverged", "WorkerContext", "run_training"]
