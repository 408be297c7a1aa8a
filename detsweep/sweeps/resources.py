"""What one trial occupies on a Ray cluster, and how many trials fit side by side."""

from __future__ import annotations

from .spec import Sweep

# The trial's own process only waits on its Ray Train workers, so it takes no CPU (a
# fraction would keep the last worker of a full node from starting). Tune refuses an empty
# request, so it asks for a little memory instead.
TRIAL_DRIVER = {"CPU": 0, "memory": 64 * 1024**2}


def trials_at_once(sweep: Sweep, cpus: float, gpus: float) -> int:
    """How many trials the cluster fits side by side, from each trial's Ray Train workers and,
    with ``train.evaluation: async``, its evaluation task (one worker's resources)."""
    scaling = sweep.base.scaling
    workers = scaling.num_workers + (sweep.base.train.evaluation == "async")
    fits = [(cpus + 1e-9) // (workers * scaling.cpus_per_worker)]
    if scaling.use_gpu and scaling.gpus_per_worker:
        fits.append(gpus // (workers * scaling.gpus_per_worker))
    return max(0, int(min(fits)))
