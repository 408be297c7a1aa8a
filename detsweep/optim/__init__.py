"""Optimizers, learning-rate schedules and moving averages with the TF OD API's semantics."""

from .ema import MovingAverage
from .optimizers import build_optimizer, unwrap
from .schedules import build_schedule, schedule_landmarks

__all__ = ["MovingAverage", "build_optimizer", "build_schedule", "schedule_landmarks", "unwrap"]
