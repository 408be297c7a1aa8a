"""What an optimizer config will do: the Keras optimizer, its hyperparameters, the schedule."""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from detsweep.config import LearningRateConfig, TrialConfig
from detsweep.config.loader import plain

from .optimizers import build_optimizer, unwrap
from .schedules import build_schedule, schedule_landmarks


def learning_rates(config: LearningRateConfig, steps: Sequence[int]) -> list[float]:
    """The schedule's learning rate at each step, computed by the same TF code training uses."""
    rates = build_schedule(config)(np.asarray(steps, dtype=np.int64)).numpy()
    return [float(rate) for rate in rates]


def schedule_png(config: TrialConfig) -> bytes:
    """The learning rate at every step of the trial, plotted from the same code training uses."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = list(range(0, config.train.num_steps + 1, max(1, config.train.num_steps // 500)))
    figure, axes = plt.subplots(figsize=(6, 3.5), layout="constrained")
    axes.plot(steps, learning_rates(config.optimizer.learning_rate, steps))
    axes.set(xlabel="step", ylabel="learning rate", title=f"{config.optimizer.learning_rate.type} schedule")
    axes.grid(alpha=0.3)
    out = io.BytesIO()
    figure.savefig(out, format="png", dpi=72)
    plt.close(figure)
    return out.getvalue()


def optimizer_report(config: TrialConfig, steps: Sequence[int]) -> dict[str, Any]:
    """The report of ``detsweep optimizer --json``."""
    optimizer = build_optimizer(
        config.optimizer,
        clip_norm=config.train.gradient_clipping_by_norm,
        mixed_precision=config.train.mixed_precision,
    )
    inner = unwrap(optimizer)
    hyperparameters = {k: plain(v) for k, v in inner.get_config().items() if k != "learning_rate"}
    if inner is not optimizer:
        hyperparameters["loss_scaling"] = "dynamic"
    moving = config.optimizer
    return {
        "optimizer": type(inner).__name__,
        "hyperparameters": hyperparameters,
        "moving_average": {
            "enabled": moving.use_moving_average,
            "decay": moving.moving_average_decay if moving.use_moving_average else None,
            "dynamic": moving.use_moving_average and moving.moving_average_dynamic_decay,
        },
        "steps": [int(step) for step in steps],
        "learning_rate": learning_rates(config.optimizer.learning_rate, steps),
    }


def plot_schedule(config: LearningRateConfig, last_step: int, path: str | Path, title: str = "") -> None:
    """Draw the schedule from step 0 to ``last_step`` with its warm-up, hold and burn-in shaded."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    steps = _plot_steps(config, last_step)
    figure, axis = plt.subplots(figsize=(8, 4.5))
    axis.plot(steps, learning_rates(config, steps), color="tab:blue", linewidth=1.8, label=config.type)
    colours = iter(["tab:orange", "tab:green", "tab:purple"])
    for name, (start, stop) in schedule_landmarks(config).items():
        if stop > start:
            axis.axvspan(start, min(stop, last_step), alpha=0.18, color=next(colours), label=f"{name} ({start}–{stop})")
    if config.type == "manual_step":
        for entry in config.schedule:
            axis.axvline(entry.step, color="grey", linestyle=":", linewidth=1)
    axis.set_xlabel("training step")
    axis.set_ylabel("learning rate")
    axis.set_xlim(0, last_step)
    axis.set_ylim(bottom=0)
    axis.set_title(title or f"learning-rate schedule: {config.type}")
    axis.grid(alpha=0.3)
    axis.legend(loc="best")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def _plot_steps(config: LearningRateConfig, last_step: int) -> np.ndarray:
    """About 2000 evenly spread steps, plus both sides of every jump so staircases stay sharp."""
    edges = [entry.step for entry in config.schedule]
    if config.type == "exponential_decay" and config.staircase:
        edges += list(range(config.burnin_steps, last_step + 1, config.decay_steps))[:2000]
    for start, stop in schedule_landmarks(config).values():
        edges += [start, stop]
    edges = np.asarray(edges, dtype=np.int64)
    spread = np.linspace(0, last_step, num=min(last_step + 1, 2000)).astype(np.int64)
    steps = np.concatenate([spread, edges, edges - 1])
    return np.unique(steps[(steps >= 0) & (steps <= last_step)])

