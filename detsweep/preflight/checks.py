"""The checks themselves, in the order :func:`preflight` makes them: the cheap ones first
(results storage, resources, tracking server), then what loads keras-hub or reads the data."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from detsweep import console
from detsweep.cluster import check_storage
from detsweep.config import TrialConfig
from detsweep.errors import DetsweepError, stderr_held_back
from detsweep.tracking.backend import Backend, check_backend

from .capacity import Capacity, check_worker_fits


@dataclass(frozen=True)
class Preflight:
    """What a command is about to run, and so what to check. A field left at its default is
    not checked."""

    config: TrialConfig  # the trial config: a ``detsweep train`` file's, a sweep's base
    where: str  # the file it came from, for the messages
    prefix: str = ""  # where the config sits in that file: a sweep's ``base.``
    storage: str | None = None  # results: a folder this machine can write, or a bucket that exists
    # a sweep's as-run file (``<storage>/<name>/sweep.yaml``): there already, an earlier sweep
    # of that name ran there, and a launch must not write over it
    earlier_sweep: str | None = None
    capacity: Capacity | None = None  # a Ray Train worker must fit a node of it (else: sized once Ray is up)
    backend: Backend | None = None  # the tracking server: reachable, its credentials accepted
    # fields a whole detector's preset fixes, which a sweep must not vary: {"search.space": paths, …}
    varied: dict[str, Iterable[str]] = field(default_factory=dict)
    inputs: bool = True  # the preset and the data (a resumed sweep's were checked at its launch)
    read_data: bool = True  # read and verify the datasets; else only find them (validate)
    local: bool = True  # folders (data, presets) are this machine's; else a cluster's nodes', left to them
    strict: bool = True  # else what is not here (resources, data) is a note: validate without a cluster


@dataclass(frozen=True)
class Cleared:
    """What the checks found, for the caller to say once every check passed (a refusal is its
    one line): notes (a preset's architecture, what was left to a cluster's nodes) and one
    summary line per dataset read; a fine-tune's warm-start plan."""

    notes: list[str]
    summaries: list[str]
    plan: Any = None  # detsweep.train.warm_start.WarmStartPlan
    config: TrialConfig | None = None  # the config checked, its bucket data's version fixed: what to train


def preflight(checks: Preflight) -> Cleared:
    """Every check ``checks`` asks for, each once; raises the first that fails."""
    config, where = checks.config, checks.where
    notes: list[str] = []
    if checks.storage is not None:
        check_storage(checks.storage, f"{where}: storage")
    if checks.earlier_sweep is not None:
        check_new_sweep(checks.earlier_sweep, where)
    if checks.capacity is not None:
        notes += lenient(checks.strict, "does not fit on this machine; launch it on a cluster", lambda: check_worker_fits(
            config.scaling, checks.capacity, f"{where}: {checks.prefix}scaling") or [])
    if checks.backend is not None:
        check_backend(checks.backend)
    if not checks.inputs:
        return Cleared(notes, [])
    notes += preset(checks)
    if not checks.read_data:
        return Cleared(notes + locate_data(checks), [])
    config = with_data_versions(config, f"{where}: {checks.prefix}")
    summaries = read_data(config)
    return Cleared(notes, summaries, check_fit(config, where) if config.train.fine_tune else None, config)


def check_new_sweep(sweep_file: str, where: str) -> None:
    """A launch never writes over an earlier sweep of the same name and storage: its folder,
    Tune's state and its MLflow run stay whole."""
    import pyarrow.fs

    filesystem, path = pyarrow.fs.FileSystem.from_uri(sweep_file)
    if filesystem.get_file_info(path).type == pyarrow.fs.FileType.File:
        folder = sweep_file.rsplit("/", 1)[0]
        raise DetsweepError(f"{where}: name: found {folder.rsplit('/', 1)[1]!r}, which already ran at {folder}; "
                            "expected a new name (--set name=NEW) or another storage, or to go on with it: "
                            f"detsweep resume {folder}")


def lenient(strict: bool, what: str, check: Callable[[], list[str]]) -> list[str]:
    """``check()``'s notes; not ``strict``, its refusal too, as a note saying ``what``."""
    try:
        return check()
    except DetsweepError as error:
        if strict:
            raise
        return [f"{what}: {str(error).split(': ', 1)[1]}"]


def left_to_the_nodes(unchecked: list[str]) -> list[str]:
    """Notes for the ``FILE: field: path`` a cluster's nodes hold, which this machine cannot see."""
    return [f"left to the nodes, which must have it: {where.split(': ', 1)[1]}" for where in unchecked]


def preset(checks: Preflight) -> list[str]:
    """A ``model.weights`` preset keras-hub can load, as the image encoder or a whole detector;
    a whole detector's fields not varied; its note, and the folders left to the nodes."""
    config = checks.config
    if config.model.weights == "none":  # keras-hub, and TensorFlow with it, load only for a preset
        return []
    from detsweep.models.detector_presets import ARCHITECTURE, names_a_detector_here
    from detsweep.models.presets import architecture_note, check_weights_preset

    field_name = f"{checks.where}: {checks.prefix}model.weights"
    with console.working(f"checking the preset {config.model.weights}"):
        unchecked = check_weights_preset(config.model.weights, field_name, local=checks.local)
        if checks.varied and names_a_detector_here(config.model.weights):
            fixed = {f"model.{name}" for name in (*ARCHITECTURE, "image_mean", "image_std")}
            for where, paths in checks.varied.items():
                for path in sorted(set(paths) & fixed):
                    raise DetsweepError(f"{checks.where}: {where}.{path}: found a field of the network, expected "
                                        f"none: {checks.prefix}model.weights ({config.model.weights}) is a whole "
                                        "detector's preset, whose architecture wins")
        note = architecture_note(config, field_name, local=checks.local)
    return left_to_the_nodes(unchecked) + ([note] if note else [])


def locate_data(checks: Preflight) -> list[str]:
    """Every dataset's bucket URIs name something, and its paths too where they are this
    machine's; nothing is read. What a cluster's nodes hold is left to them (a note)."""
    from detsweep.data.remote import check_locations

    notes = []
    for split in ("train", "val"):
        dataset = getattr(checks.config.data, split)
        if dataset is not None:
            where = f"{checks.where}: {checks.prefix}data.{split}"
            notes += lenient(checks.strict, "not on this machine; the cluster must have it", lambda: left_to_the_nodes(
                check_locations(dataset, where, local=checks.local)))  # noqa: B023 (called at once)
    return notes


def with_data_versions(config: TrialConfig, where: str) -> TrialConfig:
    """``config`` with the version its bucket data has now, the one every node will train on."""
    from detsweep.data.remote import pinned

    data = config.data
    fixed = {split: pinned(getattr(data, split), f"{where}data.{split}") for split in ("train", "val")
             if getattr(data, split) is not None}
    return config.model_copy(update={"data": data.model_copy(update=fixed)})


def read_data(config: TrialConfig) -> list[str]:
    """Read and verify the datasets once, on the driver, so that workers can trust them;
    one summary line per dataset (what was clipped, dropped, converted)."""
    from detsweep.data import load_dataset
    from detsweep.data.remote import with_local_copies
    from detsweep.data.tfrecord import sample_tfrecord

    summaries = []
    for name, dataset in (("data.train", config.data.train), ("data.val", config.data.val)):
        if dataset is not None and dataset.format == "tfrecord" and name == "data.train":
            with console.working(f"sampling {name} (tfrecord)"):  # COCO's are 19 GB: the nodes stream them
                summaries.append(sample_tfrecord(with_local_copies(dataset), named=dataset.annotations))
        elif dataset is not None:
            with console.working(f"reading and checking {name} ({dataset.format})"):
                summaries.append(load_dataset(dataset, verify=True).summary_line())
    return summaries


def check_fit(config: TrialConfig, where: str):
    """A fine-tune's checkpoint restored into the model, here, once, as the workers will (the
    datasets were verified already); its warm-start plan, and a line saying what it restores."""
    from detsweep.data import dataset_categories
    from detsweep.train.warm_start import plan_warm_start
    from detsweep.trainables.worker import fine_tune_source

    categories = dataset_categories(config.data.train)
    # a checkpoint that does not fit: one line, not TensorFlow's start-up
    with console.working("building the model and restoring the fine-tune's checkpoint into it"), \
            stderr_held_back(), fine_tune_source(config) as directory:
        plan = plan_warm_start(config, config.model.num_classes or len(categories), directory)
    if config.train.fine_tune.keep_optimizer_state and plan.step >= config.train.num_steps:
        raise DetsweepError(f"{where}: train.num_steps: found {config.train.num_steps}, expected more than the "
                            f"checkpoint's step {plan.step} (keep_optimizer_state goes on from there)")
    print(f"fine-tune: {len(plan.restored)} weights restored, {len(plan.fresh)} fresh"
          + (f" ({', '.join(plan.fresh)})" if plan.fresh else "") + f"; training starts at step {plan.step}",
          file=console.err(), flush=True)
    return plan
