"""What a person at a terminal sees: the sweep's live table and a spinner for long work, drawn
on a real pseudo-terminal; on a pipe, plain lines (what logs and tests read)."""

from __future__ import annotations

import io
import os
import pickle
import pty
import select
import sys
import time

import pytest
from ray.tune.experiment import Trial

from detsweep import console
from detsweep.sweeps.progress import SweepProgress

from .conftest import plain

PATH = "optimizer.learning_rate.learning_rate_base"


@pytest.fixture
def terminal():
    """A pseudo-terminal: the stream to write to, and a function returning what it was sent
    (read as it comes, so that a writer never waits on a full terminal)."""
    import threading

    leader, follower = pty.openpty()
    stream = os.fdopen(follower, "w")
    chunks: list[bytes] = []
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            if select.select([leader], [], [], 0.05)[0]:
                chunks.append(os.read(leader, 65536))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()

    def sent() -> str:
        stream.flush()
        time.sleep(0.3)  # what was written has reached the reader
        count = len(chunks)
        taken = b"".join(chunks[:count])
        del chunks[:count]
        return taken.decode(errors="replace")

    yield stream, sent
    done.set()
    reader.join()
    stream.close()
    os.close(leader)


def trial(trial_id: str, rate: float, status: str = Trial.RUNNING, **result) -> Trial:
    made = Trial("run_trial", config={"trial": {"optimizer": {"learning_rate": {"learning_rate_base": rate}}}}, trial_id=trial_id, stub=True)
    made.set_status(status)
    made.run_metadata.last_result = result
    return made


def test_on_a_terminal_the_table_is_live_under_the_event_lines_and_leaves_nothing_behind(terminal):
    stream, sent = terminal
    progress = SweepProgress([PATH], "eval/AP", 20, stream=stream, redraw_every_s=0)
    assert progress.live
    first, second = trial("a_00000", 0.02), trial("a_00001", 0.01, Trial.PENDING)
    progress.on_trial_start(0, [first, second], first)
    # Tune pickles its callbacks (a resume unpickles them): the copy decides for itself where it
    # runs, and pytest's captured stdout is no terminal
    assert not pickle.loads(pickle.dumps(progress)).live
    print("(TrainController pid=1) from Ray, in Python", file=sys.stderr)  # goes where fd 2 goes: the log
    first.run_metadata.last_result = {"step": 10, "eval/AP": 0.25}
    progress.on_trial_result(0, [first, second], first, {"step": 10, "eval/AP": 0.25, "train/loss": 1.5})
    drawn = sent()
    shown = plain(drawn)
    assert "trial a_00000 started: learning_rate_base=0.02" in shown
    assert "trial a_00000 step 10/20  loss 1.500  eval/AP 0.25" in shown
    assert "│ a_00000 │ RUNNING │ 10   │ 0.25    │ 0.02 " in shown and "│ a_00001 │ PENDING │" in shown
    assert "1 pending, 1 running; 0 min" in shown and "from Ray" not in shown
    assert drawn.index("\x1b[?25l") < drawn.index("step 10/20")  # the cursor hides while the table is drawn
    progress.close()
    ended = sent()
    assert ended.count("\x1b[?25h") == 1  # the cursor back, then the table wiped: only erasures follow
    assert plain(ended[ended.index("\x1b[?25h"):]).strip() == "" and "\x1b[2K" in ended
    progress.on_step_end(0, [first, second])
    assert sent() == ""


def test_on_a_pipe_events_are_lines_and_the_table_comes_every_table_every_s():
    stream = io.StringIO()
    progress = SweepProgress([PATH], "eval/AP", 20, stream=stream, table_every_s=0.1)
    assert not progress.live
    done = trial("a_00000", 0.02, Trial.TERMINATED, step=20, **{"eval/AP": 0.5})
    stopped = trial("a_00001", 0.01, Trial.TERMINATED, step=5, **{"eval/AP": 0.1})  # Tune's name for it
    progress.on_trial_complete(0, [done], done)
    progress.on_trial_complete(0, [done, stopped], stopped)
    progress.on_step_end(0, [done, stopped])
    time.sleep(0.15)
    progress.on_step_end(0, [done, stopped])
    assert stream.getvalue().splitlines() == [
        "trial a_00000 finished at step 20: eval/AP 0.5",
        "trial a_00001 stopped early by the scheduler at step 5: eval/AP 0.1",
        "trial    status      step  eval/AP  learning_rate_base",
        "a_00000  TERMINATED  20    0.5      0.02",
        "a_00001  STOPPED     5     0.1      0.01"]  # as the sweep's final table says it


def sweep_of(count: int) -> list[Trial]:
    """``count`` stand-in trials as Tune holds them mid-sweep: the first 32 running, the rest
    ended, each with its swept value and its last AP (the best the one at ``count // 2``)."""
    return [trial(f"t_{i:05d}", 0.01 + i * 1e-6, Trial.RUNNING if i < 32 else Trial.TERMINATED,
                  step=10 if i < 32 else 20, **{"eval/AP": 0.9 if i == count // 2 else 0.1 + i * 1e-5})
            for i in range(count)]


def test_the_console_draws_a_bounded_window_throttled_whatever_the_number_of_trials(terminal):
    """Rows per redraw counted, not timed: 15 trials are all shown, 2 000 are a window of the
    best and the running ones with the counts; fifty events inside the redraw interval draw
    once, and the next step's end draws again only once it has passed and something changed.
    On a pipe, the minute's table is as bounded."""
    from detsweep.sweeps import progress as shown

    stream, sent = terminal
    for count in (15, 2000):
        trials = sweep_of(count)
        progress = SweepProgress([PATH], "eval/AP", 20, stream=stream, redraw_every_s=3600)
        for one in trials[:50]:
            progress.on_trial_result(0, trials, one, {"step": 10, "eval/AP": 0.1})
        progress.on_step_end(0, trials)
        assert progress.redraws == 1  # the first event drew; the other 49 and the step's end waited
        drawn = sent()
        progress.redraw_every_s = 0
        progress.on_step_end(0, trials)
        progress.on_step_end(0, trials)
        assert progress.redraws == 2  # what changed, drawn once; then nothing had
        drawn += sent()
        progress.on_trial_complete(0, trials, trials[-1])
        assert progress.redraws == 3 and progress.most_rows == min(count, shown.ALL_ROWS_UP_TO)
        drawn = plain(drawn + sent())
        assert drawn.count("trial t_00014 step 10/20") == 1  # every line once, with the redraw after it
        progress.close()
        assert f"t_{count // 2:05d}" in drawn and "..." not in drawn  # the best in it; it fits a 25-line terminal
    assert "32 running, 1968 terminated; 0 min" in drawn and "15 of 2000 shown: the best 5, the running" in drawn
    assert "trial t_01999 finished at step 20: eval/AP 0.12" in drawn.split("detsweep status")[-1]  # the last to end
    piped = SweepProgress([PATH], "eval/AP", 20, stream=io.StringIO(), table_every_s=0)
    piped.on_step_end(0, sweep_of(2000))
    assert len(piped.stream.getvalue().splitlines()) == 1 + shown.ALL_ROWS_UP_TO + 1  # header, rows, note


def test_long_work_shows_a_spinner_with_its_time_on_a_terminal_and_nothing_on_a_pipe(terminal, monkeypatch):
    stream, sent = terminal
    monkeypatch.setitem(console._terminal, "err", stream)
    with console.working("reading and checking data.train (coco)"):
        print("from TensorFlow, in Python", file=sys.stderr)
        time.sleep(0.3)
    drawn = sent()
    assert "reading and checking data.train (coco) 0:00:00" in plain(drawn) and "from TensorFlow" not in drawn
    assert plain(drawn[drawn.index("\x1b[?25h"):]).strip() == ""  # the cursor back, the line wiped
    piped = io.StringIO()
    monkeypatch.setitem(console._terminal, "err", piped)
    with console.working("exporting"):
        pass
    assert piped.getvalue() == ""


# One bad input for each command; those that load TensorFlow before they find it bad
# (a corrupt TFRecord, a checkpoint folder without a checkpoint) would print its C++ start-up.
BAD_INPUTS = {
    "config": ["config", "bad.yaml"],
    "optimizer": ["optimizer", "bad.yaml"],
    "train": ["train", "bad.yaml"],
    "best": ["best", "nosuch"],
    "finetune": ["finetune", "--from", "run:0123456789abcdef"],
    "ui": ["ui", "--config", "bad.yaml"],
    "eval": ["eval", "--checkpoint", "."],
    "import-odapi": ["import-odapi", "bad.record"],
    "export": ["export", "--from", "checkpoint:.", "--out", "exported"],
    "predict": ["predict", "--from", "checkpoint:.", "bad.record"],
    "validate": ["validate", "bad.yaml"],
    "launch": ["launch", "bad.yaml"],
    "status": ["status", "."],
    "study": ["study", "nosuch"],  # neither a folder nor an MLflow experiment
    "rerun": ["rerun", "nosuch"],
    "importance": ["importance", "."],
    "resume": ["resume", "."],
    "replay": ["replay", "bad.yaml", "bad.yaml"],
    "data inspect": ["data", "inspect", "--format", "tfrecord", "--annotations", "bad.record"],
    "data synth": ["data", "synth", "--num-images", "-3", "--out", "synth"],
}


def test_every_command_refuses_a_bad_input_in_one_line_on_stderr_without_tensorflows_start_up(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    from detsweep.cli import build_parser

    from .conftest import run_cli

    commands = build_parser()._subparsers._group_actions[0].choices  # every command the CLI has
    assert set(commands) - {"data"} | {f"data {name}" for name in ("inspect", "synth")} == set(BAD_INPUTS)
    (tmp_path / "bad.yaml").write_text("optimizer: {type: adam\n")
    (tmp_path / "bad.record").write_text("not a TFRecord, nor an OD API text proto, and longer than a header\n")
    with ThreadPoolExecutor(2) as pool:
        results = dict(zip(BAD_INPUTS, pool.map(lambda args: run_cli(*args, cwd=tmp_path, timeout=120),
                                               BAD_INPUTS.values())))
    for name, result in results.items():
        lines = result.stderr.splitlines()
        assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("detsweep"), (name, result.stderr)
    assert "corrupt TFRecord" in results["data inspect"].stderr and "not a detsweep checkpoint" in results["eval"].stderr
    assert sorted(path.name for path in tmp_path.iterdir()) == ["bad.record", "bad.yaml"]  # nothing written
