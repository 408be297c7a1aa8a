"""The private parts of libraries detsweep relies on, each by name: a release that renames or
drops one fails here, saying which, instead of a sweep halving wrongly without a word.
``pyproject.toml`` bounds these libraries at the next minor version for the same reason."""

import inspect

import pytest


def test_tunes_hyperband_bracket_keeps_the_state_our_brackets_read_and_set():
    """sweeps/tuner.py: ``_Bracket.filled``, ``successive_halving`` and ``_WholeSweep``."""
    from ray.tune.schedulers import hyperband

    bracket = hyperband._Bracket(time_attr="t", max_trials=3, init_t_attr=1, max_t_attr=9, eta=3, s=2)
    missing = [name for name in ("is_being_processed", "_all_trials", "_n0", "_halves", "_r", "_cumul_r",
                                 "_max_t_attr", "_n", "_live_trials", "successive_halving") if not hasattr(bracket, name)]
    assert not missing, f"ray.tune.schedulers.hyperband._Bracket no longer has {missing}"


def test_tunes_hyperband_for_bohb_keeps_what_our_schedulers_override_and_read():
    """sweeps/tuner.py: ``HyperBandForBOHB`` and ``SuccessiveHalving``."""
    from ray import tune

    scheduler = tune.schedulers.HyperBandForBOHB(time_attr="t", max_t=9, metric="m", mode="max")
    missing = [name for name in ("_create_bracket", "_process_bracket", "choose_trial_to_run", "on_trial_remove",
                                 "_time_attr", "_get_n0", "_get_r0", "_max_t_attr", "_eta", "_stop_last_trials",
                                 "_s_max_1") if not hasattr(scheduler, name)]
    assert not missing, f"ray.tune.schedulers.HyperBandForBOHB no longer has {missing}"
    assert list(inspect.signature(scheduler._create_bracket).parameters) == ["s"]
    assert list(inspect.signature(scheduler._process_bracket).parameters) == ["tune_controller", "bracket"]


def test_tunes_controller_and_variant_generator_keep_what_pauses_use():
    """sweeps/tuner.py: a trial stopped while paused is written to the experiment state; the
    generator's live trials count a paused trial's slot."""
    from ray.tune.execution.tune_controller import TuneController
    from ray.tune.search import BasicVariantGenerator

    assert hasattr(TuneController, "_mark_trial_to_checkpoint"), "TuneController lost _mark_trial_to_checkpoint"
    assert hasattr(BasicVariantGenerator(), "_live_trials"), "BasicVariantGenerator lost _live_trials"


@pytest.mark.parametrize("logger", ["JsonLoggerCallback", "CSVLoggerCallback"])
def test_tunes_result_loggers_still_restore_through_the_method_we_override(logger):
    """sweeps/trial_files.py keeps the staged file over the stored one by overriding it."""
    from ray.tune import logger as loggers

    method = getattr(getattr(loggers, logger), "_restore_from_remote", None)
    assert method is not None, f"ray.tune.logger.{logger} lost _restore_from_remote"
    assert list(inspect.signature(method).parameters) == ["self", "file_name", "trial"]


def test_ray_trains_report_logger_is_where_we_quiet_it():
    """trainables/worker.py quiets the logger named by this module's path."""
    from ray.train.v2._internal.execution import context

    assert context.__file__.endswith("context.py")
