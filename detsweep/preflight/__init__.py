"""Every check a command makes before Ray or MLflow start, each written once: ``detsweep
validate``, ``launch``, ``resume``, ``train`` and ``finetune`` describe what they will run
(:class:`Preflight`) and call :func:`preflight`. A failed check is one line naming the file
and field (a :class:`~detsweep.errors.DetsweepError`), before any compute is spent."""

from .capacity import Capacity
from .checks import Cleared, Preflight, preflight

__all__ = ["Capacity", "Cleared", "Preflight", "preflight"]
