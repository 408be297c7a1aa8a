"""What ``detsweep launch`` prints while a sweep runs: a line per trial event, and the trial table.

Tune's own reporter prints every trial's whole config (80 rows here) and truncates the
swept columns; this prints what a sweep's user watches: the swept values, the step, the
metric, and why a trial ended. On a terminal the table is live (rich), redrawn under the
event lines as trials move, at most every ``redraw_every_s``; on a pipe or a file it is printed
every ``table_every_s``.

Its cost does not grow with the sweep: up to ``ALL_ROWS_UP_TO`` trials the table has a row per
trial; past that it is a window (rich's advice for large tables): the best ``BEST_ROWS``, the
running trials (at most ``RUNNING_ROWS``), the counts by status and the last trials to end.
``detsweep status`` prints every row, and the parent run's ``trials.csv`` holds them.
"""

from __future__ import annotations

import time
from collections import deque
from pathlib import Path
from typing import Any, TextIO

from ray import tune

from detsweep import console
from detsweep.errors import failure_reason
from detsweep.tracking.sweep_run import TrialStatus
from detsweep.trainables.trial import INFEASIBLE, swept_values

from .resources import Capacity, nodes_wanted

REDRAW_EVERY_S = 0.5  # Tune calls on_step_end many times a second; the table changes per report
BEST_ROWS, RUNNING_ROWS, ENDED_SHOWN = 5, 10, 2  # with its caption, within a 25-line terminal
ALL_ROWS_UP_TO = BEST_ROWS + RUNNING_ROWS  # trials; a larger sweep's table is a window of as many rows
MEMORY = ("memory", "object_store_memory")
WAITS_EVERY_S = 2.0  # how often the cluster is asked for workers that wait to be placed


def short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def latest_error(trial) -> str | None:
    """The trial's error as Tune has just written it, into the driver's staging folder;
    ``Trial.get_error`` reads the copy in the sweep's storage, which comes later (and for a
    resumed sweep may be the last run's)."""
    staged = trial.error_file
    if staged and Path(staged).exists():
        return Path(staged).read_text()
    return trial.get_error()


def waiting_bundles() -> dict[str, list[dict[str, float]]]:
    """The placement groups that wait for resources (Ray Train's worker groups before their
    nodes are up), by id: the CPUs, GPUs and custom resources each of their workers asks for
    (a trial's own process asks for memory and the head only)."""
    from ray.util import placement_group_table

    waiting = {}
    for group, info in placement_group_table().items():
        if info["state"] in ("PENDING", "RESCHEDULING"):
            bundles = [{name: amount for name, amount in bundle.items() if amount and name not in MEMORY
                        and not name.startswith("node:")}
                       for bundle in info["bundles"].values()]
            waiting[group] = [bundle for bundle in bundles if bundle]
    return waiting


class SweepProgress(tune.Callback):
    """One line when a trial starts, reports, ends or fails; the table live on a terminal,
    else every ``table_every_s``. ``close`` ends the live table (the sweep's end does too).
    With the cluster's ``capacity``, a line when trials' workers wait for nodes, saying how many
    of which type the autoscaler has to start."""

    def __init__(self, paths: list[str], metric: str, num_steps: int, stream: TextIO | None = None,
                 table_every_s: float = 60.0, live: bool | None = None, capacity: Capacity | None = None,
                 mode: str = "max", redraw_every_s: float = REDRAW_EVERY_S):
        self.paths = paths
        self.metric = metric
        self.mode = mode
        self.num_steps = num_steps
        self.stream = stream
        self.table_every_s = table_every_s
        self.redraw_every_s = redraw_every_s
        self._live = live
        self._last_table = time.monotonic()
        self._started = time.monotonic()
        self._display = None  # rich's Live, started with the first event; never pickled with the callback
        self._drawn = -float("inf")  # when the live table was last drawn
        self._changed = False  # since then
        self._pending: list[str] = []  # lines for above the live table, printed with its next redraw
        self._ended: deque[str] = deque(maxlen=ENDED_SHOWN)  # the last trials to end, as their lines said it
        self.redraws, self.most_rows = 0, 0  # what the console has cost so far: redraws, the most rows in one
        self.capacity = capacity
        self._waiting: dict[str, list] = {}  # the groups seen waiting at the last look
        self._said_waiting: str | None = None
        self._last_look = time.monotonic()

    def __getstate__(self) -> dict:  # Tune pickles its callbacks into the experiment's state (a resume
        # unpickles them and writes to its own terminal)
        return {**self.__dict__, "_display": None, "stream": None, "_pending": []}

    @property
    def live(self) -> bool:
        """Whether the table is live: by default, when the stream is a terminal (decided where
        the callback runs, so a sweep resumed into a file prints lines)."""
        return console.is_terminal(self._stream()) if self._live is None else self._live

    def _stream(self) -> TextIO:
        return self.stream or console.out()

    def _print(self, line: str) -> None:
        """A line above the live table goes out with its next redraw (rich draws the table again
        under every line it prints); without one, at once."""
        if self.live and self._display is not None:
            self._pending.append(line)
        else:
            print(line, file=self._stream(), flush=True)

    def _label(self, trial) -> str:
        return trial.trial_id

    def on_trial_start(self, iteration, trials, trial, **info) -> None:
        values = swept_values(trial.config, self.paths)
        self._print(f"trial {self._label(trial)} started: " + "  ".join(
            f"{path.rsplit('.', 1)[-1]}={short(value)}" for path, value in values.items()))
        self._redraw(trials)

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        if result.get(INFEASIBLE):  # its one report, at step 0: said once it completes
            return
        parts = [f"step {result.get('step', 0)}/{self.num_steps}"]
        if "train/loss" in result and self.metric != "train/loss":
            parts.append(f"loss {result['train/loss']:.3f}")
        if self.metric in result:
            parts.append(f"{self.metric} {short(result[self.metric])}")
        self._print(f"trial {self._label(trial)} " + "  ".join(parts))
        self._redraw(trials)

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        step = trial.last_result.get("step", 0)
        if trial.last_result.get(INFEASIBLE):
            self._said_end(f"trial {self._label(trial)} not trained: {trial.last_result[INFEASIBLE]} "
                           "(search.constraints)", trials)
            return
        how = "finished" if step >= self.num_steps else "stopped early by the scheduler"
        self._said_end(f"trial {self._label(trial)} {how} at step {step}: "
                       f"{self.metric} {short(trial.last_result.get(self.metric))}", trials)

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        self._said_end(f"trial {self._label(trial)} errored: {failure_reason(latest_error(trial))}", trials)

    def _said_end(self, line: str, trials) -> None:
        self._print(line)
        self._ended.append(line)
        self._redraw(trials)

    def on_step_end(self, iteration, trials, **info) -> None:
        if self.capacity is not None and time.monotonic() - self._last_look >= WAITS_EVERY_S:
            self._last_look = time.monotonic()
            self._say_waits()
        if self.live and self._changed:
            self._redraw(trials)
        elif not self.live and time.monotonic() - self._last_table >= self.table_every_s:
            self._last_table = time.monotonic()
            self._print(self.table(trials))

    def _say_waits(self) -> None:
        """Workers waiting at two looks in a row (a placement takes milliseconds when the nodes
        are there): one line, again only when what is awaited changes."""
        waiting = waiting_bundles()
        bundles = [bundle for group, found in waiting.items() if group in self._waiting for bundle in found]
        self._waiting = waiting
        if not bundles:
            self._said_waiting = None
            return
        wanted = nodes_wanted(self.capacity, bundles) if self.capacity.autoscales else None
        line = (f"waiting for {wanted[0]} node{'s' * (wanted[0] > 1)} of type {wanted[1]} for {len(bundles)} "
                "trial worker(s): the autoscaler starts them" if wanted else
                f"waiting for {len(bundles)} trial worker(s) that no node alive has room for")
        if line != self._said_waiting:
            self._print(line)
            self._said_waiting = line

    def on_experiment_end(self, trials, **info) -> None:
        self.close()

    def close(self) -> None:
        """End the live table (it leaves the terminal: the command prints its final table)."""
        if self._display is not None:
            self._flush_lines()
            self._display.stop()
            self._display = None

    def _flush_lines(self) -> None:
        if self._pending:
            self._display.console.print("\n".join(self._pending), markup=False, highlight=False, soft_wrap=True)
            self._pending = []

    def _redraw(self, trials) -> None:
        """The live table drawn again, at most every ``redraw_every_s``: an event between two
        draws marks it changed, and the next ``on_step_end`` after the interval draws it."""
        if not self.live:
            return
        self._changed = True
        if time.monotonic() - self._drawn < self.redraw_every_s:
            return
        if self._display is None:
            from rich.console import Console
            from rich.live import Live

            # redirect_*: rich would show on the terminal what Ray and Tune print from Python; it goes to the log
            self._display = Live(console=Console(file=self._stream()), transient=True, auto_refresh=False,
                                 redirect_stdout=False, redirect_stderr=False)
            self._display.start()
        table = self.live_table(trials)
        self._flush_lines()
        self._display.update(table, refresh=True)
        self._drawn, self._changed = time.monotonic(), False
        self.redraws, self.most_rows = self.redraws + 1, max(self.most_rows, table.row_count)

    def _status(self, trial) -> str:
        """As the sweep's final table says it: a trial ended before ``num_steps`` is ``STOPPED``."""
        return str(TrialStatus.of(trial.status, trial.last_result.get("step", 0), self.num_steps,
                                  bool(trial.last_result.get(INFEASIBLE))))

    def shown(self, trials) -> list:
        """The trials the table shows: every one in a small sweep; else the best few (by the
        metric's last value) and the running ones, in Tune's order."""
        if len(trials) <= ALL_ROWS_UP_TO:
            return list(trials)
        scored = [trial for trial in trials if isinstance(trial.last_result.get(self.metric), (int, float))]
        best = sorted(scored, key=lambda trial: trial.last_result[self.metric], reverse=self.mode == "max")[:BEST_ROWS]
        chosen = {id(trial) for trial in best}
        running = [trial for trial in trials if trial.status == "RUNNING" and id(trial) not in chosen]
        chosen |= {id(trial) for trial in running[:RUNNING_ROWS]}
        return [trial for trial in trials if id(trial) in chosen]

    def counts(self, trials) -> str:
        """How many trials are in each status, as the sweep's final table says it."""
        counts: dict[str, int] = {}
        for trial in trials:
            counts[self._status(trial)] = counts.get(self._status(trial), 0) + 1
        return ", ".join(f"{n} {status.lower()}" for status, n in sorted(counts.items()))

    def rows(self, trials) -> tuple[list[str], list[list[str]]]:
        headers = ["trial", "status", "step", self.metric] + [path.rsplit(".", 1)[-1] for path in self.paths]
        rows = [[self._label(trial), self._status(trial), str(trial.last_result.get("step", "")),
                 short(trial.last_result.get(self.metric, ""))]
                + [short(value) for value in swept_values(trial.config, self.paths).values()]
                for trial in self.shown(trials)]
        return headers, rows

    def _window_note(self, trials, shown: int) -> list[str]:
        """Under a window: what it shows, and where every row is."""
        if shown == len(trials):
            return []
        return [f"{shown} of {len(trials)} shown: the best {BEST_ROWS}, the running", "every trial: detsweep status"]

    def table(self, trials) -> str:
        headers, rows = self.rows(trials)
        widths = [max(len(row[i]) for row in [headers, *rows]) for i in range(len(headers))]
        lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip()
                 for row in [headers, *rows]]
        note = self._window_note(trials, len(rows))
        return "\n".join(lines + (["; ".join([self.counts(trials), *note])] if note else []))

    def live_table(self, trials):
        """The table as rich draws it: its rows, the counts by status and the time so far; past
        ``ALL_ROWS_UP_TO`` trials, the last ones to end."""
        from rich.table import Table

        headers, rows = self.rows(trials)
        elapsed = time.monotonic() - self._started
        caption = [f"{self.counts(trials)}; {elapsed // 60:.0f} min {elapsed % 60:02.0f} s",
                   *self._window_note(trials, len(rows))]
        if len(rows) < len(trials):
            caption += self._ended
        table = Table(*headers, caption="\n".join(caption), caption_justify="left")
        for row in rows:
            table.add_row(*row)
        return table
