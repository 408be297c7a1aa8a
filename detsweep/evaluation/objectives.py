"""What a multi-objective sweep ranks trials on, and the Pareto front it hands back.

An :class:`Objective` is a metric and whether more is better; a :class:`Constraint` a bound on
a metric known before training (``serve/latency_ms <= 20``). A trial's values over the
objectives are a point; one point dominates another when it is no worse on every objective
and better on one. :func:`fronts` sorts points into non-dominated fronts (NSGA-II's sort: the
first front is the Pareto front), and :func:`hypervolume` measures the space a front
dominates up to a reference point, by slicing along the first objective (exact; fronts here
hold tens of points).
"""

from __future__ import annotations

import operator
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from detsweep.errors import DetsweepError

Point = Sequence[float]


@dataclass(frozen=True)
class Objective:
    metric: str
    mode: str  # "max" or "min"

    def as_min(self, value: float) -> float:
        """The value on a scale where less is better (every objective alike)."""
        return -value if self.mode == "max" else value


BOUNDS = {"<=": operator.le, "<": operator.lt, ">=": operator.ge, ">": operator.gt}
_CONSTRAINT = re.compile(r"^\s*(?P<metric>[\w/.-]+)\s*(?P<op><=|>=|<|>)\s*(?P<bound>[-+]?[\d.]+(?:[eE][-+]?\d+)?)\s*$")


@dataclass(frozen=True)
class Constraint:
    metric: str
    op: str  # one of BOUNDS
    bound: float

    @classmethod
    def parse(cls, text: str, field: str) -> Constraint:
        """``"serve/latency_ms <= 20"``; anything else is one line naming ``field``."""
        match = _CONSTRAINT.match(text) if isinstance(text, str) else None
        if match is None:
            raise DetsweepError(f"{field}: found {text!r}, expected METRIC OP NUMBER with OP one of "
                                f"{', '.join(BOUNDS)} (serve/latency_ms <= 20)")
        return cls(match["metric"], match["op"], float(match["bound"]))

    def holds(self, metrics: Mapping[str, float]) -> bool:
        return BOUNDS[self.op](metrics[self.metric], self.bound)


def broken(constraints: Sequence[Constraint], metrics: Mapping[str, float]) -> str | None:
    """Why ``metrics`` break the constraints (each broken one with its value), or None."""
    reasons = [f"{c.metric} is {metrics[c.metric]:g}, expected {c.op} {c.bound:g}" for c in constraints
               if not c.holds(metrics)]
    return "; ".join(reasons) or None


def dominates(a: Point, b: Point) -> bool:
    """``a`` no worse than ``b`` everywhere and better somewhere (both on the less-is-better scale)."""
    return all(x <= y for x, y in zip(a, b, strict=True)) and any(x < y for x, y in zip(a, b, strict=True))


def fronts(points: Sequence[Point]) -> list[list[int]]:
    """The points' indices in non-dominated fronts, the Pareto front first (less is better)."""
    left = list(range(len(points)))
    sorted_fronts = []
    while left:
        front = [i for i in left if not any(dominates(points[j], points[i]) for j in left if j != i)]
        sorted_fronts.append(front)
        left = [i for i in left if i not in front]
    return sorted_fronts


def hypervolume(points: Sequence[Point], reference: Point) -> float:
    """The volume the points dominate up to ``reference`` (less is better; points not better
    than the reference everywhere add nothing). Exact, by slicing along the first axis."""
    inside = [tuple(p) for p in points if all(x < r for x, r in zip(p, reference, strict=True))]
    if not inside:
        return 0.0
    if len(reference) == 1:
        return reference[0] - min(p[0] for p in inside)
    cuts = sorted({p[0] for p in inside}) + [reference[0]]
    volume = 0.0
    for low, high in zip(cuts, cuts[1:]):
        below = [p[1:] for p in inside if p[0] <= low]
        volume += (high - low) * hypervolume(below, reference[1:])
    return volume
