"""The one exception type for mistakes a user can fix.

Anything raised as a :class:`DetsweepError` is printed by the CLI as a single
line and exits with code 2. Every other exception is a bug in detsweep and keeps
its traceback.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator


class DetsweepError(Exception):
    """A problem in the user's input: a config file, a flag, a dataset."""


@contextlib.contextmanager
def stderr_held_back() -> Iterator[None]:
    """Hold back what is written to stderr in the block, native code's too (TensorFlow's
    start-up lines, progress bars): dropped when the block ends in a :class:`DetsweepError`,
    so that the error is the only line; written out when the block ends otherwise."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        except DetsweepError:
            held.truncate(0)
            raise
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            os.write(2, held.read())


def failure_reason(failure: BaseException | str | None) -> str:
    """The innermost error of a failed run or trial, as one line (e.g. ``loss is NaN/Inf at step 12``):
    the wrappers Ray puts around an exception (``WorkerGroupError: module.Error: …``, a trial's
    traceback ending in ``module.TrialFailed: …``) are dropped, and the exception's name is kept
    only when its message alone would not say much. A trial's error read back from its sweep's
    folder may be its text."""
    cause = failure
    while getattr(cause, "__cause__", None) is not None:
        cause = cause.__cause__
    lines = str(cause or "").strip().splitlines()
    text = lines[-1].strip() if lines else ""
    names = [] if cause is None or isinstance(cause, str) else [type(cause).__name__]
    while match := _EXCEPTION_PREFIX.match(text):
        names.append(match[1].rsplit(".", 1)[-1])
        text = text[match.end():]
    if names and names[-1] not in _SELF_EXPLAINING:
        return f"{names[-1]}: {text}"
    return text or "no reason given"


_EXCEPTION_PREFIX = re.compile(r"([\w.]*(?:Error|Exception|Diverged|Failed)):\s*")
_SELF_EXPLAINING = {"TrainingDiverged", "DetsweepError", "TrialFailed"}  # their message is the reason
