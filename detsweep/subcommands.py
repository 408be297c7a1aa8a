"""The one way detsweep declares a sub-command: ``detsweep NAME`` runs ``run(args)``, which
returns the exit code; the summary is both the ``--help`` line and the description. The
flags several commands share (``--set``, ``--verbose``) are declared here once."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

Command = Callable[[argparse.Namespace], int]


class OneLineParser(argparse.ArgumentParser):
    """A usage mistake is one line on stderr, like every other error (sub-commands inherit it)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def add_command(commands: Any, name: str, run: Command, summary: str) -> argparse.ArgumentParser:
    """``commands``: what ``add_subparsers()`` returned."""
    sub = commands.add_parser(name, help=summary, description=summary[0].upper() + summary[1:] + ".")
    sub.set_defaults(command=run)
    return sub


def add_overrides(parser: argparse.ArgumentParser, help: str) -> None:
    """``--set PATH=VALUE``, repeatable, into ``args.overrides``."""
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="PATH=VALUE", help=help)


def add_verbose(parser: argparse.ArgumentParser) -> None:
    """``--verbose``: Ray's, Tune's and TensorFlow's own lines on the terminal instead of a log."""
    parser.add_argument("--verbose", action="store_true",
                        help="show Ray's, Tune's and TensorFlow's own output here instead of in the run's logs/ file")
