"""What one trial occupies on a Ray cluster, and how many trials fit side by side (what the
cluster holds: ``preflight.capacity``)."""

from __future__ import annotations

import math

from detsweep.adapters.ray import HEAD_NODE_RESOURCE
from detsweep.preflight.capacity import Capacity, check_worker_fits, slots, worker_request

from .spec import Sweep

# The trial's own process only waits on its Ray Train workers, so it takes no CPU (a
# fraction would keep the last worker of a full node from starting). Tune refuses an empty
# request, so it asks for a little memory instead. It runs on the head, as Ray's own state
# actors do (by the head's own resource): Ray Train's controller runs where it runs, and a
# worker node reclaimed mid-trial (a spot instance) then takes only training workers with it,
# which Ray Train restarts from the last checkpoint on a node the autoscaler adds.
TRIAL_DRIVER = {"CPU": 0, "memory": 64 * 1024**2, HEAD_NODE_RESOURCE: 0.001}


def workers_per_trial(sweep: Sweep) -> int:
    """Its Ray Train workers and, with ``train.evaluation: async``, its evaluation task (one
    worker's resources)."""
    return sweep.base.scaling.num_workers + (sweep.base.train.evaluation == "async")


def check_fits(sweep: Sweep, capacity: Capacity) -> None:
    """Every Ray Train worker must fit on some node type (a trial waits forever otherwise)."""
    check_worker_fits(sweep.base.scaling, capacity, f"{sweep.path}: base.scaling")


def trials_at_once(sweep: Sweep, capacity: Capacity) -> int:
    """How many trials the cluster fits side by side once grown to its most nodes."""
    request = worker_request(sweep.base.scaling)
    per_node = sorted(((slots(kind.resources, request), kind.count, kind.head) for kind in capacity.types), reverse=True)
    workers, nodes_left = 0, capacity.max_workers
    for held, count, head in per_node:  # the config's bound on worker nodes spent on the types that hold most
        taken = count if nodes_left is None or head else min(count, nodes_left)
        workers += held * taken
        nodes_left = nodes_left if nodes_left is None or head else nodes_left - taken
    return workers // workers_per_trial(sweep)


def nodes_wanted(capacity: Capacity, bundles: list[dict[str, float]]) -> tuple[int, str] | None:
    """How many nodes of which type would hold ``bundles`` (workers waiting to be placed): the
    first type of the config that holds one, as the autoscaler would add; None when none does."""
    for kind in capacity.types:
        held = min((slots(kind.resources, bundle) for bundle in bundles), default=0)
        if held:
            return math.ceil(len(bundles) / held), kind.name
    return None
