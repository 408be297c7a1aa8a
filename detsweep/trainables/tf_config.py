"""TF_CONFIG for a trial's workers, set by a Ray Train backend that does not import TensorFlow.

Ray's own ``TensorflowConfig`` lives in ``ray.train.tensorflow``, whose package imports
TensorFlow: every process that builds or runs the trainer would import it, the trial's
process and Ray Train's controller included, for ~7 s of CPU each before the first worker
starts (bench/RESULTS.md). This backend does what Ray's does, from a module that needs
only Ray, so TensorFlow loads once per worker and nowhere else.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass

import ray
from ray.train.backend import Backend, BackendConfig


@dataclass
class TensorflowWorkers(BackendConfig):
    """Ray Train's ``TensorflowConfig``: each worker gets TF_CONFIG, the list of all workers'
    addresses and its own index, which MultiWorkerMirroredStrategy reads."""

    @property
    def backend_cls(self):
        return _TensorflowWorkersBackend


class _TensorflowWorkersBackend(Backend):
    def on_start(self, worker_group, backend_config: TensorflowWorkers) -> None:
        addresses = worker_group.execute(free_address)
        ray.get([worker_group.execute_single_async(index, set_tf_config, addresses, index)
                 for index in range(len(worker_group))])


def free_address() -> str:
    """``host:port`` of a free port on this worker's node, for TensorFlow's collectives."""
    host = ray.util.get_node_ip_address()
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.bind(("", 0))
        port = probe.getsockname()[1]
    return f"[{host}]:{port}" if family == socket.AF_INET6 else f"{host}:{port}"


def set_tf_config(addresses: list[str], index: int) -> None:
    os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": addresses}, "task": {"type": "worker", "index": index}})
