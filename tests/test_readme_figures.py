"""README's figures are the recorded ones: its *Speed* table is rendered from
``bench/results.json`` (``bench/readme.py``), and a figure it states anywhere else restates one
of that table's cells. A benchmark run again changes the table; this test then names the
sentence to change with it."""

import json
import re

from bench.readme import BEGIN, END, render_figures

from .conftest import REPO

README = (REPO / "README.md").read_text()
RESULTS = json.loads((REPO / "bench" / "results.json").read_text())

# A number with the unit of a measurement: 20.5 s, 31 %, 0.72x, 29.4 writes/s, 41 min.
FIGURE = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?: ?%|x\b| (?:s|ms|min|minutes|images/s|writes/s)\b)")

# Figures README states that are settings or limits, not measurements.
SETTINGS = {
    "0.5 s",  # Ray Train's poll, as detsweep starts Ray
    "2 s",  # Ray Train's poll, Ray's default
    "60 s",  # the MLflow server's credential cache
    "10 minutes",  # a test's time limit
    "15 minutes",  # the longest a cluster sweep's test sets
    "80 minutes",  # the run's time limit
    "45 minutes",  # the suite's budget
}


def figures(text: str) -> set[str]:
    return {" ".join(figure.split()) for figure in FIGURE.findall(text)}


def test_the_speed_table_is_the_one_results_json_renders():
    table = README[README.index(BEGIN):README.index(END) + len(END)]
    assert table == render_figures(RESULTS), "run: .venv/bin/python -c 'from bench.common import render; render()'"


def test_every_figure_outside_the_table_restates_one_of_its_cells_or_is_a_setting():
    table = README[README.index(BEGIN):README.index(END)]
    rest = README.replace(table, "")
    unrecorded = figures(rest) - figures(table) - SETTINGS
    assert not unrecorded, f"figures README states that no recorded result gives: {sorted(unrecorded)}"
