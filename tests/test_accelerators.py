"""GPU paths without a GPU: what stands in for one is in each test's name. Ray's GPU resources
come from ``ray start --num-gpus`` on this CPU machine, where TensorFlow sees none."""

from __future__ import annotations

import os
import re
from pathlib import Path

from .cluster_parts import AUTH, free_port, ray_start_head
from .conftest import REPO, run_cli

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


def test_a_worker_whose_tensorflow_sees_no_gpu_on_a_ray_start_num_gpus_cluster_fails_at_its_start_in_one_line(tmp_path):
    """``ray start --num-gpus=1`` here: Ray gives the worker a GPU (CUDA_VISIBLE_DEVICES=0) that
    TensorFlow cannot see, as on a GPU node whose TensorFlow lacks CUDA. The training fails at
    its start, saying where and what TensorFlow saw, and Ray Train does not restart it (the
    same would happen again): no step is trained."""
    port = free_port()
    with ray_start_head(tmp_path, port, ["--num-cpus=1", "--num-gpus=1"], {}):
        result = run_cli("train", str(QUICKSTART), "--address", f"127.0.0.1:{port}", "--set", "scaling.use_gpu=true",
                         "--set", "train.num_steps=4", "--set", "data.val=null", "--storage", str(tmp_path / "ray"),
                         cwd=tmp_path, env=AUTH)  # the cluster's mode, not one an earlier test's ray.init set
    assert result.returncode == 1, result.stderr[-3000:]
    failed = [line for line in result.stderr.splitlines() if line.startswith("detsweep: training failed: ")]
    assert len(failed) == 1, result.stderr[-3000:]
    [failed] = failed
    assert failed.startswith(f"detsweep: training failed: scaling.use_gpu: found true, but TensorFlow on {os.uname().nodename} "
                             "sees no GPU (it sees CPU:0; CUDA_VISIBLE_DEVICES='0'; "), failed
    assert failed.endswith("expected a node whose TensorFlow sees its GPUs (pip install 'tensorflow[and-cuda]')"), failed
    assert "workers failed" not in result.stderr and not re.search(r"^step \d+/", result.stderr, re.M), result.stderr[-3000:]
    assert not list(Path(tmp_path / "ray").rglob("checkpoint_*"))
