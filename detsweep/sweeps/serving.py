"""What each architecture a sweep can draw costs to serve (``search.serving_cost``), measured
once per architecture by the driver before the trials start, so that no trial trains beside
a measurement (Ray's CPU reservations are not pinned cores). Every trial's run then carries its
architecture's ``serve/latency_ms``, ``serve/size_mb`` and ``serve/params``, and so does every
report Tune hears of it (:func:`detsweep.trainables.trial.run_trial`)."""

from __future__ import annotations

import copy
import itertools
from collections.abc import Sequence
from typing import Any

from detsweep.config import TrialConfig, validate
from detsweep.config.loader import get_path, set_path
from detsweep.errors import DetsweepError
from detsweep.evaluation.objectives import Constraint, broken

from .spec import Sweep, is_architecture


def architectures(sweep: Sweep) -> list[TrialConfig]:
    """Every trial config the space's architecture fields can make, one per distinct network;
    combinations the config's rules refuse are left out (their trials fail at their start)."""
    base = sweep.base.model_dump(mode="json")
    choices = {dotted: parameter.grid or parameter.values or [parameter.value]
               for dotted, parameter in sweep.search.space.items() if is_architecture(dotted)}
    configs = []
    for combination in itertools.product(*choices.values()):
        tree = copy.deepcopy(base)
        for dotted, value in zip(choices, combination, strict=True):
            set_path(tree, dotted, value)
        try:
            configs.append(validate(TrialConfig, tree, "an architecture"))
        except DetsweepError:
            continue
    return configs


def measure_architectures(sweep: Sweep, say=print) -> dict[str, dict[str, float]]:
    """``ModelConfig.architecture_key`` → its ``serve/*`` metrics, each architecture measured once. Refused
    in one line when none meets the sweep's constraints: no trial could train."""
    from detsweep.data import dataset_categories
    from detsweep.export.architecture import serving_cost

    configs = architectures(sweep)
    classes = sweep.base.model.num_classes or len(dataset_categories(sweep.base.data.train))
    costs: dict[str, dict[str, Any]] = {}
    for config in configs:
        key = config.model.architecture_key(config.model.num_classes or 0)
        if key not in costs:
            cost = serving_cost(config.model, classes, int8=sweep.search.measures_int8)
            costs[key] = cost.metrics()
            int8 = f"; int8 {cost.int8[0]:.1f} ms, {cost.int8[1]:.1f} MB" if cost.int8 else ""
            say(f"serving cost of {describe(config, sweep)}: {cost.latency_ms:.1f} ms, {cost.size_mb:.1f} MB, "
                f"{cost.params:,} parameters{int8}")
    bounds = sweep.search.bounds
    if bounds and costs and all(broken(bounds, cost) for cost in costs.values()):
        raise DetsweepError(f"{sweep.path}: search.constraints: {none_meet(bounds, list(costs.values()))}")
    return costs


def none_meet(bounds: Sequence[Constraint], costs: list[dict[str, float]]) -> str:
    """What a sweep none of whose architectures meets its constraints is told: the first's broken bound."""
    first = broken(bounds, costs[0])
    found = (f"found the space's one architecture not meeting them ({first})" if len(costs) == 1 else
             f"found none of the space's {len(costs)} architectures meeting them (the first: {first})")
    return f"{found}, expected at least one: no trial could train"


def describe(config: TrialConfig, sweep: Sweep) -> str:
    tree = config.model_dump(mode="json")
    parts = [f"{dotted}={get_path(tree, dotted)}" for dotted in sweep.search.space if is_architecture(dotted)]
    return ", ".join(parts) or "the base's architecture"
