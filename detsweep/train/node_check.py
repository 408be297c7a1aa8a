"""A GPU node's start-up check, run by ``ray_cluster.yaml`` on each GPU worker node before Ray
starts there: TensorFlow on this node sees a GPU, or the command fails, saying in one line what
TensorFlow saw, and the node with it (a trial placed there would fail at its start).

    python -m detsweep.train.node_check
"""

from __future__ import annotations

import sys


def main() -> int:
    import tensorflow as tf

    from detsweep.train.strategy import no_gpu_seen

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        print(f"detsweep: node check: {no_gpu_seen('a GPU node')}", file=sys.stderr)
        return 1
    print(f"detsweep: node check: TensorFlow sees {len(gpus)} GPU(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
