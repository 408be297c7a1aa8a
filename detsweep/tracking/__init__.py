"""MLflow tracking: a sweep is a parent run, each trial a nested child run; the best model is registered."""

from .backend import Backend, backend_of, check_backend, resolve_backend, trial_environment
from .sweep_run import TrialStatus, close_sweep_run, open_sweep_run, reopen_sweep_run
from .trial_run import RunLink, TrialIdentity, TrialRun

__all__ = ["Backend", "TrialStatus", "backend_of", "RunLink", "TrialIdentity", "TrialRun", "check_backend", "close_sweep_run", "open_sweep_run",
           "reopen_sweep_run", "resolve_backend", "trial_environment"]
