"""What a cluster holds or can grow to, and whether one Ray Train worker fits on it.

A cluster that autoscales is sized by its node types, as the autoscaler reads them from the
cluster config (``ray up`` writes it to ``~/ray_bootstrap_config.yaml`` on the head, with
every type's resources filled in): a trial that fits a type with no node up yet is launched,
and the autoscaler starts nodes for it. A cluster started by hand is sized by its nodes alive.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import yaml

from detsweep.config import ScalingConfig
from detsweep.errors import DetsweepError

# Where ``ray up`` leaves the cluster config on the head: the one its autoscaler runs on.
BOOTSTRAP_CONFIG = "~/ray_bootstrap_config.yaml"
ALIVE = "the nodes alive"
THIS_MACHINE = "this machine"  # a local cluster's, before it starts


@dataclass(frozen=True)
class NodeType:
    name: str
    resources: dict[str, float]  # one node's: CPU, GPU, and any custom resource
    count: int  # how many such nodes the cluster can have at once (alive: how many are up)
    head: bool = False  # the head itself, which a config's max_workers does not count


@dataclass(frozen=True)
class Capacity:
    """The nodes trials are sized against: a cluster config's node types at their most, or the
    nodes alive. ``source`` names it in messages: ``ray_cluster.yaml``, ``the nodes alive``."""

    types: tuple[NodeType, ...]
    source: str
    max_workers: int | None = None  # the config's bound on worker nodes of every type together

    @property
    def autoscales(self) -> bool:
        return self.max_workers is not None


def worker_request(scaling: ScalingConfig) -> dict[str, float]:
    """One Ray Train worker's resources, as ``trainables.trainer.ray_scaling`` asks for them."""
    request = {"CPU": float(scaling.cpus_per_worker)}
    if scaling.use_gpu:
        request["GPU"] = float(scaling.gpus_per_worker)
    return request


def slots(node: dict[str, float], request: dict[str, float]) -> int:
    """How many workers asking for ``request`` one node holds."""
    return min((math.floor((node.get(name, 0.0) + 1e-9) / amount) for name, amount in request.items() if amount > 0),
               default=10**9)


def check_worker_fits(scaling: ScalingConfig, capacity: Capacity, where: str) -> None:
    """A worker of ``scaling`` fits some node type of ``capacity``; else one line naming the
    field at ``where`` (``FILE: scaling``)."""
    request = worker_request(scaling)
    if any(slots(kind.resources, request) for kind in capacity.types):
        return
    for name, field in (("CPU", "cpus_per_worker"), ("GPU", "gpus_per_worker")):
        largest = max((kind.resources.get(name, 0.0) for kind in capacity.types), default=0.0)
        if request.get(name, 0.0) > largest:
            raise DetsweepError(f"{where}.{field}: found {request[name]:g}, "
                                f"expected <= {largest:g} (the most {name}s {_any_node(capacity)} has{_hint(capacity)})")
    shown = ", ".join(f"{name} {amount:g}" for name, amount in request.items())
    raise DetsweepError(f"{where}: found a worker of {shown}, expected one that "
                        f"{_any_node(capacity)} holds ({'; '.join(_described(kind) for kind in capacity.types)})")


def _any_node(capacity: Capacity) -> str:
    return f"any node type in {capacity.source}" if capacity.autoscales else \
        "any node alive" if capacity.source == ALIVE else THIS_MACHINE if capacity.source == THIS_MACHINE else "any node"


def _hint(capacity: Capacity) -> str:
    if capacity.source == THIS_MACHINE:
        return "; a cluster's nodes: --address"
    return "; for the node types an autoscaler can add: --cluster-config FILE" if capacity.source == ALIVE else ""


def _described(kind: NodeType) -> str:
    return f"{kind.name}: " + ", ".join(f"{name} {amount:g}" for name, amount in kind.resources.items()
                                        if name in ("CPU", "GPU"))


def this_machine() -> Capacity:
    """What a local cluster of this machine will hold, known before Ray starts."""
    return Capacity((NodeType(THIS_MACHINE, {"CPU": float(os.cpu_count() or 1), "GPU": float(local_gpus())}, 1),),
                    THIS_MACHINE)


def local_gpus() -> int:
    """The GPUs Ray will find here: the ones ``CUDA_VISIBLE_DEVICES`` lists when it is set (Ray
    reads it too), else every GPU the NVIDIA driver has registered."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([device for device in visible.split(",") if device.strip() not in ("", "-1")])
    registered = Path("/proc/driver/nvidia/gpus")
    return len(list(registered.iterdir())) if registered.is_dir() else 0


def nodes_alive() -> Capacity:
    import ray

    alive = [node["Resources"] for node in ray.nodes() if node.get("Alive")]
    return Capacity(tuple(NodeType(f"node {i}", resources, 1) for i, resources in enumerate(alive)), ALIVE)


def from_cluster_config(path: str | Path) -> Capacity:
    """The node types of a Ray cluster config, each at its ``max_workers``, and the head,
    bounded by the config's ``max_workers`` (which does not count the head)."""
    where = str(path)
    try:
        config = yaml.safe_load(Path(path).expanduser().read_text())
    except (OSError, yaml.YAMLError) as error:
        raise DetsweepError(f"{where}: found no readable cluster config ({str(error).splitlines()[0]})") from None
    types = config.get("available_node_types") if isinstance(config, dict) else None
    if not isinstance(types, dict) or not types:
        raise DetsweepError(f"{where}: available_node_types: found {types!r}, expected Ray's node types "
                            "(a mapping of names to resources, min_workers and max_workers)")
    head = config.get("head_node_type")
    kinds = []
    for name, kind in types.items():
        resources = (kind or {}).get("resources")
        if not isinstance(resources, dict) or not resources or not all(
                isinstance(v, (int, float)) and v >= 0 for v in resources.values()):
            raise DetsweepError(f"{where}: available_node_types.{name}.resources: found {resources!r}, expected "
                                'what one node holds, e.g. {"CPU": 8, "GPU": 1}')
        resources = {k: float(v) for k, v in resources.items()}
        if name == head:
            kinds.append(NodeType(name, resources, 1, head=True))
        if int(kind.get("max_workers", 0) or 0):
            kinds.append(NodeType(name, resources, int(kind["max_workers"])))
    return Capacity(tuple(kinds), os.path.basename(where), max_workers=int(config.get("max_workers", 10**9)))

def cluster_capacity() -> tuple[Capacity, str | None]:
    """The capacity of the cluster this process is connected to: the config ``ray up`` left on
    this machine when it is the head, else the nodes alive (with a line to say so: trials that
    need nodes the autoscaler would add are refused)."""
    if Path(BOOTSTRAP_CONFIG).expanduser().is_file():
        return from_cluster_config(BOOTSTRAP_CONFIG), None
    return nodes_alive(), ("sizing trials against the nodes alive now: no cluster config was found "
                           f"({BOOTSTRAP_CONFIG} or --cluster-config FILE) to say what the cluster can grow to")
