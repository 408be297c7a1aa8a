"""Every page of an MLflow listing. MLflow answers ``search_runs`` and ``search_logged_models``
a page at a time (newest first, by default), with a token for the next page: a caller that
reads one page loses the oldest runs of a sweep larger than the page. Every listing detsweep
makes goes through here and reads until MLflow says there is no more (a look-up of one run
too, so that no search of MLflow's is made anywhere else: ``tests/test_paging.py`` checks it).
MLflow's pages are offsets into its order: a run made while paging pushes one onto the next
page (kept once here), and one deleted (a running trial pruning its checkpoints) can pull one
back onto a page already read, so a listing made while a sweep runs (``best`` of a live sweep)
can miss a checkpoint pruned meanwhile; one made at a sweep's end sees them all.

``PAGE_SIZE`` is the page asked for (MLflow's default for runs; its server allows up to
50 000, but a run comes back with all its params, metrics and tags, so pages stay moderate).

MLflow has no call that reads many runs' metric histories at once: :func:`metric_histories`
reads them ``AT_ONCE`` at a time, so that a sweep of thousands waits on the server's latency
a few times, not once per run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

PAGE_SIZE = 1000
AT_ONCE = 8  # independent reads sent to the tracking server at once


def metric_histories(client, wanted: list[tuple[str, str]]) -> dict[tuple[str, str], dict[int, float]]:
    """Each ``(run_id, metric)``'s history, step → value (the latest value at a step logged twice)."""
    from concurrent.futures import ThreadPoolExecutor

    def history(pair: tuple[str, str]) -> dict[int, float]:
        points = sorted(client.get_metric_history(*pair), key=lambda point: (point.step, point.timestamp))
        return {point.step: point.value for point in points}

    with ThreadPoolExecutor(AT_ONCE) as pool:
        return dict(zip(wanted, pool.map(history, wanted)))


def every_run(client, experiment_ids: list[str], filter_string: str = "",
              order_by: list[str] | None = None) -> list:
    """Every run of ``experiment_ids`` that ``filter_string`` selects, in MLflow's order; a run
    seen on two pages (runs made while paging shift the pages) is kept once, where it came first."""
    return _every(lambda size, token: client.search_runs(
        experiment_ids, filter_string, max_results=size, order_by=order_by, page_token=token),
        lambda run: run.info.run_id)


def first_run(client, experiment_ids: list[str], filter_string: str):
    """The first run ``filter_string`` selects, or None: a look-up of one run, not a listing."""
    runs = client.search_runs(experiment_ids, filter_string, max_results=1)
    return runs[0] if runs else None


def every_logged_model(client, experiment_ids: list[str], filter_string: str | None = None) -> list:
    """Every logged model of ``experiment_ids`` that ``filter_string`` selects, each once."""
    return _every(lambda size, token: client.search_logged_models(
        experiment_ids, filter_string=filter_string, max_results=size, page_token=token),
        lambda model: model.model_id)


def every_model_version(client, filter_string: str) -> list:
    """Every registered model version ``filter_string`` selects, each once."""
    return _every(lambda size, token: client.search_model_versions(
        filter_string, max_results=size, page_token=token), lambda version: f"{version.name}/{version.version}")


def _every(search: Callable[[int, str | None], Any], key: Callable[[Any], str]) -> list:
    found: dict[str, Any] = {}
    token = None
    while True:
        page = search(PAGE_SIZE, token)
        for item in page:
            found.setdefault(key(item), item)
        token = page.token
        if not token:
            return list(found.values())
