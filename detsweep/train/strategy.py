"""Which tf.distribute strategy a trial's worker uses, from ``scaling``."""

from __future__ import annotations

import tensorflow as tf

from detsweep.config import ScalingConfig


def use_worker_cpus(cpus: float) -> None:
    """Size TensorFlow's thread pools to the CPUs Ray gave the worker (at least one), so
    workers sharing a node neither oversubscribe it nor leave it idle. Call before any op."""
    threads = max(1, int(cpus))
    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
    except RuntimeError:  # the runtime already runs (a second training in one process): keep its pools
        pass


def make_strategy(scaling: ScalingConfig) -> tf.distribute.Strategy:
    """TPUStrategy with ``use_tpu``; MultiWorkerMirroredStrategy across several workers (Ray's
    trainer sets TF_CONFIG); one GPU: OneDeviceStrategy on it; otherwise TensorFlow's
    default strategy, so a single worker pays for no all-reduce and no device copies.

    On CPU, ``OneDeviceStrategy("/cpu:0")`` trains the quickstart model at 60 % of the default
    strategy's speed: its input iterator and per-step copies make TensorFlow allocate fresh
    memory at every step (ten times the page faults; bench/RESULTS.md).

    Must be called before any other TensorFlow op in the process (a TF requirement for
    multi-worker strategies).
    """
    if scaling.use_tpu:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver()
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        return tf.distribute.TPUStrategy(resolver)
    if scaling.num_workers > 1:
        return tf.distribute.MultiWorkerMirroredStrategy()
    gpus = tf.config.list_logical_devices("GPU")
    return tf.distribute.OneDeviceStrategy(gpus[0].name) if gpus else tf.distribute.get_strategy()
