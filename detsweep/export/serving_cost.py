"""What a TFLite model costs to serve, measured one way for the export, the sweeps and ``bench/``:
its file's size and its latency at batch 1 at the model's image size in the LiteRT runtime
(``ai-edge-litert``; XNNPACK, its default CPU delegate, on a stated number of threads).

Latency is the median of single runs after a warm-up, taken in rounds of :data:`ROUND` runs
until the last three rounds' medians lie within ``spread_target`` of each other (their range
over their median). A machine too busy to settle within ``max_rounds`` still gets a figure,
with ``steady`` false, so that nobody mistakes it for a settled one. These are the figures of
the CPU they ran on, not of a target device.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import numpy as np

from .saved_model import SIGNATURE

THREADS = 2
ROUND = 10
WARM_UP = 5
SETTLED_ROUNDS = 3


@dataclass(frozen=True)
class Latency:
    median_ms: float
    spread: float  # the range of the last rounds' medians over their median
    runs: int
    threads: int
    steady: bool  # the spread fell within the target

    def as_dict(self) -> dict:
        return asdict(self)


def tflite_runner(model: bytes, threads: int = THREADS):
    """The model's serving signature in LiteRT: uint8 pictures ``[1, h, w, 3]`` of any size in,
    the SavedModel's outputs out (the runner resizes its input to each picture)."""
    from ai_edge_litert.interpreter import Interpreter

    return Interpreter(model_content=model, num_threads=threads).get_signature_runner(SIGNATURE)


def measure_latency(model: bytes, image_size: int, threads: int = THREADS, spread_target: float = 0.05,
                    max_rounds: int = 30) -> Latency:
    """Milliseconds per picture of ``image_size`` square at batch 1 (see the module's docstring)."""
    runner = tflite_runner(model, threads)
    picture = np.random.default_rng(0).integers(0, 256, (1, image_size, image_size, 3), dtype=np.uint8)
    for _ in range(WARM_UP):
        runner(images=picture)
    medians: list[float] = []
    spread = float("inf")
    while len(medians) < max_rounds:
        times = []
        for _ in range(ROUND):
            start = time.perf_counter()
            runner(images=picture)
            times.append(time.perf_counter() - start)
        medians.append(statistics.median(times) * 1000)
        last = medians[-SETTLED_ROUNDS:]
        if len(last) == SETTLED_ROUNDS:
            spread = (max(last) - min(last)) / statistics.median(last)
            if spread <= spread_target:
                break
    last = medians[-SETTLED_ROUNDS:]
    return Latency(round(statistics.median(last), 3), round(spread, 4), len(medians) * ROUND, threads,
                   spread <= spread_target)


def size_mb(model: bytes) -> float:
    return round(len(model) / 1e6, 3)
