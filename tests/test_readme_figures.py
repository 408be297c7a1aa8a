"""README's figures are the recorded ones (``bench/results.json``): a benchmark run again
changes them there, and this test says which sentence to change with them."""

import json
import re

from .conftest import REPO

README = (REPO / "README.md").read_text()
RESULTS = json.loads((REPO / "bench" / "results.json").read_text())


def recorded(entry: str, first_cell: str, column: int) -> float:
    [row] = [row for row in RESULTS[entry]["rows"][1:] if row[0] == first_cell]
    return row[column]


def test_every_trial_start_up_figure_is_the_recorded_median():
    figure = f"{recorded('startup_1w', '**Tune start → first step**', 1):.1f} s"
    stated = re.findall(r"(\d+(?:\.\d+)?) s\s(?:here|after Tune starts it|on two cores|each here)", README)
    assert len(stated) >= 4 and {f"{value} s" for value in stated} == {figure}, (stated, figure)


def test_the_scaling_bullet_states_the_recorded_ratios():
    [bullet] = [part for part in README.split("\n- ") if part.startswith("**Scaling**")]
    two, xla = (recorded("scaling_cpu", name, 3) for name in ("2", "1, XLA"))
    assert f"2 workers train at {two:.2f}x" in bullet and f"with XLA\n  (`train.jit_compile`) at {xla:.2f}x" in bullet, bullet
