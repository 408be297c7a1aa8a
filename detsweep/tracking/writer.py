"""A background writer: MLflow calls leave the trial's loop at once and are retried until
the tracking server takes them, so a server outage never stalls or crashes training."""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class RetryingWriter:
    """Runs queued calls in order on one thread; a call that fails is retried (about 1, 2, 4, 8,
    10, 10 … s apart) until it succeeds or ``close`` gives up on it after its deadline. Each wait
    is drawn between half and all of its step, so the trials a server restart cut do not all
    come back at the same instant; capped at 10 s, a write waits at most that long after the
    server is back (bench/tracking_load.py restarts it mid-sweep)."""

    def __init__(self, max_backoff_s: float = 10.0):
        self._calls: queue.Queue = queue.Queue()  # task_done per call: ``drain`` waits on it
        self._max_backoff_s = max_backoff_s
        self._deadline: float | None = None
        self.lost: list[str] = []
        self._in_flight: str | None = None  # what the thread is writing now
        self._thread = threading.Thread(target=self._run, name="mlflow-writer", daemon=True)
        self._thread.start()

    def submit(self, what: str, call: Callable[[], object]) -> None:
        self._calls.put((what, call))

    def drain(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` until every call submitted so far was written or given up
        on, and keep accepting calls; whether it got there in time."""
        deadline = time.monotonic() + timeout_s
        with self._calls.all_tasks_done:
            while self._calls.unfinished_tasks:
                left = deadline - time.monotonic()
                if left <= 0 or not self._thread.is_alive():
                    return False
                self._calls.all_tasks_done.wait(min(left, 1.0))
        return True

    def close(self, timeout_s: float = 60.0) -> list[str]:
        """Wait up to ``timeout_s`` for what is queued; returns what could not be written: what
        failed, what was still queued, and a write still in flight (given up on, though the
        server may yet take it)."""
        self._deadline = time.monotonic() + timeout_s
        self._calls.put(None)
        self._thread.join(timeout_s + 1)
        if self._thread.is_alive() and (in_flight := self._in_flight) is not None:
            self.lost.append(in_flight)
        while not self._calls.empty():
            item = self._calls.get_nowait()
            if item is not None:
                self.lost.append(item[0])
        return self.lost

    def _run(self) -> None:
        while (item := self._calls.get()) is not None:
            what, call = item
            self._in_flight = what
            if not self._call_until_done(what, call):
                self.lost.append(what)
            self._in_flight = None
            self._calls.task_done()

    def _call_until_done(self, what: str, call: Callable[[], object]) -> bool:
        backoff = 1.0
        while True:
            try:
                call()
                return True
            except Exception as error:  # the server is down or busy: try again, never crash the trial
                if _permanent(error):
                    log.warning("MLflow: %s was refused: %s", what, error)
                    return False
                if self._deadline is not None and time.monotonic() + backoff > self._deadline:
                    log.warning("MLflow: gave up on %s: %s", what, error)
                    return False
                wait = random.uniform(backoff / 2, backoff)
                log.warning("MLflow: %s failed (%s); retrying in %.0f s", what, type(error).__name__, wait)
                time.sleep(wait)
                backoff = min(2 * backoff, self._max_backoff_s)


_REFUSALS = {"INVALID_PARAMETER_VALUE", "BAD_REQUEST", "RESOURCE_ALREADY_EXISTS", "RESOURCE_DOES_NOT_EXIST",
             "PERMISSION_DENIED", "UNAUTHENTICATED"}


def _permanent(error: Exception) -> bool:
    """A refusal (a bad value, a missing run) stays one: sending it again cannot help."""
    return getattr(error, "error_code", None) in _REFUSALS
