"""``python -m detsweep``: the same as the ``detsweep`` command."""

import sys

from detsweep.cli import main

sys.exit(main())
