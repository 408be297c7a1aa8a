"""detsweep's own lines, and only those, on the terminal.

A long command (``launch``, ``resume``, ``train``, ``finetune``) hands the process's file
descriptors 1 and 2 to a log file once it starts working (:func:`take_over`): everything Ray,
Tune, TensorFlow and MLflow print goes there, from Python and native code alike, including
what Ray forwards from its workers. detsweep writes its lines through :func:`out` and
:func:`err`, which keep the terminal. The log starts in a scratch file and moves into the
run's own folder once there is one (:func:`keep_log_in`), so that a command refused early
leaves nothing behind.
"""

from __future__ import annotations

import io
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

LOG_FOLDER = "logs"
_terminal: dict[str, TextIO] = {}
_log: dict[str, str] = {}


def out() -> TextIO:
    """Where detsweep's progress and results go: the terminal's stdout (stderr under ``--json``)."""
    return _terminal.get("out", sys.stdout)


def err() -> TextIO:
    """Where detsweep's errors and warnings go: the terminal's stderr."""
    return _terminal.get("err", sys.stderr)


def say(line: str) -> None:
    print(line, file=out(), flush=True)


def is_terminal(stream: TextIO) -> bool:
    """Whether ``stream`` is a terminal a person watches (not a pipe, a file or a closed stream)."""
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


@contextmanager
def working(what: str) -> Iterator[None]:
    """Long work (a dataset read and checked, a model built, an export, an evaluation) shows
    ``what`` with a spinner and the time so far on a terminal's stderr, and leaves no trace
    when it ends: the caller says what came of it. On a pipe or a file, nothing is shown."""
    if not is_terminal(err()):
        yield
        return
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=Console(file=err()),
                  transient=True, redirect_stdout=False, redirect_stderr=False) as shown:
        shown.add_task(what, total=None)
        yield


def hold_stderr() -> None:
    """Every command's start (``cli.main``): from now on file descriptor 2 writes to a scratch
    log, so that what libraries print there (TensorFlow's C++ start-up lines, which come before
    any Python setting can act; Python warnings) stays off the terminal, where detsweep's own
    lines go (:func:`err`). The log is dropped when the command ends or is refused, and named in
    its one line when it fails unexpectedly (its traceback is there). Nothing is held where
    ``sys.stderr`` is not file descriptor 2 (``main`` called in a process that captures it)."""
    try:
        if sys.stderr.fileno() != 2:
            return
    except (AttributeError, ValueError, io.UnsupportedOperation):
        return
    sys.stderr.flush()
    _terminal["err"] = os.fdopen(os.dup(2), "w", buffering=1)
    _write_to_log(2)


def release_stderr(drop_log: bool = True) -> None:
    """File descriptor 2 back on the terminal, its scratch log dropped (unless not
    ``drop_log``): a command that hands over to another program (``ui``), shows everything
    (``--verbose``) or has ended without taking the terminal over (:func:`take_over` keeps it
    until the process ends: Ray writes until then)."""
    if "err" not in _terminal or "out" in _terminal:
        return
    terminal = _terminal.pop("err")
    sys.stderr.flush()
    os.dup2(terminal.fileno(), 2)
    terminal.close()
    if drop_log:
        drop_scratch_log()
    else:
        _log.pop("path", None)


def take_over(as_json: bool = False, verbose: bool = False) -> TextIO:
    """From now until the process ends, file descriptors 1 and 2 write to a scratch log (with
    ``verbose``, they keep the terminal); returns the stream for the command's result, the
    terminal's stdout. Under ``as_json`` detsweep's lines go to stderr, the result alone to stdout."""
    if verbose:
        release_stderr()
    sys.stdout.flush()
    sys.stderr.flush()
    result = os.fdopen(os.dup(1), "w", buffering=1)
    if "err" not in _terminal:
        _terminal["err"] = os.fdopen(os.dup(2), "w", buffering=1)
    _terminal["out"] = _terminal["err"] if as_json else result
    if verbose:
        if as_json:  # Ray keeps writing to fd 1 until the process exits: none of it in the result
            os.dup2(2, 1)
        return result
    _write_to_log(1, 2)
    return result


def _write_to_log(*descriptors: int) -> None:
    """Point ``descriptors`` at the log, a new scratch file when there is none yet."""
    if "path" not in _log:
        descriptor, _log["path"] = tempfile.mkstemp(prefix="detsweep-", suffix=".log")
        os.close(descriptor)
    log = os.open(_log["path"], os.O_WRONLY | os.O_APPEND)
    for descriptor in descriptors:
        os.dup2(log, descriptor)
    os.close(log)


def keep_log_in(folder: str | Path, name: str) -> Path | None:
    """Move the log into ``folder/logs/name`` and say where it is; the writes go on there. A
    folder in the cloud (``s3://…``) keeps its results only: the log goes to ``./logs/`` here.
    Nothing to do without a log (``--verbose``)."""
    scratch = _log.get("path")
    if scratch is None:
        return None
    target = (Path.cwd() if "://" in str(folder) else Path(folder)) / LOG_FOLDER / name
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(scratch, "rb") as old, open(target, "ab") as new:
        new.write(old.read())
        descriptor = os.open(target, os.O_WRONLY | os.O_APPEND)
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(descriptor, 1)
        os.dup2(descriptor, 2)
        os.close(descriptor)
        new.write(old.read())  # what was written between the copy and the switch
    os.unlink(scratch)
    _log["path"] = str(target)
    say(f"logs: {target} (Ray's, Tune's and TensorFlow's own output; --verbose shows it here)")
    return target


def log_path() -> str | None:
    """Where the process's own output goes now, if not to the terminal."""
    return _log.get("path")


def drop_scratch_log() -> None:
    """A command that ended before it had a folder of its own leaves no log behind (its error,
    if any, is its one line on the terminal)."""
    path = _log.get("path")
    if path and path.startswith(tempfile.gettempdir()) and Path(path).name.startswith("detsweep-"):
        os.unlink(path)
        _log.pop("path")
