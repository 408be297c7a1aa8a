"""Search spaces in the syntax of W&B sweeps, as Ray Tune domains.

Each key is a dotted path into the trial config; each value one of
``value: x``, ``values: [...]``, ``grid: [...]``, or ``distribution: uniform |
log_uniform_values | int_uniform | q_uniform | normal`` with ``min``/``max``/``q``/
``mu``/``sigma``. Parameters only some choices use (momentum for adam) are reset to the
base value where they do not apply, so grids do not multiply trials over them.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from detsweep.config.loader import get_path
from detsweep.config.schema import OPTIMIZER_ALIASES, SCHEDULE_ALIASES, invalid

Distribution = Literal["uniform", "log_uniform_values", "int_uniform", "q_uniform", "normal"]


class Parameter(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    value: Any = None
    values: list[Any] | None = None
    grid: list[Any] | None = None
    distribution: Distribution | None = None
    min: float | None = None
    max: float | None = None
    q: float | None = Field(None, gt=0)
    mu: float | None = None
    sigma: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _one_kind(self) -> Parameter:
        kinds = [k for k in ("value", "values", "grid", "distribution") if k in self.model_fields_set]
        if len(kinds) != 1:
            raise invalid("(parameter)", kinds or None, "exactly one of value, values, grid, distribution")
        if self.distribution:
            self._check_distribution()
        for kind in ("values", "grid"):
            if kind in kinds and not getattr(self, kind):
                raise invalid(kind, [], "a non-empty list")
        return self

    def _check_distribution(self) -> None:
        if self.distribution == "normal":
            if self.mu is None or self.sigma is None:
                raise invalid("sigma" if self.mu is not None else "mu", None, "a number (normal needs mu and sigma)")
            return
        if self.min is None or self.max is None:
            raise invalid("max" if self.min is not None else "min", None, f"a number ({self.distribution} needs min and max)")
        if self.min > self.max:
            raise invalid("min", self.min, f"<= max ({self.max})")
        if self.distribution == "log_uniform_values" and self.min <= 0:
            raise invalid("min", self.min, "> 0 (a log distribution needs positive bounds)")
        if self.distribution == "q_uniform" and self.q is None:
            raise invalid("q", None, "a positive step (q_uniform needs q)")

    @property
    def is_grid(self) -> bool:
        return self.grid is not None

    def domain(self):
        """The Ray Tune domain (or constant) for this parameter."""
        from ray import tune

        if self.grid is not None:
            return tune.grid_search(self.grid)
        if self.values is not None:
            return tune.choice(self.values)
        if self.distribution is None:
            return self.value
        return {
            "uniform": lambda: tune.uniform(self.min, self.max),
            "log_uniform_values": lambda: tune.loguniform(self.min, self.max),
            "int_uniform": lambda: tune.randint(int(self.min), int(self.max) + 1),
            "q_uniform": lambda: tune.quniform(self.min, self.max, self.q),
            "normal": lambda: tune.randn(self.mu, self.sigma),
        }[self.distribution]()


Space = dict[str, Parameter]

# Which optimizer or schedule types use a field; fields not listed are used by all.
USED_BY_OPTIMIZER = {
    "optimizer.momentum_optimizer_value": {"momentum", "rms_prop"},
    "optimizer.decay": {"rms_prop"},
    "optimizer.epsilon": {"adam", "adamw", "rms_prop"},
    "optimizer.weight_decay": {"adamw"},
}
USED_BY_SCHEDULE = {
    "optimizer.learning_rate.learning_rate": {"constant"},
    "optimizer.learning_rate.initial_learning_rate": {"exponential_decay", "manual_step"},
    **{f"optimizer.learning_rate.{name}": {"exponential_decay"} for name in (
        "decay_steps", "decay_factor", "staircase", "burnin_learning_rate", "burnin_steps", "min_learning_rate")},
    **{f"optimizer.learning_rate.{name}": {"cosine"} for name in (
        "learning_rate_base", "total_steps", "warmup_learning_rate", "warmup_steps", "hold_base_rate_steps")},
    "optimizer.learning_rate.schedule": {"manual_step"},
    "optimizer.learning_rate.warmup": {"manual_step"},
}


def is_used(path: str, assignment: Mapping[str, Any], base: Mapping[str, Any]) -> bool:
    """Does the trial config that ``assignment`` (over ``base``) describes use ``path``?"""
    def current(key: str, aliases: dict[str, str]) -> str:
        value = assignment.get(key, get_path(base, key))
        return aliases.get(value, value)

    if path in USED_BY_OPTIMIZER:
        return current("optimizer.type", OPTIMIZER_ALIASES) in USED_BY_OPTIMIZER[path]
    if path in USED_BY_SCHEDULE:
        return current("optimizer.learning_rate.type", SCHEDULE_ALIASES) in USED_BY_SCHEDULE[path]
    return True


def grid_points(space: Space, base: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every distinct combination of the grid parameters, unused ones collapsed."""
    grids = {path: parameter.grid for path, parameter in space.items() if parameter.is_grid}
    points, seen = [], set()
    for combination in itertools.product(*grids.values()):
        point = dict(zip(grids, combination))
        point = {path: value for path, value in point.items() if is_used(path, point, base)}
        key = repr(sorted(point.items()))
        if key not in seen:
            seen.add(key)
            points.append(point)
    return points


def swept_paths(sweep) -> list[str]:
    """The config paths a sweep varies: its space, then PBT's mutations."""
    search = sweep.search
    return list(search.space) + [path for path in search.scheduler.mutations if path not in search.space]
