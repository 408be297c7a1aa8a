"""Which tf.distribute strategy a trial's worker uses, from ``scaling``."""

from __future__ import annotations

import enum
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass

import tensorflow as tf

from detsweep.config import ScalingConfig
from detsweep.errors import DetsweepError


def use_worker_devices(scaling: ScalingConfig) -> None:
    """What a worker or an evaluator of ``scaling`` does before any op: its thread pools sized
    to the CPUs Ray gave it; without ``use_gpu``, no GPU at all (a CPU trial on a GPU node must
    not take a GPU Ray gave another); with it, every GPU TensorFlow sees allocating as it goes,
    so that a second TensorFlow process on the GPU (the async evaluator, a fractional
    ``gpus_per_worker``) finds room. Asked for GPUs and seeing none (a CPU-only TensorFlow on
    a GPU node, a driver missing), it refuses in one line: training on the CPU would be
    silent and slow."""
    use_worker_cpus(scaling.cpus_per_worker)
    gpus = tf.config.list_physical_devices("GPU")
    if gpus and not scaling.use_gpu:
        try:
            tf.config.set_visible_devices([], "GPU")
        except RuntimeError:  # the runtime already runs (a second training in one process): keep its devices
            pass
        return
    for gpu in gpus:
        try:
            tf.config.experimental.set_memory_growth(gpu, True)
        except RuntimeError:  # the runtime already runs (a second training in one process): keep its setting
            pass
    if scaling.use_gpu and not gpus:
        raise NoGPUVisible(no_gpu_seen())


class DevicesNotAsSized(DetsweepError):
    """A worker's devices are not those its config was sized for: the same on every restart."""


class NoGPUVisible(DevicesNotAsSized):
    """``scaling.use_gpu`` and TensorFlow sees no GPU in the worker."""


def no_gpu_seen(asked: str = "scaling.use_gpu: found true") -> str:
    """One line: what asked for a GPU, and what TensorFlow here sees instead."""
    devices = ", ".join(device.name.removeprefix("/physical_device:") for device in tf.config.list_physical_devices())
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    build = "built with CUDA" if tf.test.is_built_with_cuda() else "a TensorFlow built without CUDA"
    return (f"{asked}, but TensorFlow on {socket.gethostname()} sees no GPU (it sees {devices}; "
            f"CUDA_VISIBLE_DEVICES={'unset' if visible is None else repr(visible)}; {build}); expected a node whose "
            "TensorFlow sees its GPUs (pip install 'tensorflow[and-cuda]')")


def use_worker_cpus(cpus: float) -> None:
    """Size TensorFlow's thread pools to the CPUs Ray gave the worker (at least one), so
    workers sharing a node neither oversubscribe it nor leave it idle. Call before any op."""
    threads = max(1, int(cpus))
    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
    except RuntimeError:  # the runtime already runs (a second training in one process): keep its pools
        pass


class Kind(enum.Enum):
    TPU = "TPUStrategy over the slice's cores"
    MULTI_WORKER = "MultiWorkerMirroredStrategy over every device of every worker"
    MIRRORED = "MirroredStrategy over this worker's GPUs"
    ONE_GPU = "OneDeviceStrategy on this worker's GPU"
    DEFAULT = "TensorFlow's default strategy (the CPU)"


@dataclass(frozen=True)
class StrategyPlan:
    """The strategy a worker builds, decided from its trial's scaling and the GPUs it sees."""

    kind: Kind
    devices: tuple[str, ...] = ()  # this worker's GPUs it trains on
    collectives: str | None = None  # how replicas all-reduce: NCCL between GPUs, RING between CPUs


def plan_strategy(scaling: ScalingConfig, gpus: Sequence[str]) -> StrategyPlan:
    """Every accelerator a worker holds trains, if its trial asked for them (``use_gpu``; a CPU
    trial on a GPU node trains on its CPU). Several workers: MultiWorkerMirroredStrategy,
    which takes every GPU the worker sees (Ray sets ``CUDA_VISIBLE_DEVICES`` per worker), or
    its CPU; one worker with several GPUs: MirroredStrategy over them; one GPU:
    OneDeviceStrategy on it; otherwise TensorFlow's default strategy, so a single CPU worker
    pays for no all-reduce and no device copies.

    On CPU, ``OneDeviceStrategy("/cpu:0")`` trains the quickstart model at 60 % of the default
    strategy's speed: its input iterator and per-step copies make TensorFlow allocate fresh
    memory at every step (ten times the page faults; bench/RESULTS.md)."""
    if scaling.use_tpu:
        return StrategyPlan(Kind.TPU)
    gpus = gpus if scaling.use_gpu else ()
    if scaling.num_workers > 1:
        return StrategyPlan(Kind.MULTI_WORKER, tuple(gpus), "NCCL" if gpus else "RING")
    if len(gpus) > 1:
        return StrategyPlan(Kind.MIRRORED, tuple(gpus), "NCCL")
    if gpus:
        return StrategyPlan(Kind.ONE_GPU, tuple(gpus))
    return StrategyPlan(Kind.DEFAULT)


def visible_gpus() -> list[str]:
    """The GPUs TensorFlow sees here, as device names, listed without starting its runtime (a
    multi-worker strategy must configure its collectives first): each GPU is one logical
    device of the same index."""
    return [f"/device:GPU:{index}" for index, _ in enumerate(tf.config.list_physical_devices("GPU"))]


def make_strategy(scaling: ScalingConfig, gpus: Sequence[str]) -> tf.distribute.Strategy:
    """The strategy :func:`plan_strategy` plans for ``gpus`` (:func:`visible_gpus`; logical CPU
    devices stand in for them in tests; TPU: the slice's, from its resolver), checked to hold
    the replicas the config was sized and its batch split for. Must be called before any other
    TensorFlow op in the process (a TF requirement for multi-worker strategies)."""
    plan = plan_strategy(scaling, gpus)
    if plan.kind is Kind.TPU:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver()
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        return tf.distribute.TPUStrategy(resolver)
    strategy = build_strategy(plan)
    check_replicas(strategy.num_replicas_in_sync, scaling, gpus)
    return strategy


def build_strategy(plan: StrategyPlan) -> tf.distribute.Strategy:
    if plan.kind is Kind.MULTI_WORKER:
        implementation = getattr(tf.distribute.experimental.CommunicationImplementation, plan.collectives)
        options = tf.distribute.experimental.CommunicationOptions(implementation=implementation)
        return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    if plan.kind is Kind.MIRRORED:
        return tf.distribute.MirroredStrategy(list(plan.devices), cross_device_ops=tf.distribute.NcclAllReduce())
    if plan.kind is Kind.ONE_GPU:
        return tf.distribute.OneDeviceStrategy(plan.devices[0])
    return tf.distribute.get_strategy()


def check_replicas(replicas: int, scaling: ScalingConfig, gpus: Sequence[str]) -> None:
    """The strategy steps as many replicas as ``scaling`` was sized for (and the batch split
    for): a worker that can use fewer GPUs than it holds (TensorFlow skips one it cannot use,
    with only a log line) would otherwise train on fewer without a word."""
    if replicas == scaling.replicas:
        return
    per_worker = scaling.replicas // scaling.num_workers
    listed = ", ".join(gpus) if gpus else "no GPU"
    raise DevicesNotAsSized(
        f"scaling: found {replicas} replica(s) in step on {socket.gethostname()} (TensorFlow lists {listed}), "
        f"expected {scaling.replicas}: {scaling.num_workers} worker(s) x {per_worker} "
        f"{'GPU(s)' if scaling.use_gpu else 'CPU'} each, as train.batch_size was split for")
