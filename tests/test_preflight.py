"""``preflight()``: every check a command makes before Ray or MLflow start, each written once,
the cheap ones first, a refusal one line naming its file and field. Each command's own tests
follow it to the command's exit code 2 (``test_cli.py``, ``test_sweep_files.py``,
``test_tracking.py``, ``test_finetune.py``); here the function itself, with no server."""

from __future__ import annotations

import pytest

from detsweep.config import load_trial_config
from detsweep.errors import DetsweepError
from detsweep.preflight.capacity import Capacity, NodeType
from detsweep.preflight.checks import Preflight, preflight

from .conftest import REPO

NOWHERE = "{format: coco, annotations: /nowhere/annotations.json, images: /nowhere/images}"
ONE_CPU = Capacity((NodeType("small", {"CPU": 1.0}, 1, head=True),), "this machine")


def quickstart(*overrides: str):
    return load_trial_config(REPO / "configs" / "quickstart.yaml", list(overrides))


def refusal(checks: Preflight) -> str:
    with pytest.raises(DetsweepError) as refused:
        preflight(checks)
    assert "\n" not in str(refused.value)
    return str(refused.value)


def test_the_cheap_checks_come_first_and_each_refusal_names_its_field(tmp_path):
    """Storage, an earlier sweep and resources are refused before the data is looked at: the
    config's data is nowhere, and each of them is what the refusal names."""
    config = quickstart(f"data.train={NOWHERE}", "scaling.cpus_per_worker=2")
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    sweep = Preflight(config, "sweep.yaml", prefix="base.", storage=str(a_file / "results"),
                      earlier_sweep=str(tmp_path / "ran" / "sweep.yaml"), capacity=ONE_CPU)
    assert refusal(sweep).startswith(f"sweep.yaml: storage: found {str(a_file / 'results')!r}, expected a folder")

    (tmp_path / "ran").mkdir()
    (tmp_path / "ran" / "sweep.yaml").write_text("name: ran\n")
    storage_fine = Preflight(**{**sweep.__dict__, "storage": str(tmp_path)})
    assert refusal(storage_fine).startswith("sweep.yaml: name: found 'ran', which already ran at ")

    new_name = Preflight(**{**storage_fine.__dict__, "earlier_sweep": str(tmp_path / "new" / "sweep.yaml")})
    assert refusal(new_name).startswith("sweep.yaml: base.scaling.cpus_per_worker: found 2, expected <= 1")

    fits = Preflight(**{**new_name.__dict__, "capacity": None})
    assert refusal(fits) == "/nowhere/annotations.json: annotation file not found"  # only now is the data read


def test_what_is_not_checked_is_not_touched_and_a_lenient_check_notes_what_a_strict_one_refuses():
    """``inputs=False`` (a resumed sweep) reads no data; ``read_data=False`` (validate) only
    looks for it; without ``strict`` (validate with no cluster) what this machine lacks is a
    note, not a refusal."""
    config = quickstart(f"data.train={NOWHERE}", "scaling.cpus_per_worker=2")
    assert preflight(Preflight(config, "sweep.yaml", inputs=False)).notes == []
    located = Preflight(config, "sweep.yaml", prefix="base.", read_data=False, capacity=ONE_CPU)
    assert refusal(located).startswith("sweep.yaml: base.scaling.cpus_per_worker: found 2, expected <= 1")
    notes = preflight(Preflight(**{**located.__dict__, "strict": False})).notes
    assert notes[0].startswith("does not fit on this machine; launch it on a cluster: base.scaling.cpus_per_worker: found 2")
    assert any(note.startswith("not on this machine; the cluster must have it") for note in notes[1:]), notes


def test_a_config_that_clears_every_check_gets_each_datasets_summary_once():
    cleared = preflight(Preflight(quickstart(), "configs/quickstart.yaml", storage=None, capacity=ONE_CPU))
    assert cleared.notes == [] and cleared.plan is None
    assert len(cleared.summaries) == 2 and all("images" in line for line in cleared.summaries), cleared.summaries
