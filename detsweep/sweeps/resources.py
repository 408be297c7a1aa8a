"""What one trial occupies on a Ray cluster, and how many trials fit side by side."""

from __future__ import annotations

from .spec import Sweep

# The trial's own process only waits on its Ray Train workers; Tune refuses 0 CPUs.
TRIAL_DRIVER_CPUS = 0.01


def trials_at_once(sweep: Sweep, cpus: float, gpus: float) -> int:
    """How many trials the cluster fits side by side, from each trial's Ray Train workers."""
    scaling = sweep.base.scaling
    fits = [cpus // (scaling.num_workers * scaling.cpus_per_worker + TRIAL_DRIVER_CPUS)]
    if scaling.use_gpu and scaling.gpus_per_worker:
        fits.append(gpus // (scaling.num_workers * scaling.gpus_per_worker))
    return max(0, int(min(fits)))
