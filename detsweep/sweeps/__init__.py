"""Sweeps: the sweep file, search spaces, the Ray Tune tuner, launching and summarising."""

from .spec import Sweep, load_sweep

__all__ = ["Sweep", "load_sweep"]
