"""GPU paths without a GPU: what stands in for one is in each test's name. Ray's GPU resources
come from ``ray start --num-gpus=2`` with ``CUDA_VISIBLE_DEVICES=98,99`` in its raylet's
environment, as a GPU node's has its GPUs' ids: ids no machine has, so TensorFlow sees no GPU
there on this machine or on one with GPUs, and what a process was given is its
``CUDA_VISIBLE_DEVICES`` (what TensorFlow would list from it, and the strategy built on that,
is tested on logical devices: ``test_train_step.py``)."""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from .cluster_parts import AUTH, free_port, ray_start_head
from .conftest import REPO, cli_environment, run_bounded, run_cli

QUICKSTART = REPO / "configs" / "quickstart.yaml"
SWEEP = REPO / "sweeps" / "quickstart.yaml"
NO_GPU = {"CUDA_VISIBLE_DEVICES": ""}  # what Ray and detsweep count here, on a machine with GPUs too


def latest_ray_session() -> str:
    """The session folder of the cluster Ray last started on this machine."""
    return os.path.realpath("/tmp/ray/session_latest")


def test_a_gpu_asked_of_this_machine_which_has_none_is_one_line_before_a_local_cluster_starts(tmp_path):
    """``train`` and ``launch`` without an address run on a local cluster of this machine: a GPU
    worker would wait for ever there. Refused in one line, exit 2, and no Ray session begun."""
    before = latest_ray_session()
    trained = run_cli("train", str(QUICKSTART), "--set", "scaling.use_gpu=true", "--storage", str(tmp_path / "ray"),
                      cwd=tmp_path, env=NO_GPU)
    assert (trained.returncode, trained.stderr) == (2, (
        f"detsweep: error: {QUICKSTART}: scaling.gpus_per_worker: found 1, expected <= 0 (the most GPUs this machine "
        "has; a cluster's nodes: --address)\n"))
    launched = run_cli("launch", str(SWEEP), "--set", "base.scaling.use_gpu=true", "--set",
                       f"storage={tmp_path / 'ray'}", cwd=tmp_path, env=NO_GPU)
    assert (launched.returncode, launched.stderr) == (2, (
        f"detsweep: error: {SWEEP}: base.scaling.gpus_per_worker: found 1, expected <= 0 (the most GPUs this machine "
        "has; a cluster's nodes: --address)\n"))
    assert latest_ray_session() == before and not (tmp_path / "ray").exists() and not list(tmp_path.iterdir())


@pytest.fixture(scope="module")
def gpu_node(tmp_path_factory) -> Iterator[tuple[str, str]]:
    """``ray start --head --num-cpus=2 --num-gpus=2`` whose GPUs are ids 98 and 99: its address
    and its dashboard's."""
    folder, port = tmp_path_factory.mktemp("gpu-node"), free_port()
    with ray_start_head(folder, port, ["--num-cpus=2", "--num-gpus=2"], {"CUDA_VISIBLE_DEVICES": "98,99"}) as dashboard:
        yield f"127.0.0.1:{port}", dashboard


def train_workers(dashboard: str) -> int:
    """Ray Train workers the cluster has started so far (alive or not)."""
    from ray.util.state import list_actors

    return len(list_actors(address=dashboard, filters=[("class_name", "=", "RayTrainWorker")], limit=1000,
                           raise_on_missing_output=False))


def test_two_workers_whose_tensorflow_sees_no_gpu_fail_their_training_at_its_start_once_in_one_line(gpu_node, tmp_path):
    """Ray gives each of two workers a GPU (CUDA_VISIBLE_DEVICES=98 or 99) that TensorFlow cannot
    see, as on a GPU node whose TensorFlow lacks CUDA. The training fails at its start, saying
    where and what TensorFlow saw: the first worker to find it ends the run (one worker alone
    takes the same path), and Ray Train starts its group once, not once per failure
    ``max_failures`` allows (the same would happen again): no step is trained."""
    address, dashboard = gpu_node
    workers = 2
    before = train_workers(dashboard)
    result = run_cli("train", str(QUICKSTART), "--address", address, "--set", "scaling.use_gpu=true",
                     "--set", f"scaling.num_workers={workers}", "--set", "scaling.max_failures=2",
                     "--set", "train.batch_size=8", "--set", "train.num_steps=4", "--set", "data.val=null",
                     "--storage", str(tmp_path / "ray"), cwd=tmp_path, env=AUTH)  # the cluster's mode
    assert result.returncode == 1, result.stderr[-3000:]
    failed = [line for line in result.stderr.splitlines() if line.startswith("detsweep: training failed: ")]
    assert len(failed) == 1, result.stderr[-3000:]
    [failed] = failed
    assert re.match(f"detsweep: training failed: scaling.use_gpu: found true, but TensorFlow on {os.uname().nodename} "
                    r"sees no GPU \(it sees CPU:0; CUDA_VISIBLE_DEVICES='9[89]'; ", failed), failed
    assert failed.endswith("expected a node whose TensorFlow sees its GPUs (pip install 'tensorflow[and-cuda]')"), failed
    assert "workers failed" not in result.stderr and not re.search(r"^step \d+/", result.stderr, re.M), \
        result.stderr[-3000:]
    assert not list(Path(tmp_path / "ray").rglob("checkpoint_*"))
    assert train_workers(dashboard) - before == workers  # one start of the group


PROBE = r"""
import json, os, sys, tempfile

import ray, ray.train
from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

from detsweep.cluster import connect
from detsweep.config import ScalingConfig
from detsweep.trainables.evaluator import evaluation_task
from detsweep.trainables.trainer import ray_scaling


def seen(scaling):
    # what this process sees, and the strategy a worker of ``scaling`` would plan on it
    from detsweep.train.strategy import NoGPUVisible, plan_strategy, use_worker_devices, visible_gpus

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    try:
        use_worker_devices(scaling)
        planned = plan_strategy(scaling, visible_gpus()).kind.name
    except NoGPUVisible:
        planned = "refused: TensorFlow sees no GPU"
    return {"CUDA_VISIBLE_DEVICES": visible, "planned": planned}


def worker(config):
    with open(config["out"], "w") as out:
        json.dump(seen(config["scaling"]), out)


connect(sys.argv[1])
found = {}
with tempfile.TemporaryDirectory() as scratch:
    out, scaling = os.path.join(scratch, "worker.json"), ScalingConfig()
    DataParallelTrainer(worker, train_loop_config={"scaling": scaling, "out": out}, scaling_config=ray_scaling(scaling),
                        run_config=ray.train.RunConfig(storage_path=scratch, name="cpu-worker")).fit()
    found["cpu worker"] = json.load(open(out))
# a CPU trial's evaluation beside training: a task with the options Ray Train starts it with
options = evaluation_task(ScalingConfig(), channel=None, pictures=False).ray_remote_kwargs
found["cpu evaluator"] = ray.get(ray.remote(seen).options(**options).remote(ScalingConfig()))
found["one gpu"] = ray.get(ray.remote(lambda: os.environ.get("CUDA_VISIBLE_DEVICES")).options(num_gpus=1).remote())
print(json.dumps(found))
"""


def test_each_process_sees_exactly_the_gpus_ray_gave_it_and_a_cpu_trial_plans_on_its_cpu(gpu_node):
    """Through ``detsweep.cluster.connect`` (the job's environment sets
    RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=1): a CPU trial's Ray Train worker and its evaluation
    task see no GPU and plan the CPU's strategy; a task given a GPU sees that one alone (a GPU
    worker's: the test above, whose line shows it). (With the variable at Ray's default, 0,
    the CPU processes saw the node's two GPUs, "98,99": measured while writing this test.)"""
    address, _ = gpu_node
    found = run_probe(address)
    assert found["cpu worker"] == found["cpu evaluator"] == {"CUDA_VISIBLE_DEVICES": "", "planned": "DEFAULT"}, found
    assert found["one gpu"] in ("98", "99"), found


def run_probe(address: str, env: dict[str, str] | None = None) -> dict:
    result = run_bounded([sys.executable, "-c", PROBE, address], cwd=REPO, env=cli_environment({**AUTH, **(env or {})}),
                         timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])
