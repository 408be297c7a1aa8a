"""The names of the metrics a training reports, by its config: what a sweep may rank its
trials by, or stop them on. ``train/loop.py`` and ``train/evaluate.py`` write them; a test
holds this list to what a real training reports."""

from __future__ import annotations

from detsweep.config import TrialConfig

from .coco import REPORTED

# Every loop's (train/loop.py: loop_metrics).
TRAINING = ("train/loss", "train/box_loss", "train/classification_loss", "train/lr", "train/images_per_sec")
# Every evaluation's, beside COCO's (train/evaluate.py: the val set's loss terms).
LOSSES = ("loss", "box_loss", "classification_loss")


# What each architecture costs to serve, measured before the trials (``sweeps/serving.py``);
# its int8 file's too when the sweep asks (``search.serving_cost: int8``).
SERVING = ("serve/latency_ms", "serve/size_mb", "serve/params")
SERVING_INT8 = ("serve/int8_latency_ms", "serve/int8_size_mb")


def reported_metrics(config: TrialConfig) -> list[str]:
    """Every loop's metrics, then (with a val set) every evaluation's, COCO's and the loss terms:
    the raw weights', the moving average's when there is one, and ``eval/AP_best``, the better
    AP of the two."""
    names = list(TRAINING)
    if config.data.val is not None:
        names += [f"eval/{name}" for name in (*REPORTED, *LOSSES)]
        if config.optimizer.use_moving_average:
            names += [f"eval_ema/{name}" for name in (*REPORTED, *LOSSES)]
        names.append("eval/AP_best")
    return names
