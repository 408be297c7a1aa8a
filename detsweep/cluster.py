"""Connecting to Ray: a local cluster by default, any cluster by address."""

from __future__ import annotations

import logging

from detsweep.errors import DetsweepError


def connect(address: str | None = None) -> None:
    """``ray.init`` once per process: ``address`` of a running cluster, or a new local one."""
    import ray

    if ray.is_initialized():
        return
    try:
        ray.init(address=address, logging_level=logging.WARNING, configure_logging=True)
    except ConnectionError as error:
        raise DetsweepError(f"--address {address}: no Ray cluster answers there ({error})") from None
