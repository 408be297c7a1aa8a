"""The one exception type for mistakes a user can fix.

Anything raised as a :class:`DetsweepError` is printed by the CLI as a single
line and exits with code 2. Every other exception is a bug in detsweep and keeps
its traceback.
"""

from __future__ import annotations

import contextlib
import os
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
