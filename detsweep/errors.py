"""The one exception type for mistakes a user can fix.

Anything raised as a :class:`DetsweepError` is printed by the CLI as a single
line and exits with code 2. Every other exception is a bug in detsweep and keeps
its traceback.
"""


class DetsweepError(Exception):
    """A problem in the user's input: a config file, a flag, a dataset."""
